/* Rails on real soft-RoCE, in one VM with two devices on two subnets: a
 * group of two connections to one peer's region, one per device.  Both
 * rails carry bytes; a rail whose connection breaks mid-transfer is taken
 * out and its slices complete on the other, every byte right; a rail given
 * a new connection is probed and used again; bad arguments, cancels and
 * freeing the group behave.  (The mesh suite takes a real link down.) */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "meshwire.h"
#include "rxe_util.h"

static const char *addrs[2];

#define POOL (64u << 20)

struct rig {
    mw_ctx_t *ctx;
    struct rxe_server s;
    mw_conn_t *c[2];              /* client ends, one per device */
    mw_remote_t r[2];             /* the pool as exported on each */
    uint8_t *pool, *src, *back;
    mw_rails_t *g;
};

/* Connect to @addr, and export the pool on the end that was accepted. */
static void connect_rail(struct rig *k, int i, const char *addr)
{
    int before = k->s.n;
    k->c[i] = rxe_connect(k->ctx, addr, k->s.port, NULL);
    rxe_wait_accepted(&k->s, before + 1);
    assert_int_equal(mw_mem_export(k->s.conns[before], k->pool, POOL, &k->r[i]), 0);
}

static void rig_open(struct rig *k, size_t slice)
{
    memset(k, 0, sizeof *k);
    assert_int_equal(mw_ctx_new(&k->ctx, NULL, NULL), 0);
    rxe_server_start(&k->s, k->ctx, "*", NULL);
    k->pool = mw_alloc(k->ctx, POOL);
    k->src = mw_alloc(k->ctx, POOL);
    k->back = mw_alloc(k->ctx, POOL);
    assert_true(k->pool && k->src && k->back);
    memset(k->pool, 0, POOL);
    for (size_t i = 0; i < POOL; i += 8) {
        uint64_t v = i * 0x9e3779b97f4a7c15ull;
        memcpy(k->src + i, &v, 8);
    }
    for (int i = 0; i < 2; i++)
        connect_rail(k, i, addrs[i]);
    assert_int_equal(mw_rails_new(k->ctx, slice, &k->g), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(mw_rails_add(k->g, k->c[i], &k->r[i]), i);
}

static void rig_close(struct rig *k)
{
    mw_rails_free(k->g);
    for (int i = 0; i < 2; i++)
        if (k->c[i])
            mw_conn_abort(k->c[i]);
    for (int i = 0; i < k->s.n; i++)
        mw_conn_abort(k->s.conns[i]);
    k->s.n = 0;
    rxe_server_close(&k->s);
    mw_free(k->ctx, k->pool);
    mw_free(k->ctx, k->src);
    mw_free(k->ctx, k->back);
    rxe_wait_conns_gone(k->ctx);
    mw_ctx_free(k->ctx);
}

static int wait_for(mw_future_t *f)
{
    int rc = mw_wait(f);
    if (rc)
        print_message("rails: %s: %s\n", mw_strerror(rc), mw_future_message(f));
    mw_future_unref(f);
    return rc;
}

static mw_rail_stats_t rail(struct rig *k, int i)
{
    mw_rail_stats_t st;
    assert_int_equal(mw_rails_stats(k->g, i, &st), 0);
    return st;
}

/* 64 MiB written and read back over two rails on two devices: exact, and
 * each rail carried a fair part. */
static void both_rails_carry_bytes(void **state)
{
    (void)state;
    struct rig k;
    rig_open(&k, 1 << 20);
    assert_int_equal(wait_for(mw_rails_write(k.g, k.src, POOL, 0)), 0);
    assert_memory_equal(k.pool, k.src, POOL);
    assert_int_equal(wait_for(mw_rails_read(k.g, k.back, POOL, 0)), 0);
    assert_memory_equal(k.back, k.src, POOL);
    for (int i = 0; i < 2; i++) {
        mw_rail_stats_t st = rail(&k, i);
        print_message("rail %d on %s: %llu MiB in %llu slices\n", i, st.device,
                      (unsigned long long)(st.bytes >> 20), (unsigned long long)st.slices);
        assert_int_equal(st.state, MW_RAIL_UP);
        assert_true(st.bytes >= POOL / 4);       /* of 128 MiB moved, each a quarter at least */
        assert_int_equal(st.failures, 0);
    }
    if (!rxe_over_tcp())          /* (over TCP on loopback both are lo) */
        assert_string_not_equal(rail(&k, 0).device, rail(&k, 1).device);
    rig_close(&k);
}

/* Scattered entries over the rails: 2,000 pages of 4 KiB to shuffled
 * places, slices of 64 KiB. */
static void batch_over_rails(void **state)
{
    (void)state;
    enum { N = 2000, PAGE = 4096 };
    struct rig k;
    rig_open(&k, 64 << 10);
    mw_batch_entry_t *e = calloc(N, sizeof *e);
    for (size_t i = 0; i < N; i++)
        e[i] = (mw_batch_entry_t){.local = k.src + i * PAGE, .len = PAGE,
                                  .offset = ((i * 7919) % N) * PAGE};
    assert_int_equal(wait_for(mw_rails_post(k.g, MW_DIR_WRITE, e, N)), 0);
    for (size_t i = 0; i < N; i++)
        assert_memory_equal(k.pool + e[i].offset, k.src + i * PAGE, PAGE);
    assert_true(rail(&k, 0).bytes > 0 && rail(&k, 1).bytes > 0);
    free(e);
    rig_close(&k);
}

/* Rail 1's connection breaks (its peer end aborted) during a 64 MiB write:
 * the write completes on rail 0, exact; rail 1 is down, with its slices
 * posted again.  Given a new connection, it is probed and used again. */
static void rail_failure_fails_over_and_recovers(void **state)
{
    (void)state;
    struct rig k;
    rig_open(&k, 1 << 20);
    mw_future_t *f = mw_rails_write(k.g, k.src, POOL, 0);
    while (rail(&k, 1).slices < 2)
        loop_for(k.ctx, 1);
    double t0 = now_s();
    mw_conn_abort(k.s.conns[1]);                 /* rail 1's far end goes */
    assert_int_equal(wait_for(f), 0);
    print_message("rail 1 lost mid-transfer: completed %.3f s later\n", now_s() - t0);
    /* over the same-host path the far end executed what reached it as it
     * closed, so the write may be done before the disconnect reaches us */
    for (int i = 0; i < 1000 && rail(&k, 1).state != MW_RAIL_DOWN; i++)
        loop_for(k.ctx, 2);
    assert_memory_equal(k.pool, k.src, POOL);
    mw_rail_stats_t st = rail(&k, 1);
    print_message("rail 1: %s, %llu reposted, why: %s\n", st.state == MW_RAIL_DOWN ? "down" : "?",
                  (unsigned long long)st.reposted, st.why);
    assert_int_equal(st.state, MW_RAIL_DOWN);
    assert_int_equal(st.failures, 1);
    /* over the device, slices in flight are lost with the queue pair; over
     * the same-host path the far end executes what reached it as it closes */
    mw_conn_stats_t cs;
    assert_int_equal(mw_conn_stats(k.c[0], &cs), 0);
    assert_true(st.reposted >= 1 || cs.transport == MW_TRANSPORT_LOCAL);
    assert_true(st.why[0]);
    assert_int_equal(rail(&k, 0).state, MW_RAIL_UP);

    /* back: a new connection on the same device, probed, then used */
    mw_conn_abort(k.c[1]);
    k.s.conns[1] = k.s.conns[--k.s.n];
    connect_rail(&k, 1, addrs[1]);
    assert_int_equal(mw_rails_replace(k.g, 1, k.c[1], &k.r[1]), 0);
    assert_int_equal(rail(&k, 1).state, MW_RAIL_PROBING);
    for (int i = 0; i < 500 && rail(&k, 1).state == MW_RAIL_PROBING; i++)
        loop_for(k.ctx, 2);
    assert_int_equal(rail(&k, 1).state, MW_RAIL_UP);
    uint64_t before = rail(&k, 1).bytes;
    memset(k.pool, 0, POOL);
    assert_int_equal(wait_for(mw_rails_write(k.g, k.src, POOL, 0)), 0);
    assert_memory_equal(k.pool, k.src, POOL);
    /* its share follows its measured speed: a quarter at least over the
     * device; over the same-host path both rails are the same CPU's copies,
     * and used again is what counts */
    assert_int_equal(mw_conn_stats(k.c[1], &cs), 0);
    uint64_t got = rail(&k, 1).bytes - before;
    print_message("rail 1 used again: %llu of %u bytes (%s)\n", (unsigned long long)got, POOL,
                  cs.transport == MW_TRANSPORT_LOCAL ? "same-host path" : "RDMA");
    assert_true(got >= (cs.transport == MW_TRANSPORT_LOCAL ? 1 : POOL / 4));
    rig_close(&k);
}

/* An idle rail whose connection breaks is taken out without a transfer
 * having to find out: its stats say so, the next write goes to the other. */
static void idle_rail_failure_is_noticed(void **state)
{
    (void)state;
    struct rig k;
    rig_open(&k, 1 << 20);
    for (int i = 0; i < 500 && rail(&k, 1).state == MW_RAIL_PROBING; i++)
        loop_for(k.ctx, 2);
    assert_int_equal(rail(&k, 1).state, MW_RAIL_UP);
    mw_conn_abort(k.s.conns[1]);
    for (int i = 0; i < 500 && rail(&k, 1).state == MW_RAIL_UP; i++)
        loop_for(k.ctx, 2);
    mw_rail_stats_t st = rail(&k, 1);
    assert_int_equal(st.state, MW_RAIL_DOWN);
    assert_non_null(strstr(st.why, "disconnected"));
    assert_int_equal(wait_for(mw_rails_write(k.g, k.src, POOL, 0)), 0);
    assert_memory_equal(k.pool, k.src, POOL);
    assert_int_equal(rail(&k, 1).bytes, 0);
    assert_int_equal(rail(&k, 1).reposted, 0);      /* nothing was sent its way */
    rig_close(&k);
}

/* Every rail gone: the transfer fails (not hangs) with the rails' error. */
static void no_rail_left_fails(void **state)
{
    (void)state;
    struct rig k;
    rig_open(&k, 1 << 20);
    mw_future_t *f = mw_rails_write(k.g, k.src, POOL, 0);
    while (rail(&k, 0).slices + rail(&k, 1).slices < 2)
        loop_for(k.ctx, 1);
    mw_conn_abort(k.s.conns[0]);
    mw_conn_abort(k.s.conns[1]);
    k.s.n = 0;
    mw_future_set_timeout(f, 30000);
    int rc = mw_wait(f);
    print_message("both rails lost: %s: %s\n", mw_strerror(rc), mw_future_message(f));
    assert_true(rc != 0 && rc != -ETIMEDOUT);
    assert_non_null(strstr(mw_future_message(f), "no rail left"));
    mw_future_unref(f);
    assert_int_equal(rail(&k, 0).state, MW_RAIL_DOWN);
    assert_int_equal(rail(&k, 1).state, MW_RAIL_DOWN);
    rig_close(&k);
}

/* Bad arguments fail at once; a cancel stops the transfer once its slices
 * are back; freeing the group with a transfer under way fails it. */
static void arguments_cancel_and_free(void **state)
{
    (void)state;
    struct rig k;
    rig_open(&k, 1 << 20);
    static uint8_t unregistered[4096];
    assert_int_equal(wait_for(mw_rails_write(k.g, k.src, POOL, 1)), -ERANGE);
    assert_int_equal(wait_for(mw_rails_write(k.g, k.src, 0, 0)), -EINVAL);
    assert_int_equal(wait_for(mw_rails_write(k.g, unregistered, sizeof unregistered, 0)), -EFAULT);
    mw_batch_entry_t e = {.local = k.src, .len = 4096, .remote = 1};
    assert_int_equal(wait_for(mw_rails_post(k.g, MW_DIR_WRITE, &e, 1)), -EINVAL);
    assert_null(mw_rails_write(NULL, k.src, 1, 0));
    mw_remote_t other = k.r[0];
    other.len /= 2;                              /* another region */
    assert_int_equal(mw_rails_add(k.g, k.c[0], &k.r[0]), -EINVAL);
    assert_int_equal(mw_rails_replace(k.g, 5, k.c[0], &k.r[0]), -ENOENT);
    assert_int_equal(mw_rails_replace(k.g, 0, k.c[0], &other), -EINVAL);
    assert_int_equal(mw_rails_count(k.g), 2);

    mw_future_t *f = mw_rails_write(k.g, k.src, POOL, 0);
    while (rail(&k, 0).slices + rail(&k, 1).slices < 2)
        loop_for(k.ctx, 1);
    assert_int_equal(mw_future_cancel(f), 0);
    assert_int_equal(wait_for(f), -ECANCELED);
    assert_true(rail(&k, 0).bytes + rail(&k, 1).bytes < POOL);
    assert_int_equal(rail(&k, 0).state, MW_RAIL_UP);  /* a cancel takes no rail out */
    assert_int_equal(rail(&k, 1).state, MW_RAIL_UP);

    f = mw_rails_read(k.g, k.back, POOL, 0);
    mw_rails_free(k.g);
    k.g = NULL;
    assert_int_equal(wait_for(f), -ECANCELED);
    rig_close(&k);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rxe_require(2, addrs);
    if (getenv("MW_TEST_FILTER"))
        cmocka_set_test_filter(getenv("MW_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(both_rails_carry_bytes),
        cmocka_unit_test(batch_over_rails),
        cmocka_unit_test(rail_failure_fails_over_and_recovers),
        cmocka_unit_test(idle_rail_failure_is_noticed),
        cmocka_unit_test(no_rail_left_fails),
        cmocka_unit_test(arguments_cancel_and_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
