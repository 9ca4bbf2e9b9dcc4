/* Two-sided messages, the receiving side: fragments land in registered
 * slots; a slot reposted is a credit owed to the peer (send.c carries it
 * back); messages larger than a slot are reassembled; messages nobody has
 * asked for yet wait in the inbox, up to the credits -- beyond that slots
 * stay parked and the peer waits: that is the flow control. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "cm/cm.h"
#include "core/alloc.h"
#include "core/cq.h"
#include "core/dev.h"
#include "core/future.h"
#include "mem/mem.h"
#include "core/op.h"

/* --- receive slots ------------------------------------------------------- */

static int post_recv(struct mw__conn *c, unsigned i)
{
    struct mw__recv_slot *s = &c->msgs.slots[i];
    struct ibv_sge sge = {.addr = (uintptr_t)s->buf, .length = c->opts.slot_size};
    int rc = mw__conn_lkey(c, s->buf, c->opts.slot_size, &sge.lkey);
    if (rc < 0)
        return rc;
    struct ibv_recv_wr wr = {.wr_id = s->op->wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
    if ((rc = mw__conn_post_recv(c, &wr, &bad)))
        return -rc;
    s->posted = true;
    return 0;
}

static void on_recv(struct mw__op *op, const struct ibv_wc *wc);

int mw__msg_post_recvs(struct mw__conn *c)
{
    unsigned n = c->opts.credits;
    c->msgs.recv_mem = mw_alloc(c->ctx, (size_t)n * c->opts.slot_size);
    c->msgs.slots = mw__calloc(n, sizeof *c->msgs.slots);
    c->msgs.early = mw__calloc(n, sizeof *c->msgs.early);
    if (!c->msgs.recv_mem || !c->msgs.slots || !c->msgs.early)
        return -ENOMEM;
    for (unsigned i = 0; i < n; i++) {
        struct mw__recv_slot *s = &c->msgs.slots[i];
        s->buf = c->msgs.recv_mem + (size_t)i * c->opts.slot_size;
        if (!(s->op = mw__op_get(c->ctx, on_recv, NULL, c)))
            return -ENOMEM;
        s->op->u64[0] = i;
        int rc = post_recv(c, i);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int mw__msg_repost_recvs(struct mw__conn *c)
{
    for (unsigned i = 0; i < c->opts.credits; i++) {
        struct mw__recv_slot *s = &c->msgs.slots[i];
        if (!s->posted)
            continue;
        mw__conn_recv_completed(c);   /* given back unused: posted anew */
        int rc = post_recv(c, i);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void mw__msg_free_buffers(struct mw__conn *c)
{
    for (unsigned i = 0; c->msgs.slots && i < c->opts.credits; i++)
        if (c->msgs.slots[i].op)
            mw__op_put(c->ctx, c->msgs.slots[i].op);
    mw__free(c->msgs.slots);
    c->msgs.slots = NULL;
    mw__free(c->msgs.early);
    c->msgs.early = NULL;
    c->msgs.nearly = 0;
    mw__defer_cancel(c->ctx, &c->msgs.early_task);
    mw_free(c->ctx, c->msgs.recv_mem);
    c->msgs.recv_mem = NULL;
    mw__send_slots_free(c);
    mw__free(c->msgs.rx.buf);
    c->msgs.rx.buf = NULL;
    struct mw__msgq *q;
    mw__list_for_each(q, &c->msgs.inbox, link) {
        mw__list_del(&q->link);
        mw__free(q->msg.data);
        mw__free(q);
    }
    c->msgs.inbox_len = 0;
    c->stats.inbox_bytes = 0;
    /* a close that finished with receives waiting */
    char why[128];
    snprintf(why, sizeof why, "%s: connection closed", c->stats.remote);
    mw__recv_fail_all(c, c->err ? c->err : -ECANCELED, why);
}

/* A slot is reposted (a credit owed) unless the inbox is full: then it is
 * parked, and the peer runs out of credits -- that is the flow control.
 * A slot that carried no message (credits, a discard, an immediate) grows
 * no inbox and is always reposted: the peer's credit returns must get
 * through even while nobody reads here (this side may be waiting for
 * them to send). */
static void recycle_slot(struct mw__conn *c, unsigned i, bool control)
{
    if (!mw__conn_usable(c))
        return;
    if (!control && (c->msgs.inbox_len >= c->opts.credits ||
                     c->stats.inbox_bytes >= c->opts.max_inbox_bytes)) {
        mw__flow_slot_parked(&c->flow);
        return;
    }
    int rc = post_recv(c, i);
    if (rc < 0)
        mw__conn_fail(c, rc, "reposting a receive failed");
    else
        mw__flow_slot_reposted(&c->flow);
}

static void unpark_slots(struct mw__conn *c)
{
    for (unsigned i = 0; c->flow.parked && i < c->opts.credits; i++)
        if (!c->msgs.slots[i].posted) {
            mw__flow_slot_unparked(&c->flow);
            recycle_slot(c, i, false);
        }
}

/* --- delivering messages ------------------------------------------------- */

void mw_msg_free(mw_msg_t *m)
{
    if (m) {
        mw__free(m->data);
        mw__free(m);
    }
}

static void deliver(struct mw__conn *c, void *data, size_t len)
{
    c->stats.msgs_received++;
    c->stats.bytes_received += len;
    struct mw__waiter *w = mw__list_first(&c->msgs.recv_waiters, struct mw__waiter, link);
    if (w) {
        mw__list_del(&w->link);
        mw_future_t *f = w->f;
        mw__free(w);
        mw_msg_t *m = mw__malloc(sizeof *m);
        if (!m) {                 /* a message lost: the connection cannot go on */
            mw__free(data);
            mw_future_fail(f, -ENOMEM, "no memory for a received message");
            mw__conn_fail(c, -ENOMEM, "no memory for a received message");
        } else {
            *m = (mw_msg_t){data, len};
            mw_future_resolve(f, m);
        }
        mw_future_unref(f);
        return;
    }
    struct mw__msgq *q = mw__malloc(sizeof *q);
    if (!q) {
        mw__free(data);
        mw__conn_fail(c, -ENOMEM, "no memory to queue a received message");
        return;
    }
    q->msg = (mw_msg_t){data, len};
    mw__list_add_tail(&c->msgs.inbox, &q->link);
    c->msgs.inbox_len++;
    c->stats.inbox_bytes += len;
}

/* Reassemble fragment @fr (payload @p) into the message in progress. */
static int take_data(struct mw__conn *c, const struct mw__frag *fr, const uint8_t *p)
{
    if (fr->flags & MW__FRAG_FIRST) {
        if (c->msgs.rx.active)
            return -EPROTO;
        if (fr->total > c->opts.max_msg_size)
            return -EMSGSIZE;     /* more than we announced: never allocated */
        if (!(c->msgs.rx.buf = mw__malloc(fr->total ? fr->total : 1)))
            return -ENOMEM;
        c->msgs.rx.active = true;
        c->msgs.rx.id = fr->msg_id;
        c->msgs.rx.total = fr->total;
        c->msgs.rx.got = 0;
    } else if (!c->msgs.rx.active || fr->msg_id != c->msgs.rx.id || fr->offset != c->msgs.rx.got ||
               fr->total != c->msgs.rx.total) {
        return -EPROTO;
    }
    memcpy(c->msgs.rx.buf + fr->offset, p, fr->len);
    c->msgs.rx.got += fr->len;
    if (fr->flags & MW__FRAG_LAST) {
        c->msgs.rx.active = false;
        deliver(c, c->msgs.rx.buf, c->msgs.rx.total);
        c->msgs.rx.buf = NULL;
    }
    return 0;
}

/* @control: it carried no message data. */
static int take_frag(struct mw__conn *c, const uint8_t *buf, size_t len, bool *control)
{
    struct mw__frag fr;
    const char *why = "";
    int rc = mw__frag_decode(buf, len, &fr, &why);
    if (rc < 0) {
        mw__conn_fail(c, -EPROTO, "malformed fragment from the peer: %s", why);
        return rc;
    }
    *control = fr.type != MW__FRAG_DATA;
    if (mw__flow_returned(&c->flow, fr.credits) < 0) {
        mw__conn_fail(c, -EPROTO, "the peer returned more credits than it was given");
        return -EPROTO;
    }
    if (fr.type == MW__FRAG_DISCARD) {
        if (!c->msgs.rx.active || c->msgs.rx.id != fr.msg_id) {
            mw__conn_fail(c, -EPROTO, "the peer discarded message %llu, not in progress",
                          (unsigned long long)fr.msg_id);
            return -EPROTO;
        }
        mw__free(c->msgs.rx.buf);          /* its send was cancelled half way */
        c->msgs.rx.buf = NULL;
        c->msgs.rx.active = false;
        return 0;
    }
    if (fr.type == MW__FRAG_DATA && (rc = take_data(c, &fr, buf + MW__FRAG_HDR_LEN)) < 0) {
        if (rc == -EMSGSIZE)
            mw__conn_fail(c, rc, "the peer sent a %llu-byte message; max_msg_size is %llu",
                          (unsigned long long)fr.total,
                          (unsigned long long)c->opts.max_msg_size);
        else
            mw__conn_fail(c, rc, rc == -ENOMEM ? "no memory for a %llu-byte message"
                                               : "fragment out of sequence (message %llu)",
                          (unsigned long long)(rc == -ENOMEM ? fr.total : fr.msg_id));
        return rc;
    }
    return 0;
}

/* What arrived in slot @i: an immediate, or a fragment. */
static void take_slot(struct mw__conn *c, unsigned i)
{
    struct mw__recv_slot *s = &c->msgs.slots[i];
    if (s->with_imm) {
        c->stats.imms_received++;
        recycle_slot(c, i, true);
        if (c->on_imm.fn)
            MW__CALL_OUT(c->ctx, c->on_imm.fn(mw__conn_handle(c), s->imm, c->on_imm.arg));
        else if (c->owner == MW__OWNER_CALLER)   /* after close nobody listens */
            MW_LOG(c->ctx, MW_LOG_WARN, "%s: write with immediate %#x and no handler (mw_conn_on_imm)",
                   c->stats.remote, s->imm);
    } else {
        bool control = false;
        if (take_frag(c, s->buf, s->len, &control) == 0)
            recycle_slot(c, i, control);
    }
}

static void after_taking(struct mw__conn *c)
{
    unpark_slots(c);                  /* a waiter may have taken the message */
    mw__conn_pump(c);
    mw__conn_maybe_finish(c);
}

/* The peer sent as soon as it was connected, before our side is: before
 * its RTU reached our CM, or before we handled the cm event.  Nothing can
 * be taken yet (the peer's credits and our send slots come with
 * establishment), so the slot waits, in arrival order.  Data proves the
 * peer connected: the CM is told, so a lost RTU cannot leave us half-made. */
static void keep_early(struct mw__conn *c, unsigned i)
{
    c->msgs.early[c->msgs.nearly++] = i;
    if (c->state == MW__CONN_ACCEPTING && c->msgs.nearly == 1 && c->id &&   /* once */
        rdma_notify(c->id, IBV_EVENT_COMM_EST) < 0 && errno != EISCONN)
        MW_LOG(c->ctx, MW_LOG_DEBUG, "%s: rdma_notify: %s", c->stats.remote, mw_strerror(-errno));
}

void mw__msg_take_early(struct mw__conn *c)
{
    mw__defer_cancel(c->ctx, &c->msgs.early_task);
    unsigned n = c->msgs.nearly;
    c->msgs.nearly = 0;
    for (unsigned k = 0; k < n; k++)
        if (mw__conn_usable(c))
            take_slot(c, c->msgs.early[k]);
    after_taking(c);
}

static void take_early(struct mw__task *t)
{
    mw__msg_take_early(mw__container_of(t, struct mw__conn, msgs.early_task));
}

void mw__msg_established(struct mw__conn *c)
{
    c->msgs.early_task.fn = take_early;
    if (!c->msgs.nearly)
        return;
    MW_LOG(c->ctx, MW_LOG_DEBUG, "%s: %u receives arrived before the connection was "
           "established here; taken now", c->stats.remote, c->msgs.nearly);
    mw__defer(c->ctx, &c->msgs.early_task);
}

static void on_recv(struct mw__op *op, const struct ibv_wc *wc)
{
    struct mw__conn *c = op->owner;
    unsigned i = (unsigned)op->u64[0];
    mw__conn_recv_completed(c);
    c->msgs.slots[i].posted = false;
    if (wc->status != IBV_WC_SUCCESS) {
        if (wc->status != IBV_WC_WR_FLUSH_ERR)
            mw__conn_fail(c, mw__wc_errno(wc->status), "receive failed: %s",
                          ibv_wc_status_str(wc->status));
        mw__conn_maybe_finish(c);
        return;
    }
    mw__keepalive_heard(c);
    struct mw__recv_slot *s = &c->msgs.slots[i];
    s->with_imm = wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM;
    s->imm = ntohl(wc->imm_data);
    s->len = wc->byte_len;
    if (mw__conn_setting_up(c) || c->msgs.nearly) {   /* behind the early ones */
        keep_early(c, i);
        return;
    }
    take_slot(c, i);
    after_taking(c);
}

/* A receive cancelled or timed out leaves the queue of waiters at once:
 * the next message goes to the next receive, and none is lost. */
static void recv_cancel(mw_future_t *f, void *arg)
{
    struct mw__waiter *w = arg;
    mw__list_del(&w->link);
    mw_future_fail(f, -ECANCELED, "cancelled");   /* the recorded error wins */
    mw_future_unref(w->f);
    mw__free(w);
}

/* The first message waiting in the inbox, to @f. */
static void take_inbox(struct mw__conn *c, mw_future_t *f)
{
    struct mw__msgq *q = mw__list_first(&c->msgs.inbox, struct mw__msgq, link);
    mw__list_del(&q->link);
    c->msgs.inbox_len--;
    c->stats.inbox_bytes -= q->msg.len;
    mw_msg_t *m = mw__malloc(sizeof *m);
    if (m) {
        *m = q->msg;
        mw_future_resolve(f, m);
    } else {
        mw__free(q->msg.data);
        mw_future_fail(f, -ENOMEM, "no memory");
    }
    mw__free(q);
    unpark_slots(c);
    mw__conn_pump(c);             /* the credits owed may go now */
}

mw_future_t *mw_recv(mw_conn_t *h)
{
    struct mw__conn *c;
    mw_future_t *f = mw__conn_future(h, __func__, &c);
    if (!f)
        return NULL;
    if (!mw__list_empty(&c->msgs.inbox)) {
        take_inbox(c, f);
        return f;
    }
    if (c->err) {                 /* the caller holds it: established, or broken */
        mw_future_fail(f, c->err ? c->err : -ESHUTDOWN, "%s: %s", c->stats.remote,
                       c->err ? c->why : "connection closed");
        return f;
    }
    struct mw__waiter *w = mw__malloc(sizeof *w);
    if (!w) {
        mw_future_fail(f, -ENOMEM, "no memory");
        return f;
    }
    *w = (struct mw__waiter){.f = mw_future_ref(f), .c = c};
    mw__list_add_tail(&c->msgs.recv_waiters, &w->link);
    mw__future_on_cancel(f, recv_cancel, w);
    mw__keepalive_arm(c);
    return f;
}

void mw__recv_fail_all(struct mw__conn *c, int err, const char *why)
{
    struct mw__waiter *w;
    mw__list_for_each(w, &c->msgs.recv_waiters, link) {
        mw__list_del(&w->link);
        mw_future_fail(w->f, err, "%s", why);
        mw_future_unref(w->f);
        mw__free(w);
    }
}
