/* Nothing grows: 100,000 futures and 10,000 connect/close cycles (in waves
 * of 50 at once) on real soft-RoCE, with the process's resident memory, the
 * bytes it holds from malloc (the exact leak check: resident memory also
 * follows what the allocator caches), open descriptors, and its QPs and MRs as the kernel counts them
 * (rdma resource show) sampled after a warm-up and at the end.
 * MW_TEST_CYCLES overrides the cycle count (the sanitizer runs use fewer). */
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "meshwire.h"
#include "cm/cm.h"
#include "core/handle.h"
#include "core/op.h"
#include "rxe_util.h"

static const char *addrs[2];

struct usage {
    long rss_kib, heap_kib, fds, qps, mrs;
    long futures, ops, handles, conns;   /* meshwire's own objects */
};

static long count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    long n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n - 1;                 /* the one opendir holds */
}

/* This process's objects of @kind ("qp", "mr") as the kernel lists them. */
static long count_rdma(const char *kind)
{
    char cmd[64], line[512], me[32];
    snprintf(cmd, sizeof cmd, "rdma resource show %s 2>/dev/null", kind);
    snprintf(me, sizeof me, " pid %d ", (int)getpid());
    FILE *p = popen(cmd, "r");
    long n = 0;
    while (p && fgets(line, sizeof line, p))
        n += strstr(line, me) != NULL;
    if (p)
        pclose(p);
    return n;
}

/* Bytes in use from malloc, mapped chunks included; 0 where the allocator
 * is not glibc's (the sanitizers' keep their own books). */
static long heap_kib(void)
{
    struct mallinfo2 m = mallinfo2();
    return (long)((m.uordblks + m.hblkhd) / 1024);
}

static struct usage sample(mw_ctx_t *ctx)
{
    mw_ctx_stats_t st;
    mw_ctx_stats(ctx, &st);
    return (struct usage){rxe_rss_kib(), heap_kib(), count_fds(), count_rdma("qp"), count_rdma("mr"),
                          (long)st.futures_live, (long)mw__ops_live(ctx),
                          (long)mw__handles_live(), (long)rxe_conns_left(ctx)};
}

static void print_usage(const char *when, struct usage u)
{
    printf("  %-24s rss %6ld KiB  heap %6ld KiB  fds %3ld  qps %3ld  mrs %3ld  futures %3ld  ops %3ld  "
           "handles %3ld  conns %3ld\n", when, u.rss_kib, u.heap_kib, u.fds, u.qps, u.mrs, u.futures, u.ops,
           u.handles, u.conns);
}

static void count_cb(mw_future_t *f, void *arg)
{
    (void)f;
    ++*(long *)arg;
}

static void hundred_thousand_futures(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    long calls = 0;
    struct usage warm = {0};
    enum { WAVE = 1000, WAVES = 100 };
    mw_future_t *fs[WAVE];
    for (int w = 0; w < WAVES; w++) {
        for (int i = 0; i < WAVE; i++) {
            fs[i] = mw_future_new(ctx);
            mw_future_then(fs[i], count_cb, &calls);
            if (i % 2)
                mw_future_resolve(fs[i], NULL);
            else
                mw_future_fail(fs[i], -EIO, "wave %d future %d", w, i);
        }
        mw_future_t *all = mw_future_new(ctx);    /* one turn: the callbacks run */
        mw_future_set_timeout(all, 1);
        mw_wait(all);
        mw_future_unref(all);
        for (int i = 0; i < WAVE; i++)
            mw_future_unref(fs[i]);
        if (w == 9)
            warm = sample(ctx);
    }
    struct usage end = sample(ctx);
    mw_ctx_stats_t st;
    mw_ctx_stats(ctx, &st);
    printf("100,000 futures:\n");
    print_usage("after 10,000", warm);
    print_usage("after 100,000", end);
    assert_int_equal(calls, WAVE * WAVES);
    assert_int_equal(st.futures_live, 0);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /* 90,000 futures more hold not one byte more each; resident memory
     * moves with what malloc caches (+2.2 MiB in one CI run, +0.2 MiB in
     * most), so it only has to stay far below all of them leaking */
    assert_true(end.heap_kib - warm.heap_kib < 64);
    assert_true(end.rss_kib - warm.rss_kib < 8192);
#endif
    assert_int_equal(end.fds, warm.fds);
    mw_ctx_free(ctx);
}

/* --- connections ------------------------------------------------------------ */

#define WAVE 50
static mw_conn_t *accepted[WAVE];
static int naccepted;

static void on_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l, (void)arg;
    if (naccepted < WAVE)
        accepted[naccepted++] = c;
    else
        mw_conn_abort(c);
}

