/* The jemalloc arena behind mw_alloc().
 *
 * Every extent jemalloc asks the hooks for is a fresh anonymous mapping,
 * registered whole with every device as one region.  jemalloc may split an
 * extent, and merge extents back, only within one mapping, so every
 * allocation lies inside exactly one registered mapping and has its keys.
 * A mapping is deregistered and unmapped only as a whole (dalloc of exactly
 * the mapping, or once destroy has covered all of it); anything less is
 * refused, and jemalloc keeps it as retained memory, still mapped and
 * registered.  Decommit and purging are refused too: madvise on pinned,
 * registered pages would silently detach them from the MR.
 *
 * jemalloc calls the hooks synchronously, on the calling thread, inside
 * mallocx/dallocx/mallctl and under its own locks: they touch nothing but
 * the memory layer (no libevent, no futures, no log callback, which might
 * allocate from this very arena); what they did is logged after jemalloc
 * returns. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

/* meshwire's own jemalloc (deps/jemalloc, scripts/jemalloc): with
 * JEMALLOC_MANGLE, which meson sets, mallocx() here is its prefixed,
 * hidden mw__je_mallocx(), never the process's allocator. */
#include <jemalloc/jemalloc.h>

#include "core/alloc.h"
#include "mem/region.h"

struct mw__arena {
    extent_hooks_t hooks;     /* jemalloc hands this back; container_of finds us */
    struct mw__mem *mem;      /* NULL if jemalloc would not destroy the arena:
                                 then the hooks refuse everything */
    unsigned ind;
    size_t page;
    struct {                  /* what the hooks did during one jemalloc call */
        unsigned maps, unmaps;
        size_t bytes, unbytes;
        int err;
    } ev;
};

/* One mapping: a region covering it, and jemalloc's view of it. */
struct map {
    struct mw__region r;      /* the whole mapping */
    size_t size;              /* the extent jemalloc asked for (<= mapping) */
    size_t destroyed;         /* bytes of it the destroy hook released */
};

static struct mw__arena *arena_of(extent_hooks_t *h)
{
    return mw__container_of(h, struct mw__arena, hooks);
}

/* The mapping containing all of [addr, addr+size), or NULL. */
static struct map *map_find(struct mw__mem *m, void *addr, size_t size)
{
    uintptr_t start = (uintptr_t)addr, end;
    if (__builtin_add_overflow(start, size, &end))
        return NULL;
    struct mw__region *r = mw__rindex_find(&m->arena_ix, start, end);
    return r ? mw__container_of(r, struct map, r) : NULL;
}

/* mmap @size bytes aligned to @align (a power of two): over-allocate, then
 * trim both ends. */
static void *map_aligned(size_t size, size_t align, size_t page)
{
    size_t over;
    if (align < page)
        align = page;
    if (__builtin_add_overflow(size, align - page, &over))
        return NULL;
    char *p = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uintptr_t base = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    size_t head = base - (uintptr_t)p, tail = over - head - size;
    if (head)
        munmap(p, head);
    if (tail)
        munmap((char *)base + size, tail);
    return (void *)base;
}

static void *map_new(struct mw__arena *a, size_t size, size_t align)
{
    struct mw__mem *m = a->mem;
    size_t len = (size + a->page - 1) & ~(a->page - 1);
    if (len < size)
        return NULL;
    void *p = map_aligned(len, align, a->page);
    if (!p) {
        a->ev.err = -ENOMEM;
        return NULL;
    }
    struct map *mp = mw__calloc(1, sizeof *mp);
    int rc = mp ? mw__rindex_reserve(&m->arena_ix, m->arena_ix.n + 1) : -ENOMEM;
    if (!rc)
        rc = mw__region_init(&m->rg, &mp->r, (uintptr_t)p, len);
    if (rc < 0) {
        /* Not registered with every device: useless for RDMA, give it back. */
        mw__free(mp);
        munmap(p, len);
        a->ev.err = rc;
        return NULL;
    }
    mp->size = size;
    mw__rindex_insert(&m->arena_ix, &mp->r); /* cannot fail: reserved */
    a->ev.maps++;
    a->ev.bytes += len;
    return p;
}

