/* Collective schedules, proved by simulation.
 *
 * The simulator runs the N schedules of one collective in lock-step rounds
 * (round i = step i on every rank) over int64 buffers, exactly as
 * coll/sched.h's execution rule says: the local copy just before step
 * copy.at; in each round first every send (which therefore reads its source
 * as it was when the step started) lands in the receiver's scratch area for
 * the sender, then every receive is copied or sum-reduced from there into
 * the result.  Lock-step is one valid execution of the rule, and the rule
 * makes every valid execution compute the same values.  Before each round it
 * checks that the schedules pair up (r sends to p with len L iff p receives
 * from r with len L), and on every access that it stays inside the buffer
 * sizes of mw__sched_sizes().  At the end each rank's answer is compared
 * with a reference computed directly from the inputs.
 *
 * Buffers are allocated at their exact sizes so ASan/valgrind would catch
 * what the explicit range checks missed; the aliased (in-place) runs put
 * input and result in one allocation. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "coll/sched.h"

#define MAXN 9
#define POISON INT64_C(-0x5a5a5a5a5a5a5a5b)

typedef int64_t el_t;

/* How input and result of each rank are laid out. */
enum alias_mode {
    ALIAS_NONE,       /* separate buffers */
    ALIAS_SAME,       /* same address (the public API's in-place) */
    ALIAS_COPY,       /* placed so the local copy maps onto itself (MPI style) */
    ALIAS_FORCE,      /* same address even where mw__sched_alias_ok() says no */
};

struct rank_state {
    struct mw__sched s;
    el_t *mem;                /* the aliased allocation, or NULL */
    el_t *in, *res;
    el_t *scratch[MAXN];      /* written by each peer, s.scratch_len elements */
    bool full[MAXN];          /* scratch from that peer not applied yet */
    uint32_t heard;           /* ranks this one has (transitively) heard from */
    uint32_t msg_heard[MAXN]; /* what each peer's message in scratch carried */
    size_t sent;              /* elements sent */
};

struct sim {
    enum mw__coll_kind kind;
    enum mw__algo algo;
    int n, root;
    size_t count;
    enum alias_mode mode;
    struct rank_state r[MAXN];
};

static const size_t big_count = 4096 + 3;

/* ------------------------------------------------------------------------
 * Reference
 * ------------------------------------------------------------------------ */

/* Distinct everywhere: the rank in the high half, the index in the low. */
static el_t in_val(int rank, size_t i)
{
    return (el_t)(((uint64_t)(rank + 1) << 32) + i);
}

static el_t sum_over_ranks(int n, size_t i)
{
    el_t s = 0;
    for (int q = 0; q < n; q++)
        s += in_val(q, i);
    return s;
}

/* The value result[j] of @rank must hold, j inside its answer. */
static el_t expect(const struct sim *m, int rank, size_t j)
{
    size_t c = m->count;

    switch (m->kind) {
    case MW__COLL_BROADCAST:
        return in_val(m->root, j);
    case MW__COLL_REDUCE:
    case MW__COLL_ALLREDUCE:
    case MW__COLL_REDUCE_SCATTER:
        return sum_over_ranks(m->n, j);
    case MW__COLL_ALLGATHER:
    case MW__COLL_GATHER:
        return in_val((int)(j / c), j % c);
    case MW__COLL_SCATTER:
        return in_val(m->root, (size_t)rank * c + j);
    case MW__COLL_ALLTOALL:
        return in_val((int)(j / c), (size_t)rank * c + j % c);
    default:
        return POISON;
    }
}

/* Where @rank's answer must be, from the collective's meaning alone. */
static void expect_answer(const struct sim *m, int rank, size_t *off, size_t *len)
{
    size_t c = m->count, all = (size_t)m->n * c;
    bool root = rank == m->root;

    *off = 0;
    switch (m->kind) {
    case MW__COLL_BARRIER:        *len = 0; break;
    case MW__COLL_BROADCAST:
    case MW__COLL_ALLREDUCE:
    case MW__COLL_SCATTER:        *len = c; break;
    case MW__COLL_REDUCE:         *len = root ? c : 0; break;
    case MW__COLL_REDUCE_SCATTER: mw__block(c, m->n, rank, off, len); break;
    case MW__COLL_GATHER:         *len = root ? all : 0; break;
    default:                      *len = all; break;
    }
}

