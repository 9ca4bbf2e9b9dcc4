/* mw_reg(): registrations of the caller's memory, cached.
 *
 * Index rule.  A range that overlaps registered regions without fitting in
 * one is registered as the union of itself and all of them; the regions it
 * absorbs leave the index but stay registered, hung under the new region,
 * until their own handles are gone (keys already handed out, possibly to
 * peers, must stay valid).  So the index holds the outermost live regions
 * only, and each absorbed region lies inside its outer one.  When an outer
 * region leaves the index, the regions it absorbed come back into it (they
 * lie inside it, so they are disjoint from everything else there).
 *
 * Kept registrations.  Registering is slow (pinning every page), and
 * collectives on buffers of the caller's register them on every call.  So
 * when userfaultfd can say when memory goes (uffd.h), a region whose last
 * handle is dropped stays registered and indexed, idle, and the next
 * mw_reg of it is free.  A region whose memory is unmapped, zapped or
 * moved is "stale": it leaves the index at once -- before any lookup can
 * find it for the new pages at that address -- and is deregistered once
 * nobody holds it.  Idle regions beyond idle_max bytes go, oldest first.
 * Without userfaultfd the last mw_dereg deregisters at once, as it must.
 *
 * Large registrations for collectives run on the helper thread
 * (mw__reg_async); large deregistrations always do. */
#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/handle.h"
#include "mem/region.h"
#include "mem/uffd.h"
#include "core/worker.h"

/* A mw_reg() region. */
struct ureg {
    struct mw__region r;
    unsigned refs;             /* handles pointing here */
    struct ureg *parent;       /* the region that absorbed this one; NULL
                                  while this one is in the index */
    struct mw__list children;  /* live regions this one absorbed */
    struct mw__list sibling;   /* in parent->children */
    struct mw__list link;      /* in mem->uregs */
    struct mw__list idle;      /* in mem->idle while kept with no handle */
    bool indexed;              /* in the index, or under a parent that is */
    bool watched;              /* userfaultfd reports when its memory goes */
    bool stale;                /* its memory went: deregistered once free */
};

/* A mw_reg() handle: one per call, so each mw_dereg() drops exactly the
 * reference its mw_reg() took, whichever region served it. */
struct mw__mr {
    uint64_t h;                /* what the caller holds (core/handle.h) */
    struct mw__mem *mem;
    struct ureg *reg;
    void *addr;                /* the caller's exact range */
    size_t len;
    struct mw__list link;      /* in mem->handles */
};

static struct ureg *ureg_of(struct mw__region *r)
{
    return r ? mw__container_of(r, struct ureg, r) : NULL;
}

/* ------------------------------------------------------------------------
 * Regions in and out of the index
 * ------------------------------------------------------------------------ */

/* Take @u out of the index (or from under its parent); what it absorbed
 * goes where it was.  Stale children stay out. */
static void unindex(struct mw__mem *m, struct ureg *u)
{
    if (!u->indexed)
        return;
    u->indexed = false;
    if (!u->parent)
        mw__rindex_remove(&m->user_ix, &u->r);
    struct ureg *c;
    mw__list_for_each(c, &u->children, sibling) {
        mw__list_del(&c->sibling);
        c->parent = u->parent;
        if (u->parent)
            mw__list_add_tail(&u->parent->children, &c->sibling);
        else
            mw__rindex_insert(&m->user_ix, &c->r);   /* cannot fail: reserved */
    }
    mw__list_del(&u->sibling);
    u->parent = NULL;
}

/* Deregistering on the helper thread: the handles, detached from their
 * region, with the backend that made them. */
struct dereg_job {
    struct mw__job job;
    mw_ctx_t *ctx;
    struct mw__reg_backend be;
    struct mw__keys *keys;
    int n, failed;
};

static void dereg_work(struct mw__job *j)
{
    struct dereg_job *d = (struct dereg_job *)j;
    for (int i = 0; i < d->n; i++)
        if (d->keys[i].handle && d->be.dereg(d->be.be, d->keys[i].handle) != 0)
            d->failed++;
}

static void dereg_done(struct mw__job *j)
{
    struct dereg_job *d = (struct dereg_job *)j;
    for (int i = 0; i < d->n; i++)
        d->ctx->stats.deregistrations += d->keys[i].handle != NULL;
    if (d->failed)
        MW_LOG(d->ctx, MW_LOG_WARN, "deregistering memory failed on %d device(s)", d->failed);
    mw__free(d->keys);
    mw__free(d);
}

