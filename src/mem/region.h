/* Regions: address ranges registered with every device the memory layer
 * knows, their per-device keys, their keys in each connection's protection
 * domain where a connection has posted from them, and a sorted index for
 * the post path's address -> keys lookup.  Pure bookkeeping over a struct
 * mw__reg_backend, so it runs (and is tested) without an RDMA device.  Also
 * the folder's private side: the memory layer's state and life cycle, and
 * what its files share (layer.c, keys.c, arena.c, regcache.c, export.c,
 * pd.c); the rest of the library goes through mem/mem.h. */
#ifndef MW_MEM_REGION_H
#define MW_MEM_REGION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/ctx.h"
#include "core/dev.h"
#include "core/list.h"
#include "mem/mem.h"

/* How a region gets registered with one device, or in one connection's
 * protection domain (@pd; NULL: the device's own).  The real backend calls
 * ibv_reg_mr/ibv_dereg_mr; unit tests substitute a fake. */
struct mw__reg_backend {
    /* register [addr, addr+len); fill keys; return a handle or NULL with
     * errno set */
    void *(*reg)(void *be, struct mw__dev *dev, const struct mw__pd *pd, void *addr,
                 size_t len, uint32_t *lkey, uint32_t *rkey);
    /* release a handle from reg(); return 0 or a negative errno */
    int (*dereg)(void *be, void *handle);
    void *be;
};

/* One device's registration of a region; handle NULL = not registered. */
struct mw__keys {
    void *handle;
    uint32_t lkey, rkey;
};

/* A connection's protection domain registers a large region in windows,
 * never whole (a region may be a GiB, and the domain is a stranger's as
 * much as anyone's); one of at most MW__PDWIN_WHOLE it registers whole, at
 * once (a single device object, and the arena's first mappings, where the
 * slots are, are such).  A window of class c is 2 MiB << 2c long and
 * starts at a multiple of half its length, clipped to the region: a range
 * of at most half a class's length lies inside the window of that class
 * starting at or below it.  Each range takes the smallest class that holds
 * it, so a registration is at most 8 times the range (and 2 MiB at
 * least), and a domain pins at most about twice what it posts from. */
#define MW__PDWIN_MIN ((uintptr_t)2 << 20)
#define MW__PDWIN_WHOLE ((uintptr_t)16 << 20)

struct mw__pdwin {
    uint64_t id;              /* class << 56 | start / (half its length) */
    struct mw__keys k;
};

/* One domain's windows of one region, sorted by id. */
struct mw__pdwins {
    struct mw__pdwin *v;
    int n, cap;
};

/* [start, end), embedded in whatever owns it (an arena mapping, a mw_reg
 * registration) so the owner's extra state sits next to it. */
struct mw__region {
    uint64_t id;              /* never reused: names it to the helper thread */
    uintptr_t start, end;
    struct mw__keys *keys;    /* by device index; nkeys >= registrar's nslots */
    int nkeys;
    struct mw__pdwins *pwins; /* by protection domain slot, made on first use */
    int npwins;
    struct mw__list link;     /* in the registrar's list of live regions */
};

/* The devices every region is registered with, and how. */
struct mw__registrar {
    struct mw__reg_backend be;
    struct mw__dev **devs;    /* by dev->index; NULL where none was added */
    int nslots;               /* length of devs */
    int ndevs;                /* devices added */
    struct mw__pd **pds;      /* by pd->slot; NULL where free */
    int npds;                 /* length of pds */
    struct mw__list all;      /* every live region, whoever owns it */
    uint64_t *nreg, *ndereg;  /* counters bumped per backend call */
    uint64_t next_id;
};

void mw__registrar_init(struct mw__registrar *rg, const struct mw__reg_backend *be,
                        uint64_t *nreg, uint64_t *ndereg);
/* Frees the device table; the owners must have released their regions. */
void mw__registrar_fini(struct mw__registrar *rg);