static int ceil_log2(int n)
{
    int k = 0;
    while ((1 << k) < n)
        k++;
    return k;
}

/* Steps (rounds) each algorithm must take: its latency. */
static int expect_nsteps(const struct sim *m)
{
    int n = m->n, p = 1;

    if (m->kind == MW__COLL_BARRIER)
        return ceil_log2(n);
    if (m->count == 0)
        return 0;
    if (m->kind == MW__COLL_BROADCAST || m->kind == MW__COLL_REDUCE)
        return ceil_log2(n);
    if (m->kind == MW__COLL_ALLREDUCE && m->algo == MW__ALGO_RING)
        return 2 * (n - 1);
    if (m->algo == MW__ALGO_RECURSIVE_DOUBLING) {
        while (p * 2 <= n)
            p *= 2;
        return ceil_log2(p) + (p < n ? 2 : 0);
    }
    return n - 1;
}

/* ------------------------------------------------------------------------
 * Checks with the case in the message
 * ------------------------------------------------------------------------ */

static void describe(const struct sim *m)
{
    static const char *const modes[] = { "separate", "same address", "copy in place",
                                         "forced same" };
    print_error("case: %s/%s nranks=%d root=%d count=%zu buffers=%s\n",
                mw__coll_name(m->kind), mw__algo_name(m->algo), m->n, m->root, m->count,
                modes[m->mode]);
}

#define CHECK(m, cond, ...)                                                   \
    do {                                                                      \
        if (!(cond)) {                                                        \
            describe(m);                                                      \
            fail_msg(__VA_ARGS__);                                            \
        }                                                                     \
    } while (0)

static bool in_range(size_t off, size_t len, size_t size)
{
    return off <= size && len <= size - off;
}

/* Static properties of one rank's schedule. */
static void check_sched(const struct sim *m, int rank)
{
    const struct mw__sched *s = &m->r[rank].s;
    const struct mw__sched_bufs *b = &s->bufs;
    struct mw__sched_bufs ref;
    size_t max_recv = 0, aoff, alen;

    assert_int_equal(mw__sched_sizes(m->kind, m->n, rank, m->root, m->count, &ref), 0);
    CHECK(m, !memcmp(&ref, b, sizeof ref), "rank %d: bufs differ from mw__sched_sizes", rank);
    expect_answer(m, rank, &aoff, &alen);
    CHECK(m, b->ans_off == aoff && b->ans_len == alen, "rank %d: answer range", rank);
    CHECK(m, in_range(b->ans_off, b->ans_len, b->res_len), "rank %d: answer outside result", rank);
    CHECK(m, s->nsteps == expect_nsteps(m), "rank %d: %d steps", rank, s->nsteps);
    CHECK(m, s->algo != MW__ALGO_AUTO && s->rank == rank && s->nranks == m->n, "identity");
    CHECK(m, s->copy.at >= 0 && s->copy.at <= s->nsteps, "rank %d: copy.at", rank);
    CHECK(m, in_range(s->copy.src, s->copy.len, b->in_len) &&
             in_range(s->copy.dst, s->copy.len, b->res_len), "rank %d: copy range", rank);
    for (int i = 0; i < s->nsteps; i++) {
        const struct mw__step *st = &s->steps[i];
        CHECK(m, st->send_to >= -1 && st->send_to < m->n && st->send_to != rank,
              "rank %d step %d: send_to %d", rank, i, st->send_to);
        CHECK(m, st->recv_from >= -1 && st->recv_from < m->n && st->recv_from != rank,
              "rank %d step %d: recv_from %d", rank, i, st->recv_from);
        CHECK(m, st->send_to >= 0 || (st->send_len == 0 && st->send_off == 0),
              "rank %d step %d: stray send fields", rank, i);
        CHECK(m, st->recv_from >= 0 || (st->recv_len == 0 && st->recv_off == 0),
              "rank %d step %d: stray receive fields", rank, i);
        CHECK(m, st->send_from <= MW__BUF_RESULT && st->recv_action <= MW__RECV_REDUCE,
              "rank %d step %d: enum values", rank, i);
        /* only the barrier sends empty messages */
        CHECK(m, m->kind == MW__COLL_BARRIER || st->send_to < 0 || st->send_len > 0,
              "rank %d step %d: empty send", rank, i);
        if (st->recv_len > max_recv)
            max_recv = st->recv_len;
    }
    CHECK(m, s->scratch_len == max_recv, "rank %d: scratch_len", rank);
}

