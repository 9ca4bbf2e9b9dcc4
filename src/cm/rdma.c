/* One-sided operations: bounds and keys checked before anything is posted,
 * large transfers split into chunks and pipelined with a bounded number in
 * flight, in the connection's issue order (queue.c); a write with
 * immediate puts its immediate on the last chunk (RC delivers in order, so
 * it lands after all the data) and spends a credit, because it consumes
 * one of the peer's receive slots.
 *
 * Chunks go to the device in chains: one ibv_post_send per chain, only the
 * chain's last request signalled.  RC completes a queue pair's requests in
 * order, so a successful completion says every request before it in the
 * transfer succeeded; an error completes the request that failed, signalled
 * or not, and flushes each one after it.  Requests carry their sequence
 * number (op.h: the wr_id's position), so each completion accounts exactly
 * for the requests up to it either way. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "cm/cm.h"
#include "cm/export.h"
#include "core/alloc.h"
#include "core/cq.h"
#include "core/dev.h"
#include "core/future.h"
#include "mem/mem.h"
#include "core/op.h"

/* A connection's exports (mem/mem.h: each its own registration, the only
 * kind with remote access, withdrawn when its memory is released).  (Type
 * 2 memory windows would also tie the key to the QP, but rxe checks a
 * window's accesses against its MR's range, not its own.) */
struct mw__conn_export {
    struct mw__export e;
    struct mw__conn_export *next;
};

/* @c's export of [addr, addr+len), standing or pending (@done, @arg: see
 * mw__export_new_async; NULL: made now, whatever its size). */
static int export_on(struct mw__conn *c, void *addr, size_t len, mw_remote_t *out,
                     void (*done)(void *arg, int err), void *arg,
                     struct mw__conn_export **xp)
{
    if (!addr || !len || !out)
        return -EINVAL;
    if (c->path.dev ? !c->path.pd || c->path.dev->removed : !c->path.lqp)
        return -ENOTCONN;             /* no queue pair (device gone, or not yet) */
    struct mw__conn_export *x = mw__calloc(1, sizeof *x);
    if (!x)
        return -ENOMEM;
    int rc = done ? mw__export_new_async(c->ctx, c->path.pd, addr, len, &x->e, done, arg)
                  : mw__export_new(c->ctx, c->path.pd, addr, len, &x->e);
    if (rc < 0) {
        mw__free(x);
        return rc;
    }
    x->next = c->exports;
    c->exports = x;
    if (rc == 0)
        *out = (mw_remote_t){.addr = (uintptr_t)addr, .len = len, .rkey = x->e.rkey};
    if (xp)
        *xp = x;
    return rc;
}

int mw_mem_export(mw_conn_t *h, void *addr, size_t len, mw_remote_t *out)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, __func__, &err);
    return c ? export_on(c, addr, len, out, NULL, NULL, NULL) : err;
}

/* An export of mw__mem_export_async under way. */
struct export_wait {
    struct mw__conn *c;
    struct mw__conn_export *x;    /* the connection's (freed by it on -ECANCELED) */
    void (*done)(void *arg, int err, const mw_remote_t *r);
    void *arg;
};

static void unlink_export(struct mw__conn *c, struct mw__conn_export *x)
{
    for (struct mw__conn_export **pp = &c->exports; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            mw__free(x);
            return;
        }
}

static void export_made(void *arg, int err)
{
    struct export_wait *w = arg;
    mw_remote_t r = {0};
    if (!err)
        r = (mw_remote_t){.addr = w->x->e.start, .len = w->x->e.end - w->x->e.start,
                          .rkey = w->x->e.rkey};
    else if (err != -ECANCELED)   /* still listed, never standing */
        unlink_export(w->c, w->x);
    w->done(w->arg, err, err ? NULL : &r);
    mw__free(w);
}

