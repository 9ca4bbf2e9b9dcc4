/* The completion engine: event -> drain -> re-arm -> poll again. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/time.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/cq.h"
#include "core/op.h"

#define POLL_BATCH 32

void mw__cq_dispatch(mw_ctx_t *ctx, const struct ibv_wc *wc, int n)
{
    for (int i = 0; i < n; i++) {
        ctx->stats.completions++;
        /* A flush is the ordinary end of work posted on a queue pair that
         * closed or failed, not an error of its own. */
        if (wc[i].status == IBV_WC_WR_FLUSH_ERR)
            ctx->stats.flushes++;
        else if (wc[i].status != IBV_WC_SUCCESS)
            ctx->stats.completion_errors++;
        struct mw__op *op = mw__op_lookup(ctx, wc[i].wr_id);
        if (!op) {
            /* A completion for an op already released (a flush after the
             * op was aborted) or a wr_id we never issued: never chase it. */
            ctx->stats.stray_completions++;
            MW_LOG(ctx, MW_LOG_DEBUG, "completion for no live operation (wr_id %#llx, %s)",
                   (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status));
            continue;
        }
        op->done(op, &wc[i]);
    }
}

void mw__cq_fail(struct mw__cq *cq, const char *what, int err)
{
    if (cq->broken)
        return;
    cq->broken = true;
    MW_LOG(cq->ctx, MW_LOG_ERROR, "%s a completion queue failed: %s", what, mw_strerror(err));
    /* stop watching it: its channel would otherwise wake the loop for ever */
    if (cq->ev) {
        mw__unwatch_fd(cq->ctx, event_get_fd(cq->ev));
        event_del(cq->ev);
    }
    if (cq->resume_ev)
        event_del(cq->resume_ev);
    if (cq->broken_fn)
        cq->broken_fn(cq->broken_arg, err);
}

/* Poll until dry, re-arming once and polling again.  Returns false when the
 * budget ran out with completions possibly left (come back next turn).  The
 * budget is in completions and in the turn's work budget: what a completion
 * sets off (a reduction, the next posts) can cost milliseconds on soft-RoCE. */
static bool drain(struct mw__cq *cq, unsigned *budget)
{
    mw_ctx_t *ctx = cq->ctx;
    struct ibv_wc wc[POLL_BATCH];
    for (;;) {
        if (*budget == 0 || !mw__turn_may(ctx))
            return false;
        int want = *budget < POLL_BATCH ? (int)*budget : POLL_BATCH;
        int n = cq->drv->poll(cq->cq, want, wc);
        ctx->stats.polls++;
        if (n < 0) {
            mw__cq_fail(cq, "polling", n);
            return true;
        }
        mw__cq_dispatch(ctx, wc, n);
        *budget -= (unsigned)n;
        if (n == want)
            continue;
        if (cq->armed)
            return true;              /* dry after the re-arm: done */
        int rc = cq->drv->req_notify(cq->cq);
        if (rc < 0) {
            mw__cq_fail(cq, "arming", rc);
            return true;
        }
        cq->armed = true;             /* and poll once more */
    }
}

void mw__cq_handle(struct mw__cq *cq)
{
    mw_ctx_t *ctx = cq->ctx;
    void *cq_context;
    /* One event per wake-up: the descriptor is level-triggered, so another
     * pending event wakes us again, and reading until EAGAIN would cost a
     * failing read(2) on every wake-up. */
    if (cq->drv->get_event(cq->chan, &cq_context) == 0) {
        ctx->stats.events++;
        cq->unacked++;
        cq->armed = false;            /* an event disarms the CQ */
    } else if (!cq->backlog) {
        return;                       /* spurious wake-up */
    }
    cq->backlog = false;
    unsigned budget = ctx->opts.max_wc_per_turn;
    if (!drain(cq, &budget)) {
        /* A zero timer, not event_active: libevent runs events activated
         * during a pass in that same pass, which would never yield. */
        cq->backlog = true;
        mw__ev_add(cq->ctx, cq->resume_ev, &mw__zero_tv);
    }
    if (cq->unacked) {                /* one ack per wake-up, not per event */
        cq->drv->ack_events(cq->cq, cq->unacked);
        cq->unacked = 0;
    }
}

void mw__cq_drain_now(struct mw__cq *cq)
{
    unsigned budget = UINT32_MAX;
    if (cq && !cq->broken)
        drain(cq, &budget);
}

static void on_event(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mw__cq_handle(arg);
}