/* Round @i: "each rank's sends and receives add up". */
static void check_pairing(const struct sim *m, int i)
{
    for (int r = 0; r < m->n; r++) {
        const struct mw__step *st = &m->r[r].s.steps[i];
        if (st->send_to >= 0) {
            const struct mw__step *peer = &m->r[st->send_to].s.steps[i];
            CHECK(m, peer->recv_from == r && peer->recv_len == st->send_len,
                  "step %d: %d sends %zu to %d, which receives %zu from %d", i, r,
                  st->send_len, st->send_to, peer->recv_len, peer->recv_from);
        }
        if (st->recv_from >= 0)
            CHECK(m, m->r[st->recv_from].s.steps[i].send_to == r,
                  "step %d: %d receives from %d, which sends to %d", i, r, st->recv_from,
                  m->r[st->recv_from].s.steps[i].send_to);
    }
}

/* ------------------------------------------------------------------------
 * The simulator
 * ------------------------------------------------------------------------ */

static el_t *alloc_els(size_t n)
{
    el_t *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    return p;
}

static bool wants_alias(const struct sim *m, const struct mw__sched *s, ptrdiff_t shift)
{
    return m->mode == ALIAS_FORCE || mw__sched_alias_ok(s, shift);
}

/* Lay out input and result, poison result, fill input. */
static void setup_buffers(struct sim *m, struct rank_state *rs, int rank)
{
    const struct mw__sched_bufs *b = &rs->s.bufs;
    ptrdiff_t shift = 0;
    size_t total;

    if (m->mode == ALIAS_COPY && rs->s.copy.len)
        shift = (ptrdiff_t)rs->s.copy.dst - (ptrdiff_t)rs->s.copy.src;
    if (m->mode != ALIAS_NONE && wants_alias(m, &rs->s, shift)) {
        /* input[i] is result[i + shift] */
        size_t in_at = shift > 0 ? (size_t)shift : 0, res_at = shift < 0 ? (size_t)-shift : 0;
        total = in_at + b->in_len > res_at + b->res_len ? in_at + b->in_len
                                                          : res_at + b->res_len;
        rs->mem = alloc_els(total);
        rs->in = rs->mem + in_at;
        rs->res = rs->mem + res_at;
    } else {
        rs->in = alloc_els(b->in_len);
        rs->res = alloc_els(b->res_len);
    }
    for (size_t j = 0; j < b->res_len; j++)
        rs->res[j] = POISON;
    for (size_t j = 0; j < b->in_len; j++)
        rs->in[j] = in_val(rank, j);
    for (int p = 0; p < m->n; p++)
        rs->scratch[p] = alloc_els(rs->s.scratch_len);
    rs->heard = 1u << rank;
}

static void sim_init(struct sim *m, enum mw__coll_kind kind, enum mw__algo algo, int n,
                     int root, size_t count, enum alias_mode mode)
{
    memset(m, 0, sizeof *m);
    m->kind = kind;
    m->algo = algo;
    m->n = n;
    m->root = root;
    m->count = count;
    m->mode = mode;
    for (int r = 0; r < n; r++) {
        int err = mw__sched_build(kind, algo, n, r, root, count, &m->r[r].s);
        CHECK(m, err == 0, "rank %d: build returned %d", r, err);
        check_sched(m, r);
        CHECK(m, m->r[r].s.nsteps == m->r[0].s.nsteps, "ranks disagree on nsteps");
    }
    for (int r = 0; r < n; r++)
        setup_buffers(m, &m->r[r], r);
}

