/* A connection's operations in issue order.  Messages, one-sided transfers
 * and writes with immediate share one queue, and the pump posts from its
 * head: an operation's first work request goes out only after the one
 * before it has posted its last.  RC executes a queue pair's work requests
 * in posting order, so the order the caller issued is the order the peer
 * sees (a write, then a message saying it is there).
 *
 * An operation leaves the queue once nothing more will be posted for it
 * and none of its work requests is out; its future completes then, or
 * earlier when it was cancelled and no longer needs the caller's memory
 * (see mw__xfer_cancel in msg.c and rdma.c). */
#include <errno.h>
#include <stdlib.h>

#include <event2/event.h>

#include "cm/cm.h"
#include "core/alloc.h"
#include "core/future.h"
#include "core/op.h"

#define POSTS_PER_TURN 32         /* doorbells one loop turn rings (rxe posts inline) */

void mw__queue_add(struct mw__conn *c, struct mw__xfer *x, enum mw__xfer_kind kind,
                   mw_future_t *f)
{
    x->c = c;
    x->kind = kind;
    x->f = mw_future_ref(f);
    mw__list_add_tail(&c->xfers.queue, &x->link);
    mw__keepalive_arm(c);
}

bool mw__queue_busy(const struct mw__conn *c)
{
    return !mw__list_empty(&c->xfers.queue);
}

/* Complete @x's future, if it still has one, with what happened to it. */
static void complete(struct mw__conn *c, struct mw__xfer *x)
{
    if (!x->f)
        return;
    bool send = x->kind == MW__XFER_SEND;
    if (x->err == -EBUSY) {
        mw_future_fail(x->f, x->err, "%s: %s; the peer's process did not say within %u ms that "
                       "it stopped executing requests (it runs outside its loop): it may still "
                       "finish the copy it had begun", c->stats.remote,
                       c->err ? c->why : "failed", c->opts.timeout_ms);
    } else if (x->err) {
        mw_future_fail(x->f, x->err, "%s: %s", c->stats.remote, c->err ? c->why :
                       send ? "send failed" : "RDMA operation failed");
    } else {
        if (send) {
            c->stats.msgs_sent++;
            c->stats.bytes_sent += ((struct mw__send *)x)->len;
        }
        mw_future_resolve(x->f, NULL);
    }
    mw_future_unref(x->f);
    x->f = NULL;
}

static void xfer_free(struct mw__conn *c, struct mw__xfer *x)
{
    complete(c, x);
    mw__list_del(&x->link);
    if (x->kind == MW__XFER_RDMA)
        mw__rdma_free(c, (struct mw__rdma *)x);
    else
        mw__free(x);
}

void mw__xfer_completed(struct mw__conn *c, struct mw__xfer *x, unsigned n, int err)
{
    x->out -= n;
    /* -EBUSY (the same-host peer never said it stopped) outranks the
     * connection's error: the caller must know its memory may be lent */
    if (err && (!x->err || err == -EBUSY))
        x->err = err;
    /* A failed operation may still have something to post (a cancelled
     * send its DISCARD): it goes when it is all posted, failed or not. */
    if (x->out == 0 && x->all_posted)
        xfer_free(c, x);
}

void mw__xfer_complete_early(struct mw__conn *c, struct mw__xfer *x)
{
    complete(c, x);
    if (x->out == 0 && x->all_posted)
        xfer_free(c, x);
}

static void on_pump(evutil_socket_t fd, short what, void *arg);

/* When the queue's head began to wait for the peer's credits: the
 * keepalive gives up on it after send_timeout_ms (keepalive.c). */
static void note_credit_wait(struct mw__conn *c, bool waiting)
{
    if (mw__flow_wait(&c->flow, waiting)) {
        c->stats.credit_waits++;
        mw__keepalive_arm(c);                     /* its deadline */
    }
}

void mw__conn_pump(struct mw__conn *c)
{
    if (!mw__conn_usable(c))
        return;
    int budget = POSTS_PER_TURN;
    bool deferred = false, no_credit = false;
    struct mw__xfer *x;
    mw__list_for_each(x, &c->xfers.queue, link) {
        if (x->all_posted)
            continue;
        budget -= x->kind == MW__XFER_SEND
                      ? mw__send_pump(c, (struct mw__send *)x, budget, &deferred, &no_credit)
                      : mw__rdma_pump(c, (struct mw__rdma *)x, budget, &deferred, &no_credit);
        /* issue order: nothing overtakes an operation not all posted */
        if (c->err || !x->all_posted || budget <= 0 || deferred)
            break;
    }
    note_credit_wait(c, no_credit && !c->err);
    if (!c->err)
        budget -= mw__msg_return_credits(c);
    if (!c->err && (budget <= 0 || deferred)) {   /* more may be waiting: next turn */
        if (!c->xfers.pump_ev)
            c->xfers.pump_ev = evtimer_new(c->ctx->base, on_pump, c);
        if (c->xfers.pump_ev)
            mw__ev_add(c->ctx, c->xfers.pump_ev, &mw__zero_tv);
    }
    mw__conn_maybe_finish(c);
}

static void on_pump(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mw__conn_pump(arg);
}

/* Fail what is pending; records with work requests still out stay until
 * those come back (flushed), so completions never touch freed memory, and
 * a transfer's future fails only then: the device is done with the
 * caller's memory. */
void mw__queue_fail_all(struct mw__conn *c, int err, const char *why)
{
    (void)why;
    struct mw__xfer *x;
    mw__list_for_each(x, &c->xfers.queue, link) {
        x->all_posted = true;
        if (!x->err)
            x->err = err;
        if (x->kind == MW__XFER_SEND)
            complete(c, x);           /* posted fragments are copies */
        if (x->out == 0)
            xfer_free(c, x);
    }
}

/* The connection is being freed with its QP destroyed: nothing posted will
 * come back, so records still waiting for completions go now. */
void mw__queue_drop_all(struct mw__conn *c)
{
    struct mw__xfer *x;
    mw__list_for_each(x, &c->xfers.queue, link) {
        if (!x->err)
            x->err = c->err ? c->err : -ECANCELED;
        xfer_free(c, x);
    }
}
