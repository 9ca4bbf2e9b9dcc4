/* A context's life: it joins (or owns) a libevent base, gets core's parts
 * (the loop, the task queue's event, operation records), and is torn down in
 * reverse order of dependency, the layers on it through their slots' hooks.
 * The one file of core that knows every other. */
#include <errno.h>
#include <stdlib.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/dev.h"
#include "core/future.h"
#include "core/op.h"
#include "core/worker.h"

void mw_ctx_opts_init(mw_ctx_opts_t *opts)
{
    *opts = (mw_ctx_opts_t){
        .log_level = mw__log_level_from_env(MW_LOG_WARN),
        .cq_depth = 0,
        .max_wc_per_turn = 0,
    };
}

static void on_defer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mw__run_deferred(arg);
}

int mw__ctx_new(mw_ctx_t **ctxp, struct event_base *base, const mw_ctx_opts_t *opts)
{
    if (!ctxp)
        return -EINVAL;
    mw_ctx_t *ctx = mw__calloc(1, sizeof *ctx);
    if (!ctx)
        return -ENOMEM;
    int rc = -ENOMEM;
    if (opts)
        ctx->opts = *opts;
    else
        mw_ctx_opts_init(&ctx->opts);
    if (!ctx->opts.max_wc_per_turn)
        ctx->opts.max_wc_per_turn = 1024;
    mw__list_init(&ctx->futures);
    ctx->defer_tail = &ctx->defer_head;
    ctx->base = base;
    if (!base) {
        /* Not EVENT_BASE_FLAG_PRECISE_TIMER: with it libevent's epoll
         * backend re-arms a timerfd (a system call) on every loop turn whose
         * earliest timer changed, i.e. on every receive; millisecond
         * timeouts need no more than epoll_wait's own. */
        ctx->base = event_base_new();
        if (!ctx->base)
            goto fail;
        ctx->own_base = true;
    }
    ctx->defer_ev = event_new(ctx->base, -1, 0, on_defer, ctx);
    if (!ctx->defer_ev)
        goto fail;
    if ((rc = mw__loop_new(ctx)) < 0 || (rc = mw__ops_new(ctx)) < 0)
        goto fail;
    *ctxp = ctx;
    return 0;
fail:
    mw_ctx_free(ctx);
    return rc;
}

/* Called from one of the context's callbacks, the loop that called out
 * still runs on the context: on return it would touch what was freed (the
 * task queue, the connection that accepted, the base of its own that
 * mw_ctx_progress is inside).  Refused, not deferred: a deferred free has
 * no place to run that every way of driving the loop passes through (a
 * caller's event_base_dispatch, mw_wait, mw_ctx_progress). */
static bool called_out(const mw_ctx_t *ctx)
{
    return ctx->in_callback > 0 || ctx->in_handler > 0;
}

int mw_ctx_free(mw_ctx_t *ctx)
{
    if (!ctx)
        return 0;
    if (called_out(ctx)) {
        MW_LOG(ctx, MW_LOG_ERROR, "mw_ctx_free() from inside a meshwire callback: refused, "
               "nothing freed (free the context once the callback has returned)");
        return -EDEADLK;
    }
    ctx->closing = true;
    for (int i = MW__LAYERS; i-- > 0;)
        if (ctx->layers[i].teardown)
            ctx->layers[i].teardown(ctx, ctx->layers[i].state);
    /* Pending work fails first, and its callbacks run while everything
     * they may touch still exists. */
    mw__ops_fail_all(ctx);
    mw__future_fail_all(ctx);
    while (ctx->defer_head)
        mw__run_deferred(ctx);
    mw__worker_free(ctx);    /* its last jobs hand their registrations back */
    while (ctx->defer_head)
        mw__run_deferred(ctx);
    mw__future_detach_all(ctx);
    for (int i = MW__LAYERS; i-- > 0;)   /* MRs before the PDs they belong to */
        if (ctx->layers[i].release)
            ctx->layers[i].release(ctx, ctx->layers[i].state);
    mw__devs_free(ctx);      /* CQs, PDs, the completion channel */
    mw__ops_free(ctx);
    mw__loop_free(ctx);
    if (ctx->defer_ev)
        event_free(ctx->defer_ev);
    if (ctx->own_base)
        event_base_free(ctx->base);
    mw__free(ctx);
    return 0;
}

struct event_base *mw_ctx_base(mw_ctx_t *ctx)
{
    return ctx->base;
}

void mw_ctx_stats(const mw_ctx_t *ctx, mw_ctx_stats_t *out)
{
    *out = ctx->stats;
}