static void sim_free(struct sim *m)
{
    for (int r = 0; r < m->n; r++) {
        struct rank_state *rs = &m->r[r];
        if (rs->mem) {
            free(rs->mem);
        } else {
            free(rs->in);
            free(rs->res);
        }
        for (int p = 0; p < m->n; p++)
            free(rs->scratch[p]);
        mw__sched_free(&rs->s);
    }
}

static void local_copy(struct sim *m, int i)
{
    for (int r = 0; r < m->n; r++) {
        struct rank_state *rs = &m->r[r];
        const struct mw__sched_copy *c = &rs->s.copy;
        if (c->at == i && c->len)
            memmove(rs->res + c->dst, rs->in + c->src, c->len * sizeof(el_t));
    }
}

/* Every send of the round: source -> receiver's scratch area for the sender. */
static void do_sends(struct sim *m, int i)
{
    for (int r = 0; r < m->n; r++) {
        struct rank_state *rs = &m->r[r];
        const struct mw__step *st = &rs->s.steps[i];
        if (st->send_to < 0)
            continue;
        struct rank_state *to = &m->r[st->send_to];
        bool from_in = st->send_from == MW__BUF_INPUT;
        size_t size = from_in ? rs->s.bufs.in_len : rs->s.bufs.res_len;
        CHECK(m, in_range(st->send_off, st->send_len, size),
              "rank %d step %d: send [%zu,+%zu) outside %s of %zu", r, i, st->send_off,
              st->send_len, from_in ? "input" : "result", size);
        CHECK(m, st->send_len <= to->s.scratch_len, "step %d: %d overflows %d's scratch", i, r,
              st->send_to);
        CHECK(m, !to->full[r], "step %d: %d overwrites unconsumed scratch at %d", i, r,
              st->send_to);
        memcpy(to->scratch[r], (from_in ? rs->in : rs->res) + st->send_off,
               st->send_len * sizeof(el_t));
        to->full[r] = true;
        to->msg_heard[r] = rs->heard;
        rs->sent += st->send_len;
    }
}

/* Every receive of the round: scratch -> result, copied or summed. */
static void do_receives(struct sim *m, int i)
{
    for (int r = 0; r < m->n; r++) {
        struct rank_state *rs = &m->r[r];
        const struct mw__step *st = &rs->s.steps[i];
        int from = st->recv_from;
        if (from < 0)
            continue;
        CHECK(m, rs->full[from], "rank %d step %d: nothing arrived from %d", r, i, from);
        CHECK(m, in_range(st->recv_off, st->recv_len, rs->s.bufs.res_len),
              "rank %d step %d: receive [%zu,+%zu) outside result of %zu", r, i, st->recv_off,
              st->recv_len, rs->s.bufs.res_len);
        el_t *dst = rs->res + st->recv_off;
        const el_t *src = rs->scratch[from];
        for (size_t j = 0; j < st->recv_len; j++)
            dst[j] = st->recv_action == MW__RECV_REDUCE ? dst[j] + src[j] : src[j];
        rs->full[from] = false;
        rs->heard |= rs->msg_heard[from];
    }
}

static void sim_run(struct sim *m)
{
    int nsteps = m->r[0].s.nsteps;

    for (int i = 0; i < nsteps; i++) {
        check_pairing(m, i);
        local_copy(m, i);
        do_sends(m, i);
        do_receives(m, i);
    }
    local_copy(m, nsteps);
    for (int r = 0; r < m->n; r++)
        for (int p = 0; p < m->n; p++)
            CHECK(m, !m->r[r].full[p], "rank %d: data from %d never applied", r, p);
}

/* Answer elements that differ from the reference, over all ranks. */
static size_t count_wrong(const struct sim *m)
{
    size_t wrong = 0;

    for (int r = 0; r < m->n; r++) {
        const struct rank_state *rs = &m->r[r];
        size_t end = rs->s.bufs.ans_off + rs->s.bufs.ans_len;
        for (size_t j = rs->s.bufs.ans_off; j < end; j++)
            if (rs->res[j] != expect(m, r, j)) {
                if (m->mode != ALIAS_FORCE && wrong == 0)
                    print_error("rank %d result[%zu] = %lld, want %lld\n", r, j,
                                (long long)rs->res[j], (long long)expect(m, r, j));
                wrong++;
            }
    }
    return wrong;
}

