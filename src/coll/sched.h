/* Collective schedules: for one rank of an N-rank communicator, the list of
 * steps (send this range to that peer, receive that range from this peer and
 * copy or reduce it into the result) that performs a collective.  Pure
 * arithmetic, no transport: the executor runs the steps over RDMA, and
 * tests/unit/test_sched.c proves every schedule correct by simulation.
 *
 * Buffers.  A schedule works on two buffers of the collective's elements:
 *   input   read only, never written;
 *   result  written only by the local copy and by receives, read by sends
 *           with send_from == MW__BUF_RESULT.
 * All offsets and lengths are in ELEMENTS; the executor multiplies by the
 * dtype size.  Their sizes, and where this rank's answer lies in result,
 * come from mw__sched_sizes() (table there).  The result buffer is a working
 * buffer: for reduce-scatter it holds all count elements (the partial sums
 * travel through it) and the answer is one block of it; a rank whose answer
 * is empty may still need it as workspace (an interior node of a reduce).
 *
 * Execution rule, per rank (the executor must honour it; the simulator in
 * tests/unit/test_sched.c models it exactly):
 *   - Local copy: result[copy.dst, +len) = input[copy.src, +len), done just
 *     before step copy.at starts (copy.at == nsteps: after the last step).
 *     Use memmove semantics: input and result may overlap (in-place).
 *   - Steps run in order; step i starts when step i-1 has completed.
 *   - Send (send_to >= 0): send_len elements of buffer send_from from
 *     send_off go to rank send_to, into send_to's scratch area for this rank.
 *   - Receive (recv_from >= 0): recv_len elements from rank recv_from arrive
 *     in this rank's scratch area for recv_from and are copied
 *     (MW__RECV_COPY) or reduced (MW__RECV_REDUCE: result[x] = result[x] op
 *     scratch[x]) into result[recv_off, +recv_len); the scratch area is then
 *     free for the peer's next send.
 *   - Within a step, the send reads its source as it was when the step
 *     started: the receive must not change it first.  This is what lets one
 *     step send and receive the same result range (recursive doubling, ring
 *     steps on small blocks).  The executor may wait for the send's local
 *     completion before applying an overlapping receive, or send from a
 *     private copy taken at step start; an executor that pushes a step
 *     through fewer scratch slots than it has chunks must do the latter (or
 *     every rank of a ring would wait for its successor's acks).  Receives
 *     that do not overlap the send's source may be applied on arrival.
 *   - Step i completes when its send completed and its receive was applied.
 * Pairing: every rank's schedule of one collective has the same nsteps, and
 * if rank r's step i sends to p then p's step i receives from r, with
 * recv_len == send_len (and conversely).  The step index is thus a tag both
 * sides agree on (e.g. carried in the write's immediate).  Steps with
 * neither send nor receive are no-ops that complete at once.
 * Flow control: a sender must not write into a peer's scratch area for it
 * before the peer freed the previous data from it (one slot per ordered
 * pair suffices: a peer's receives from one sender are in step order).
 * Executing all ranks in lock-step rounds is one valid execution; any
 * execution obeying these rules computes the same values (each value depends
 * only on per-rank order and pairing) and cannot deadlock (every wait is on
 * a step of the same round or an earlier one).
 * Scratch: mw__sched.scratch_len elements per peer suffice.  The executor
 * may split one step's range into pipelined chunks: copy and reduce are
 * elementwise.
 * Zero-length transfers are left out on both sides (both compute the same
 * length); only the barrier keeps them, its zero-length messages being the
 * point.  A data collective with count 0 has no steps.
 *
 * Reductions assume an associative and commutative op (sum, prod, min, max).
 * With floating point, ring, recursive doubling and binomial trees give the
 * same bits on every rank that holds an answer; DIRECT allreduce does not
 * (each rank sums in its own order), one more reason to keep it for tiny
 * counts only.
 */
#ifndef MW_COLL_SCHED_H
#define MW_COLL_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest communicator a schedule is built for.  A full mesh needs N-1
 * RC connections per rank, so this is far beyond any real mesh; the bound
 * keeps step counts and rank arithmetic within int. */
#define MW__SCHED_MAX_RANKS (1 << 20)

enum mw__coll_kind {
    MW__COLL_BARRIER = 0,
    MW__COLL_BROADCAST,
    MW__COLL_REDUCE,
    MW__COLL_ALLREDUCE,
    MW__COLL_REDUCE_SCATTER,
    MW__COLL_ALLGATHER,
    MW__COLL_GATHER,
    MW__COLL_SCATTER,
    MW__COLL_ALLTOALL,
    MW__COLL_COUNT
};

/* Algorithms.  Every kind has exactly one except allreduce:
 *   BARRIER         DISSEMINATION       ceil(log2 N) steps of zero-length sends
 *   BROADCAST       BINOMIAL            ceil(log2 N) steps, tree rooted at root
 *   REDUCE          BINOMIAL            ceil(log2 N) steps, tree rooted at root
 *   ALLREDUCE       RING                2(N-1) steps, bandwidth-optimal
 *                   RECURSIVE_DOUBLING  log2 p steps (+2 when N is not a power
 *                                       of two p: fold the extra ranks in/out)
 *                   DIRECT              N-1 steps, everyone sends everything
 *   REDUCE_SCATTER  RING                N-1 steps
 *   ALLGATHER       RING                N-1 steps
 *   GATHER          DIRECT              N-1 steps, root receives one per step
 *   SCATTER         DIRECT              N-1 steps, root sends one per step
 *   ALLTOALL        DIRECT              N-1 steps, step k: to rank+k, from rank-k
 * MW__ALGO_AUTO picks that one algorithm, RING for allreduce: choosing by
 * message size needs bytes and link figures, the caller's business. */
