/* One-sided operations: bounds and keys checked before anything is posted,
 * large transfers split into chunks and pipelined with a bounded number in
 * flight, in the connection's issue order (queue.c); a write with
 * immediate puts its immediate on the last chunk (RC delivers in order, so
 * it lands after all the data) and spends a credit, because it consumes
 * one of the peer's receive slots. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "cm/cm.h"
#include "core/alloc.h"
#include "core/cq.h"
#include "core/dev.h"
#include "core/future.h"
#include "core/mem.h"
#include "core/op.h"

/* A connection's exports (core/mem.h: each its own registration, the only
 * kind with remote access, withdrawn when its memory is released).  (Type
 * 2 memory windows would also tie the key to the QP, but rxe checks a
 * window's accesses against its MR's range, not its own.) */
struct mw__conn_export {
    struct mw__export e;
    struct mw__conn_export *next;
};

int mw_mem_export(mw_conn_t *h, void *addr, size_t len, mw_remote_t *out)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, __func__, &err);
    if (!c)
        return err;
    if (!addr || !len || !out)
        return -EINVAL;
    if (!c->pd || c->dev->removed)
        return -ENOTCONN;
    struct mw__conn_export *x = mw__calloc(1, sizeof *x);
    if (!x)
        return -ENOMEM;
    int rc = mw__export_new(c->ctx, c->pd, addr, len, &x->e);
    if (rc < 0) {
        mw__free(x);
        return rc;
    }
    x->next = c->exports;
    c->exports = x;
    *out = (mw_remote_t){.addr = (uintptr_t)addr, .len = len, .rkey = x->e.rkey};
    return 0;
}

int mw_mem_unexport(mw_conn_t *h, const mw_remote_t *r)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, __func__, &err);
    if (!c)
        return err;
    if (!r)
        return -EINVAL;
    for (struct mw__conn_export **pp = &c->exports; *pp; pp = &(*pp)->next) {
        struct mw__conn_export *x = *pp;
        if (x->e.rkey == r->rkey && x->e.start == r->addr && x->e.end - x->e.start == r->len) {
            *pp = x->next;
            mw__export_withdraw(c->ctx, &x->e);
            mw__free(x);
            return 0;
        }
    }
    return -ENOENT;
}

void mw__rdma_drop_exports(struct mw__conn *c)
{
    while (c->exports) {
        struct mw__conn_export *x = c->exports;
        c->exports = x->next;
        mw__export_withdraw(c->ctx, &x->e);
        mw__free(x);
    }
}

static uint64_t chunk_of(const struct mw__conn *c)
{
    uint64_t chunk = c->opts.chunk_size;
    if (c->max_msg && c->max_msg < chunk)
        chunk = c->max_msg;
    return mw__dev_post_chunk(c->dev, chunk);
}

static void on_chunk_done(struct mw__op *op, const struct ibv_wc *wc)
{
    struct mw__rdma *r = (struct mw__rdma *)(uintptr_t)op->u64[0];
    struct mw__conn *c = op->owner;
    mw__conn_send_completed(c);
    c->rdma_out--;
    bool read = r->opcode == IBV_WR_RDMA_READ;
    c->reads_out -= read;
    int err = wc->status == IBV_WC_SUCCESS ? 0
              : wc->status == IBV_WC_WR_FLUSH_ERR && c->err ? c->err : mw__wc_errno(wc->status);
    /* first @r (it may go): failing the connection fails what is left,
     * and must not find @r still listed */
    mw__xfer_completed(c, &r->x, err);
    if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
        mw__conn_fail(c, err, "RDMA %s failed: %s", read ? "read" : "write",
                      ibv_wc_status_str(wc->status));
    mw__conn_pump(c);
}

static int post_chunk(struct mw__conn *c, struct mw__rdma *r)
{
    uint64_t n = r->len - r->posted < chunk_of(c) ? r->len - r->posted : chunk_of(c);
    bool last = r->posted + n == r->len;
    struct ibv_sge sge = {.addr = (uintptr_t)(r->local + r->posted), .length = (uint32_t)n,
                          .lkey = r->lkey};
    struct ibv_send_wr wr = {
        .wr_id = r->op->wr_id, .sg_list = &sge, .num_sge = n ? 1 : 0,
        .opcode = r->opcode, .send_flags = IBV_SEND_SIGNALED,
        .wr.rdma = {.remote_addr = r->remote + r->posted, .rkey = r->rkey},
    }, *bad;
    if (last && r->with_imm) {
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htonl(r->imm);
    }
    uint64_t t0 = mw__now_ns();
    int rc = -ibv_post_send(c->id->qp, &wr, &bad);
    if (rc < 0)
        return rc;
    uint64_t took = mw__now_ns() - t0;
    if (r->opcode != IBV_WR_RDMA_READ)   /* a read's bytes move later */
        mw__dev_post_cost(c->dev, n, took);
    if (last && r->with_imm)
        c->send_credits--;
    r->posted += n;
    r->x.all_posted = last;
    r->x.out++;
    c->rdma_out++;
    c->reads_out += r->opcode == IBV_WR_RDMA_READ;
    c->wr_out++;
    c->stats.rdma_bytes += n;
    return 0;
}