/* ------------------------------------------------------------------------
 * Traffic: the ring algorithms move the minimum
 * ------------------------------------------------------------------------ */

static void check_traffic(const struct sim *m)
{
    int n = m->n;
    size_t c = m->count, off, len, len_next;

    if (m->algo != MW__ALGO_RING)
        return;
    for (int r = 0; r < n; r++) {
        size_t sent = m->r[r].sent;
        mw__block(c, n, r, &off, &len);
        mw__block(c, n, (r + 1) % n, &off, &len_next);
        if (m->kind == MW__COLL_ALLGATHER) {
            CHECK(m, sent == (size_t)(n - 1) * c, "rank %d sent %zu", r, sent);
        } else if (m->kind == MW__COLL_REDUCE_SCATTER) {
            /* every block but its own, once */
            CHECK(m, sent == (n > 1 ? c - len : 0), "rank %d sent %zu", r, sent);
        } else {
            /* 2(N-1)/N * count, off by under 2 elements from uneven blocks */
            long long dev = (long long)sent * n - 2LL * (n - 1) * (long long)c;
            CHECK(m, sent == (n > 1 ? 2 * c - len - len_next : 0), "rank %d sent %zu", r, sent);
            CHECK(m, dev < 2LL * n && dev > -2LL * n, "rank %d sent %zu: not 2(N-1)/N", r, sent);
        }
    }
}

/* ------------------------------------------------------------------------
 * Driving the cases
 * ------------------------------------------------------------------------ */

static bool expect_alias_ok(const struct sim *m)
{
    bool hazard = m->kind == MW__COLL_ALLTOALL ||
                  (m->kind == MW__COLL_ALLREDUCE && m->algo == MW__ALGO_DIRECT);
    return !(hazard && m->n >= 3 && m->count > 0);
}

static void run_one(enum mw__coll_kind kind, enum mw__algo algo, int n, int root, size_t count,
                    enum alias_mode mode)
{
    struct sim m;

    sim_init(&m, kind, algo, n, root, count, mode);
    if (mode == ALIAS_SAME)
        for (int r = 0; r < n; r++)
            CHECK(&m, mw__sched_alias_ok(&m.r[r].s, 0) == expect_alias_ok(&m),
                  "rank %d: in-place verdict", r);
    sim_run(&m);
    CHECK(&m, count_wrong(&m) == 0, "wrong answer");
    if (mode == ALIAS_NONE)
        check_traffic(&m);
    if (kind == MW__COLL_BARRIER)
        for (int r = 0; r < n; r++)
            CHECK(&m, m.r[r].heard == (1u << n) - 1, "rank %d left the barrier early", r);
    sim_free(&m);
}

static void run_kind(enum mw__coll_kind kind, enum mw__algo algo)
{
    for (int n = 1; n <= MAXN; n++) {
        const size_t counts[] = { 0, 1, (size_t)n - 1, (size_t)n, (size_t)n + 1, 7, big_count };
        const int roots[] = { 0, n - 1 };
        for (size_t ri = 0; ri < 2; ri++) {
            if (ri == 1 && n == 1)
                break;
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
                for (int mode = ALIAS_NONE; mode <= ALIAS_COPY; mode++)
                    run_one(kind, algo, n, roots[ri], counts[ci], (enum alias_mode)mode);
        }
    }
}

static void barrier_dissemination(void **state)
{
    (void)state;
    run_kind(MW__COLL_BARRIER, MW__ALGO_AUTO);
    run_kind(MW__COLL_BARRIER, MW__ALGO_DISSEMINATION);
}

static void broadcast_binomial(void **state)
{
    (void)state;
    run_kind(MW__COLL_BROADCAST, MW__ALGO_BINOMIAL);
}

static void reduce_binomial(void **state)
{
    (void)state;
    run_kind(MW__COLL_REDUCE, MW__ALGO_BINOMIAL);
}

static void allreduce_ring(void **state)
{
    (void)state;
    run_kind(MW__COLL_ALLREDUCE, MW__ALGO_RING);
}

