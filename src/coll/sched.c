/* Collective schedules (see sched.h for the step model and its execution
 * rule).  Every builder fills a schedule of a length all ranks agree on, so
 * that step i of one rank pairs with step i of its peers; ranks idle in a
 * round keep a no-op step there. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/sched.h"
#include "core/alloc.h"

/* ------------------------------------------------------------------------
 * Rank arithmetic (nranks <= MW__SCHED_MAX_RANKS keeps all of it in int)
 * ------------------------------------------------------------------------ */

static int ceil_log2(int n)
{
    int k = 0;
    while ((1 << k) < n)
        k++;
    return k;
}

static int floor_pow2(int n)
{
    int p = 1;
    while (p <= n / 2)
        p *= 2;
    return p;
}

/* (r + d) mod n for |d| < n: the neighbour d places along the ring. */
static int ring_peer(int r, int d, int n)
{
    return (r + d % n + n) % n;
}

/* Trees and linear patterns are built on ranks relative to the root, so the
 * root is 0 and the shape is the same whoever the root is. */
static int rel_rank(const struct mw__sched *s)
{
    return ring_peer(s->rank, -s->root, s->nranks);
}

static int abs_rank(const struct mw__sched *s, int v)
{
    return ring_peer(v, s->root, s->nranks);
}

/* In a binomial tree rooted at 0, v's children are v + 2^k for every 2^k
 * below v's lowest set bit; so only even v with v + 1 < n have any. */
static bool binomial_has_children(int v, int n)
{
    return v % 2 == 0 && v + 1 < n;
}

/* ------------------------------------------------------------------------
 * Sizes
 * ------------------------------------------------------------------------ */

void mw__block(size_t count, int nranks, int r, size_t *off, size_t *len)
{
    size_t n = (size_t)nranks, b = (size_t)r;
    size_t q = count / n, extra = count % n;

    *len = q + (b < extra ? 1 : 0);
    *off = b * q + (b < extra ? b : extra);
}

static bool is_rooted(enum mw__coll_kind kind)
{
    return kind == MW__COLL_BROADCAST || kind == MW__COLL_REDUCE ||
           kind == MW__COLL_GATHER || kind == MW__COLL_SCATTER;
}

static int check_ranks(enum mw__coll_kind kind, int nranks, int rank, int root)
{
    if ((unsigned)kind >= MW__COLL_COUNT)
        return -EINVAL;
    if (nranks < 1 || nranks > MW__SCHED_MAX_RANKS || rank < 0 || rank >= nranks)
        return -EINVAL;
    if (is_rooted(kind) && (root < 0 || root >= nranks))
        return -EINVAL;
    return 0;
}

static void set_bufs(struct mw__sched_bufs *b, size_t in, size_t res, size_t ans_off,
                     size_t ans_len)
{
    b->in_len = in;
    b->res_len = res;
    b->ans_off = ans_off;
    b->ans_len = ans_len;
}

int mw__sched_sizes(enum mw__coll_kind kind, int nranks, int rank, int root, size_t count,
                    struct mw__sched_bufs *out)
{
    int err = check_ranks(kind, nranks, rank, root);
    size_t n = (size_t)nranks, all, off, len;
    bool is_root = rank == root;