/* Deregister (before the pages go, so no MR outlives them) and, when
 * @unmap, unmap. */
static void map_release(struct mw__arena *a, struct mw__mem *m, struct map *mp,
                        bool unmap)
{
    void *p = (void *)mp->r.start;
    size_t len = mp->r.end - mp->r.start;
    mw__rindex_remove(&m->arena_ix, &mp->r);
    int rc = mw__region_fini(&m->rg, &mp->r);
    if (rc < 0 && !a->ev.err)
        a->ev.err = rc;
    if (unmap)
        munmap(p, len);
    mw__free(mp);
    a->ev.unmaps++;
    a->ev.unbytes += len;
}

/* ------------------------------------------------------------------------
 * Extent hooks
 * ------------------------------------------------------------------------ */

static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t align,
                        bool *zero, bool *commit, unsigned ind)
{
    (void)ind;
    struct mw__arena *a = arena_of(h);
    /* A fixed address (growing in place) cannot be had from mmap without
     * clobbering; jemalloc copes with a refusal. */
    if (!a->mem || new_addr || !size)
        return NULL;
    void *p = map_new(a, size, align);
    if (p) {
        *zero = true;         /* fresh anonymous pages */
        *commit = true;       /* and always committed */
    }
    return p;
}

static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed,
                        unsigned ind)
{
    (void)committed;
    (void)ind;
    struct mw__arena *a = arena_of(h);
    struct map *mp = a->mem ? map_find(a->mem, addr, size) : NULL;
    /* Only a whole mapping can go: the rest of one is a single MR still in
     * use.  Refused, jemalloc retains the extent (mapped, registered). */
    if (!mp || mp->r.start != (uintptr_t)addr || mp->size != size || mp->destroyed)
        return true;
    map_release(a, a->mem, mp, true);
    return false;
}

static void hook_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed,
                         unsigned ind)
{
    (void)committed;
    (void)ind;
    struct mw__arena *a = arena_of(h);
    struct map *mp = a->mem ? map_find(a->mem, addr, size) : NULL;
    if (!mp)
        return;
    /* The MR covers the whole mapping: it goes once every part has been
     * destroyed (mw__arena_destroy sweeps up parts jemalloc never hands
     * back). */
    mp->destroyed += size;
    if (mp->destroyed >= mp->size)
        map_release(a, a->mem, mp, true);
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size, size_t offset,
                        size_t length, unsigned ind)
{
    (void)h, (void)addr, (void)size, (void)offset, (void)length, (void)ind;
    return false;             /* never decommitted, so always committed */
}

/* Decommit and both purges: refused (see the top of the file). */
static bool hook_refuse(extent_hooks_t *h, void *addr, size_t size, size_t offset,
                        size_t length, unsigned ind)
{
    (void)h, (void)addr, (void)size, (void)offset, (void)length, (void)ind;
    return true;
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a,
                       size_t size_b, bool committed, unsigned ind)
{
    (void)size_a, (void)size_b, (void)committed, (void)ind;
    struct mw__arena *a = arena_of(h);
    /* Both halves keep the mapping's MR: fine as long as they lie in it. */
    return !a->mem || !map_find(a->mem, addr, size);
}

static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b,
                       size_t size_b, bool committed, unsigned ind)
{
    (void)committed, (void)ind;
    struct mw__arena *a = arena_of(h);
    if (!a->mem)
        return true;
    /* Across mappings (adjacent by chance) no single MR would cover the
     * result. */
    struct map *ma = map_find(a->mem, addr_a, size_a);
    return !ma || ma != map_find(a->mem, addr_b, size_b);
}

/* ------------------------------------------------------------------------
 * The arena
 * ------------------------------------------------------------------------ */