/* Deregister @r's device keys on the helper thread when it is large (the
 * loop must not wait), else now (its keys in protection domains go now
 * either way: a domain is freed right after its connection, and must hold
 * nothing by then); @r is unlinked either way and may be freed when this
 * returns.  Returns the first error seen now (0 when left to the helper). */
static int dereg_later(struct mw__mem *m, struct mw__region *r)
{
    struct dereg_job *d = r->end - r->start > MW__REG_INLINE_BYTES ? mw__calloc(1, sizeof *d) : NULL;
    if (!d)
        return mw__region_fini(&m->rg, r);
    int rc = mw__region_drop_pd_keys(&m->rg, r);
    *d = (struct dereg_job){.job = {.work = dereg_work, .done = dereg_done}, .ctx = m->ctx,
                            .be = m->rg.be, .keys = r->keys, .n = r->nkeys};
    r->keys = NULL;               /* the job owns them now */
    r->nkeys = 0;
    mw__list_del(&r->link);
    if (mw__worker_submit(m->ctx, &d->job) < 0) {
        dereg_work(&d->job);      /* no helper: here, then */
        dereg_done(&d->job);
    }
    return rc;
}

/* Deregister @u and free it; nobody holds it and it is out of the index. */
static int release(struct mw__mem *m, struct ureg *u)
{
    if (u->watched && !u->stale && m->uffd)
        mw__uffd_unwatch(m->uffd, u->r.start, u->r.end);
    mw__list_del(&u->idle);
    mw__list_del(&u->link);
    m->nuregs--;
    uintmax_t start = u->r.start, len = u->r.end - u->r.start;
    int rc = dereg_later(m, &u->r);
    if (rc < 0)
        MW_LOG(m->ctx, MW_LOG_WARN, "mw_dereg: deregistering [%#jx, +%ju) failed: %s", start,
               len, mw_strerror(rc));
    mw__free(u);
    return rc;
}

static void idle_drop(struct mw__mem *m, struct ureg *u)
{
    if (mw__list_empty(&u->idle))
        return;
    mw__list_del(&u->idle);
    m->idle_bytes -= u->r.end - u->r.start;
}

/* Idle regions beyond the cap go, least recently used first. */
static void idle_trim(struct mw__mem *m)
{
    struct ureg *u;
    while (m->idle_bytes > m->idle_max &&
           (u = mw__list_first(&m->idle, struct ureg, idle))) {
        idle_drop(m, u);
        unindex(m, u);
        release(m, u);
    }
}

/* ------------------------------------------------------------------------
 * Memory that went away (userfaultfd)
 * ------------------------------------------------------------------------ */

static void mark_stale(struct mw__mem *m, struct ureg *u)
{
    u->stale = true;
    mw__exports_withdraw_range(m->ctx, u->r.start, u->r.end);
    unindex(m, u);
    if (u->refs == 0) {
        idle_drop(m, u);
        release(m, u);
    }
}

/* Drop every region touching a range that went: before any lookup. */
void mw__regcache_sync(struct mw__mem *m)
{
    if (!m->uffd || !mw__uffd_changed(m->uffd))
        return;
    struct mw__gone g[MW__UFFD_TAKE_MAX];
    size_t n = mw__uffd_take(m->uffd, g);
    for (size_t i = 0; i < n; i++) {
        struct ureg *u;
        mw__list_for_each(u, &m->uregs, link)
            if (!u->stale && u->r.start < g[i].end && g[i].start < u->r.end)
                mark_stale(m, u);
    }
    if (n)
        MW_LOG(m->ctx, MW_LOG_DEBUG, "mw_reg: %zu range(s) of registered memory went away", n);
}

static void on_gone(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    uint64_t v;
    (void)!read(fd, &v, sizeof v);
    mw__regcache_sync(arg);
}

