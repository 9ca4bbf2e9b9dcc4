/* Registered memory, the library's door to it: the jemalloc arena behind
 * mw_alloc() and the registration cache behind mw_reg(), both as "regions"
 * registered with every device's protection domain; the address -> keys
 * lookup of the post path; connections' protection domains and exports.
 * The layer sits on core (the context, its devices, the helper thread) and
 * under cm: it hangs its state on the context in slot MW__LAYER_MEM, and
 * core reaches it only through that slot's hooks.  What the folder's files
 * share among themselves is in mem/region.h, not here. */
#ifndef MW_MEM_MEM_H
#define MW_MEM_MEM_H

#include <stdbool.h>
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
 * connection's domain registers again only windows of a region, each at
 * its first post from it (mem/region.h: at most 8 times what the post
 * moves, 2 MiB at least; already pinned, about as cheap as a lookup of its
 * pages), so a connection pins about what it posts from, not whole
 * regions. */
struct mw__pd {
    struct mw__dev *dev;
    struct ibv_pd *pd;
    int slot;                     /* in the registrar's table; -1: none */
    int jobs;                     /* exports being registered in it off the loop */
    bool freed;                   /* mw__pd_free()d: dealloc'd once jobs is 0 */
};

/* mw__pd_new() / mw__pd_free() - a protection domain of its own for one
 * connection on @dev (pd.c).  Free it after its queue pair and its exports:
 * it drops the registrations made in it (one the helper thread is still
 * making ends with it, later).  The first returns 0 or a negative errno. */
int mw__pd_new(mw_ctx_t *ctx, struct mw__dev *dev, struct mw__pd **out);
void mw__pd_free(mw_ctx_t *ctx, struct mw__pd *pd);

/* mw__reg_async() - mw_reg() without stalling the loop on a large range:
 * above MW__REG_ASYNC_BYTES a range not registered yet is registered by the
 * helper thread.  Return 0 with *@mrp set (registered now, or it was:
 * @done is not called), 1 (pending: @done(arg, mr, err) runs from the loop
 * with the handle or the error), or a negative errno. */
#define MW__REG_ASYNC_BYTES (4u << 20)
int mw__reg_async(mw_ctx_t *ctx, void *addr, size_t len, mw_mr_t **mrp,
                  void (*done)(void *arg, mw_mr_t *mr, int err), void *arg);

/* mw__mem_keys() - the local key of @pd for [addr, addr+len), which must
 * lie inside one region registered with @pd's device; the window of the
 * region holding it is registered in @pd on first use.  Return 0, -EFAULT when the range is not
 * registered memory, -ENODEV (@pd unknown), or the registration's error. */
int mw__mem_keys(mw_ctx_t *ctx, const struct mw__pd *pd, const void *addr, size_t len,
                 uint32_t *lkey);

/* mw__mem_held() - whether [addr, addr+len) lies inside one region of
 * registered memory (mw_alloc, mw_reg), devices or none: what a transport
 * without a device checks in place of keys.  0, -EFAULT, or -EINVAL (an
 * empty or wrapping range). */
int mw__mem_held(mw_ctx_t *ctx, const void *addr, size_t len);

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

/* An export: a registration of its own over exactly [start, end), the only
 * kind with remote access (those behind mw_alloc and mw_reg are local
 * only).  Embedded in its owner's record (a connection's), and listed by
 * the memory layer while it stands: memory released -- mw_free, the last
 * mw_dereg of a range, memory unmapped under a registration -- withdraws
 * every export over it first, so a key a peer holds never reaches memory
 * handed out again. */
struct mw__export {
    struct ibv_mr *mr;            /* the registration (NULL without a device) */
    bool standing;                /* until withdrawn */
    uintptr_t start, end;
    uint32_t rkey;                /* what the peer was given (kept after) */
    struct mw__list link;         /* in the memory layer's list while standing */
    void *pending;                /* being registered off the loop */
};

/* mw__export_new() - register [addr, addr+len) of registered memory for
 * remote access in @pd (the connection's own) into @e.  With @pd NULL (a
 * connection without a device) nothing is registered: the key is random,
 * and the transport that executes the peer's requests checks each against
 * the exports standing (lqp.h).  Return 0, -EFAULT (not memory from
 * mw_alloc or mw_reg), or the device's error. */
int mw__export_new(mw_ctx_t *ctx, const struct mw__pd *pd, void *addr, size_t len,
                   struct mw__export *e);
/* mw__export_new_async() - mw__export_new() without stalling the loop: a
 * range over MW__REG_ASYNC_BYTES is registered by the helper thread.
 * Return 0 (standing now: @done is not called), 1 (pending: @done(arg, err)
 * runs from the loop once, @e standing when err is 0; -EFAULT if the
 * memory was released meanwhile, -ECANCELED if @e was withdrawn first), or
 * a negative errno. */
int mw__export_new_async(mw_ctx_t *ctx, struct mw__pd *pd, void *addr, size_t len,
                         struct mw__export *e, void (*done)(void *arg, int err), void *arg);
/* mw__export_withdraw() - deregister @e: its key works no more.  One still
 * pending is let go of (its registration is dropped when made; @e may be
 * freed now).  Again is a no-op. */
void mw__export_withdraw(mw_ctx_t *ctx, struct mw__export *e);

#endif