int mw__mem_export_async(mw_conn_t *h, void *addr, size_t len, mw_remote_t *out,
                         void (*done)(void *arg, int err, const mw_remote_t *r), void *arg)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, __func__, &err);
    if (!c)
        return err;
    struct export_wait *w = done ? mw__malloc(sizeof *w) : NULL;
    if (!w)
        return done ? -ENOMEM : -EINVAL;
    *w = (struct export_wait){.c = c, .done = done, .arg = arg};
    int rc = export_on(c, addr, len, out, export_made, w, &w->x);
    if (rc != 1)
        mw__free(w);
    return rc;
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
        if (!x->e.pending && x->e.rkey == r->rkey && x->e.start == r->addr &&
            x->e.end - x->e.start == r->len) {
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

bool mw__rdma_export_covers(const struct mw__conn *c, uint32_t rkey, uint64_t addr, uint64_t len)
{
    for (const struct mw__conn_export *x = c->exports; x; x = x->next)
        if (x->e.standing && x->e.rkey == rkey && addr >= x->e.start && addr <= x->e.end &&
            len <= x->e.end - addr)
            return true;
    return false;
}

/* A key and range of ours the peer names: an export standing now.  Memory
 * unmapped and mapped again at the same address must not take the write
 * meant for the old pages (on a device the old pages would, pinned), so
 * what the registration cache heard of unmaps is taken first. */
int mw__conn_peer_access(void *arg, uint32_t rkey, uint64_t addr, uint64_t len)
{
    struct mw__conn *c = arg;
    mw__mem_sync(c->ctx);
    return mw__rdma_export_covers(c, rkey, addr, len) ? 0 : -EACCES;
}

#define CHAIN_MAX 16              /* work requests per doorbell */
#define XFER_WINDOW 128           /* requests of one transfer in flight (< 256) */

static uint64_t chunk_of(const struct mw__conn *c)
{
    uint64_t chunk = c->opts.chunk_size;
    if (c->xfers.max_msg && c->xfers.max_msg < chunk)
        chunk = c->xfers.max_msg;
    return c->path.dev ? mw__dev_post_chunk(c->path.dev, chunk) : chunk;
}

/* Move a cursor (@seg, @off) of @r by @len bytes: into the next segment
 * when the current one is done. */
static void advance(const struct mw__rdma *r, size_t *seg, uint64_t *off, uint64_t len)
{
    *off += len;
    if (*off == r->segs[*seg].len) {
        ++*seg;
        *off = 0;
    }
}

static void on_chain_done(struct mw__op *op, const struct ibv_wc *wc)
{
    struct mw__rdma *r = (struct mw__rdma *)(uintptr_t)op->u64[0];
    struct mw__conn *c = op->owner;
    uint8_t pos = mw__wc_pos(wc);
    unsigned n = (uint8_t)(pos - r->seq_acked) + 1u;    /* requests accounted for */
    bool ok = wc->status == IBV_WC_SUCCESS;
    r->seq_acked = (uint8_t)(pos + 1);
    mw__conn_send_completed(c, n);
    c->xfers.rdma_out -= n;
    bool read = r->opcode == IBV_WR_RDMA_READ;
    if (read)
        c->xfers.reads_out -= n;
    if (ok && r->done_out)        /* also after a cancel: these did complete */
        *r->done_out = r->ends ? r->ends[pos] : r->seg == r->nsegs && r->x.out == n;
    int err = ok ? 0
              : wc->status == IBV_WC_WR_FLUSH_ERR && c->err ? c->err : mw__wc_errno(wc->status);
    /* first @r (it may go): failing the connection fails what is left,
     * and must not find @r still listed */
    mw__xfer_completed(c, &r->x, n, err);
    if (!ok && wc->status != IBV_WC_WR_FLUSH_ERR)
        mw__conn_fail(c, err, "RDMA %s failed: %s", read ? "read" : "write",
                      ibv_wc_status_str(wc->status));
    mw__conn_pump(c);
}

/* The chain's room: requests the connection, the transfer's window, and
 * (for reads) the QP's reads in flight allow. */
static unsigned chain_room(const struct mw__conn *c, const struct mw__rdma *r)
{
    unsigned room = c->opts.max_rdma_inflight - c->xfers.rdma_out;
    if (room > XFER_WINDOW - r->x.out)
        room = XFER_WINDOW - r->x.out;
    if (r->opcode == IBV_WR_RDMA_READ && room > c->xfers.max_reads - c->xfers.reads_out)
        room = c->xfers.max_reads - c->xfers.reads_out;
    return room < CHAIN_MAX ? room : CHAIN_MAX;
}

/* Fill @wr/@sge with up to @room requests from @r's cursor, no more bytes
 * than a chunk unless one request alone; the immediate's request only
 * with a credit to spend (else *@no_credit).  Return the count. */
static unsigned build_chain(struct mw__conn *c, struct mw__rdma *r, unsigned room,
                            struct ibv_send_wr *wr, struct ibv_sge *sge, uint64_t *bytes,
                            bool *no_credit)
{
    uint64_t cap = chunk_of(c);
    size_t seg = r->seg;
    uint64_t off = r->seg_off;
    unsigned n = 0;
    *bytes = 0;
    while (n < room && seg < r->nsegs) {
        const struct mw__seg *s = &r->segs[seg];
        uint64_t len = s->len - off < cap ? s->len - off : cap;
        if (n && *bytes + len > cap)
            break;
        bool last = seg + 1 == r->nsegs && off + len == s->len;
        if (last && r->with_imm && !mw__flow_data_ok(&c->flow)) {
            *no_credit = true;        /* the immediate waits for a credit */
            break;
        }
        sge[n] = (struct ibv_sge){.addr = (uintptr_t)(s->local + off), .length = (uint32_t)len,
                                  .lkey = s->lkey};
        wr[n] = (struct ibv_send_wr){
            .wr_id = mw__op_wr_id_at(r->op, (uint8_t)(r->seq_posted + n)),
            .sg_list = &sge[n], .num_sge = len ? 1 : 0, .opcode = r->opcode,
            .wr.rdma = {.remote_addr = s->remote + off, .rkey = s->rkey},
        };
        if (last && r->with_imm) {
            wr[n].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr[n].imm_data = htonl(r->imm);
        }
        advance(r, &seg, &off, len);
        if (r->ends)
            r->ends[(uint8_t)(r->seq_posted + n)] = (uint32_t)seg;
        *bytes += len;
        n++;
    }
    if (n) {
        wr[n - 1].send_flags = IBV_SEND_SIGNALED;
        for (unsigned i = 0; i + 1 < n; i++)
            wr[i].next = &wr[i + 1];
    }
    return n;
}

/* Post one chain (*@posted: the requests the device took, accounted for
 * even when it refused the rest: their flushes come back).  Return 0 or
 * the device's refusal. */
static int post_chain(struct mw__conn *c, struct mw__rdma *r, unsigned room, bool *no_credit,
                      unsigned *posted)
{
    struct ibv_send_wr wr[CHAIN_MAX];
    struct ibv_sge sge[CHAIN_MAX];
    uint64_t bytes;
    unsigned n = build_chain(c, r, room, wr, sge, &bytes, no_credit);
    *posted = 0;
    if (!n)
        return 0;
    /* a read's bytes move later; a small post's time is the call's */
    bool timed = r->opcode != IBV_WR_RDMA_READ && mw__dev_post_timed(bytes);
    uint64_t t0 = timed ? mw__now_ns() : 0;
    unsigned took;
    int rc = mw__conn_post_send(c, wr, n, &took);
    if (rc == 0 && timed && c->path.dev)
        mw__dev_post_cost(c->path.dev, bytes, mw__now_ns() - t0);
    for (unsigned i = 0; i < took; i++) {
        advance(r, &r->seg, &r->seg_off, sge[i].length);
        c->stats.rdma_bytes += sge[i].length;
        if (wr[i].opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
            mw__flow_imm_sent(&c->flow);
    }
    r->seq_posted = (uint8_t)(r->seq_posted + took);
    r->x.all_posted = r->seg == r->nsegs;
    r->x.out += took;
    c->xfers.rdma_out += took;
    if (r->opcode == IBV_WR_RDMA_READ)
        c->xfers.reads_out += took;
    *posted = took;
    return rc;
}

int mw__rdma_pump(struct mw__conn *c, struct mw__rdma *r, int budget, bool *deferred,
                  bool *no_credit)
{
    int rung = 0;
    while (!r->x.all_posted && rung < budget && !*no_credit) {
        unsigned room = chain_room(c, r);
        if (!room)
            break;
        if (!mw__turn_may(c->ctx)) {
            *deferred = true;         /* the rest next turn */
            break;
        }
        unsigned posted;
        int rc = post_chain(c, r, room, no_credit, &posted);
        if (rc < 0) {
            mw__conn_fail(c, rc, "posting an RDMA operation failed");
            break;
        }
        if (!posted)
            break;
        rung++;
    }
    return rung;
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

struct mw__rdma *mw__rdma_new(struct mw__conn *c, enum ibv_wr_opcode opcode, bool with_imm,
                              uint32_t imm)
{
    struct mw__rdma *r = mw__calloc(1, sizeof *r);
    if (!r || !(r->op = mw__op_get(c->ctx, on_chain_done, NULL, c))) {
        mw__free(r);
        return NULL;
    }
    r->op->u64[0] = (uintptr_t)r;
    r->opcode = opcode;
    r->with_imm = with_imm;
    r->imm = imm;
    r->segs = &r->one;
    r->nsegs = 1;
    return r;
}

void mw__rdma_queue(struct mw__conn *c, struct mw__rdma *r, mw_future_t *f)
{
    if (r->done_out)
        *r->done_out = 0;
    mw__queue_add(c, &r->x, MW__XFER_RDMA, f);
    mw__future_on_cancel(f, rdma_cancel, r);
    if (r->opcode == IBV_WR_RDMA_READ)
        c->stats.reads += r->nsegs;
    else
        c->stats.writes += r->nsegs;
    mw__conn_pump(c);
}

void mw__rdma_free(struct mw__conn *c, struct mw__rdma *r)
{
    mw__op_put(c->ctx, r->op);
    mw__free(r->ends);
    if (r->batch)
        mw__batch_put(r->batch);
    mw__free(r);
}

int mw__rdma_refusal(const struct mw__conn *c, const char **why)
{
    *why = c->err ? c->why : "connection closing";
    return c->err ? c->err : c->state == MW__CONN_ESTABLISHED ? 0 : -ESHUTDOWN;
}

static mw_future_t *start(mw_conn_t *h, const char *fn, enum ibv_wr_opcode opcode, void *local,
                          size_t len, const mw_remote_t *rem, uint64_t offset, bool with_imm,
                          uint32_t imm)
{
    struct mw__conn *c;
    mw_future_t *f = mw__conn_future(h, fn, &c);
    if (!f)
        return NULL;
    const char *why;
    int rc = mw__rdma_refusal(c, &why);
    uint32_t lkey = 0;
    if (rc == 0 && (!rem || (!local && len) || (!len && !with_imm))) {
        rc = -EINVAL;
        why = "NULL or empty argument";
    } else if (rc == 0 && (offset > rem->len || len > rem->len - offset)) {
        rc = -ERANGE;
        why = "outside the remote memory exported";
    } else if (rc == 0 && len && (rc = mw__conn_lkey(c, local, len, &lkey)) < 0) {
        why = rc == -EFAULT ? "local memory not registered (use mw_alloc or mw_reg)"
                            : "cannot register the local memory for this connection";
    }
    struct mw__rdma *r = rc ? NULL : mw__rdma_new(c, opcode, with_imm, imm);
    if (rc == 0 && !r) {
        rc = -ENOMEM;
        why = "no memory";
    }
    if (rc) {
        mw_future_fail(f, rc, "%s: %s", c->stats.remote, why);
        return f;
    }
    r->one = (struct mw__seg){.local = local, .len = len, .lkey = lkey, .rkey = rem->rkey,
                              .remote = rem->addr + offset};
    mw__rdma_queue(c, r, f);
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