static void close_wave(mw_ctx_t *ctx, mw_future_t **fs)
{
    mw_future_t *closing[2 * WAVE];
    int n = 0;
    for (int i = 0; i < WAVE; i++) {
        closing[n++] = mw_conn_close(mw_future_value(fs[i]));
        mw_future_unref(fs[i]);
    }
    for (int i = 0; i < naccepted; i++)
        closing[n++] = mw_conn_close(accepted[i]);
    naccepted = 0;
    mw_future_t *all = mw_future_all(ctx, closing, (size_t)n);
    assert_int_equal(mw_wait(all), 0);
    mw_future_unref(all);
    for (int i = 0; i < n; i++)
        mw_future_unref(closing[i]);
}

static void connect_close_cycles(void **state)
{
    (void)state;
    const char *env = getenv("MW_TEST_CYCLES");
    int cycles = env ? atoi(env) : 10000;
    cycles = cycles < 2 * WAVE ? 2 * WAVE : cycles / WAVE * WAVE;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.credits = 4;
    o.slot_size = 4096;
    /* this test counts what cycles leave behind, not how fast they are: a
     * wave of 50 handshakes under a sanitizer in a busy VM has taken longer
     * than the default 5 s per step (CI, stop 42) */
    o.timeout_ms = 30000;
    char la[64], target[80];
    snprintf(la, sizeof la, "%s:0", addrs[1]);
    mw_listener_t *l;
    assert_int_equal(mw_listen(ctx, la, &o, on_accept, NULL, &l), 0);
    snprintf(target, sizeof target, "%s:%d", addrs[1], mw_listener_port(l));
    /* the baseline is taken once the first waves ran: by then the
     * registered arena, the completion channels and the caches exist */
    struct usage open = {0}, base = {0}, mid = {0};
    int at_base = cycles / 5 / WAVE * WAVE, at_mid = cycles * 3 / 5 / WAVE * WAVE;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int done = 0; done < cycles; done += WAVE) {
        mw_future_t *fs[WAVE];
        for (int i = 0; i < WAVE; i++)
            fs[i] = mw_connect(ctx, target, &o);
        mw_future_t *all = mw_future_all(ctx, fs, WAVE);
        if (mw_wait(all))
            fail_msg("cycle %d: %s", done, mw_future_message(all));
        mw_future_unref(all);
        while (naccepted < WAVE)
            loop_for(ctx, 2);
        if (done == at_base)
            open = sample(ctx);      /* with a wave open: the count sees our QPs */
        close_wave(ctx, fs);
        if (done == at_base || done == at_mid) {
            loop_for(ctx, 100);   /* ids destroyed later, off the cm handler */
            *(done == at_base ? &base : &mid) = sample(ctx);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    loop_for(ctx, 100);
    struct usage end = sample(ctx);
    printf("%d connect/close cycles (%d at once) in %.1f s:\n", cycles, WAVE,
           (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    print_usage("a wave open", open);
    print_usage("closed, at 20%", base);
    print_usage("closed, at 60%", mid);
    print_usage("closed, at the end", end);
    assert_true(open.qps >= 2 * WAVE);
    assert_int_equal(base.qps, 0);
    assert_int_equal(end.qps, 0);
    assert_int_equal(end.fds, base.fds);
    /* not one of meshwire's own objects more than after the first waves */
    assert_int_equal(end.futures, base.futures);
    assert_int_equal(end.ops, base.ops);
    assert_int_equal(end.handles, base.handles);
    assert_int_equal(end.conns, 0);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /* the registered arena grows when jemalloc asks for it: one mapping
     * more (+14 MiB, one MR) came between 20% and 60% once, and after 60%
     * in another run of 4,000 cycles, flat otherwise.  So from the 60% mark
     * it may map once more; an arena leak of a connection's slots (32 KiB
     * an end here) over the last 1,600 cycles would be 100 MiB.
     * Under ASan or TSan (their allocators hold freed memory, and their
     * runs are shorter) neither settles: the plain run checks them. */
    assert_true(end.mrs - mid.mrs <= 1);
    assert_true(end.rss_kib - mid.rss_kib < 16384);
    /* malloc's own count is flat from the first waves (280-283 KiB): 8,000
     * cycles leaking 4 bytes each would show */
    assert_true(end.heap_kib - base.heap_kib < 32);
#endif
    mw_listener_free(l);
    mw_ctx_free(ctx);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rxe_require(2, addrs);
    if (getenv("MW_TEST_FILTER"))
        cmocka_set_test_filter(getenv("MW_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hundred_thousand_futures),
        cmocka_unit_test(connect_close_cycles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
