/* Liveness while anything waits on the peer.  A receive, or a send waiting
 * for credits, can wait for ever on a peer whose host or link silently went
 * away: nothing is in flight to time out.  So while anything waits (a
 * receive, an operation in the queue) and nothing arrives or completes for
 * keepalive_ms, a zero-length RDMA write probes the peer: it needs no
 * credit and no remote memory.  Its retries fail it (and the connection)
 * when nobody answers -- unless the device retries for ever (rxe reads
 * retry count 7 so), hence a deadline too: a probe still unanswered, and
 * nothing else heard, keepalive_ms later fails the connection.  A peer
 * that answers but never returns credits (alive, not reading) makes the
 * message waiting for them fail after send_timeout_ms.  An idle
 * connection sends nothing and wakes nobody.
 *
 * On the same-host path the peer's own loop would have to answer a probe,
 * where a NIC answers it on a device: a peer busy outside its loop (a
 * model load, a long forward pass) would be declared dead alive.  There
 * the peer's liveness is its process's -- its pidfd and its socket's end,
 * watched in the reactor (lqp.c) -- so no probe goes out, and the timer
 * runs only for the credit deadline.
 *
 * Over TCP the peer's kernel answers for it, as a NIC does: its
 * acknowledgements (of data, of keepalive and zero-window probes) go on
 * while its process is outside its loop.  A host gone silent is found by
 * the transport's silent_ms -- how long nothing was acknowledged while
 * something waited for it -- at each tick, and the kernel's keepalive
 * finds one while nothing is in flight. */
#include <errno.h>

#include <event2/event.h>

#include "cm/cm.h"
#include "core/cq.h"
#include "core/op.h"

static bool waiting(const struct mw__conn *c)
{
    return !mw__list_empty(&c->msgs.recv_waiters) || mw__queue_busy(c);
}

static void on_probe_done(struct mw__op *op, const struct ibv_wc *wc)
{
    struct mw__conn *c = op->owner;
    mw__conn_send_completed(c, 1);
    c->keepalive.probe_op = NULL;
    mw__op_put(c->ctx, op);
    if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
        mw__conn_fail(c, mw__wc_errno(wc->status), "peer not responding (keepalive: %s)",
                      ibv_wc_status_str(wc->status));
    else
        mw__keepalive_arm(c);
    mw__conn_maybe_finish(c);
}

static void send_probe(struct mw__conn *c)
{
    struct mw__op *op = mw__op_get(c->ctx, on_probe_done, NULL, c);
    if (!op)
        return;
    struct ibv_send_wr wr = {.wr_id = op->wr_id, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED};
    unsigned took;
    if (mw__conn_post_send(c, &wr, 1, &took) < 0) {
        mw__op_put(c->ctx, op);
        return;
    }
    c->keepalive.probe_op = op;
}

/* The operation at the head of the queue, waiting for credits since
 * c->flow.wait_since: past the deadline it gives up. */
static void credit_deadline(struct mw__conn *c)
{
    if (!mw__flow_wait_expired(&c->flow, c->opts.send_timeout_ms))
        return;
    struct mw__xfer *x;
    mw__list_for_each(x, &c->xfers.queue, link) {
        if (x->all_posted)
            continue;
        MW_LOG(c->ctx, MW_LOG_WARN, "%s: no credits from the peer for %u ms (it does not "
               "read its messages): the waiting operation fails", c->stats.remote,
               c->opts.send_timeout_ms);
        if (x->kind == MW__XFER_SEND)
            mw__send_give_up(c, (struct mw__send *)x, -ETIMEDOUT);
        else
            mw__rdma_give_up(c, (struct mw__rdma *)x, -ETIMEDOUT);
        return;
    }
}

static void on_probe_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct mw__conn *c = arg;
    if (!mw__conn_usable(c))
        return;
    credit_deadline(c);
    if (!waiting(c))
        return;
    if (!c->path.tp->probes) {             /* liveness is the process's (above) */
        unsigned silent = c->path.tp->silent_ms ? c->path.tp->silent_ms(c) : 0;
        if (silent > 2 * c->opts.keepalive_ms) {
            mw__conn_fail(c, -ETIMEDOUT, "peer not responding (its host acknowledged nothing "
                          "for %u ms)", silent);
            return;
        }
        mw__keepalive_arm(c);
        return;
    }
    if (c->keepalive.peer_heard != c->keepalive.heard_at_probe) {   /* the peer spoke: no probe */
        mw__keepalive_arm(c);
        return;
    }
    if (c->keepalive.probe_op) {
        mw__conn_fail(c, -ETIMEDOUT, "peer not responding (keepalive: no answer for %u ms)",
                      2 * c->opts.keepalive_ms);
        return;
    }
    send_probe(c);
    mw__keepalive_arm(c);             /* the probe's deadline */
}

void mw__keepalive_arm(struct mw__conn *c)
{
    if (!waiting(c) || !mw__conn_usable(c) ||
        (!c->path.tp->probes && !c->path.tp->silent_ms && !c->flow.wait_since))
        return;
    if (!c->keepalive.probe_ev && !(c->keepalive.probe_ev = evtimer_new(c->ctx->base, on_probe_timer, c)))
        return;
    if (evtimer_pending(c->keepalive.probe_ev, NULL))
        return;
    unsigned ms = c->opts.keepalive_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    c->keepalive.heard_at_probe = c->keepalive.peer_heard;
    mw__ev_add(c->ctx, c->keepalive.probe_ev, &tv);
}

void mw__keepalive_heard(struct mw__conn *c)
{
    c->keepalive.peer_heard++;
}

void mw__keepalive_drop(struct mw__conn *c)
{
    c->keepalive.probe_op = NULL;
}