    memset(out, 0, sizeof *out);
    if (err)
        return err;
    if (count > SIZE_MAX / n)
        return -EINVAL;           /* N*count must fit for the blocked kinds */
    all = n * count;
    switch (kind) {
    case MW__COLL_BARRIER:
        break;
    case MW__COLL_BROADCAST:
        set_bufs(out, is_root ? count : 0, count, 0, count);
        break;
    case MW__COLL_REDUCE: {
        int v = ring_peer(rank, -root, nranks);
        bool works = is_root || binomial_has_children(v, nranks);
        set_bufs(out, count, works ? count : 0, 0, is_root ? count : 0);
        break;
    }
    case MW__COLL_ALLREDUCE:
        set_bufs(out, count, count, 0, count);
        break;
    case MW__COLL_REDUCE_SCATTER:
        mw__block(count, nranks, rank, &off, &len);
        set_bufs(out, count, count, off, len);
        break;
    case MW__COLL_ALLGATHER:
        set_bufs(out, count, all, 0, all);
        break;
    case MW__COLL_GATHER:
        set_bufs(out, count, is_root ? all : 0, 0, is_root ? all : 0);
        break;
    case MW__COLL_SCATTER:
        set_bufs(out, is_root ? all : 0, count, 0, count);
        break;
    case MW__COLL_ALLTOALL:
        set_bufs(out, all, all, 0, all);
        break;
    default:
        return -EINVAL;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Algorithms and step counts
 * ------------------------------------------------------------------------ */

static enum mw__algo only_algo(enum mw__coll_kind kind)
{
    switch (kind) {
    case MW__COLL_BARRIER:        return MW__ALGO_DISSEMINATION;
    case MW__COLL_BROADCAST:
    case MW__COLL_REDUCE:         return MW__ALGO_BINOMIAL;
    case MW__COLL_ALLREDUCE:
    case MW__COLL_REDUCE_SCATTER:
    case MW__COLL_ALLGATHER:      return MW__ALGO_RING;
    default:                      return MW__ALGO_DIRECT;
    }
}

/* The algorithm to use, or MW__ALGO_COUNT when @algo does not apply. */
static enum mw__algo resolve_algo(enum mw__coll_kind kind, enum mw__algo algo)
{
    if (algo == MW__ALGO_AUTO)
        return only_algo(kind);
    if (kind == MW__COLL_ALLREDUCE)
        return algo == MW__ALGO_RING || algo == MW__ALGO_RECURSIVE_DOUBLING ||
               algo == MW__ALGO_DIRECT ? algo : MW__ALGO_COUNT;
    return algo == only_algo(kind) ? algo : MW__ALGO_COUNT;
}

static int count_steps(enum mw__coll_kind kind, enum mw__algo algo, int n, size_t count)
{
    if (kind == MW__COLL_BARRIER)
        return ceil_log2(n);
    if (count == 0)
        return 0;                 /* nothing moves; zero-length sends are left out */
    switch (algo) {
    case MW__ALGO_BINOMIAL:
        return ceil_log2(n);
    case MW__ALGO_RECURSIVE_DOUBLING:
        return ceil_log2(floor_pow2(n)) + (floor_pow2(n) < n ? 2 : 0);
    case MW__ALGO_RING:
        return kind == MW__COLL_ALLREDUCE ? 2 * (n - 1) : n - 1;
    default:
        return n - 1;
    }
}

/* ------------------------------------------------------------------------
 * Step construction
 * ------------------------------------------------------------------------ */

/* Zero-length transfers are dropped; the peer computes the same length and
 * drops its half too, so the pairing holds. */
static void put_send(struct mw__step *st, int to, enum mw__buf from, size_t off, size_t len)
{
    if (len == 0)
        return;
    st->send_to = to;
    st->send_from = (uint8_t)from;
    st->send_off = off;
    st->send_len = len;
}

static void put_recv(struct mw__step *st, int from, enum mw__recv_action act, size_t off,
                     size_t len)
{
    if (len == 0)
        return;
    st->recv_from = from;
    st->recv_action = (uint8_t)act;
    st->recv_off = off;
    st->recv_len = len;
}

static void set_copy(struct mw__sched *s, int at, size_t src, size_t dst, size_t len)
{
    s->copy.at = at;
    s->copy.src = src;
    s->copy.dst = dst;
    s->copy.len = len;
}

/* How a ring cuts its vector into N blocks: uneven mw__block() blocks of a
 * whole vector (reduce-scatter, allreduce), or one rank's @count each
 * (allgather). */
struct ring_layout {
    size_t count;
    bool per_rank;
};

static void ring_block(const struct ring_layout *lay, int n, int b, size_t *off, size_t *len)
{
    if (lay->per_rank) {
        *off = (size_t)b * lay->count;
        *len = lay->count;
    } else {
        mw__block(lay->count, n, b, off, len);
    }
}

/* Ring reduce-scatter over N-1 steps from @first: at step j, rank r passes
 * its partial sum of block r-j-1 to r+1 and adds r-1's partial of block
 * r-j-2 into its own copy; the last one received is block r, now complete. */
static void ring_reduce_scatter(struct mw__sched *s, const struct ring_layout *lay, int first)
{
    int n = s->nranks, r = s->rank;
    size_t off, len;

    for (int j = 0; j < n - 1; j++) {
        struct mw__step *st = &s->steps[first + j];
        ring_block(lay, n, ring_peer(r, -j - 1, n), &off, &len);
        put_send(st, ring_peer(r, 1, n), MW__BUF_RESULT, off, len);
        ring_block(lay, n, ring_peer(r, -j - 2, n), &off, &len);
        put_recv(st, ring_peer(r, -1, n), MW__RECV_REDUCE, off, len);
    }
}

/* Ring allgather over N-1 steps from @first: rank r starts with block r
 * complete and at step j forwards block r-j, receiving block r-j-1. */
static void ring_allgather(struct mw__sched *s, const struct ring_layout *lay, int first)
{
    int n = s->nranks, r = s->rank;
    size_t off, len;

    for (int j = 0; j < n - 1; j++) {
        struct mw__step *st = &s->steps[first + j];
        ring_block(lay, n, ring_peer(r, -j, n), &off, &len);
        put_send(st, ring_peer(r, 1, n), MW__BUF_RESULT, off, len);
        ring_block(lay, n, ring_peer(r, -j - 1, n), &off, &len);
        put_recv(st, ring_peer(r, -1, n), MW__RECV_COPY, off, len);
    }
}

/* ------------------------------------------------------------------------
 * One builder per kind/algorithm
 * ------------------------------------------------------------------------ */

/* Dissemination: in round k everyone signals rank+2^k and waits for
 * rank-2^k; after ceil(log2 N) rounds each rank has transitively heard from
 * all others, with no root and no N-is-a-power-of-two requirement. */
static void build_barrier(struct mw__sched *s, size_t count)
{
    (void)count;
    for (int k = 0; k < s->nsteps; k++) {
        s->steps[k].send_to = ring_peer(s->rank, 1 << k, s->nranks);
        s->steps[k].send_from = MW__BUF_RESULT;
        s->steps[k].recv_from = ring_peer(s->rank, -(1 << k), s->nranks);
    }
}

/* Binomial broadcast: in round k the 2^k ranks holding the data (relative
 * ranks below 2^k) each send it to relative rank + 2^k. */
static void build_broadcast(struct mw__sched *s, size_t count)
{
    int n = s->nranks, v = rel_rank(s);

    for (int k = 0; k < s->nsteps; k++) {
        int mask = 1 << k;
        if (v < mask && v + mask < n)
            put_send(&s->steps[k], abs_rank(s, v + mask), MW__BUF_RESULT, 0, count);
        else if (v >= mask && v < 2 * mask)
            put_recv(&s->steps[k], abs_rank(s, v - mask), MW__RECV_COPY, 0, count);
    }
    if (v == 0)
        set_copy(s, 0, 0, 0, count);
}

/* Binomial reduce, the broadcast mirrored: in round k a rank whose lowest
 * set bit is 2^k sends its subtree's sum to v - 2^k, which adds it in.
 * Leaves send their input directly and need no result buffer. */
static void build_reduce(struct mw__sched *s, size_t count)
{
    int n = s->nranks, v = rel_rank(s);
    bool works = v == 0 || binomial_has_children(v, n);

    for (int k = 0; k < s->nsteps; k++) {
        int mask = 1 << k;
        struct mw__step *st = &s->steps[k];
        if (v & mask) {
            if ((v & (mask - 1)) == 0)
                put_send(st, abs_rank(s, v - mask), works ? MW__BUF_RESULT : MW__BUF_INPUT,
                         0, count);
        } else if ((v & (mask - 1)) == 0 && v + mask < n) {
            put_recv(st, abs_rank(s, v + mask), MW__RECV_REDUCE, 0, count);
        }
    }
    if (works)
        set_copy(s, 0, 0, 0, count);
}

static void build_allreduce_ring(struct mw__sched *s, size_t count)
{
    struct ring_layout lay = { count, false };

    set_copy(s, 0, 0, 0, count);
    ring_reduce_scatter(s, &lay, 0);
    ring_allgather(s, &lay, s->nranks - 1);
}

/* Recursive doubling on the p = 2^floor(log2 N) ranks, the other N-p folded
 * in first and out last (MPICH's scheme): among ranks 0..2(N-p)-1 each even
 * rank hands its vector to the odd rank above it and sits out; the p active
 * ranks are renumbered 0..p-1. */
static int rd_new_rank(int r, int extra)
{
    if (r < 2 * extra)
        return r % 2 ? r / 2 : -1;
    return r - extra;
}

static int rd_old_rank(int nr, int extra)
{
    return nr < extra ? 2 * nr + 1 : nr + extra;
}

static void build_allreduce_rd(struct mw__sched *s, size_t count)
{
    int r = s->rank, p = floor_pow2(s->nranks), extra = s->nranks - p;
    int nr = rd_new_rank(r, extra), i = 0;

    set_copy(s, 0, 0, 0, count);
    if (extra) {
        if (r < 2 * extra && r % 2 == 0)
            put_send(&s->steps[i], r + 1, MW__BUF_RESULT, 0, count);
        else if (r < 2 * extra)
            put_recv(&s->steps[i], r - 1, MW__RECV_REDUCE, 0, count);
        i++;
    }
    for (int mask = 1; mask < p; mask *= 2, i++) {
        if (nr < 0)
            continue;
        /* Both partners send and receive the same whole vector in one step:
         * safe because a receive is applied after the own send read it. */
        int peer = rd_old_rank(nr ^ mask, extra);
        put_send(&s->steps[i], peer, MW__BUF_RESULT, 0, count);
        put_recv(&s->steps[i], peer, MW__RECV_REDUCE, 0, count);
    }
    if (extra) {
        if (r < 2 * extra && r % 2 == 0)
            put_recv(&s->steps[i], r + 1, MW__RECV_COPY, 0, count);
        else if (r < 2 * extra)
            put_send(&s->steps[i], r - 1, MW__BUF_RESULT, 0, count);
    }
}

/* Direct: one step per peer, rotated so all links are busy at once.  Sends
 * read the input because result already holds partial sums. */
static void build_allreduce_direct(struct mw__sched *s, size_t count)
{
    int n = s->nranks, r = s->rank;

    set_copy(s, 0, 0, 0, count);
    for (int k = 1; k < n; k++) {
        put_send(&s->steps[k - 1], ring_peer(r, k, n), MW__BUF_INPUT, 0, count);
        put_recv(&s->steps[k - 1], ring_peer(r, -k, n), MW__RECV_REDUCE, 0, count);
    }
}

static void build_allreduce(struct mw__sched *s, size_t count)
{
    if (s->algo == MW__ALGO_RING)
        build_allreduce_ring(s, count);
    else if (s->algo == MW__ALGO_RECURSIVE_DOUBLING)
        build_allreduce_rd(s, count);
    else
        build_allreduce_direct(s, count);
}

static void build_reduce_scatter(struct mw__sched *s, size_t count)
{
    struct ring_layout lay = { count, false };

    set_copy(s, 0, 0, 0, count);
    ring_reduce_scatter(s, &lay, 0);
}

static void build_allgather(struct mw__sched *s, size_t count)
{
    struct ring_layout lay = { count, true };

    set_copy(s, 0, 0, (size_t)s->rank * count, count);
    ring_allgather(s, &lay, 0);
}

/* Linear gather: relative rank v sends at step v-1.  All of it must cross
 * the root's link anyway, and since the idle steps before a send are no-ops
 * every rank actually sends at once, into its own scratch area at the root. */
static void build_gather(struct mw__sched *s, size_t count)
{
    int v = rel_rank(s);

    if (v == 0) {
        set_copy(s, 0, 0, (size_t)s->root * count, count);
        for (int k = 1; k < s->nranks; k++)
            put_recv(&s->steps[k - 1], abs_rank(s, k), MW__RECV_COPY,
                     (size_t)abs_rank(s, k) * count, count);
    } else {
        put_send(&s->steps[v - 1], s->root, MW__BUF_INPUT, 0, count);
    }
}

/* Linear scatter, the gather mirrored.  The root's own block is copied
 * last: with input and result at the same address (in-place) that copy
 * overwrites input block 0, which must have been sent by then. */
static void build_scatter(struct mw__sched *s, size_t count)
{
    int v = rel_rank(s);

    if (v == 0) {
        for (int k = 1; k < s->nranks; k++)
            put_send(&s->steps[k - 1], abs_rank(s, k), MW__BUF_INPUT,
                     (size_t)abs_rank(s, k) * count, count);
        set_copy(s, s->nsteps, (size_t)s->root * count, 0, count);
    } else {
        put_recv(&s->steps[v - 1], s->root, MW__RECV_COPY, 0, count);
    }
}

/* Pairwise exchange: step k-1 sends block rank+k to rank+k and receives
 * block rank-k from rank-k, so every rank sends and receives once per step. */
static void build_alltoall(struct mw__sched *s, size_t count)
{
    int n = s->nranks, r = s->rank;

    set_copy(s, 0, (size_t)r * count, (size_t)r * count, count);
    for (int k = 1; k < n; k++) {
        int to = ring_peer(r, k, n), from = ring_peer(r, -k, n);
        put_send(&s->steps[k - 1], to, MW__BUF_INPUT, (size_t)to * count, count);
        put_recv(&s->steps[k - 1], from, MW__RECV_COPY, (size_t)from * count, count);
    }
}

typedef void (*build_fn)(struct mw__sched *s, size_t count);

static const build_fn builders[MW__COLL_COUNT] = {
    [MW__COLL_BARRIER] = build_barrier,
    [MW__COLL_BROADCAST] = build_broadcast,
    [MW__COLL_REDUCE] = build_reduce,
    [MW__COLL_ALLREDUCE] = build_allreduce,
    [MW__COLL_REDUCE_SCATTER] = build_reduce_scatter,
    [MW__COLL_ALLGATHER] = build_allgather,
    [MW__COLL_GATHER] = build_gather,
    [MW__COLL_SCATTER] = build_scatter,
    [MW__COLL_ALLTOALL] = build_alltoall,
};

/* ------------------------------------------------------------------------
 * Public entry points
 * ------------------------------------------------------------------------ */

static void init_steps(struct mw__sched *s)
{
    static const struct mw__step noop = { .send_to = -1, .recv_from = -1 };

    for (int i = 0; i < s->nsteps; i++)
        s->steps[i] = noop;
}

static size_t max_recv(const struct mw__sched *s)
{
    size_t m = 0;

    for (int i = 0; i < s->nsteps; i++)
        if (s->steps[i].recv_len > m)
            m = s->steps[i].recv_len;
    return m;
}

int mw__sched_build(enum mw__coll_kind kind, enum mw__algo algo, int nranks, int rank, int root,
                    size_t count, struct mw__sched *out)
{
    struct mw__sched_bufs bufs;
    enum mw__algo a;
    int err;

    memset(out, 0, sizeof *out);
    err = mw__sched_sizes(kind, nranks, rank, root, count, &bufs);
    if (err)
        return err;
    a = (unsigned)algo < MW__ALGO_COUNT ? resolve_algo(kind, algo) : MW__ALGO_COUNT;
    if (a == MW__ALGO_COUNT)
        return -EINVAL;
    out->nsteps = count_steps(kind, a, nranks, count);
    if (out->nsteps > 0) {
        out->steps = mw__calloc((size_t)out->nsteps, sizeof *out->steps);
        if (!out->steps) {
            out->nsteps = 0;
            return -ENOMEM;
        }
    }
    out->kind = kind;
    out->algo = a;
    out->nranks = nranks;
    out->rank = rank;
    out->root = is_rooted(kind) ? root : 0;
    out->bufs = bufs;
    init_steps(out);
    /* count 0 moves nothing: no steps, no copy (barrier ignores count) */
    if (count > 0 || kind == MW__COLL_BARRIER)
        builders[kind](out, count);
    out->scratch_len = max_recv(out);
    return 0;
}

void mw__sched_free(struct mw__sched *s)
{
    mw__free(s->steps);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------------------
 * Aliasing check
 * ------------------------------------------------------------------------ */

/* Do input[in_off, +in_len) and result[res_off, +res_len) share memory when
 * input[i] is result[i + shift]?  Offsets are element counts of buffers that
 * exist, far below INTMAX_MAX, so the signed arithmetic cannot overflow. */
static bool alias_overlap(size_t in_off, size_t in_len, size_t res_off, size_t res_len,
                          ptrdiff_t shift)
{
    intmax_t a = (intmax_t)in_off + shift, b = (intmax_t)res_off;

    if (in_len == 0 || res_len == 0)
        return false;
    return a < b + (intmax_t)res_len && b < a + (intmax_t)in_len;
}

/* Did anything before step @upto (and the local copy, if @copy_done) write
 * result over input[off, +len)? */
static bool written_before(const struct mw__sched *s, int upto, bool copy_done, size_t off,
                           size_t len, ptrdiff_t shift)
{
    const struct mw__sched_copy *c = &s->copy;
    bool self_copy = (intmax_t)c->src + shift == (intmax_t)c->dst;

    if (copy_done && !self_copy && alias_overlap(off, len, c->dst, c->len, shift))
        return true;
    for (int j = 0; j < upto; j++) {
        const struct mw__step *st = &s->steps[j];
        if (st->recv_from >= 0 && alias_overlap(off, len, st->recv_off, st->recv_len, shift))
            return true;
    }
    return false;
}

bool mw__sched_alias_ok(const struct mw__sched *s, ptrdiff_t shift)
{
    /* The copy reads input before it writes (memmove), so only earlier
     * receives can spoil its source. */
    if (s->copy.len && written_before(s, s->copy.at, false, s->copy.src, s->copy.len, shift))
        return false;
    for (int i = 0; i < s->nsteps; i++) {
        const struct mw__step *st = &s->steps[i];
        if (st->send_to < 0 || st->send_from != MW__BUF_INPUT)
            continue;
        if (written_before(s, i, s->copy.at <= i, st->send_off, st->send_len, shift))
            return false;
    }
    return true;
}

/* ------------------------------------------------------------------------
 * Names
 * ------------------------------------------------------------------------ */

const char *mw__coll_name(enum mw__coll_kind kind)
{
    static const char *const names[MW__COLL_COUNT] = {
        "barrier", "broadcast", "reduce", "allreduce", "reduce_scatter",
        "allgather", "gather", "scatter", "alltoall",
    };
    return (unsigned)kind < MW__COLL_COUNT ? names[kind] : "?";
}

const char *mw__algo_name(enum mw__algo algo)
{
    static const char *const names[MW__ALGO_COUNT] = {
        "auto", "ring", "recursive_doubling", "direct", "binomial", "dissemination",
    };
    return (unsigned)algo < MW__ALGO_COUNT ? names[algo] : "?";
}