int mw__rdma_pump(struct mw__conn *c, struct mw__rdma *r, int budget, bool *deferred,
                  bool *no_credit)
{
    int posted = 0;
    bool read = r->opcode == IBV_WR_RDMA_READ;
    while (!r->x.all_posted && c->rdma_out < c->opts.max_rdma_inflight && posted < budget &&
           !(read && c->reads_out >= c->max_reads)) {
        bool last = r->len - r->posted <= chunk_of(c);
        if (last && r->with_imm && c->send_credits <= 1) {
            *no_credit = true;        /* the immediate waits for a credit */
            break;
        }
        if (!mw__turn_may(c->ctx)) {
            *deferred = true;         /* the rest next turn */
            break;
        }
        int rc = post_chunk(c, r);
        if (rc < 0) {
            mw__conn_fail(c, rc, "posting an RDMA operation failed");
            break;
        }
        posted++;
    }
    return posted;
}

void mw__rdma_give_up(struct mw__conn *c, struct mw__rdma *r, int err)
{
    r->x.all_posted = true;
    if (!r->x.err)
        r->x.err = err;
    if (r->x.out == 0)
        mw__xfer_complete_early(c, &r->x);
    mw__conn_pump(c);             /* what was queued behind it */
}

static void rdma_cancel(mw_future_t *f, void *arg)
{
    (void)f;
    struct mw__rdma *r = arg;
    mw__rdma_give_up(r->x.c, r, -ECANCELED);
}

static mw_future_t *start(mw_conn_t *h, const char *fn, enum ibv_wr_opcode opcode, void *local,
                          size_t len, const mw_remote_t *rem, uint64_t offset, bool with_imm,
                          uint32_t imm)
{
    struct mw__conn *c;
    mw_future_t *f = mw__conn_future(h, fn, &c);
    if (!f)
        return NULL;
    int rc = c->err ? c->err : c->state == MW__CONN_ESTABLISHED ? 0 : -ESHUTDOWN;
    uint32_t lkey = 0;
    const char *why = c->err ? c->why : "connection closing";
    if (rc == 0 && (!rem || (!local && len) || (!len && !with_imm))) {
        rc = -EINVAL;
        why = "NULL or empty argument";
    } else if (rc == 0 && (offset > rem->len || len > rem->len - offset)) {
        rc = -ERANGE;
        why = "outside the remote memory exported";
    } else if (rc == 0 && len && (rc = mw__mem_keys(c->ctx, c->pd, local, len, &lkey)) < 0) {
        why = rc == -EFAULT ? "local memory not registered (use mw_alloc or mw_reg)"
                            : "cannot register the local memory for this connection";
    }
    struct mw__rdma *r = rc ? NULL : mw__calloc(1, sizeof *r);
    if (rc == 0 && (!r || !(r->op = mw__op_get(c->ctx, on_chunk_done, NULL, c)))) {
        mw__free(r);
        rc = -ENOMEM;
        why = "no memory";
    }
    if (rc) {
        mw_future_fail(f, rc, "%s: %s", c->stats.remote, why);
        return f;
    }
    r->opcode = opcode;
    r->with_imm = with_imm;
    r->imm = imm;
    r->local = local;
    r->lkey = lkey;
    r->rkey = rem->rkey;
    r->remote = rem->addr + offset;
    r->len = len;
    r->op->u64[0] = (uintptr_t)r;
    mw__queue_add(c, &r->x, MW__XFER_RDMA, f);
    mw__future_on_cancel(f, rdma_cancel, r);
    if (opcode == IBV_WR_RDMA_READ)
        c->stats.reads++;
    else
        c->stats.writes++;
    mw__conn_pump(c);
    return f;
}

mw_future_t *mw_write(mw_conn_t *c, const void *local, size_t len, const mw_remote_t *r,
                      uint64_t offset)
{
    return start(c, __func__, IBV_WR_RDMA_WRITE, (void *)local, len, r, offset, false, 0);
}

mw_future_t *mw_write_imm(mw_conn_t *c, const void *local, size_t len, const mw_remote_t *r,
                          uint64_t offset, uint32_t imm)
{
    return start(c, __func__, IBV_WR_RDMA_WRITE, (void *)local, len, r, offset, true, imm);
}

mw_future_t *mw_read(mw_conn_t *c, void *local, size_t len, const mw_remote_t *r,
                     uint64_t offset)
{
    return start(c, __func__, IBV_WR_RDMA_READ, local, len, r, offset, false, 0);
}