/* mw__registrar_has() - whether @dev was added (post path: inline). */
static inline bool mw__registrar_has(const struct mw__registrar *rg,
                                     const struct mw__dev *dev)
{
    return dev && dev->index >= 0 && dev->index < rg->nslots &&
           rg->devs[dev->index] == dev;
}

/* mw__registrar_add_dev() - register every live region with @dev, and every
 * later one.  On error nothing is left registered with @dev and it stays
 * unknown.  Adding the same device again is a no-op; another device at a
 * taken index is -EEXIST. */
int mw__registrar_add_dev(struct mw__registrar *rg, struct mw__dev *dev);
/* mw__registrar_remove_dev() - deregister every region from @dev (it is
 * going away) and forget it; regions registered later skip its slot. */
void mw__registrar_remove_dev(struct mw__registrar *rg, struct mw__dev *dev);

/* mw__registrar_add_pd() - give @pd a slot (a free one, or a new one);
 * nothing is registered in it until mw__region_pd_keys asks.  -ENOMEM. */
int mw__registrar_add_pd(struct mw__registrar *rg, struct mw__pd *pd);
/* mw__registrar_remove_pd() - deregister every region from @pd and free
 * its slot: after this the domain holds no registration of ours. */
void mw__registrar_remove_pd(struct mw__registrar *rg, struct mw__pd *pd);
/* mw__region_pd_keys() - keys in @pd for [addr, addr+len) of @r: those of
 * the window holding it, registered there on first use.  Return 0 with *@k
 * set, or the backend's error / -ENOMEM. */
int mw__region_pd_keys(struct mw__registrar *rg, struct mw__region *r,
                       const struct mw__pd *pd, uintptr_t addr, size_t len,
                       const struct mw__keys **k);

/* Adding a device without registering in the caller's thread: begin_dev
 * makes @dev known (regions made from now on register with it at once)
 * and lists the live regions, which still have no keys for it, in *@todo
 * (malloc'd; *@n of them); the helper thread registers those; set_keys
 * then hands each result to its region -- false when that region went
 * meanwhile (the caller deregisters the handle).  On failure, remove_dev. */
struct mw__regjob_entry {
    uint64_t id;
    void *addr;
    size_t len;
    void *handle;             /* the backend's, once registered */
    uint32_t lkey, rkey;
    int err;
};
int mw__registrar_begin_dev(struct mw__registrar *rg, struct mw__dev *dev,
                            struct mw__regjob_entry **todo, size_t *n);
bool mw__registrar_set_keys(struct mw__registrar *rg, const struct mw__dev *dev,
                            const struct mw__regjob_entry *e);

/* mw__region_init() - register [start, start+len) with every device and
 * link @r as live.  On error (the backend's, or -ENOMEM) nothing stays
 * registered and @r is not linked. */
int mw__region_init(struct mw__registrar *rg, struct mw__region *r,
                    uintptr_t start, size_t len);

/* mw__region_adopt() - as mw__region_init, with the registrations already
 * made elsewhere: @keys[i] for device slot i (@nkeys of them, taken over);
 * devices without one (added meanwhile) are registered now.  On error
 * nothing is taken and @r is not linked. */
int mw__region_adopt(struct mw__registrar *rg, struct mw__region *r, uintptr_t start,
                     size_t len, struct mw__keys *keys, int nkeys);

/* mw__region_fini() - deregister @r from every device and protection
 * domain and unlink it.  The
 * handles are dropped even when the backend fails; returns its first error. */
int mw__region_fini(struct mw__registrar *rg, struct mw__region *r);
/* mw__region_drop_pd_keys() - deregister @r from every protection domain
 * only; returns the first error. */
int mw__region_drop_pd_keys(struct mw__registrar *rg, struct mw__region *r);

/* An index of regions sorted by start.  Its users keep the regions in one
 * index pairwise disjoint, which makes the region containing an address
 * unique and binary search exact. */
struct mw__rindex {
    struct mw__region **v;
    size_t n, cap;
    uint64_t removed;             /* regions ever taken out (mw__mem_epoch) */
};