int mw__cq_start(mw_ctx_t *ctx, struct mw__cq *cq, const struct mw__cq_driver *drv,
                 int fd, void *chan, void *vcq)
{
    *cq = (struct mw__cq){.ctx = ctx, .drv = drv, .chan = chan, .cq = vcq};
    cq->ev = event_new(ctx->base, fd, EV_READ | EV_PERSIST, on_event, cq);
    cq->resume_ev = evtimer_new(ctx->base, on_event, cq);
    int rc = cq->ev && cq->resume_ev ? drv->req_notify(vcq) : -ENOMEM;
    if (rc < 0 || event_add(cq->ev, NULL) < 0 || (rc = mw__watch_fd(ctx, fd)) < 0) {
        mw__cq_stop(cq);
        return rc < 0 ? rc : -EIO;
    }
    cq->armed = true;
    return 0;
}

void mw__cq_stop(struct mw__cq *cq)
{
    if (cq->ev) {
        mw__unwatch_fd(cq->ctx, event_get_fd(cq->ev));
        event_free(cq->ev);
    }
    if (cq->resume_ev)
        event_free(cq->resume_ev);
    cq->ev = cq->resume_ev = NULL;
    if (cq->unacked) {
        cq->drv->ack_events(cq->cq, cq->unacked);
        cq->unacked = 0;
    }
}

/* --- the real driver: libibverbs ----------------------------------------- */

static int verbs_get_event(void *chan, void **cq_context)
{
    struct ibv_cq *cq;
    if (ibv_get_cq_event(chan, &cq, cq_context) < 0)
        return -errno;                /* EAGAIN: the fd is non-blocking */
    return 0;
}

static void verbs_ack(void *cq, unsigned n)
{
    ibv_ack_cq_events(cq, n);
}

static int verbs_poll(void *cq, int n, struct ibv_wc *wc)
{
    int rc = ibv_poll_cq(cq, n, wc);
    return rc < 0 ? -EIO : rc;
}

static int verbs_req_notify(void *cq)
{
    return -ibv_req_notify_cq(cq, 0);  /* verbs returns the errno itself */
}

const struct mw__cq_driver mw__verbs_cq_driver = {
    .get_event = verbs_get_event,
    .ack_events = verbs_ack,
    .poll = verbs_poll,
    .req_notify = verbs_req_notify,
};

int mw__cq_create(struct mw__cq *cq, struct ibv_context *verbs, int depth)
{
    struct ibv_comp_channel *ch = ibv_create_comp_channel(verbs);
    if (!ch)
        return errno ? -errno : -ENOMEM;
    int rc, fl = fcntl(ch->fd, F_GETFL);
    if (fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        goto fail;
    struct ibv_cq *vcq = ibv_create_cq(verbs, depth, cq, ch, 0);
    if (!vcq)
        goto fail;
    cq->chan = ch;
    cq->cq = vcq;
    return 0;
fail:
    rc = errno ? -errno : -EIO;
    ibv_destroy_comp_channel(ch);
    return rc;
}

int mw__cq_watch(mw_ctx_t *ctx, struct mw__cq *cq)
{
    struct ibv_comp_channel *ch = cq->chan;
    return mw__cq_start(ctx, cq, &mw__verbs_cq_driver, ch->fd, ch, cq->cq);
}

void mw__cq_close(struct mw__cq *cq)
{
    if (!cq)
        return;
    mw__cq_stop(cq);                  /* acks first: destroy waits for them */
    if (cq->cq)
        ibv_destroy_cq(cq->cq);
    if (cq->chan)
        ibv_destroy_comp_channel(cq->chan);
    mw__free(cq);
}

int mw__wc_errno(enum ibv_wc_status status)
{
    switch (status) {
    case IBV_WC_SUCCESS: return 0;
    case IBV_WC_WR_FLUSH_ERR: return -ECANCELED;
    case IBV_WC_RETRY_EXC_ERR: return -ETIMEDOUT;
    case IBV_WC_RNR_RETRY_EXC_ERR: return -ECONNRESET;
    case IBV_WC_LOC_PROT_ERR: return -EFAULT;
    case IBV_WC_REM_ACCESS_ERR: return -EACCES;
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_REM_INV_REQ_ERR: return -EINVAL;
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_ABORT_ERR: return -EREMOTEIO;
    /* no device reports it on RC: the same-host path's "flushed before the
     * peer confirmed it stopped" (cm/lqp.h) */
    case IBV_WC_RESP_TIMEOUT_ERR: return -EBUSY;
    default: return -EIO;
    }
}
