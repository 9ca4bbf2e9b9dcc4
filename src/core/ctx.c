/* The context's task queue: work deferred to the loop, run from one
 * libevent event (life.c makes and frees the context itself). */
#include <sys/time.h>

#include <event2/event.h>

#include "core/ctx.h"

const struct timeval mw__zero_tv = {0, 0};

void mw__defer(mw_ctx_t *ctx, struct mw__task *t)
{
    if (t->queued)
        return;
    t->queued = true;
    t->next = NULL;
    t->pass = ctx->defer_pass;
    *ctx->defer_tail = t;
    ctx->defer_tail = &t->next;
    if (!ctx->in_callback) {      /* else mw__run_deferred schedules it */
        event_active(ctx->defer_ev, EV_READ, 0);
        mw__loop_kick(ctx);
    }
}

void mw__defer_cancel(mw_ctx_t *ctx, struct mw__task *t)
{
    if (!t->queued)
        return;
    for (struct mw__task **pp = &ctx->defer_head; *pp; pp = &(*pp)->next) {
        if (*pp != t)
            continue;
        *pp = t->next;
        if (ctx->defer_tail == &t->next)
            ctx->defer_tail = pp;
        break;
    }
    t->queued = false;
}

void mw__run_deferred(mw_ctx_t *ctx)
{
    /* Run what was queued before we started, popping one task at a time so
     * that a task may cancel another still queued.  Tasks queued by these
     * callbacks belong to the next pass and wait for the next loop turn, so
     * a chain of callbacks never starves I/O. */
    uint64_t pass = ctx->defer_pass++;
    ctx->in_callback++;
    struct mw__task *t;
    while ((t = ctx->defer_head) && t->pass == pass) {
        ctx->defer_head = t->next;
        if (!ctx->defer_head)
            ctx->defer_tail = &ctx->defer_head;
        t->queued = false;
        t->fn(t);
    }
    ctx->in_callback--;
    /* Tasks queued meanwhile run on the next turn, after I/O: a zero
     * timer, because libevent would run a re-activated event in this same
     * pass, and a chain of callbacks would never yield. */
    if (ctx->defer_head)
        mw__ev_add(ctx, ctx->defer_ev, &mw__zero_tv);
}