void mw__rindex_fini(struct mw__rindex *ix);

/* mw__rindex_reserve() - room for @n regions, so later inserts cannot fail. */
int mw__rindex_reserve(struct mw__rindex *ix, size_t n);

/* mw__rindex_insert() - add @r (disjoint from the others); -ENOMEM. */
int mw__rindex_insert(struct mw__rindex *ix, struct mw__region *r);

/* mw__rindex_remove() - take @r out; false if it was not there. */
bool mw__rindex_remove(struct mw__rindex *ix, const struct mw__region *r);

/* mw__rindex_find() - the region containing all of [start, end), or NULL.
 * O(log n), no allocation: this is the post path. */
struct mw__region *mw__rindex_find(const struct mw__rindex *ix, uintptr_t start,
                                   uintptr_t end);

/* mw__rindex_overlap() - the regions intersecting [start, end): they are
 * ix->v[*first .. *first + count).  Returns count. */
size_t mw__rindex_overlap(const struct mw__rindex *ix, uintptr_t start,
                          uintptr_t end, size_t *first);

/* ------------------------------------------------------------------------
 * The memory layer's state and life cycle, shared by the folder's files
 * ------------------------------------------------------------------------ */

struct mw__arena;
struct mw__uffd;
struct event;

struct mw__mem {
    mw_ctx_t *ctx;
    struct mw__registrar rg;
    /* Lookup rule: two indexes, each pairwise disjoint; the post path tries
     * the arena's, then mw_reg's (see regcache.c for how merging keeps the
     * latter disjoint). */
    struct mw__rindex arena_ix;   /* one region per arena mapping */
    struct mw__rindex user_ix;    /* outermost live mw_reg regions */
    struct mw__list uregs;        /* every live mw_reg region */
    size_t nuregs;
    struct mw__list handles;      /* every mw_mr_t handed out */
    struct mw__list exports;      /* every standing export (export.c) */
    struct mw__arena *arena;      /* created by the first mw_alloc() */
    void *reserve;                /* mw__mem_reserve(): held until a device */
    /* registrations kept after their last mw_dereg (regcache.c) */
    struct mw__uffd *uffd;        /* NULL: userfaultfd unavailable or unused yet */
    int uffd_tried;               /* 0 not yet, 1 on, -errno unavailable */
    int uffd_wake;                /* eventfd: ranges gone, for the loop */
    struct event *uffd_ev;
    struct mw__list idle;         /* kept regions nobody holds, oldest first */
    uint64_t idle_bytes, idle_max;
};

/* mw__mem_of() - the memory layer's state on @ctx (its slot), or NULL. */
static inline struct mw__mem *mw__mem_of(const mw_ctx_t *ctx)
{
    return ctx->layers[MW__LAYER_MEM].state;
}

/* mw__mem_new() - set up the memory layer on @ctx, in its slot (arena
 * created lazily on first alloc); @backend NULL means ibv_reg_mr.  Return 0
 * or a negative errno (-EEXIST: the slot is taken). */
int mw__mem_new(mw_ctx_t *ctx, const struct mw__reg_backend *backend);

/* mw__mem_free() - destroy the arena, deregister everything, empty the
 * slot. */
void mw__mem_free(mw_ctx_t *ctx);

/* mw__mem_add_dev() - a device was opened: register every live region with
 * it, and every later region too.  The memory layer keeps its own list of
 * the devices added here (it calls nothing in dev.c), indexed by dev->index.
 * Return 0 or a negative errno. */
int mw__mem_add_dev(mw_ctx_t *ctx, struct mw__dev *dev);
/* mw__mem_add_dev_async() - as mw__mem_add_dev(), but when the live
 * regions come to more than MW__REG_INLINE_BYTES the helper thread
 * registers them (pinning and faulting in pages: about a second per GiB on
 * soft-RoCE, milliseconds per MiB in a VM: the loop must not wait) and @done(dev, err, arg) runs from the loop once it has; regions
 * made meanwhile register with @dev at once, as usual.  Return 0 (done
 * now: @done is not called), 1 (pending: @done will be), or a negative
 * errno. */
