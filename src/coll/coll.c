/* The public collectives: check the arguments, build this rank's schedule,
 * set up its buffers (the caller's where they hold the whole result, else a
 * registered work buffer; the input set aside when aliasing it would be
 * wrong), and queue it on the communicator. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coll/comm.h"
#include "coll/exec.h"
#include "coll/reduce.h"
#include "coll/sched.h"
#include "core/alloc.h"
#include "core/ctx.h"
#include "core/future.h"
#include "mem/mem.h"

/* Below this many bytes allreduce uses recursive doubling (log2 n steps of
 * the whole vector), from it on the ring (2(n-1) steps of 1/n of it).
 * Measured with mwbench allreduce on rxe, f32, ranks as processes in one
 * VM: recursive doubling is 1.8x faster at 16 KiB with 4 ranks and 1.4x
 * with 3; at 64 KiB the two are within 10% (either way) for 2, 3 and 4
 * ranks; at 256 KiB the ring is 1.1-1.4x faster.  Direct (one step: the
 * whole vector to each of the n-1 others, reduced locally) never won:
 * 4 ranks at 4 / 16 / 64 KiB took 1245 / 2346 / 6565 us against recursive
 * doubling's 844 / 1706 / 4823, 3 ranks 795 / 1508 / 4294 against 720 /
 * 1368 / 4008 (2026-11-26, same run): with four processes on two CPUs a
 * rank's cost is its wake-ups (one per chunk in, one per chunk out), and
 * direct has n-1 of each where recursive doubling has log2(n). */
#define ALLREDUCE_RD_BELOW (64u << 10)

/* Every rank picks the same: the size is part of the signature, and the
 * override (MW_ALLREDUCE_ALGO) was fixed at creation, the same on all. */
static enum mw__algo algo_for(const struct mw__comm *comm, enum mw__coll_kind kind, size_t bytes)
{
    if (kind != MW__COLL_ALLREDUCE)
        return MW__ALGO_AUTO;
    if (comm->allreduce_algo != MW__ALGO_AUTO)
        return (enum mw__algo)comm->allreduce_algo;
    return bytes < ALLREDUCE_RD_BELOW ? MW__ALGO_RECURSIVE_DOUBLING : MW__ALGO_RING;
}

static void on_in_registered(void *arg, mw_mr_t *mr, int err)
{
    struct mw__run *k = arg;
    k->mr_in = mr;
    mw__coll_registered(k, err);
}

static void on_out_registered(void *arg, mw_mr_t *mr, int err)
{
    struct mw__run *k = arg;
    k->mr_out = mr;
    mw__coll_registered(k, err);
}

/* The caller's buffer, registered through the cache (free when it was
 * before); a large one not yet registered is, off the loop, and the run
 * waits for it before it starts. */
static int register_user(struct mw__run *k, const void *p, size_t bytes, mw_mr_t **mr,
                         void (*done)(void *arg, mw_mr_t *mr, int err))
{
    int rc = bytes ? mw__reg_async(k->comm->ctx, (void *)p, bytes, mr, done, k) : 0;
    if (rc == 1)
        k->regs_pending++;
    return rc < 0 ? rc : 0;
}