static void ev_begin(struct mw__arena *a)
{
    a->ev.maps = a->ev.unmaps = 0;
    a->ev.bytes = a->ev.unbytes = 0;
    a->ev.err = 0;
}

/* Log what the hooks did, now that jemalloc has returned. */
static void ev_report(struct mw__mem *m, struct mw__arena *a, const char *what)
{
    mw_ctx_t *ctx = m->ctx;
    if (a->ev.maps)
        MW_LOG(ctx, MW_LOG_DEBUG, "%s: mapped %u extent(s), %zu bytes, registered "
               "with %d device(s)", what, a->ev.maps, a->ev.bytes, m->rg.ndevs);
    if (a->ev.unmaps)
        MW_LOG(ctx, MW_LOG_DEBUG, "%s: deregistered %u mapping(s), %zu bytes",
               what, a->ev.unmaps, a->ev.unbytes);
    if (a->ev.err)
        MW_LOG(ctx, MW_LOG_WARN, "%s: registration failed: %s", what,
               mw_strerror(a->ev.err));
}

/* jemalloc's background threads (background_thread:true; for this build's
 * prefix the variable is MW__JE_MALLOC_CONF, not MALLOC_CONF) purge
 * every arena from their own threads, while the hooks and the index they
 * edit belong to the context's thread.  Then this arena never decays: freed
 * memory stays registered for reuse until the context goes. */
static void keep_off_background_threads(struct mw__arena *a)
{
    bool bg = false;
    size_t sz = sizeof bg;
    if (mallctl("background_thread", &bg, &sz, NULL, 0) || !bg)
        return;
    static const char *const knobs[] = {"dirty_decay_ms", "muzzy_decay_ms"};
    for (size_t i = 0; i < 2; i++) {
        char name[64];
        ssize_t never = -1;
        snprintf(name, sizeof name, "arena.%u.%s", a->ind, knobs[i]);
        if (mallctl(name, NULL, NULL, &never, sizeof never))
            MW_LOG(a->mem->ctx, MW_LOG_WARN, "mallctl %s failed", name);
    }
}

/* jemalloc grows an arena by geometrically larger mappings (hundreds of MiB
 * after a while); registering pins and faults in all of a mapping, used or
 * not, so growth steps are capped (a larger block still gets a mapping of
 * its own size). */
#define GROW_LIMIT ((size_t)16 << 20)

static void tune(struct mw__arena *a)
{
    char name[64];
    size_t limit = GROW_LIMIT;
    snprintf(name, sizeof name, "arena.%u.retain_grow_limit", a->ind);
    if (mallctl(name, NULL, NULL, &limit, sizeof limit))
        MW_LOG(a->mem->ctx, MW_LOG_WARN, "mallctl %s failed", name);
    keep_off_background_threads(a);
}

/* Release what the hooks left mapped; only unmapped when jemalloc has let
 * go of the arena. */
static void release_maps(struct mw__arena *a, struct mw__mem *m, bool unmap)
{
    while (m->arena_ix.n) {
        struct mw__region *r = m->arena_ix.v[m->arena_ix.n - 1];
        map_release(a, m, mw__container_of(r, struct map, r), unmap);
    }
}

static int arena_create(struct mw__mem *m)
{
    struct mw__arena *a = mw__calloc(1, sizeof *a);
    if (!a)
        return -ENOMEM;
    a->hooks = (extent_hooks_t){
        .alloc = hook_alloc,
        .dalloc = hook_dalloc,
        .destroy = hook_destroy,
        .commit = hook_commit,
        .decommit = hook_refuse,
        .purge_lazy = hook_refuse,
        .purge_forced = hook_refuse,
        .split = hook_split,
        .merge = hook_merge,
    };
    a->mem = m;
    a->page = (size_t)sysconf(_SC_PAGESIZE);
    /* Set before creating: jemalloc allocates the arena's own metadata
     * through the hooks already. */
    m->arena = a;
    ev_begin(a);
    extent_hooks_t *hooks = &a->hooks;
    size_t sz = sizeof a->ind;
    int rc = mallctl("arenas.create", &a->ind, &sz, &hooks, sizeof hooks);
    ev_report(m, a, "arena creation");
    if (rc) {
        /* The hooks' error says more than jemalloc's EAGAIN. */
        int err = a->ev.err < 0 ? a->ev.err : -rc;
        MW_LOG(m->ctx, MW_LOG_WARN, "jemalloc arenas.create failed: %s", mw_strerror(rc));
        release_maps(a, m, true);
        m->arena = NULL;
        mw__free(a);
        return err;
    }
    tune(a);
    MW_LOG(m->ctx, MW_LOG_DEBUG, "registered memory: jemalloc arena %u", a->ind);
    return 0;
}