static void allreduce_recursive_doubling(void **state)
{
    (void)state;
    run_kind(MW__COLL_ALLREDUCE, MW__ALGO_RECURSIVE_DOUBLING);
}

static void allreduce_direct(void **state)
{
    (void)state;
    run_kind(MW__COLL_ALLREDUCE, MW__ALGO_DIRECT);
}

static void reduce_scatter_ring(void **state)
{
    (void)state;
    run_kind(MW__COLL_REDUCE_SCATTER, MW__ALGO_RING);
}

static void allgather_ring(void **state)
{
    (void)state;
    run_kind(MW__COLL_ALLGATHER, MW__ALGO_RING);
}

static void gather_direct(void **state)
{
    (void)state;
    run_kind(MW__COLL_GATHER, MW__ALGO_DIRECT);
}

static void scatter_direct(void **state)
{
    (void)state;
    run_kind(MW__COLL_SCATTER, MW__ALGO_DIRECT);
}

static void alltoall_direct(void **state)
{
    (void)state;
    run_kind(MW__COLL_ALLTOALL, MW__ALGO_DIRECT);
}

/* The in-place verdict is not merely cautious: where it says no, sharing
 * the buffer really corrupts the answer. */
static void alias_refusal_is_real(void **state)
{
    struct sim m;

    (void)state;
    sim_init(&m, MW__COLL_ALLTOALL, MW__ALGO_AUTO, 3, 0, 2, ALIAS_FORCE);
    assert_false(mw__sched_alias_ok(&m.r[0].s, 0));
    sim_run(&m);
    assert_true(count_wrong(&m) > 0);
    sim_free(&m);

    sim_init(&m, MW__COLL_ALLREDUCE, MW__ALGO_DIRECT, 4, 0, 5, ALIAS_FORCE);
    assert_false(mw__sched_alias_ok(&m.r[1].s, 0));
    sim_run(&m);
    assert_true(count_wrong(&m) > 0);
    sim_free(&m);
}

/* ------------------------------------------------------------------------
 * Blocks, sizes, arguments
 * ------------------------------------------------------------------------ */

static void blocks_partition_evenly(void **state)
{
    (void)state;
    for (int n = 1; n <= 2 * MAXN; n++)
        for (size_t count = 0; count <= 3 * (size_t)n + 2; count++) {
            size_t next = 0, off, len;
            for (int r = 0; r < n; r++) {
                mw__block(count, n, r, &off, &len);
                assert_int_equal(off, next);
                /* the first count % n blocks have one more */
                assert_int_equal(len, count / (size_t)n + ((size_t)r < count % (size_t)n));
                next = off + len;
            }
            assert_int_equal(next, count);
        }
}