/* Where the result lives and what the input is; 0 or a negative errno. */
static int setup_buffers(struct mw__run *k, const void *in, void *out)
{
    struct mw__comm *comm = k->comm;
    const struct mw__sched_bufs *b = &k->s.bufs;
    size_t res_bytes = b->res_len * k->esz, in_bytes = b->in_len * k->esz;
    if ((b->res_len && res_bytes / b->res_len != k->esz) || (b->ans_len && !out) ||
        (b->in_len && !in))
        return -EINVAL;
    k->out = out;
    if (b->res_len && b->ans_off == 0 && b->ans_len == b->res_len) {
        k->res = out;
    } else if (b->res_len && !(k->res = k->work = mw_alloc(comm->ctx, res_bytes))) {
        return -ENOMEM;
    }
    k->in = in;
    if (b->in_len && k->res) {
        const uint8_t *i8 = in, *r8 = k->res;
        bool overlap = i8 < r8 + res_bytes && r8 < i8 + in_bytes;
        ptrdiff_t shift = (i8 - r8) / (ptrdiff_t)k->esz;
        if (overlap && ((i8 - r8) % (ptrdiff_t)k->esz || !mw__sched_alias_ok(&k->s, shift))) {
            if (!(k->in_copy = mw_alloc(comm->ctx, in_bytes)))
                return -ENOMEM;
            memcpy(k->in_copy, in, in_bytes);
            k->in = k->in_copy;
        }
    }
    int rc = 0;
    /* in place: one registration covers both */
    bool covered = k->res == out && k->in == (const uint8_t *)out && in_bytes <= res_bytes;
    if (k->in != k->in_copy && !covered)
        rc = register_user(k, k->in, in_bytes, &k->mr_in, on_in_registered);
    if (!rc && k->res == out)
        rc = register_user(k, out, res_bytes, &k->mr_out, on_out_registered);
    return rc;
}

static int setup_stage(struct mw__run *k)
{
    size_t max = 0;
    for (int i = 0; i < k->s.nsteps; i++) {
        const struct mw__step *st = &k->s.steps[i];
        if (mw__step_overlaps(k, st) && st->send_len > max)
            max = st->send_len;
    }
    if (max && !(k->stage = mw_alloc(k->comm->ctx, max * k->esz)))
        return -ENOMEM;
    return 0;
}

/* Check the arguments and build @k's schedule and buffers; 0 or a negative
 * errno with *why set. */
static int prepare(struct mw__run *k, enum mw__coll_kind kind, const void *in, void *out,
                   size_t count, int root, const char **why)
{
    bool reducing = kind == MW__COLL_REDUCE || kind == MW__COLL_ALLREDUCE ||
                    kind == MW__COLL_REDUCE_SCATTER;
    *why = "unknown type or op";
    if (!k->esz || (reducing && (unsigned)k->op >= MW_OP_COUNT))
        return -EINVAL;
    int rc = mw__sched_build(kind, algo_for(k->comm, kind, count * k->esz), k->comm->nranks,
                             k->comm->rank, root, count, &k->s);
    *why = rc == -ENOMEM ? "no memory" : "bad count or root";
    if (rc)
        return rc;
    if ((rc = setup_buffers(k, in, out)) < 0) {
        *why = rc == -EINVAL ? "NULL buffer or size overflow" : "cannot register the buffers";
        return rc;
    }
    *why = "no memory";
    return setup_stage(k);
}

/* A collective cannot leave the sequence alone: the other ranks would wait
 * for its part.  Cancelling one (or its deadline) breaks the communicator
 * for every rank; its future fails once its writes in flight are back. */
static void coll_cancel(mw_future_t *f, void *arg)
{
    (void)f;
    struct mw__run *k = arg;
    mw__comm_abort(k->comm, MW__ABORT_CANCELLED, k->comm->rank, -ECANCELED,
                   "%s was cancelled or timed out on rank %d", mw__coll_name(k->s.kind),
                   k->comm->rank);
}

