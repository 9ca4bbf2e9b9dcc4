/* Two-sided messages, the sending side: a message goes out as fragments,
 * each copied into a registered send slot and posted as one SEND into one
 * of the peer's receive slots, as far as the peer's credits allow.  Credits
 * owed to the peer ride on every fragment; when many are owed and nothing
 * carries them, a credit-only fragment does, and the last credit is kept for
 * that, so the two sides can never both wait. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cm/cm.h"
#include "core/alloc.h"
#include "core/cq.h"
#include "core/future.h"
#include "mem/mem.h"
#include "core/op.h"

static void on_send_done(struct mw__op *op, const struct ibv_wc *wc);

static uint8_t *send_slot(struct mw__conn *c, unsigned i)
{
    return c->msgs.send_mem + (size_t)i * (c->msgs.max_frag + MW__FRAG_HDR_LEN);
}

int mw__send_slots_new(struct mw__conn *c)
{
    size_t slot = c->msgs.max_frag + MW__FRAG_HDR_LEN;
    c->msgs.send_mem = mw_alloc(c->ctx, c->msgs.nsend * slot);
    c->msgs.free_send = mw__calloc(c->msgs.nsend, sizeof *c->msgs.free_send);
    if (!c->msgs.send_mem || !c->msgs.free_send)
        return -ENOMEM;
    for (unsigned i = 0; i < c->msgs.nsend; i++)
        c->msgs.free_send[c->msgs.nfree_send++] = c->msgs.nsend - 1 - i;
    return 0;
}

void mw__send_slots_free(struct mw__conn *c)
{
    mw_free(c->ctx, c->msgs.send_mem);
    c->msgs.send_mem = NULL;
    mw__free(c->msgs.free_send);
    c->msgs.free_send = NULL;
}

/* Post one fragment: @s may be NULL for a credit-only fragment. */
static int post_frag(struct mw__conn *c, struct mw__send *s, struct mw__frag *fr)
{
    unsigned slot = c->msgs.free_send[--c->msgs.nfree_send];
    struct mw__op *op = mw__op_get(c->ctx, on_send_done, NULL, c);
    if (!op) {
        c->msgs.nfree_send++;
        return -ENOMEM;
    }
    op->u64[0] = slot;
    op->u64[1] = (uintptr_t)s;
    uint8_t *buf = send_slot(c, slot);
    unsigned give = mw__flow_to_give(&c->flow);
    fr->credits = (uint16_t)give;
    mw__frag_encode(fr, buf, MW__FRAG_HDR_LEN);
    if (fr->len)
        memcpy(buf + MW__FRAG_HDR_LEN, s->buf + fr->offset, fr->len);
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = MW__FRAG_HDR_LEN + fr->len};
    int rc = mw__conn_lkey(c, buf, sge.length, &sge.lkey);
    struct ibv_send_wr wr = {.wr_id = op->wr_id, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
    unsigned took;
    if (rc == 0 && (rc = mw__conn_post_send(c, &wr, 1, &took)) == 0) {
        mw__flow_frag_sent(&c->flow, give, s != NULL);
        if (s)
            s->x.out++;
        return 0;
    }
    mw__op_put(c->ctx, op);
    c->msgs.free_send[c->msgs.nfree_send++] = slot;
    return rc;
}

/* The next fragment of @s: data, or the discard that ends a message whose
 * send was cancelled half way. */
static struct mw__frag next_frag(const struct mw__conn *c, const struct mw__send *s)
{
    if (s->discard)
        return (struct mw__frag){.type = MW__FRAG_DISCARD, .msg_id = s->msg_id};
    size_t n = s->len - s->sent < c->msgs.max_frag ? s->len - s->sent : c->msgs.max_frag;
    struct mw__frag fr = {.type = MW__FRAG_DATA, .len = (uint32_t)n, .msg_id = s->msg_id,
                          .total = s->len, .offset = s->sent};
    fr.flags = (s->sent == 0 ? MW__FRAG_FIRST : 0) | (s->sent + n == s->len ? MW__FRAG_LAST : 0);
    return fr;
}