#define MW__REG_INLINE_BYTES (1u << 20)
int mw__mem_add_dev_async(mw_ctx_t *ctx, struct mw__dev *dev,
                          void (*done)(struct mw__dev *dev, int err, void *arg), void *arg);

/* mw__mem_remove_dev() - the device is going away: deregister everything
 * from it. */
void mw__mem_remove_dev(mw_ctx_t *ctx, struct mw__dev *dev);

/* mw__mem_add_pd() / mw__mem_remove_pd() - a connection's protection
 * domain joins the memory layer (a slot, nothing registered yet) / leaves
 * it (every registration in it dropped: it may be deallocated).  The first
 * returns 0 or -ENOMEM. */
int mw__mem_add_pd(mw_ctx_t *ctx, struct mw__pd *pd);
void mw__mem_remove_pd(mw_ctx_t *ctx, struct mw__pd *pd);

/* mw__mem_dev_keys() - whether [addr, addr+len) lies inside one region
 * registered with @dev, and that registration's keys (@lkey, @rkey may be
 * NULL).  Return 0, -EFAULT (not registered), -ENODEV (@dev unknown). */
int mw__mem_dev_keys(mw_ctx_t *ctx, const struct mw__dev *dev, const void *addr, size_t len,
                     uint32_t *lkey, uint32_t *rkey);

/* mw__memlock_why() - describe the failure @err of registering @bytes
 * into @buf: when RLIMIT_MEMLOCK refused it (ENOMEM, a finite limit, no
 * CAP_IPC_LOCK), naming the limit and what it would take, and returning
 * true; else with mw_strerror(@err), returning false.  Short enough to
 * quote in a connection's message (under 110 bytes).  memlock.c */
bool mw__memlock_why(int err, uint64_t bytes, char *buf, size_t n);

/* mw__mem_reserve() / mw__mem_unreserve() - hold @bytes of mw_alloc()
 * memory from context creation until the first device is usable, then
 * give it back to the arena.  Growing the arena costs tens of milliseconds
 * in a VM (jemalloc's arena, faulting in the pages); done at creation, with
 * no device yet, it registers nothing, and the first device registers it
 * off the loop: the first connections then find their slots registered
 * already, with no growth inside an rdma_cm handler. */
#define MW__MEM_RESERVE_BYTES (8u << 20)
void mw__mem_reserve(mw_ctx_t *ctx, size_t bytes);
void mw__mem_unreserve(mw_ctx_t *ctx);

/* mw__exports_withdraw_range() - withdraw every export overlapping
 * [start, end): the memory is being released. */
void mw__exports_withdraw_range(mw_ctx_t *ctx, uintptr_t start, uintptr_t end);

/* mw__arena_destroy() - (arena.c) destroy the jemalloc arena, deregister
 * and unmap every mapping; for mw__mem_free(). */
void mw__arena_destroy(struct mw__mem *m);

/* mw__regcache_free() - (regcache.c) release every mw_reg region and
 * handle, held or not; for mw__mem_free(), before the devices go. */
void mw__regcache_free(struct mw__mem *m);

/* mw__regcache_sync() - (regcache.c) drop every mw_reg region whose memory
 * went since the last look: before a lookup may trust the index.  One
 * atomic load when nothing went. */
void mw__regcache_sync(struct mw__mem *m);

/* mw__pd_unhold() - an export job done with @pd (pd.c): the last one
 * deallocates a domain freed meanwhile. */
void mw__pd_unhold(mw_ctx_t *ctx, struct mw__pd *pd);

/* mw__mem_region_id() - the id of the live region holding [addr, addr+len)
 * with keys of @dev; 0 if none (keys.c). */
uint64_t mw__mem_region_id(mw_ctx_t *ctx, const struct mw__dev *dev, const void *addr,
                           size_t len);

#endif
