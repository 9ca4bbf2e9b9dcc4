/* Futures, internal side: what operations and the context need. */
#ifndef MW_CORE_FUTURE_H
#define MW_CORE_FUTURE_H

#include "core/ctx.h"

/* A callback record.  mw_future_then() allocates one (heap); internal
 * users embed theirs in their own state (chain, all, the communicator's
 * handshake), so that registering cannot fail. */
struct mw__cb {
    struct mw__cb *next;
    mw_then_fn fn;
    void *arg;
    bool heap;
};

/* mw__future_then_in() - mw_future_then() with the record @c embedded in
 * the caller's state, which must live until @fn(f, arg) ran: nothing is
 * allocated.  Return 0, or the refusal of @f (-ESTALE, -ESHUTDOWN). */
int mw__future_then_in(mw_future_t *f, struct mw__cb *c, mw_then_fn fn, void *arg);

/* mw__future_on_cancel() - @fn(f, arg) runs once, instead of @f failing at
 * once, when someone other than the operation ends @f: mw_future_cancel(),
 * its deadline, or the context's teardown.  The failure (-ECANCELED,
 * -ETIMEDOUT) is recorded and @f stays pending; @fn stops the operation and
 * completes @f -- at once, or once nothing (no device, no queue) can touch
 * the memory the caller lent it any more.  Any completion then fails @f
 * with the recorded error.  Cleared when @f completes. */
void mw__future_on_cancel(mw_future_t *f, void (*fn)(mw_future_t *f, void *arg), void *arg);

/* mw__future_fail_all() - fail every pending future of @ctx with
 * -ECANCELED (teardown). Callbacks are deferred as usual. */
void mw__future_fail_all(mw_ctx_t *ctx);

/* mw__future_detach_all() - after the last deferred task ran at teardown:
 * futures still referenced by the caller forget the context (later calls that
 * need it return -ESHUTDOWN); the ctx no longer tracks them. */
void mw__future_detach_all(mw_ctx_t *ctx);

#endif
