/* Two-sided messages: fragments in registered slots, credit-based flow
 * control (a slot reposted is a credit owed to the peer, carried back in the
 * next fragment or, when owed a lot and idle, in a credit-only fragment; the
 * last credit is kept for that so the two sides can never both wait), and
 * reassembly of messages larger than a slot. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "cm/cm.h"
#include "core/cq.h"
#include "core/dev.h"
#include "core/future.h"
#include "core/mem.h"
#include "core/op.h"

#define POSTS_PER_TURN 32      /* bound what one loop turn posts (rxe posts inline) */

/* --- receive slots ------------------------------------------------------- */

static int post_recv(struct mw__conn *c, unsigned i)
{
    struct mw__recv_slot *s = &c->slots[i];
    struct ibv_sge sge = {.addr = (uintptr_t)s->buf, .length = c->opts.slot_size};
    uint32_t rkey;
    int rc = mw__mem_keys(c->ctx, c->dev, s->buf, c->opts.slot_size, &sge.lkey, &rkey);
    if (rc < 0)
        return rc;
    struct ibv_recv_wr wr = {.wr_id = s->op->wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
    if ((rc = ibv_post_recv(c->id->qp, &wr, &bad)))
        return -rc;
    s->posted = true;
    c->wr_out++;
    return 0;
}

static void on_recv(struct mw__op *op, const struct ibv_wc *wc);

int mw__msg_post_recvs(struct mw__conn *c)
{
    unsigned n = c->opts.credits;
    c->recv_mem = mw_alloc(c->ctx, (size_t)n * c->opts.slot_size);
    c->slots = calloc(n, sizeof *c->slots);
    c->early = calloc(n, sizeof *c->early);
    if (!c->recv_mem || !c->slots || !c->early)
        return -ENOMEM;
    for (unsigned i = 0; i < n; i++) {
        struct mw__recv_slot *s = &c->slots[i];
        s->buf = c->recv_mem + (size_t)i * c->opts.slot_size;
        if (!(s->op = mw__op_get(c->ctx, on_recv, NULL, c)))
            return -ENOMEM;
        s->op->u64[0] = i;
        int rc = post_recv(c, i);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void mw__msg_free_buffers(struct mw__conn *c)
{
    while (!mw__list_empty(&c->sends)) {   /* nothing posted comes back now */
        struct mw__send *s = mw__container_of(c->sends.next, struct mw__send, link);
        mw_future_fail(s->f, c->err ? c->err : -ECANCELED, "%s: connection closed", c->stats.remote);
        mw_future_unref(s->f);
        mw__list_del(&s->link);
        free(s);
    }
    for (unsigned i = 0; c->slots && i < c->opts.credits; i++)
        if (c->slots[i].op)
            mw__op_put(c->ctx, c->slots[i].op);
    free(c->slots);
    c->slots = NULL;
    free(c->early);
    c->early = NULL;
    c->nearly = 0;
    mw__defer_cancel(c->ctx, &c->early_task);
    mw_free(c->ctx, c->recv_mem);
    mw_free(c->ctx, c->send_mem);
    c->recv_mem = c->send_mem = NULL;
    free(c->free_send);
    c->free_send = NULL;
    free(c->rx.buf);
    c->rx.buf = NULL;
    while (!mw__list_empty(&c->inbox)) {
        struct mw__msgq *q = mw__container_of(c->inbox.next, struct mw__msgq, link);
        mw__list_del(&q->link);
        free(q->msg.data);
        free(q);
    }
    while (!mw__list_empty(&c->recv_waiters)) {   /* a close finished with them waiting */
        struct mw__waiter *w = mw__container_of(c->recv_waiters.next, struct mw__waiter, link);
        mw__list_del(&w->link);
        mw_future_fail(w->f, c->err ? c->err : -ECANCELED, "%s: connection closed",
                       c->stats.remote);
        mw_future_unref(w->f);
        free(w);
    }
}

/* A slot is reposted (a credit owed) unless the inbox is full: then it is
 * parked, and the peer runs out of credits -- that is the flow control. */
static void recycle_slot(struct mw__conn *c, unsigned i)
{
    if (c->state != MW__CONN_ESTABLISHED && c->state != MW__CONN_CLOSING)
        return;
    if (c->inbox_len >= c->opts.credits) {
        c->slots_parked++;
        return;
    }
    int rc = post_recv(c, i);
    if (rc < 0)
        mw__conn_fail(c, rc, "reposting a receive failed");
    else
        c->credits_owed++;
}

static void unpark_slots(struct mw__conn *c)
{
    for (unsigned i = 0; c->slots_parked && i < c->opts.credits; i++)
        if (!c->slots[i].posted) {
            c->slots_parked--;
            recycle_slot(c, i);
        }
}

/* --- delivering messages ------------------------------------------------- */

void mw_msg_free(mw_msg_t *m)
{
    if (m) {
        free(m->data);
        free(m);
    }
}

static void deliver(struct mw__conn *c, void *data, size_t len)
{
    c->stats.msgs_received++;
    c->stats.bytes_received += len;
    if (!mw__list_empty(&c->recv_waiters)) {
        struct mw__waiter *w = mw__container_of(c->recv_waiters.next, struct mw__waiter, link);
        mw__list_del(&w->link);
        mw_future_t *f = w->f;
        free(w);
        mw_msg_t *m = malloc(sizeof *m);
        if (!m) {
            free(data);
            mw_future_fail(f, -ENOMEM, "no memory for a received message");
        } else {
            *m = (mw_msg_t){data, len};
            mw_future_resolve(f, m);
        }
        mw_future_unref(f);
        return;
    }
    struct mw__msgq *q = malloc(sizeof *q);
    if (!q) {
        free(data);
        mw__conn_fail(c, -ENOMEM, "no memory to queue a received message");
        return;
    }
    q->msg = (mw_msg_t){data, len};
    mw__list_add_tail(&c->inbox, &q->link);
    c->inbox_len++;
}

/* Reassemble fragment @fr (payload @p) into the message in progress. */
static int take_data(struct mw__conn *c, const struct mw__frag *fr, const uint8_t *p)
{
    if (fr->flags & MW__FRAG_FIRST) {
        if (c->rx.active)
            return -EPROTO;
        if (fr->total > SIZE_MAX || !(c->rx.buf = malloc(fr->total ? fr->total : 1)))
            return -ENOMEM;
        c->rx.active = true;
        c->rx.id = fr->msg_id;
        c->rx.total = fr->total;
        c->rx.got = 0;
    } else if (!c->rx.active || fr->msg_id != c->rx.id || fr->offset != c->rx.got ||
               fr->total != c->rx.total) {
        return -EPROTO;
    }
    memcpy(c->rx.buf + fr->offset, p, fr->len);
    c->rx.got += fr->len;
    if (fr->flags & MW__FRAG_LAST) {
        c->rx.active = false;
        deliver(c, c->rx.buf, c->rx.total);
        c->rx.buf = NULL;
    }
    return 0;
}

static int take_frag(struct mw__conn *c, const uint8_t *buf, size_t len)
{
    struct mw__frag fr;
    const char *why = "";
    int rc = mw__frag_decode(buf, len, &fr, &why);
    if (rc < 0) {
        mw__conn_fail(c, -EPROTO, "malformed fragment from the peer: %s", why);
        return rc;
    }
    c->send_credits += fr.credits;
    if (c->send_credits > c->nsend) {
        mw__conn_fail(c, -EPROTO, "the peer returned more credits than it was given");
        return -EPROTO;
    }
    if (fr.type == MW__FRAG_DATA && (rc = take_data(c, &fr, buf + MW__FRAG_HDR_LEN)) < 0) {
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
    struct mw__recv_slot *s = &c->slots[i];
    if (s->with_imm) {
        c->stats.imms_received++;
        recycle_slot(c, i);
        if (c->imm_fn)
            c->imm_fn(mw__conn_handle(c), s->imm, c->imm_arg);
        else if (!c->owner_gone)          /* after close nobody listens */
            MW_LOG(c->ctx, MW_LOG_WARN, "%s: write with immediate %#x and no handler (mw_conn_on_imm)",
                   c->stats.remote, s->imm);
    } else if (take_frag(c, s->buf, s->len) == 0) {
        recycle_slot(c, i);
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
    c->early[c->nearly++] = i;
    if (c->state == MW__CONN_ACCEPTING && c->nearly == 1 &&   /* once: the first */
        rdma_notify(c->id, IBV_EVENT_COMM_EST) < 0 && errno != EISCONN)
        MW_LOG(c->ctx, MW_LOG_DEBUG, "%s: rdma_notify: %s", c->stats.remote, mw_strerror(-errno));
}

void mw__msg_take_early(struct mw__conn *c)
{
    mw__defer_cancel(c->ctx, &c->early_task);
    unsigned n = c->nearly;
    c->nearly = 0;
    for (unsigned k = 0; k < n; k++)
        if (c->state == MW__CONN_ESTABLISHED || c->state == MW__CONN_CLOSING)
            take_slot(c, c->early[k]);
    after_taking(c);
}

static void take_early(struct mw__task *t)
{
    mw__msg_take_early(mw__container_of(t, struct mw__conn, early_task));
}

void mw__msg_established(struct mw__conn *c)
{
    c->early_task.fn = take_early;
    if (!c->nearly)
        return;
    MW_LOG(c->ctx, MW_LOG_DEBUG, "%s: %u receives arrived before the connection was "
           "established here; taken now", c->stats.remote, c->nearly);
    mw__defer(c->ctx, &c->early_task);
}

static void on_recv(struct mw__op *op, const struct ibv_wc *wc)
{
    struct mw__conn *c = op->owner;
    unsigned i = (unsigned)op->u64[0];
    c->wr_out--;
    c->slots[i].posted = false;
    if (wc->status != IBV_WC_SUCCESS) {
        if (wc->status != IBV_WC_WR_FLUSH_ERR)
            mw__conn_fail(c, mw__wc_errno(wc->status), "receive failed: %s",
                          ibv_wc_status_str(wc->status));
        mw__conn_maybe_finish(c);
        return;
    }
    c->rx_activity++;
    struct mw__recv_slot *s = &c->slots[i];
    s->with_imm = wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM;
    s->imm = ntohl(wc->imm_data);
    s->len = wc->byte_len;
    if (c->state < MW__CONN_ESTABLISHED || c->nearly) {   /* behind the early ones */
        keep_early(c, i);
        return;
    }
    take_slot(c, i);
    after_taking(c);
}

mw_future_t *mw_recv(mw_conn_t *h)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, __func__, &err);
    if (!c) {
        errno = -err;
        return NULL;
    }
    mw_future_t *f = mw_future_new(c->ctx);
    if (!f)
        return NULL;
    if (!mw__list_empty(&c->inbox)) {
        struct mw__msgq *q = mw__container_of(c->inbox.next, struct mw__msgq, link);
        mw__list_del(&q->link);
        c->inbox_len--;
        mw_msg_t *m = malloc(sizeof *m);
        if (m) {
            *m = q->msg;
            mw_future_resolve(f, m);
        } else {
            free(q->msg.data);
            mw_future_fail(f, -ENOMEM, "no memory");
        }
        free(q);
        unpark_slots(c);
        mw__conn_pump(c);
        return f;
    }
    if (c->err || c->owner_gone) {
        mw_future_fail(f, c->err ? c->err : -ESHUTDOWN, "%s: %s", c->stats.remote,
                       c->err ? c->why : "connection closed");
        return f;
    }
    struct mw__waiter *w = malloc(sizeof *w);
    if (!w) {
        mw_future_fail(f, -ENOMEM, "no memory");
        return f;
    }
    w->f = mw_future_ref(f);
    mw__list_add_tail(&c->recv_waiters, &w->link);
    mw__probe_arm(c);
    return f;
}

/* --- sending ------------------------------------------------------------- */

static void on_send_done(struct mw__op *op, const struct ibv_wc *wc);

static uint8_t *send_slot(struct mw__conn *c, unsigned i)
{
    return c->send_mem + (size_t)i * (c->max_frag + MW__FRAG_HDR_LEN);
}

/* Post one fragment: @s may be NULL for a credit-only fragment. */
static int post_frag(struct mw__conn *c, struct mw__send *s, struct mw__frag *fr)
{
    unsigned slot = c->free_send[--c->nfree_send];
    struct mw__op *op = mw__op_get(c->ctx, on_send_done, NULL, c);
    if (!op) {
        c->nfree_send++;
        return -ENOMEM;
    }
    op->u64[0] = slot;
    op->u64[1] = (uintptr_t)s;
    uint8_t *buf = send_slot(c, slot);
    unsigned give = c->credits_owed > 0xffff ? 0xffff : c->credits_owed;
    fr->credits = (uint16_t)give;
    mw__frag_encode(fr, buf, MW__FRAG_HDR_LEN);
    if (s)
        memcpy(buf + MW__FRAG_HDR_LEN, s->buf + fr->offset, fr->len);
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = MW__FRAG_HDR_LEN + fr->len};
    uint32_t rkey;
    int rc = mw__mem_keys(c->ctx, c->dev, buf, sge.length, &sge.lkey, &rkey);
    struct ibv_send_wr wr = {.wr_id = op->wr_id, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
    if (rc == 0 && (rc = -ibv_post_send(c->id->qp, &wr, &bad)) == 0) {
        c->credits_owed -= give;
        c->send_credits--;
        c->wr_out++;
        return 0;
    }
    mw__op_put(c->ctx, op);
    c->free_send[c->nfree_send++] = slot;
    return rc;
}

static struct mw__send *next_unposted(struct mw__conn *c)
{
    for (struct mw__list *l = c->sends.next; l != &c->sends; l = l->next) {
        struct mw__send *s = mw__container_of(l, struct mw__send, link);
        if (!s->all_posted)
            return s;
    }
    return NULL;
}

/* Post data fragments while credits last (keeping the last one for credit
 * returns), then a credit-only fragment if much is owed.  Returns the
 * number of work requests posted. */
static int pump_msgs(struct mw__conn *c, int budget)
{
    int posted = 0;
    struct mw__send *s;
    while (posted < budget && c->send_credits > 1 && c->nfree_send && (s = next_unposted(c))) {
        size_t n = s->len - s->sent < c->max_frag ? s->len - s->sent : c->max_frag;
        struct mw__frag fr = {.type = MW__FRAG_DATA, .len = (uint32_t)n, .msg_id = s->msg_id,
                              .total = s->len, .offset = s->sent};
        fr.flags = (s->sent == 0 ? MW__FRAG_FIRST : 0) | (s->sent + n == s->len ? MW__FRAG_LAST : 0);
        int rc = post_frag(c, s, &fr);
        if (rc < 0) {
            mw__conn_fail(c, rc, "posting a send failed");
            return posted;
        }
        s->sent += n;
        s->frags_out++;
        s->all_posted = s->sent == s->len;
        posted++;
    }
    if (c->send_credits == 0 && next_unposted(c))
        c->stats.credit_waits++;
    /* Data that could go has gone above, carrying the credits owed; if many
     * are still owed, nothing can carry them (no data, or no credits for
     * data): the reserved last credit sends them alone.  Its slot, reposted
     * by the peer, is one credit owed back: below the threshold, so the two
     * sides never ping-pong credit messages. */
    if (c->credits_owed >= (c->opts.credits + 1) / 2 && c->send_credits && c->nfree_send) {
        struct mw__frag fr = {.type = MW__FRAG_CREDIT};
        if (post_frag(c, NULL, &fr) == 0)
            posted++;
    }
    return posted;
}

static void on_send_done(struct mw__op *op, const struct ibv_wc *wc)
{
    struct mw__conn *c = op->owner;
    struct mw__send *s = (struct mw__send *)(uintptr_t)op->u64[1];
    c->free_send[c->nfree_send++] = (unsigned)op->u64[0];
    c->wr_out--;
    mw__op_put(c->ctx, op);
    if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
        mw__conn_fail(c, mw__wc_errno(wc->status), "send failed: %s", ibv_wc_status_str(wc->status));
    if (s && --s->frags_out == 0 && (s->all_posted || c->err)) {
        if (wc->status == IBV_WC_SUCCESS && s->all_posted) {
            c->stats.msgs_sent++;
            c->stats.bytes_sent += s->len;
            mw_future_resolve(s->f, NULL);
        } else {
            mw_future_fail(s->f, c->err ? c->err : mw__wc_errno(wc->status), "%s: %s",
                           c->stats.remote, c->err ? c->why : ibv_wc_status_str(wc->status));
        }
        mw_future_unref(s->f);
        mw__list_del(&s->link);
        free(s);
    }
    mw__conn_pump(c);
    mw__conn_maybe_finish(c);
}

/* Fail what is pending; records with fragments still posted stay until
 * those come back (flushed), so the completions never touch freed memory. */
void mw__msg_fail_all(struct mw__conn *c, int err, const char *why)
{
    struct mw__list *l = c->sends.next;
    while (l != &c->sends) {
        struct mw__send *s = mw__container_of(l, struct mw__send, link);
        l = l->next;
        mw_future_fail(s->f, err, "%s", why);
        s->all_posted = true;
        if (s->frags_out == 0) {
            mw_future_unref(s->f);
            mw__list_del(&s->link);
            free(s);
        }
    }
    while (!mw__list_empty(&c->recv_waiters)) {
        struct mw__waiter *w = mw__container_of(c->recv_waiters.next, struct mw__waiter, link);
        mw__list_del(&w->link);
        mw_future_fail(w->f, err, "%s", why);
        mw_future_unref(w->f);
        free(w);
    }
}

static int refuse(struct mw__conn *c)
{
    if (c->err)
        return c->err;
    return c->state == MW__CONN_ESTABLISHED ? 0 : -ESHUTDOWN;
}

mw_future_t *mw_send(mw_conn_t *h, const void *buf, size_t len)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, __func__, &err);
    if (!c) {
        errno = -err;
        return NULL;
    }
    mw_future_t *f = mw_future_new(c->ctx);
    if (!f)
        return NULL;
    int rc = refuse(c);
    if (rc < 0 || (!buf && len)) {
        mw_future_fail(f, rc < 0 ? rc : -EINVAL, "%s", rc < 0 ? c->why : "NULL buffer");
        return f;
    }
    struct mw__send *s = calloc(1, sizeof *s);
    if (!s) {
        mw_future_fail(f, -ENOMEM, "no memory");
        return f;
    }
    *s = (struct mw__send){.f = mw_future_ref(f), .buf = buf, .len = len,
                           .msg_id = ++c->next_msg_id};
    mw__list_add_tail(&c->sends, &s->link);
    mw__conn_pump(c);
    return f;
}

/* --- the pump ------------------------------------------------------------ */

static void on_pump(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mw__rdma_new_turn(arg);
    mw__conn_pump(arg);
}

void mw__conn_pump(struct mw__conn *c)
{
    if (c->state != MW__CONN_ESTABLISHED && c->state != MW__CONN_CLOSING)
        return;
    int budget = POSTS_PER_TURN;
    bool deferred = false;
    budget -= pump_msgs(c, budget);
    budget -= mw__rdma_pump(c, budget, &deferred);
    if (budget <= 0 || deferred) {   /* more may be waiting: continue next turn */
        if (!c->pump_ev)
            c->pump_ev = evtimer_new(c->ctx->base, on_pump, c);
        if (c->pump_ev)
            mw__ev_add(c->ctx, c->pump_ev, &mw__zero_tv);
    }
    mw__conn_maybe_finish(c);
}

/* --- keepalive ----------------------------------------------------------- */

/* A receive can wait forever on a peer whose host or link silently went
 * away: nothing is in flight to time out.  So while receives wait and
 * nothing arrives for keepalive_ms, a zero-length RDMA write probes the peer:
 * it needs no credit and no remote memory, and its retries fail it (and the
 * connection) when nobody answers.  An idle connection with no waiters
 * sends nothing and wakes nobody. */
static void on_probe_done(struct mw__op *op, const struct ibv_wc *wc)
{
    struct mw__conn *c = op->owner;
    c->wr_out--;
    c->probe_op = NULL;
    mw__op_put(c->ctx, op);
    if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
        mw__conn_fail(c, mw__wc_errno(wc->status), "peer not responding (keepalive: %s)",
                      ibv_wc_status_str(wc->status));
    else
        mw__probe_arm(c);
    mw__conn_maybe_finish(c);
}

static void send_probe(struct mw__conn *c)
{
    struct mw__op *op = mw__op_get(c->ctx, on_probe_done, NULL, c);
    if (!op)
        return;
    struct ibv_send_wr wr = {.wr_id = op->wr_id, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED}, *bad;
    if (ibv_post_send(c->id->qp, &wr, &bad)) {
        mw__op_put(c->ctx, op);
        return;
    }
    c->probe_op = op;
    c->wr_out++;
}

static void on_probe_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct mw__conn *c = arg;
    if (c->state != MW__CONN_ESTABLISHED || mw__list_empty(&c->recv_waiters) || c->probe_op)
        return;
    if (c->rx_activity != c->rx_seen_at_probe) {   /* the peer spoke: no probe */
        c->rx_seen_at_probe = c->rx_activity;
        mw__probe_arm(c);
        return;
    }
    send_probe(c);
}

void mw__probe_arm(struct mw__conn *c)
{
    if (mw__list_empty(&c->recv_waiters) || c->state != MW__CONN_ESTABLISHED)
        return;
    if (!c->probe_ev && !(c->probe_ev = evtimer_new(c->ctx->base, on_probe_timer, c)))
        return;
    if (evtimer_pending(c->probe_ev, NULL))
        return;
    unsigned ms = c->opts.keepalive_ms ? c->opts.keepalive_ms : c->opts.timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    c->rx_seen_at_probe = c->rx_activity;
    mw__ev_add(c->ctx, c->probe_ev, &tv);
}
