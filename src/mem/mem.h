/* Registered memory: the jemalloc arena behind mw_alloc() and the
 * registration cache behind mw_reg(), both as "regions" registered with every
 * device's protection domain, and the address -> keys lookup of the post
 * path. */
#ifndef MW_MEM_MEM_H
#define MW_MEM_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "core/ctx.h"
#include "core/list.h"

struct mw__dev;
struct ibv_mr;
struct ibv_pd;

/* A protection domain of one connection (pd.c): its queue pair, its
 * exports, and its own registrations of the memory it posts from.  Keys
 * made in one domain work on no other connection's queue pair, so a peer
 * that learns or guesses a key of another connection reaches nothing.
 * All memory stays registered with each device's own domain too: that
 * pins it (off the loop where large) and says what is registered; a
 * connection's domain registers a region again, at its first post from it
 * (already pinned: about as cheap as a lookup of its pages). */
struct mw__pd {
    struct mw__dev *dev;
    struct ibv_pd *pd;
    int slot;                     /* in the registrar's table; -1: none */
};

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

/* mw__mem_new() - set up @ctx->mem (arena created lazily on first alloc);
 * @backend NULL means ibv_reg_mr.  Return 0 or a negative errno. */
int mw__mem_new(mw_ctx_t *ctx, const struct mw__reg_backend *backend);

/* mw__mem_free() - destroy the arena, deregister everything. */
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

/* mw__reg_async() - mw_reg() without stalling the loop on a large range:
 * above MW__REG_ASYNC_BYTES a range not registered yet is registered by the
 * helper thread.  Return 0 with *@mrp set (registered now, or it was:
 * @done is not called), 1 (pending: @done(arg, mr, err) runs from the loop
 * with the handle or the error), or a negative errno. */
#define MW__REG_ASYNC_BYTES (4u << 20)
int mw__reg_async(mw_ctx_t *ctx, void *addr, size_t len, mw_mr_t **mrp,
                  void (*done)(void *arg, mw_mr_t *mr, int err), void *arg);

/* mw__mem_remove_dev() - the device is going away: deregister everything
 * from it. */
void mw__mem_remove_dev(mw_ctx_t *ctx, struct mw__dev *dev);

/* mw__mem_add_pd() / mw__mem_remove_pd() - a connection's protection
 * domain joins the memory layer (a slot, nothing registered yet) / leaves
 * it (every registration in it dropped: it may be deallocated).  The first
 * returns 0 or -ENOMEM. */
int mw__mem_add_pd(mw_ctx_t *ctx, struct mw__pd *pd);
void mw__mem_remove_pd(mw_ctx_t *ctx, struct mw__pd *pd);

/* mw__mem_keys() - the local key of @pd for [addr, addr+len), which must
 * lie inside one region registered with @pd's device; the region is
 * registered in @pd on first use.  Return 0, -EFAULT when the range is not
 * registered memory, -ENODEV (@pd unknown), or the registration's error. */
int mw__mem_keys(mw_ctx_t *ctx, const struct mw__pd *pd, const void *addr, size_t len,
                 uint32_t *lkey);

/* mw__mem_epoch() - a number that changes whenever registered memory goes
 * away (a region leaves the lookup): keys looked up under one epoch hold
 * for as long as it lasts.  Prepared transfer lists look their keys up
 * once and again only when this moved. */
uint64_t mw__mem_epoch(mw_ctx_t *ctx);
/* mw__mem_sync() - take what userfaultfd reported of memory unmapped or
 * moved since the last look: its regions and the exports over them are
 * withdrawn now (a peer's key for the old pages reaches nothing at that
 * address on the same-host path, as the device's would reach nothing new). */
void mw__mem_sync(mw_ctx_t *ctx);

/* mw__mem_dev_keys() - whether [addr, addr+len) lies inside one region
 * registered with @dev, and that registration's keys (@lkey, @rkey may be
 * NULL).  Return 0, -EFAULT (not registered), -ENODEV (@dev unknown). */
int mw__mem_dev_keys(mw_ctx_t *ctx, const struct mw__dev *dev, const void *addr, size_t len,
                     uint32_t *lkey, uint32_t *rkey);

/* An export: a registration of its own over exactly [start, end), the only
 * kind with remote access (those behind mw_alloc and mw_reg are local
 * only).  Embedded in its owner's record (a connection's), and listed by
 * the memory layer while it stands: memory released -- mw_free, the last
 * mw_dereg of a range, memory unmapped under a registration -- withdraws
 * every export over it first, so a key a peer holds never reaches memory
 * handed out again. */
struct mw__export {
    struct ibv_mr *mr;            /* NULL once withdrawn */
    uintptr_t start, end;
    uint32_t rkey;                /* what the peer was given (kept after) */
    struct mw__list link;         /* in the memory layer's list while standing */
};

/* mw__export_new() - register [addr, addr+len) of registered memory for
 * remote access in @pd (the connection's own) into @e.  Return 0, -EFAULT
 * (not memory from mw_alloc or mw_reg), or the device's error. */
int mw__export_new(mw_ctx_t *ctx, const struct mw__pd *pd, void *addr, size_t len,
                   struct mw__export *e);
/* mw__export_withdraw() - deregister @e: its key works no more.  Again is
 * a no-op. */
void mw__export_withdraw(mw_ctx_t *ctx, struct mw__export *e);
/* mw__exports_withdraw_range() - withdraw every export overlapping
 * [start, end): the memory is being released. */
void mw__exports_withdraw_range(mw_ctx_t *ctx, uintptr_t start, uintptr_t end);

#endif