static void bad_arguments(void **state)
{
    struct mw__sched s;
    struct mw__sched_bufs b;

    (void)state;
    assert_int_equal(mw__sched_build(MW__COLL_ALLREDUCE, MW__ALGO_RING, 0, 0, 0, 8, &s), -EINVAL);
    assert_null(s.steps);
    assert_int_equal(s.nsteps, 0);
    mw__sched_free(&s);               /* safe after a failure */
    assert_int_equal(mw__sched_build(MW__COLL_ALLREDUCE, MW__ALGO_RING, 4, 4, 0, 8, &s), -EINVAL);
    assert_int_equal(mw__sched_build(MW__COLL_ALLREDUCE, MW__ALGO_RING, 4, -1, 0, 8, &s), -EINVAL);
    assert_int_equal(mw__sched_build(MW__COLL_BROADCAST, MW__ALGO_AUTO, 4, 0, 4, 8, &s), -EINVAL);
    assert_int_equal(mw__sched_build(MW__COLL_GATHER, MW__ALGO_AUTO, 4, 0, -1, 8, &s), -EINVAL);
    assert_int_equal(mw__sched_build(MW__COLL_COUNT, MW__ALGO_AUTO, 4, 0, 0, 8, &s), -EINVAL);
    assert_int_equal(mw__sched_build(MW__COLL_ALLREDUCE, MW__ALGO_COUNT, 4, 0, 0, 8, &s), -EINVAL);
    assert_int_equal(mw__sched_build(MW__COLL_ALLREDUCE, MW__ALGO_BINOMIAL, 4, 0, 0, 8, &s),
                     -EINVAL);
    assert_int_equal(mw__sched_build(MW__COLL_BROADCAST, MW__ALGO_RING, 4, 0, 0, 8, &s), -EINVAL);
    assert_int_equal(mw__sched_build(MW__COLL_ALLGATHER, MW__ALGO_DIRECT, 4, 0, 0, 8, &s),
                     -EINVAL);
    assert_int_equal(mw__sched_build(MW__COLL_BARRIER, MW__ALGO_AUTO, MW__SCHED_MAX_RANKS + 1, 0,
                                     0, 0, &s), -EINVAL);
    /* N * count must fit */
    assert_int_equal(mw__sched_build(MW__COLL_ALLGATHER, MW__ALGO_AUTO, 2, 0, 0,
                                     SIZE_MAX / 2 + 1, &s), -EINVAL);
    assert_int_equal(mw__sched_sizes(MW__COLL_ALLTOALL, 3, 0, 0, SIZE_MAX / 3 + 1, &b), -EINVAL);
    /* the root of an unrooted collective is ignored */
    assert_int_equal(mw__sched_build(MW__COLL_ALLREDUCE, MW__ALGO_AUTO, 4, 1, 99, 8, &s), 0);
    assert_int_equal(s.algo, MW__ALGO_RING);
    mw__sched_free(&s);
    assert_null(s.steps);
    mw__sched_free(&s);               /* idempotent */
}

static void deterministic(void **state)
{
    struct mw__sched a, b;

    (void)state;
    for (int kind = 0; kind < MW__COLL_COUNT; kind++) {
        assert_int_equal(mw__sched_build((enum mw__coll_kind)kind, MW__ALGO_AUTO, 7, 3, 5, 100, &a),
                         0);
        assert_int_equal(mw__sched_build((enum mw__coll_kind)kind, MW__ALGO_AUTO, 7, 3, 5, 100, &b),
                         0);
        assert_int_equal(a.nsteps, b.nsteps);
        if (a.nsteps)
            assert_memory_equal(a.steps, b.steps, (size_t)a.nsteps * sizeof *a.steps);
        mw__sched_free(&a);
        mw__sched_free(&b);
    }
}

/* A large mesh still builds, with the expected latency. */
static void large_mesh(void **state)
{
    struct mw__sched s;

    (void)state;
    assert_int_equal(mw__sched_build(MW__COLL_ALLREDUCE, MW__ALGO_RECURSIVE_DOUBLING, 1000, 999,
                                     0, 1, &s), 0);
    assert_int_equal(s.nsteps, 9 + 2);           /* p = 512, 488 folded in and out */
    mw__sched_free(&s);
    assert_int_equal(mw__sched_build(MW__COLL_BARRIER, MW__ALGO_AUTO, MW__SCHED_MAX_RANKS,
                                     MW__SCHED_MAX_RANKS - 1, 0, 0, &s), 0);
    assert_int_equal(s.nsteps, 20);
    mw__sched_free(&s);
}

/* What a rank of a communicator of up to 1,024 ranks pays per algorithm,
 * with connections made only to the peers its schedules name (coll/comm.c):
 * the connections (its ring neighbours, made at creation, plus the
 * schedule's peers) and the bytes it sends for a 1 MiB f32 allreduce, the
 * most over all ranks.  The connection count follows the algorithm, not n
 * (except where the algorithm is all-to-all). */
static int peers_of(enum mw__coll_kind kind, enum mw__algo algo, int n, int r, size_t count,
                    bool *seen, size_t *sent)
{
    struct mw__sched s;
    memset(seen, 0, (size_t)n);
    seen[(r + 1) % n] = seen[(r + n - 1) % n] = n > 1;
    seen[r] = false;
    assert_int_equal(mw__sched_build(kind, algo, n, r, 0, count, &s), 0);
    *sent = 0;
    for (int i = 0; i < s.nsteps; i++) {
        const struct mw__step *st = &s.steps[i];
        if (st->send_to >= 0)
            seen[st->send_to] = true, *sent += st->send_len * 4;
        if (st->recv_from >= 0)
            seen[st->recv_from] = true;
    }
    mw__sched_free(&s);
    int k = 0;
    for (int q = 0; q < n; q++)
        k += seen[q];
    return k;
}

