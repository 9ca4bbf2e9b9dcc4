/* Completion queues without spinning.  Each CQ has its completion channel
 * (a channel belongs to the device context that made it) whose fd sits in
 * the reactor.  When it is readable: take every pending event, poll the CQ
 * dry, re-arm, and poll once more -- a completion that lands between the
 * last poll and the re-arm raises no event, so without that last poll it
 * would wait for the next, unrelated, completion.  Events are acked in one
 * batch per wake-up.  One wake-up handles at most opts.max_wc_per_turn
 * completions, then yields to other events and comes back next turn. */
#ifndef MW_CORE_CQ_H
#define MW_CORE_CQ_H

#include <stdbool.h>

#include <infiniband/verbs.h>

#include "core/ctx.h"

struct event;

/* The verbs calls the engine makes; unit tests substitute a fake CQ. */
struct mw__cq_driver {
    int (*get_event)(void *chan, void **cq_context);  /* 0, or -EAGAIN when none */
    void (*ack_events)(void *cq, unsigned n);
    int (*poll)(void *cq, int n, struct ibv_wc *wc);  /* count, or negative errno */
    int (*req_notify)(void *cq);                      /* 0 or negative errno */
};

struct mw__cq {
    mw_ctx_t *ctx;
    const struct mw__cq_driver *drv;
    void *chan, *cq;          /* ibv_comp_channel / ibv_cq, or the fake's */
    struct event *ev;         /* the channel fd */
    struct event *resume_ev;  /* zero timer: continue a backlog next turn */
    unsigned unacked;         /* events taken, not yet acked */
    bool armed;               /* req_notify done since the last event */
    bool backlog;             /* stopped on the per-turn budget: poll again */
    bool broken;              /* the CQ failed: broken_fn was told */
    void (*broken_fn)(void *arg, int err);   /* whoever can fail its users */
    void *broken_arg;
};

extern const struct mw__cq_driver mw__verbs_cq_driver;

/* mw__cq_start() - watch @fd (the channel's) on the loop and arm the CQ.
 * Return 0 or a negative errno. */
int mw__cq_start(mw_ctx_t *ctx, struct mw__cq *cq, const struct mw__cq_driver *drv,
                 int fd, void *chan, void *vcq);

/* mw__cq_stop() - stop watching, ack what was taken (before the CQ goes). */
void mw__cq_stop(struct mw__cq *cq);

/* mw__cq_handle() - the readable handler's work (exposed for tests). */
void mw__cq_handle(struct mw__cq *cq);

/* mw__cq_fail() - the CQ cannot be used any more (@what failed with @err,
 * or the device said so): nothing will complete through it, so it stops
 * being watched and broken_fn fails whatever waits on it.  Once. */
void mw__cq_fail(struct mw__cq *cq, const char *what, int err);

/* mw__cq_drain_now() - handle every completion already in the CQ, without
 * waiting for its event: before a connection is declared dead, whatever the
 * peer delivered before leaving is taken first. */
void mw__cq_drain_now(struct mw__cq *cq);

/* A real CQ, in two halves.  mw__cq_create(): the verbs calls, on any
 * thread (the helper's: on soft-RoCE they take milliseconds) -- a CQ of
 * @depth entries on @verbs, its events naming @cq (zeroed, the caller's
 * allocation), with its own non-blocking completion channel.
 * mw__cq_watch(): on the loop, watch and arm it.  Both return 0 or a
 * negative errno.  mw__cq_close(): destroy whatever of it exists, and
 * free @cq. */
int mw__cq_create(struct mw__cq *cq, struct ibv_context *verbs, int depth);
int mw__cq_watch(mw_ctx_t *ctx, struct mw__cq *cq);
void mw__cq_close(struct mw__cq *cq);

/* mw__cq_dispatch() - hand @n completions to the operations that posted
 * them, counted in the context's stats (a CQ's poll, or completions made
 * up by a transport without a device: cm/lqp.c). */
void mw__cq_dispatch(mw_ctx_t *ctx, const struct ibv_wc *wc, int n);

/* mw__wc_errno() - a negative errno for a failed work completion. */
int mw__wc_errno(enum ibv_wc_status status);

#endif