/* The monitor, started with the first registration of caller memory. */
static void uffd_start(struct mw__mem *m)
{
    if (m->uffd_tried)
        return;
    int rc = (m->uffd_wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ? -errno : 0;
    if (!rc && !(m->uffd_ev = event_new(m->ctx->base, m->uffd_wake, EV_READ | EV_PERSIST,
                                        on_gone, m)))
        rc = -ENOMEM;
    if (!rc && (event_add(m->uffd_ev, NULL) < 0 || (rc = mw__watch_fd(m->ctx, m->uffd_wake)) < 0))
        rc = rc ? rc : -ENOMEM;
    if (!rc)
        rc = mw__uffd_new(&m->uffd, m->uffd_wake);
    m->uffd_tried = rc ? rc : 1;
    if (rc)
        MW_LOG(m->ctx, MW_LOG_INFO, "mw_reg: userfaultfd unavailable (%s): registrations are "
               "dropped with their last mw_dereg", mw_strerror(rc));
}

/* ------------------------------------------------------------------------
 * New regions
 * ------------------------------------------------------------------------ */

/* Link @u, registered already, into the index in place of the regions it
 * overlaps (ix->v[first, +n)), which it absorbs. */
static void adopt(struct mw__mem *m, struct ureg *u, size_t first, size_t n)
{
    struct mw__rindex *ix = &m->user_ix;
    mw__list_init(&u->children);
    mw__list_init(&u->sibling);
    mw__list_init(&u->idle);
    for (size_t i = 0; i < n; i++) {
        struct ureg *c = ureg_of(ix->v[first + i]);
        c->parent = u;
        mw__list_add_tail(&u->children, &c->sibling);
    }
    struct ureg *c;
    mw__list_for_each(c, &u->children, sibling)
        mw__rindex_remove(ix, &c->r);
    mw__rindex_insert(ix, &u->r); /* cannot fail: reserved by the caller */
    u->indexed = true;
    mw__list_add_tail(&m->uregs, &u->link);
    m->nuregs++;
    uffd_start(m);
    u->watched = m->uffd && mw__uffd_watch(m->uffd, u->r.start, u->r.end) == 0;
}

/* Register [start, end) grown to the union with every indexed region it
 * overlaps, and put it in the index in their place. */
static int ureg_new(struct mw__mem *m, uintptr_t start, uintptr_t end, struct ureg **up)
{
    struct mw__rindex *ix = &m->user_ix;
    size_t first, n = mw__rindex_overlap(ix, start, end, &first);
    if (n) {
        if (ix->v[first]->start < start)
            start = ix->v[first]->start;
        if (ix->v[first + n - 1]->end > end)
            end = ix->v[first + n - 1]->end;
    }
    /* Room for every live region, so that putting absorbed regions back
     * into the index can never fail. */
    int rc = mw__rindex_reserve(ix, m->nuregs + 1);
    struct ureg *u = rc ? NULL : mw__calloc(1, sizeof *u);
    if (!u)
        return -ENOMEM;
    rc = mw__region_init(&m->rg, &u->r, start, end - start);
    if (rc < 0) {
        MW_LOG(m->ctx, MW_LOG_WARN, "mw_reg: registering [%#jx, +%ju) failed: %s",
               (uintmax_t)start, (uintmax_t)(end - start), mw_strerror(rc));
        mw__free(u);
        return rc;
    }
    adopt(m, u, first, n);
    MW_LOG(m->ctx, MW_LOG_DEBUG, "mw_reg: registered [%#jx, +%ju) with %d device(s)%s",
           (uintmax_t)start, (uintmax_t)(end - start), m->rg.ndevs,
           n ? ", merging overlapping registrations" : "");
    *up = u;
    return 0;
}

/* ------------------------------------------------------------------------
 * Handles
 * ------------------------------------------------------------------------ */

/* The region serving [start, end) now, or NULL: an arena range needs none
 * (*@arena set), an indexed one is reused (taken off the idle list). */
static struct ureg *lookup(struct mw__mem *m, uintptr_t start, uintptr_t end, bool *arena)
{
    mw__regcache_sync(m);
    *arena = mw__rindex_find(&m->arena_ix, start, end) != NULL;
    struct ureg *u = *arena ? NULL : ureg_of(mw__rindex_find(&m->user_ix, start, end));
    if (*arena || u)
        m->ctx->stats.reg_cache_hits++;
    if (u)
        idle_drop(m, u);
    return u;
}

/* A handle for @u (NULL: arena memory, nothing behind it). */
static int make_handle(struct mw__mem *m, struct ureg *u, void *addr, size_t len, mw_mr_t **mrp)
{
    struct mw__mr *h = mw__calloc(1, sizeof *h);
    uint64_t hv = h ? mw__handle_new(MW__H_MR, h, mw__loop_thread(m->ctx)) : 0;
    if (!hv) {
        mw__free(h);
        return -ENOMEM;
    }
    if (u)
        u->refs++;
    *h = (struct mw__mr){.h = hv, .mem = m, .reg = u, .addr = addr, .len = len};
    mw__list_add_tail(&m->handles, &h->link);
    *mrp = MW__HANDLE_PTR(mw_mr_t, hv);
    return 0;
}

static bool valid_range(const void *addr, size_t len, uintptr_t *end)
{
    return addr && len && !__builtin_add_overflow((uintptr_t)addr, len, end);
}

/* Nobody holds @u any more: a region userfaultfd watches is kept (idle,
 * until its memory goes or the cap pushes it out), else it goes. */
static int unheld(struct mw__mem *m, struct ureg *u)
{
    if (u->indexed && u->watched && !u->stale) {
        mw__list_add_tail(&m->idle, &u->idle);
        m->idle_bytes += u->r.end - u->r.start;
        idle_trim(m);
        return 0;
    }
    unindex(m, u);
    return release(m, u);
}

/* The last handle on @u went: the caller may now free its memory, so no
 * export over it may stand (the registration itself may stay, idle). */
static int ureg_put(struct mw__mem *m, struct ureg *u)
{
    if (--u->refs)
        return 0;
    mw__exports_withdraw_range(m->ctx, u->r.start, u->r.end);
    return unheld(m, u);
}

int mw_reg(mw_ctx_t *ctx, void *addr, size_t len, mw_mr_t **mrp)
{
    uintptr_t start = (uintptr_t)addr, end;
    if (!ctx || !mw__mem_of(ctx) || !mrp || !valid_range(addr, len, &end))
        return -EINVAL;
    struct mw__mem *m = mw__mem_of(ctx);
    bool arena;
    struct ureg *u = lookup(m, start, end, &arena);
    if (!arena && !u) {
        int rc = ureg_new(m, start, end, &u);
        if (rc < 0)
            return rc;
    }
    int rc = make_handle(m, u, addr, len, mrp);
    if (rc < 0 && u && u->refs == 0)
        unheld(m, u);             /* as after a dereg */
    return rc;
}

int mw_dereg(mw_ctx_t *ctx, mw_mr_t *handle)
{
    int err;
    if (!ctx || !handle || !mw__mem_of(ctx))
        return -EINVAL;
    struct mw__mr *mr = mw__handle_get(MW__HANDLE(handle), MW__H_MR, __func__, &err);
    if (!mr)
        return err;
    if (mr->mem != mw__mem_of(ctx))
        return -EINVAL;               /* another context's */
    struct ureg *u = mr->reg;
    mw__list_del(&mr->link);
    mw__handle_release(mr->h);
    mw__free(mr);
    return u ? ureg_put(mw__mem_of(ctx), u) : 0;
}

/* ------------------------------------------------------------------------
 * Registering off the loop, for collectives
 * ------------------------------------------------------------------------ */

struct areg {
    struct mw__job job;
    struct mw__mem *m;
    struct mw__reg_backend be;
    struct mw__dev **devs;        /* the devices when it started */
    int ndevs;
    struct mw__keys *keys;        /* by device index */
    uintptr_t start, end;
    int err;
    void *addr;
    size_t len;
    void (*done)(void *arg, mw_mr_t *mr, int err);
    void *arg;
};

static void areg_work(struct mw__job *j)
{
    struct areg *a = (struct areg *)j;
    for (int i = 0; i < a->ndevs && !a->err; i++) {
        struct mw__keys *k = &a->keys[i];
        if (!a->devs[i])
            continue;
        errno = 0;
        k->handle = a->be.reg(a->be.be, a->devs[i], NULL, (void *)a->start, a->end - a->start,
                              &k->lkey, &k->rkey);
        if (!k->handle)
            a->err = errno > 0 ? -errno : -EIO;
    }
}

/* The registration is made: a region of it, unless its memory went or the
 * index changed meanwhile (then the ordinary, synchronous way). */
static void areg_done(struct mw__job *j)
{
    struct areg *a = (struct areg *)j;
    struct mw__mem *m = a->m;
    mw_mr_t *mr = NULL;
    int err = a->err;
    m->ctx->stats.registrations += a->ndevs;
    mw__regcache_sync(m);
    size_t first, n = mw__rindex_overlap(&m->user_ix, a->start, a->end, &first);
    struct ureg *u = NULL;
    bool usable = !err && !n && mw__rindex_reserve(&m->user_ix, m->nuregs + 1) == 0 &&
                  (u = mw__calloc(1, sizeof *u)) &&
                  mw__region_adopt(&m->rg, &u->r, a->start, a->end - a->start, a->keys,
                                   a->ndevs) == 0;
    if (usable) {                 /* its keys are the region's now */
        adopt(m, u, first, 0);
        if ((err = make_handle(m, u, a->addr, a->len, &mr)) < 0)
            unheld(m, u);
    } else {
        mw__free(u);
        for (int i = 0; i < a->ndevs; i++)
            if (a->keys[i].handle) {
                a->be.dereg(a->be.be, a->keys[i].handle);
                m->ctx->stats.deregistrations++;
            }
        if (!err)
            err = mw_reg(m->ctx, a->addr, a->len, &mr);
    }
    a->done(a->arg, err ? NULL : mr, err);
    mw__free(a->keys);
    mw__free(a->devs);
    mw__free(a);
}

int mw__reg_async(mw_ctx_t *ctx, void *addr, size_t len, mw_mr_t **mrp,
                  void (*done)(void *arg, mw_mr_t *mr, int err), void *arg)
{
    uintptr_t start = (uintptr_t)addr, end;
    if (!ctx || !mw__mem_of(ctx) || !mrp || !done || !valid_range(addr, len, &end))
        return -EINVAL;
    struct mw__mem *m = mw__mem_of(ctx);
    bool arena;
    struct ureg *u = lookup(m, start, end, &arena);
    size_t first;
    if (arena || u || len <= MW__REG_ASYNC_BYTES ||
        mw__rindex_overlap(&m->user_ix, start, end, &first))
        return u ? make_handle(m, u, addr, len, mrp)
                 : arena ? make_handle(m, NULL, addr, len, mrp) : mw_reg(ctx, addr, len, mrp);
    struct areg *a = mw__calloc(1, sizeof *a);
    int nd = m->rg.nslots;
    if (!a || !(a->devs = mw__calloc((size_t)(nd ? nd : 1), sizeof *a->devs)) ||
        !(a->keys = mw__calloc((size_t)(nd ? nd : 1), sizeof *a->keys))) {
        if (a)
            mw__free(a->devs);
        mw__free(a);
        return -ENOMEM;
    }
    for (int i = 0; i < nd; i++)
        a->devs[i] = m->rg.devs[i];
    *a = (struct areg){.job = {.work = areg_work, .done = areg_done}, .m = m, .be = m->rg.be,
                       .devs = a->devs, .ndevs = nd, .keys = a->keys, .start = start,
                       .end = end, .addr = addr, .len = len, .done = done, .arg = arg};
    if (mw__worker_submit(ctx, &a->job) < 0) {
        mw__free(a->keys);
        mw__free(a->devs);
        mw__free(a);
        return mw_reg(ctx, addr, len, mrp);
    }
    return 1;
}

/* ------------------------------------------------------------------------
 * Teardown
 * ------------------------------------------------------------------------ */

void mw__regcache_free(struct mw__mem *m)
{
    mw__uffd_free(m->uffd);       /* no more events: nothing watches now */
    m->uffd = NULL;
    if (m->uffd_ev) {
        mw__unwatch_fd(m->ctx, m->uffd_wake);
        event_free(m->uffd_ev);
    }
    if (m->uffd_wake >= 0)
        close(m->uffd_wake);
    size_t held = 0;
    struct mw__mr *h;
    mw__list_for_each(h, &m->handles, link) {
        mw__list_del(&h->link);
        mw__handle_release(h->h);
        mw__free(h);
        held++;
    }
    if (held)
        MW_LOG(m->ctx, MW_LOG_WARN, "%zu mw_reg registration(s) still held at "
               "teardown: deregistered", held);
    struct ureg *u;
    mw__list_for_each(u, &m->uregs, link) {
        mw__list_del(&u->link);
        mw__region_fini(&m->rg, &u->r);
        mw__free(u);
    }
    mw__list_init(&m->idle);
    m->idle_bytes = 0;
    m->nuregs = 0;
    mw__rindex_fini(&m->user_ix);
}