void *mw_alloc(mw_ctx_t *ctx, size_t size)
{
    if (!ctx || !mw__mem_of(ctx) || !size) {
        errno = EINVAL;
        return NULL;
    }
    struct mw__mem *m = mw__mem_of(ctx);
    int rc = m->arena ? 0 : arena_create(m);
    if (rc < 0) {
        errno = -rc;
        return NULL;
    }
    struct mw__arena *a = m->arena;
    int flags = MALLOCX_ARENA(a->ind) | MALLOCX_TCACHE_NONE;
    if (size >= 4096)
        flags |= MALLOCX_ALIGN(4096);
    ev_begin(a);
    void *p = mallocx(size, flags);
    ev_report(m, a, "mw_alloc");
    if (!p)
        errno = a->ev.err < 0 ? -a->ev.err : ENOMEM;
    return p;
}

void mw_free(mw_ctx_t *ctx, void *p)
{
    if (!p)
        return;
    struct mw__arena *a = ctx && mw__mem_of(ctx) ? mw__mem_of(ctx)->arena : NULL;
    if (!a) {
        if (ctx)
            MW_LOG(ctx, MW_LOG_WARN, "mw_free(%p): nothing was allocated", p);
        return;
    }
    /* never handed out again while a peer's key reaches it */
    if (!mw__list_empty(&mw__mem_of(ctx)->exports))
        mw__exports_withdraw_range(ctx, (uintptr_t)p, (uintptr_t)p + sallocx(p, 0));
    ev_begin(a);
    dallocx(p, MALLOCX_TCACHE_NONE);
    ev_report(mw__mem_of(ctx), a, "mw_free");
}

void mw__mem_reserve(mw_ctx_t *ctx, size_t bytes)
{
    if (ctx && mw__mem_of(ctx) && !mw__mem_of(ctx)->reserve)
        mw__mem_of(ctx)->reserve = mw_alloc(ctx, bytes);   /* NULL: grown later, inline */
}

void mw__mem_unreserve(mw_ctx_t *ctx)
{
    if (ctx && mw__mem_of(ctx) && mw__mem_of(ctx)->reserve) {
        mw_free(ctx, mw__mem_of(ctx)->reserve);
        mw__mem_of(ctx)->reserve = NULL;
    }
}

void mw__arena_destroy(struct mw__mem *m)
{
    struct mw__arena *a = m->arena;
    if (!a)
        return;
    char name[64];
    snprintf(name, sizeof name, "arena.%u.destroy", a->ind);
    ev_begin(a);
    /* Runs dalloc for whole mappings and destroy for retained extents. */
    int rc = mallctl(name, NULL, NULL, NULL, 0);
    if (rc)
        MW_LOG(m->ctx, MW_LOG_WARN, "jemalloc %s failed: %s; its memory is "
               "deregistered but left mapped", name, mw_strerror(rc));
    /* The devices go next: no MR may outlive them.  Without the arena
     * destroyed, jemalloc still owns the pages and may call the hooks: they
     * must find no memory layer, so that struct stays (leaked). */
    release_maps(a, m, rc == 0);
    ev_report(m, a, "arena teardown");
    m->arena = NULL;
    if (rc)
        a->mem = NULL;
    else
        mw__free(a);
}
