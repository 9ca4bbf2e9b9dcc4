/* Batches: prepared lists of one-sided transfers.  Preparing checks every
 * entry (bounds against its remote, the local memory's key in the
 * connection's protection domain) and keeps the resolved segments; each
 * post is one transfer over them (rdma.c), so the posting path does no
 * lookups -- unless registered memory went away since (mw__mem_epoch),
 * when the keys are looked up again before anything is posted. */
#include <errno.h>
#include <stdint.h>

#include "cm/cm.h"
#include "core/alloc.h"
#include "core/future.h"
#include "mem/mem.h"

struct mw_batch {
    mw_conn_t *conn;              /* its connection's handle, checked per post */
    enum ibv_wr_opcode opcode;
    struct mw__seg *segs;
    size_t n;
    uint64_t epoch;               /* mw__mem_epoch() when the keys were looked up */
    unsigned refs;                /* the caller's, and one per post under way */
};

void mw__batch_put(struct mw_batch *b)
{
    if (--b->refs)
        return;
    mw__free(b->segs);
    mw__free(b);
}

void mw_batch_free(mw_batch_t *b)
{
    if (b)
        mw__batch_put(b);
}

static int entry_keys(struct mw__conn *c, struct mw__seg *s)
{
    int rc = mw__conn_lkey(c, s->local, s->len, &s->lkey);
    return rc == -EINVAL ? -EFAULT : rc;          /* a wrapping range: not registered */
}

/* Check and resolve entry @i: @len bytes at @local to @r at @offset. */
static int set_entry(struct mw__conn *c, struct mw_batch *b, size_t i, void *local,
                     uint64_t len, const mw_remote_t *r, uint64_t offset)
{
    if (!local || !len)
        return -EINVAL;
    if (offset > r->len || len > r->len - offset)
        return -ERANGE;
    struct mw__seg *s = &b->segs[i];
    *s = (struct mw__seg){.local = local, .len = len, .rkey = r->rkey,
                          .remote = r->addr + offset};
    return entry_keys(c, s);
}

/* A batch of @n entries for @h, segments not set yet. */
static int batch_alloc(mw_conn_t *h, mw_dir_t dir, size_t n, struct mw__conn **cp,
                       struct mw_batch **out)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, "mw_batch_new", &err);
    if (!c)
        return err;
    if (!out || n == 0 || n > MW_BATCH_MAX || (dir != MW_DIR_WRITE && dir != MW_DIR_READ))
        return -EINVAL;
    if ((!c->path.pd && !c->path.lqp) || mw__conn_setting_up(c))
        return -ENOTCONN;
    struct mw_batch *b = mw__calloc(1, sizeof *b);
    if (!b || !(b->segs = mw__calloc(n, sizeof *b->segs))) {
        mw__free(b);
        return -ENOMEM;
    }
    b->conn = h;
    b->opcode = dir == MW_DIR_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    b->n = n;
    b->refs = 1;
    b->epoch = mw__mem_epoch(c->ctx);
    *cp = c;
    *out = b;
    return 0;
}

/* The end of preparing: @b on success, else freed with entry @i named. */
static int batch_done(struct mw_batch *b, int rc, size_t i, mw_batch_t **out, size_t *bad)
{
    if (rc == 0)
        return 0;
    mw__batch_put(b);
    *out = NULL;
    if (bad)
        *bad = i;
    return rc;
}

int mw_batch_new(mw_conn_t *h, mw_dir_t dir, const mw_remote_t *remotes, size_t nremotes,
                 const mw_batch_entry_t *e, size_t n, mw_batch_t **out, size_t *bad)
{
    struct mw__conn *c;
    if (!e || !remotes || !nremotes)
        return -EINVAL;
    int rc = batch_alloc(h, dir, n, &c, out);
    if (rc < 0)
        return rc;
    size_t i = 0;
    for (; i < n && rc == 0; i++)
        rc = e[i].remote >= nremotes ? -EINVAL
             : set_entry(c, *out, i, e[i].local, e[i].len, &remotes[e[i].remote], e[i].offset);
    return batch_done(*out, rc, i - 1, out, bad);
}

int mw_batch_new_strided(mw_conn_t *h, mw_dir_t dir, void *local, uint64_t local_stride,
                         const mw_remote_t *r, uint64_t offset, uint64_t remote_stride,
                         size_t count, uint64_t len, mw_batch_t **out, size_t *bad)
{
    struct mw__conn *c;
    if (!local || !r)
        return -EINVAL;
    int rc = batch_alloc(h, dir, count, &c, out);
    if (rc < 0)
        return rc;
    size_t i = 0;
    for (; i < count && rc == 0; i++) {
        uint64_t lstep, rstep, laddr, roff;
        if (__builtin_mul_overflow((uint64_t)i, local_stride, &lstep) ||
            __builtin_add_overflow((uint64_t)(uintptr_t)local, lstep, &laddr) ||
            __builtin_mul_overflow((uint64_t)i, remote_stride, &rstep) ||
            __builtin_add_overflow(offset, rstep, &roff))
            rc = -ERANGE;
        else
            rc = set_entry(c, *out, i, (void *)(uintptr_t)laddr, len, r, roff);
    }
    return batch_done(*out, rc, i - 1, out, bad);
}

/* Look the local keys up again if registered memory went away since. */
static int refresh_keys(struct mw__conn *c, struct mw_batch *b, size_t *bad)
{
    uint64_t epoch = mw__mem_epoch(c->ctx);
    if (epoch == b->epoch)
        return 0;
    for (size_t i = 0; i < b->n; i++) {
        int rc = entry_keys(c, &b->segs[i]);
        if (rc < 0) {
            *bad = i;
            return rc;
        }
    }
    b->epoch = epoch;
    return 0;
}

static mw_future_t *post(mw_batch_t *b, const char *fn, bool with_imm, uint32_t imm,
                         size_t *done)
{
    if (!b) {
        errno = EINVAL;
        return NULL;
    }
    struct mw__conn *c;
    mw_future_t *f = mw__conn_future(b->conn, fn, &c);
    if (!f)
        return NULL;
    if (done)
        *done = 0;
    const char *why;
    size_t bad = 0;
    int rc = mw__rdma_refusal(c, &why);
    if (rc == 0 && with_imm && b->opcode == IBV_WR_RDMA_READ) {
        rc = -EINVAL;
        why = "an immediate on a read batch";
    } else if (rc == 0 && (rc = refresh_keys(c, b, &bad)) < 0) {
        why = "the local memory of an entry is no longer registered";
    }
    struct mw__rdma *r = rc ? NULL : mw__rdma_new(c, b->opcode, with_imm, imm);
    if (r && !(r->ends = mw__calloc(256, sizeof *r->ends))) {
        mw__rdma_free(c, r);
        r = NULL;
    }
    if (rc == 0 && !r) {
        rc = -ENOMEM;
        why = "no memory";
    }
    if (rc) {
        if (rc == -EFAULT)
            mw_future_fail(f, rc, "%s: entry %zu: %s", c->stats.remote, bad, why);
        else
            mw_future_fail(f, rc, "%s: %s", c->stats.remote, why);
        return f;
    }
    r->segs = b->segs;
    r->nsegs = b->n;
    r->batch = b;
    b->refs++;
    r->done_out = done;
    mw__rdma_queue(c, r, f);
    return f;
}

mw_future_t *mw_batch_post(mw_batch_t *b, size_t *done)
{
    return post(b, __func__, false, 0, done);
}

mw_future_t *mw_batch_post_imm(mw_batch_t *b, uint32_t imm, size_t *done)
{
    return post(b, __func__, true, imm, done);
}