static void connections_per_rank_to_1024(void **state)
{
    (void)state;
    static const struct {
        enum mw__coll_kind kind;
        enum mw__algo algo;
        const char *name;
    } algos[] = {
        {MW__COLL_ALLREDUCE, MW__ALGO_RING, "allreduce ring"},
        {MW__COLL_ALLREDUCE, MW__ALGO_RECURSIVE_DOUBLING, "allreduce rd"},
        {MW__COLL_BARRIER, MW__ALGO_AUTO, "barrier"},
        {MW__COLL_BROADCAST, MW__ALGO_AUTO, "broadcast"},
        {MW__COLL_ALLTOALL, MW__ALGO_AUTO, "alltoall"},
    };
    const size_t count = (1u << 20) / 4;      /* 1 MiB of f32 */
    bool *seen = malloc(1024);
    assert_non_null(seen);
    printf("%-16s %6s %12s %14s\n", "algorithm", "ranks", "connections", "MiB sent");
    for (size_t a = 0; a < sizeof algos / sizeof *algos; a++)
        for (int n = 8; n <= 1024; n *= 2) {
            int most = 0;
            size_t sent_most = 0;
            for (int r = 0; r < n; r++) {
                size_t sent;
                int k = peers_of(algos[a].kind, algos[a].algo, n, r,
                                 algos[a].kind == MW__COLL_ALLTOALL ? 1 : count, seen, &sent);
                most = k > most ? k : most;
                sent_most = sent > sent_most ? sent : sent_most;
            }
            int lg = ceil_log2(n);    /* n is a power of two here */
            int bound = algos[a].algo == MW__ALGO_RING ? 2
                        : algos[a].kind == MW__COLL_ALLTOALL ? n - 1
                        : algos[a].kind == MW__COLL_BARRIER ? 2 * lg
                                                            : lg + 2;
            if (algos[a].kind != MW__COLL_ALLTOALL && n >= 64)
                printf("%-16s %6d %12d %14.2f\n", algos[a].name, n, most,
                       (double)sent_most / (1 << 20));
            assert_true(most <= bound);
            if (algos[a].algo == MW__ALGO_RING)       /* 2(n-1)/n of the vector */
                assert_true(sent_most <= 2 * count * 4);
            if (algos[a].algo == MW__ALGO_RECURSIVE_DOUBLING)   /* all of it, each step */
                assert_true(sent_most == (size_t)lg * count * 4);
        }
    free(seen);
}

static void names(void **state)
{
    (void)state;
    assert_string_equal(mw__coll_name(MW__COLL_REDUCE_SCATTER), "reduce_scatter");
    assert_string_equal(mw__coll_name(MW__COLL_COUNT), "?");
    assert_string_equal(mw__algo_name(MW__ALGO_RECURSIVE_DOUBLING), "recursive_doubling");
    assert_string_equal(mw__algo_name(MW__ALGO_COUNT), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(blocks_partition_evenly),
        cmocka_unit_test(bad_arguments),
        cmocka_unit_test(deterministic),
        cmocka_unit_test(large_mesh),
        cmocka_unit_test(connections_per_rank_to_1024),
        cmocka_unit_test(names),
        cmocka_unit_test(barrier_dissemination),
        cmocka_unit_test(broadcast_binomial),
        cmocka_unit_test(reduce_binomial),
        cmocka_unit_test(allreduce_ring),
        cmocka_unit_test(allreduce_recursive_doubling),
        cmocka_unit_test(allreduce_direct),
        cmocka_unit_test(reduce_scatter_ring),
        cmocka_unit_test(allgather_ring),
        cmocka_unit_test(gather_direct),
        cmocka_unit_test(scatter_direct),
        cmocka_unit_test(alltoall_direct),
        cmocka_unit_test(alias_refusal_is_real),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