static mw_future_t *start(mw_comm_t *h, const char *fn, enum mw__coll_kind kind, const void *in,
                          void *out, size_t count, mw_dtype_t dt, mw_op_t op, int root)
{
    struct mw__comm *comm;
    mw_future_t *f = mw__comm_future(h, fn, &comm);
    if (!f)
        return NULL;
    if (comm->err) {
        mw_future_fail(f, comm->err, "%s: %s", mw__coll_name(kind), comm->why);
        return f;
    }
    if (comm->close_f) {
        mw_future_fail(f, -ESTALE, "%s: the communicator is closing", mw__coll_name(kind));
        return f;
    }
    struct mw__run *k = mw__calloc(1, sizeof *k);
    if (!k) {                     /* as below: nobody can go on */
        mw_future_fail(f, -ENOMEM, "%s: no memory", mw__coll_name(kind));
        mw__comm_abort(comm, MW__ABORT_LOCAL, comm->rank, -ENOMEM, "%s failed on rank %d "
                       "before it started: no memory", mw__coll_name(kind), comm->rank);
        return f;
    }
    *k = (struct mw__run){.comm = comm, .dt = dt, .op = op, .esz = mw_dtype_size(dt)};
    const char *why;
    int rc = prepare(k, kind, in, out, count, root, &why);
    if (rc) {
        /* The others would wait for this rank's part, and this rank's
         * sequence would be one behind theirs: nobody can go on. */
        mw_future_fail(f, rc, "%s: %s", mw__coll_name(kind), why);
        mw__coll_discard_later(k, rc, why);
        mw__comm_abort(comm, MW__ABORT_LOCAL, comm->rank, rc, "%s failed on rank %d before "
                       "it started: %s", mw__coll_name(kind), comm->rank, why);
        return f;
    }
    k->chunk_elems = comm->opts.slot_size / k->esz;
    k->seq = comm->seq++;
    k->sig_base = mw__coll_signature(kind, k->s.algo, dt, op, count, root);
    k->f = mw_future_ref(f);
    mw__future_on_cancel(f, coll_cancel, k);
    mw__coll_enqueue(comm, k);
    return f;
}

int mw_block_of(size_t count, int nranks, int rank, size_t *off, size_t *len)
{
    if (nranks < 1 || rank < 0 || rank >= nranks || !off || !len)
        return -EINVAL;
    mw__block(count, nranks, rank, off, len);
    return 0;
}

mw_future_t *mw_barrier(mw_comm_t *comm)
{
    return start(comm, __func__, MW__COLL_BARRIER, NULL, NULL, 0, MW_UINT8, MW_SUM, 0);
}

mw_future_t *mw_broadcast(mw_comm_t *comm, void *buf, size_t count, mw_dtype_t dt, int root)
{
    return start(comm, __func__, MW__COLL_BROADCAST, buf, buf, count, dt, MW_SUM, root);
}

mw_future_t *mw_reduce(mw_comm_t *comm, const void *in, void *out, size_t count, mw_dtype_t dt,
                       mw_op_t op, int root)
{
    return start(comm, __func__, MW__COLL_REDUCE, in, out, count, dt, op, root);
}

mw_future_t *mw_allreduce(mw_comm_t *comm, const void *in, void *out, size_t count,
                          mw_dtype_t dt, mw_op_t op)
{
    return start(comm, __func__, MW__COLL_ALLREDUCE, in, out, count, dt, op, 0);
}

mw_future_t *mw_allgather(mw_comm_t *comm, const void *in, void *out, size_t count, mw_dtype_t dt)
{
    return start(comm, __func__, MW__COLL_ALLGATHER, in, out, count, dt, MW_SUM, 0);
}

mw_future_t *mw_reduce_scatter(mw_comm_t *comm, const void *in, void *out, size_t count,
                               mw_dtype_t dt, mw_op_t op)
{
    return start(comm, __func__, MW__COLL_REDUCE_SCATTER, in, out, count, dt, op, 0);
}

mw_future_t *mw_gather(mw_comm_t *comm, const void *in, void *out, size_t count, mw_dtype_t dt,
                       int root)
{
    return start(comm, __func__, MW__COLL_GATHER, in, out, count, dt, MW_SUM, root);
}

mw_future_t *mw_scatter(mw_comm_t *comm, const void *in, void *out, size_t count, mw_dtype_t dt,
                        int root)
{
    return start(comm, __func__, MW__COLL_SCATTER, in, out, count, dt, MW_SUM, root);
}

mw_future_t *mw_alltoall(mw_comm_t *comm, const void *in, void *out, size_t count, mw_dtype_t dt)
{
    return start(comm, __func__, MW__COLL_ALLTOALL, in, out, count, dt, MW_SUM, 0);
}
