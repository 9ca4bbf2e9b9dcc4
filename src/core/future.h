/* Futures, internal side: what operations and the context need. */
#ifndef MW_CORE_FUTURE_H
#define MW_CORE_FUTURE_H

#include "core/ctx.h"

/* mw__future_on_cancel() - @fn(f, arg) runs once if @f is failed while the
 * operation behind it is still in flight: by mw_future_cancel(), a timeout,
 * or the context's teardown.  It lets the operation stop and release what it
 * holds; it must not complete @f (already failed).  Cleared by resolving or
 * failing @f through the ordinary calls. */
void mw__future_on_cancel(mw_future_t *f, void (*fn)(mw_future_t *f, void *arg), void *arg);

/* mw__future_fail_all() - fail every pending future of @ctx with
 * -ECANCELED (teardown). Callbacks are deferred as usual. */
void mw__future_fail_all(mw_ctx_t *ctx);

/* mw__future_detach_all() - after the last deferred task ran at teardown:
 * futures still referenced by the caller forget the context (later calls that
 * need it return -ESHUTDOWN); the ctx no longer tracks them. */
void mw__future_detach_all(mw_ctx_t *ctx);

#endif