int mw__send_pump(struct mw__conn *c, struct mw__send *s, int budget, bool *deferred,
                  bool *no_credit)
{
    int posted = 0;
    while (posted < budget && mw__flow_data_ok(&c->flow) && c->msgs.nfree_send) {
        if (!mw__turn_may(c->ctx)) {
            *deferred = true;         /* the rest next turn */
            break;
        }
        struct mw__frag fr = next_frag(c, s);
        int rc = post_frag(c, s, &fr);
        if (rc < 0) {
            mw__conn_fail(c, rc, "posting a send failed");
            return posted;
        }
        posted++;
        if (fr.type == MW__FRAG_DISCARD) {
            s->discard = false;
            s->x.all_posted = true;
        } else {
            s->sent += fr.len;
            s->x.all_posted = s->sent == s->len;
        }
        if (s->x.all_posted)
            break;
    }
    *no_credit = !s->x.all_posted && !mw__flow_data_ok(&c->flow);
    return posted;
}

/* Data that could go has gone, carrying the credits owed; if enough are
 * still owed (flow.h: when, and why never one alone), nothing can carry
 * them (no data, or no credits for data): the reserved last credit sends
 * them alone. */
int mw__msg_return_credits(struct mw__conn *c)
{
    if (!mw__flow_return_due(&c->flow) || !c->msgs.nfree_send)
        return 0;
    struct mw__frag fr = {.type = MW__FRAG_CREDIT};
    return post_frag(c, NULL, &fr) == 0;
}

static void on_send_done(struct mw__op *op, const struct ibv_wc *wc)
{
    struct mw__conn *c = op->owner;
    struct mw__send *s = (struct mw__send *)(uintptr_t)op->u64[1];
    c->msgs.free_send[c->msgs.nfree_send++] = (unsigned)op->u64[0];
    mw__conn_send_completed(c, 1);
    mw__op_put(c->ctx, op);
    int err = wc->status == IBV_WC_SUCCESS ? 0 : c->err ? c->err : mw__wc_errno(wc->status);
    if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
        mw__conn_fail(c, err, "send failed: %s", ibv_wc_status_str(wc->status));
    if (s)
        mw__xfer_completed(c, &s->x, 1, err);
    mw__conn_pump(c);
}

/* Stop @s where it is: nothing of it posted, it leaves the queue; part of
 * it posted, the rest is not and the peer is told to drop what it has.
 * Posted fragments are copies, so the caller's buffer is free either way
 * and the future completes now. */
void mw__send_give_up(struct mw__conn *c, struct mw__send *s, int err)
{
    if (!s->x.err)
        s->x.err = err;
    if (!s->x.all_posted && s->sent > 0)
        s->discard = true;        /* the pump posts the DISCARD in its turn */
    else
        s->x.all_posted = true;
    mw__xfer_complete_early(c, &s->x);
    mw__conn_pump(c);
}

static void send_cancel(mw_future_t *f, void *arg)
{
    (void)f;
    struct mw__send *s = arg;
    mw__send_give_up(s->x.c, s, -ECANCELED);
}

mw_future_t *mw_send(mw_conn_t *h, const void *buf, size_t len)
{
    struct mw__conn *c;
    mw_future_t *f = mw__conn_future(h, __func__, &c);
    if (!f)
        return NULL;
    int rc = c->err ? c->err : c->state == MW__CONN_ESTABLISHED ? 0 : -ESHUTDOWN;
    if (rc < 0 || (!buf && len)) {
        mw_future_fail(f, rc < 0 ? rc : -EINVAL, "%s", rc < 0 ? c->why : "NULL buffer");
        return f;
    }
    if (len > c->peer.max_msg) {
        mw_future_fail(f, -EMSGSIZE, "a %zu-byte message: %s accepts at most %llu (its "
                       "max_msg_size)", len, c->stats.remote,
                       (unsigned long long)c->peer.max_msg);
        return f;
    }
    struct mw__send *s = mw__calloc(1, sizeof *s);
    if (!s) {
        mw_future_fail(f, -ENOMEM, "no memory");
        return f;
    }
    s->buf = buf;
    s->len = len;
    s->msg_id = ++c->msgs.next_msg_id;
    mw__queue_add(c, &s->x, MW__XFER_SEND, f);
    mw__future_on_cancel(f, send_cancel, s);
    mw__conn_pump(c);
    return f;
}