enum mw__algo {
    MW__ALGO_AUTO = 0,
    MW__ALGO_RING,
    MW__ALGO_RECURSIVE_DOUBLING,
    MW__ALGO_DIRECT,
    MW__ALGO_BINOMIAL,
    MW__ALGO_DISSEMINATION,
    MW__ALGO_COUNT
};

enum mw__buf { MW__BUF_INPUT = 0, MW__BUF_RESULT };
enum mw__recv_action { MW__RECV_COPY = 0, MW__RECV_REDUCE };

/* One step; -1 in send_to / recv_from means no send / no receive (the other
 * fields of that half are then 0). */
struct mw__step {
    int send_to;
    int recv_from;
    size_t send_off, send_len;    /* in the send_from buffer */
    size_t recv_off, recv_len;    /* in result */
    uint8_t send_from;            /* enum mw__buf */
    uint8_t recv_action;          /* enum mw__recv_action */
};

/* This rank's buffers, in elements. */
struct mw__sched_bufs {
    size_t in_len;                /* input elements read (0: input unused) */
    size_t res_len;               /* result elements read and written */
    size_t ans_off, ans_len;      /* the answer: result[ans_off, +ans_len) */
};

/* The local copy input -> result (len 0: none); see the execution rule. */
struct mw__sched_copy {
    int at;                       /* done just before step @at (nsteps: after all) */
    size_t src, dst, len;
};

struct mw__sched {
    struct mw__step *steps;       /* nsteps entries, owned; mw__sched_free() */
    int nsteps;
    enum mw__coll_kind kind;
    enum mw__algo algo;           /* resolved, never AUTO */
    int nranks, rank, root;
    struct mw__sched_bufs bufs;
    struct mw__sched_copy copy;
    size_t scratch_len;           /* largest recv_len: scratch per peer, elements */
};

/**
 * mw__sched_sizes() - buffer sizes and answer range of @rank, in elements.
 * @count: as the public API's count: per rank for allgather, gather,
 *         scatter and alltoall (each rank's block); the whole vector for
 *         broadcast, reduce, allreduce and reduce_scatter; ignored by barrier.
 * @root: ignored by the unrooted kinds.
 *
 *   kind            in_len             res_len               answer
 *   BARRIER         0                  0                     -
 *   BROADCAST       count at root,     count                 all
 *                   else 0
 *   REDUCE          count              count at the root and at   all at root,
 *                                      tree nodes with children,  none elsewhere
 *                                      else 0 (leaves send input)
 *   ALLREDUCE       count              count                 all
 *   REDUCE_SCATTER  count              count (workspace)     block rank (mw__block)
 *   ALLGATHER       count              N*count               all (block b from rank b)
 *   GATHER          count              N*count at root, else 0    all at root
 *   SCATTER         N*count at root,   count                 all
 *                   else 0
 *   ALLTOALL        N*count            N*count               all (block b from rank b)
 *
 * Return: 0, or -EINVAL for a bad kind, nranks (1..MW__SCHED_MAX_RANKS),
 * rank or root (rooted kinds), or when N*count overflows size_t.
 */
int mw__sched_sizes(enum mw__coll_kind kind, int nranks, int rank, int root, size_t count,
                    struct mw__sched_bufs *out);

/**
 * mw__block() - block @r of @count elements split over @nranks: the first
 * count % nranks blocks have one element more; blocks are contiguous and in
 * rank order.  Requires nranks >= 1 and 0 <= r < nranks.
 */
void mw__block(size_t count, int nranks, int r, size_t *off, size_t *len);

/**
 * mw__sched_build() - the schedule of @rank for one collective.
 * @algo: MW__ALGO_AUTO or the kind's algorithm (table above).
 * @out: filled; on error zeroed (mw__sched_free() is still safe).
 * Deterministic: the same arguments give the same schedule.  Allocates only
 * @out->steps.  Thread-safe (no shared state).
 * Return: 0, -EINVAL (bad argument, algorithm not available for @kind, see
 * mw__sched_sizes), or -ENOMEM.
 */
int mw__sched_build(enum mw__coll_kind kind, enum mw__algo algo, int nranks, int rank, int root,
                    size_t count, struct mw__sched *out);

/* mw__sched_free() - release @s->steps and zero @s; safe on a zeroed one. */
void mw__sched_free(struct mw__sched *s);

/**
 * mw__sched_alias_ok() - may input and result share memory, placed so that
 * input[i] is result[i + @shift]?  True when no read of input (the local
 * copy, sends from MW__BUF_INPUT) comes after a write of result (the local
 * copy unless it maps onto itself, receives) that overlaps it.  In-place as
 * the public API means it (same pointer) is @shift 0; it is true for every
 * kind except ALLTOALL and DIRECT allreduce with N >= 3 and count > 0,
 * where the executor must first copy the input aside.
 * O(nsteps * receives): cache the answer with the schedule.
 */
bool mw__sched_alias_ok(const struct mw__sched *s, ptrdiff_t shift);

/* mw__coll_name() / mw__algo_name() - "allreduce", "ring"...; "?" if unknown. */
const char *mw__coll_name(enum mw__coll_kind kind);
const char *mw__algo_name(enum mw__algo algo);

#endif
