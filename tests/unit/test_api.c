/* Bad input at the API: every public function given NULL handles, NULL or
 * zero-length buffers, unknown types, or counts whose byte size overflows
 * size_t returns a clear error (or NULL where it returns a pointer), never
 * crashes.  What needs a live connection or communicator is in the rxe
 * suite (test_conn's bounds table, test_coll's argument checks).  Also the
 * replaceable allocator, with any one allocation failing (connections and
 * collectives: test_limits in the rxe suite). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "meshwire.h"

static void null_handles(void **state)
{
    (void)state;
    assert_int_equal(mw_ctx_new(NULL, NULL, NULL), -EINVAL);
    mw_ctx_free(NULL);
    assert_int_equal(mw_ctx_fd(NULL), -EINVAL);
    assert_int_equal(mw_ctx_progress(NULL), -EINVAL);
    assert_int_equal(mw_ctx_post(NULL, NULL, NULL), -EINVAL);
    assert_int_equal(mw_ctx_call(NULL, NULL, NULL, NULL), -EINVAL);
    assert_null(mw_future_new(NULL));
    assert_null(mw_future_ref(NULL));
    mw_future_unref(NULL);
    assert_int_equal(mw_future_resolve(NULL, NULL), -EINVAL);
    assert_int_equal(mw_future_fail(NULL, -EIO, "x"), -EINVAL);
    assert_int_equal(mw_future_then(NULL, NULL, NULL), -EINVAL);
    assert_null(mw_future_chain(NULL, NULL, NULL));
    assert_null(mw_future_all(NULL, NULL, 0));
    assert_int_equal(mw_future_set_timeout(NULL, 1), -EINVAL);
    assert_int_equal(mw_future_cancel(NULL), -EINVAL);
    assert_int_equal(mw_wait(NULL), -EINVAL);
    assert_null(mw_alloc(NULL, 64));
    mw_free(NULL, NULL);
    assert_int_equal(mw_reg(NULL, NULL, 0, NULL), -EINVAL);
    assert_int_equal(mw_dereg(NULL, NULL), -EINVAL);
    assert_int_equal(mw_listen(NULL, "*:0", NULL, NULL, NULL, NULL), -EINVAL);
    assert_int_equal(mw_listener_port(NULL), -EINVAL);
    mw_listener_free(NULL);
    assert_null(mw_connect(NULL, "x:1", NULL));
    mw_msg_free(NULL);
    assert_null(mw_send(NULL, "x", 1));
    assert_null(mw_recv(NULL));
    assert_int_equal(mw_mem_export(NULL, NULL, 0, NULL), -EINVAL);
    assert_null(mw_write(NULL, NULL, 0, NULL, 0));
    assert_null(mw_read(NULL, NULL, 0, NULL, 0));
    assert_null(mw_write_imm(NULL, NULL, 0, NULL, 0, 0));
    mw_conn_on_imm(NULL, NULL, NULL);
    assert_null(mw_conn_close(NULL));
    mw_conn_abort(NULL);
    assert_null(mw_comm_create(NULL, 0, 1, NULL, NULL));
    assert_null(mw_comm_create_env(NULL, NULL));
    mw_comm_free(NULL);
    assert_int_equal(mw_comm_rank(NULL), -EINVAL);
    assert_int_equal(mw_comm_size(NULL), -EINVAL);
    assert_null(mw_barrier(NULL));
    assert_null(mw_allreduce(NULL, NULL, NULL, 1, MW_F32, MW_SUM));
    assert_null(mw_broadcast(NULL, NULL, 1, MW_F32, 0));
    assert_null(mw_alltoall(NULL, NULL, NULL, 1, MW_F32));
}

static mw_comm_t *one_rank_comm(mw_ctx_t *ctx)
{
    mw_future_t *f = mw_comm_create(ctx, 0, 1, (const char *[]){"localhost:1"}, NULL);
    assert_int_equal(mw_wait(f), 0);
    mw_comm_t *comm = mw_future_value(f);
    mw_future_unref(f);
    return comm;
}

static void bad_values(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    assert_null(mw_alloc(ctx, 0));
    assert_null(mw_alloc(ctx, SIZE_MAX));
    mw_mr_t *mr;
    char buf[64];
    assert_int_equal(mw_reg(ctx, NULL, 64, &mr), -EINVAL);
    assert_int_equal(mw_reg(ctx, buf, 0, &mr), -EINVAL);
    assert_int_equal(mw_reg(ctx, buf, SIZE_MAX, &mr), -EINVAL);     /* wraps around */
    assert_int_equal(mw_listen(ctx, NULL, NULL, NULL, NULL, NULL), -EINVAL);
    mw_listener_t *l;
    assert_true(mw_listen(ctx, "no-such-host.invalid:1", NULL, NULL, NULL, &l) < 0);
    assert_true(mw_listen(ctx, "*:99999", NULL, NULL, NULL, &l) < 0);
    mw_future_t *f = mw_connect(ctx, NULL, NULL);      /* a failed future, not NULL */
    assert_non_null(f);
    assert_int_equal(mw_wait(f), -EINVAL);
    mw_future_unref(f);
    f = mw_connect(ctx, "", NULL);
    assert_int_equal(mw_wait(f), -EINVAL);
    mw_future_unref(f);
    f = mw_comm_create(ctx, 2, 2, (const char *[]){"a:1", "b:1"}, NULL);   /* rank >= n */
    assert_int_equal(mw_wait(f), -EINVAL);
    mw_future_unref(f);
    f = mw_comm_create(ctx, 0, 2, (const char *[]){"a:1", NULL}, NULL);
    assert_int_equal(mw_wait(f), -EINVAL);
    mw_future_unref(f);
    /* one port per rank: an entry naming two is refused before anything starts */
    f = mw_comm_create(ctx, 0, 2, (const char *[]){"a:1,b:2", "c:1"}, NULL);
    assert_int_equal(mw_wait(f), -EINVAL);
    assert_non_null(strstr(mw_future_message(f), "rank 0"));
    mw_future_unref(f);

    /* A one-rank communicator needs no network: the collectives' own
     * checks.  A collective refused on a rank breaks its communicator (the
     * other ranks would wait for its part), so each case gets its own. */
    float x[4] = {1, 2, 3, 4};
    struct { int kind; int err; } cases[] = {
        {0, -EINVAL}, {1, -EINVAL}, {2, -EINVAL}, {3, -EINVAL}, {4, -EINVAL}, {5, -EINVAL},
        {6, -EINVAL}, {7, 0}, {8, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mw_comm_t *comm = one_rank_comm(ctx);
        mw_future_t *c;
        switch (cases[i].kind) {
        case 0: c = mw_allreduce(comm, x, x, 4, (mw_dtype_t)99, MW_SUM); break;    /* unknown type */
        case 1: c = mw_allreduce(comm, x, x, 4, MW_F32, (mw_op_t)7); break;        /* unknown op */
        case 2: c = mw_allreduce(comm, NULL, x, 4, MW_F32, MW_SUM); break;         /* NULL input */
        case 3: c = mw_allreduce(comm, x, NULL, 4, MW_F32, MW_SUM); break;         /* NULL output */
        case 4: c = mw_allreduce(comm, x, x, SIZE_MAX / 2, MW_F64, MW_SUM); break; /* overflow */
        case 5: c = mw_broadcast(comm, x, 4, MW_F32, 1); break;                    /* root >= n */
        case 6: c = mw_broadcast(comm, x, 4, MW_F32, -1); break;
        case 7: c = mw_allreduce(comm, NULL, NULL, 0, MW_F32, MW_SUM); break;      /* nothing to do */
        default: c = mw_allreduce(comm, x, x, 4, MW_F32, MW_SUM); break;
        }
        assert_non_null(c);
        int rc = mw_wait(c);
        if (rc != cases[i].err)
            fail_msg("case %zu: %d (%s), want %d", i, rc, mw_future_message(c), cases[i].err);
        mw_future_unref(c);
        /* after a refusal the communicator is broken, with a reason */
        mw_future_t *next = mw_barrier(comm);
        rc = mw_wait(next);
        if (cases[i].err) {
            assert_int_equal(rc, cases[i].err);
            assert_non_null(strstr(mw_future_message(next), "before it started"));
        } else {
            assert_int_equal(rc, 0);
        }
        mw_future_unref(next);
        assert_int_equal(mw_comm_rank(comm), 0);
        assert_int_equal(mw_comm_size(comm), 1);
        mw_comm_free(comm);
    }
    mw_ctx_free(ctx);
}

static void on_accept_nothing(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l, (void)arg;
    mw_conn_abort(c);
}

/* Connection options out of range are refused by mw_listen at once and
 * fail mw_connect's future, before any device is touched; the edges pass
 * the check (and then fail on this host for want of a device, not -EINVAL). */
static void conn_options_checked(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    struct { unsigned retry, rnr, credits; int err; } cases[] = {
        {8, 6, 16, -EINVAL},            /* retry_count beyond 3 bits */
        {7, 7, 16, -EINVAL},            /* rnr_retry 7: for ever */
        {7, 6, 1, -EINVAL},
        {0, 0, 16, 0}, {7, 6, 16, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mw_conn_opts_t o;
        mw_conn_opts_init(&o);
        o.retry_count = cases[i].retry;
        o.rnr_retry = cases[i].rnr;
        o.credits = cases[i].credits;
        o.ack_timeout_us = i == 3 ? MW_ACK_TIMEOUT_PATH : UINT_MAX - 1;   /* the largest */
        mw_listener_t *l = NULL;
        int rc = mw_listen(ctx, "*:0", &o, on_accept_nothing, NULL, &l);
        mw_future_t *f = mw_connect(ctx, "localhost:1", &o);
        int frc = mw_wait(f);
        if (cases[i].err ? rc != -EINVAL || frc != -EINVAL : rc == -EINVAL || frc == -EINVAL)
            fail_msg("case %zu: listen %d, connect %d (%s)", i, rc, frc, mw_future_message(f));
        mw_future_unref(f);
        if (!rc)
            mw_listener_free(l);
    }
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    assert_int_equal(o.ack_timeout_us, 0);              /* the documented defaults */
    assert_int_equal(o.retry_count, 7);
    assert_int_equal(o.rnr_retry, 6);
    mw_ctx_free(ctx);
}

/* A communicator's options are checked before anything starts: each one
 * out of range is refused, named; the edges are accepted. */
static void comm_options_checked(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    const char *peer[] = {"localhost:1"};
    struct { unsigned slot_size, slots, timeout_ms, credits; const char *names; } bad[] = {
        {4, 4, 1000, 16, "slot_size"},                /* smaller than an f64: SIGFPE once */
        {0, 4, 1000, 16, "slot_size"},
        {4095, 4, 1000, 16, "slot_size"},
        {4097, 4, 1000, 16, "slot_size"},             /* misaligned elements */
        {(256u << 20) + 4096, 4, 1000, 16, "slot_size"},
        {4096, 0, 1000, 16, "slots"},
        {4096, 1025, 1000, 16, "slots"},
        {4096, 1u << 24, 1000, 16, "slots"},          /* beyond the 24-bit acks */
        {4096, 4, 0, 16, "timeout_ms"},
        {4096, 4, 1000, 1, "opts->conn"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mw_comm_opts_t o;
        mw_comm_opts_init(&o);
        o.slot_size = bad[i].slot_size;
        o.slots = bad[i].slots;
        o.timeout_ms = bad[i].timeout_ms;
        o.conn.credits = bad[i].credits;
        mw_future_t *f = mw_comm_create(ctx, 0, 1, peer, &o);
        if (mw_wait(f) != -EINVAL || !strstr(mw_future_message(f), bad[i].names))
            fail_msg("case %zu: %s (%s)", i, mw_strerror(mw_future_error(f)),
                     mw_future_message(f));
        mw_future_unref(f);
    }
    unsigned good[][2] = {{4096, 1}, {256u << 20, 1024}, {8192, 4}};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        mw_comm_opts_t o;
        mw_comm_opts_init(&o);
        o.slot_size = good[i][0];
        o.slots = good[i][1];
        mw_future_t *f = mw_comm_create(ctx, 0, 1, peer, &o);
        assert_int_equal(mw_wait(f), 0);
        mw_comm_t *comm = mw_future_value(f);
        mw_future_unref(f);
        double x[5] = {1, 2, 3, 4, 5};
        f = mw_allreduce(comm, x, x, 5, MW_F64, MW_SUM);   /* one rank: itself */
        assert_int_equal(mw_wait(f), 0);
        assert_true(x[4] == 5.0);
        mw_future_unref(f);
        mw_comm_free(comm);
    }
    mw_ctx_free(ctx);
}

/* mw_block_of: the split reduce_scatter uses, and its refusals. */
static void block_of(void **state)
{
    (void)state;
    size_t off = 99, len = 99, sum = 0;
    for (int r = 0; r < 4; r++) {            /* 10 over 4: 3 3 2 2 */
        assert_int_equal(mw_block_of(10, 4, r, &off, &len), 0);
        assert_int_equal(off, sum);
        assert_int_equal(len, r < 2 ? 3 : 2);
        sum += len;
    }
    assert_int_equal(mw_block_of(2, 3, 2, &off, &len), 0);   /* fewer than ranks */
    assert_int_equal(len, 0);
    assert_int_equal(off, 2);
    assert_int_equal(mw_block_of(0, 1, 0, &off, &len), 0);
    assert_int_equal(len, 0);
    assert_int_equal(mw_block_of(10, 0, 0, &off, &len), -EINVAL);
    assert_int_equal(mw_block_of(10, 4, 4, &off, &len), -EINVAL);
    assert_int_equal(mw_block_of(10, 4, -1, &off, &len), -EINVAL);
    assert_int_equal(mw_block_of(10, 4, 0, NULL, &len), -EINVAL);
    assert_int_equal(mw_block_of(10, 4, 0, &off, NULL), -EINVAL);
}

static void names_and_errors(void **state)
{
    (void)state;
    assert_int_equal(mw_dtype_size((mw_dtype_t)-1), 0);
    assert_int_equal(mw_dtype_size(MW_DTYPE_COUNT), 0);
    assert_string_equal(mw_dtype_name((mw_dtype_t)1234), "?");
    assert_string_equal(mw_op_name((mw_op_t)-5), "?");
    assert_non_null(mw_strerror(0));
    assert_non_null(mw_strerror(-123456));
    assert_non_null(mw_strerror(123456));
    assert_non_null(mw_version());
}

/* --- the allocator: replaceable, and every allocation may fail ----------- */

static long calls, fail_at, held;

static bool refuse(void)
{
    return ++calls == fail_at;
}

static void *count_malloc(size_t size)
{
    void *p = refuse() ? NULL : malloc(size);
    held += p != NULL;
    return p;
}

static void *count_calloc(size_t n, size_t size)
{
    void *p = refuse() ? NULL : calloc(n, size);
    held += p != NULL;
    return p;
}

static void *count_realloc(void *p, size_t size)
{
    void *q = refuse() ? NULL : realloc(p, size);
    held += q && !p;
    return q;
}

static void count_free(void *p)
{
    held -= p != NULL;
    free(p);
}

static mw_future_t *then_done(mw_future_t *f, void *arg)
{
    (void)f;
    mw_future_t *g = mw_future_new(arg);
    if (g)
        mw_future_resolve(g, NULL);
    return g;
}

/* A context, and futures resolved, chained and joined, with the Nth
 * allocation failing: 0 when all of it worked, else the first error. */
static int futures_with_failure(void)
{
    mw_ctx_t *ctx;
    int rc = mw_ctx_new(&ctx, NULL, NULL);
    if (rc)
        return rc;
    mw_future_t *f[2] = {mw_future_new(ctx), mw_future_new(ctx)};
    mw_future_t *c = f[0] ? mw_future_chain(f[0], then_done, ctx) : NULL;
    mw_future_t *all = f[1] ? mw_future_all(ctx, f, 2) : NULL;
    for (int i = 0; i < 2; i++)
        if (f[i])
            mw_future_fail(f[i], -EIO, "failure number %d", i);
    rc = !f[0] || !f[1] || !c || !all ? -ENOMEM : 0;
    if (!rc) {
        assert_int_equal(mw_wait(c), -EIO);
        assert_int_equal(mw_wait(all), -EIO);
    }
    mw_future_t *v[] = {f[0], f[1], c, all};
    for (size_t i = 0; i < 4; i++)
        if (v[i])
            mw_future_unref(v[i]);
    mw_ctx_free(ctx);
    return rc;
}

static void allocator_replaced(void **state)
{
    (void)state;
    assert_int_equal(mw_replace_allocator(NULL, realloc, calloc, free), -EINVAL);
    assert_int_equal(mw_replace_allocator(malloc, NULL, calloc, free), -EINVAL);
    assert_int_equal(mw_replace_allocator(malloc, realloc, NULL, free), -EINVAL);
    assert_int_equal(mw_replace_allocator(malloc, realloc, calloc, NULL), -EINVAL);
    /* every test before this one released what it made */
    assert_int_equal(mw_replace_allocator(count_malloc, count_realloc, count_calloc, count_free), 0);

    /* replaced only while meshwire holds nothing: a future outlives its context */
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    assert_true(held > 0);
    assert_int_equal(mw_replace_allocator(malloc, realloc, calloc, free), -EBUSY);
    mw_future_t *f = mw_future_new(ctx);
    assert_non_null(f);
    mw_ctx_free(ctx);
    assert_int_equal(mw_replace_allocator(malloc, realloc, calloc, free), -EBUSY);
    mw_future_unref(f);
    assert_int_equal(held, 0);

    /* the Nth allocation fails, for every N: an error, nothing left held */
    long n;
    for (n = 1;; n++) {
        calls = 0;
        fail_at = n;
        int rc = futures_with_failure();
        assert_int_equal(held, 0);
        if (calls < n) {          /* none failed: all of it worked */
            assert_int_equal(rc, 0);
            break;
        }
    }
    fail_at = 0;
    assert_true(n > 10);
    assert_int_equal(mw_replace_allocator(malloc, realloc, calloc, free), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(null_handles),
        cmocka_unit_test(bad_values),
        cmocka_unit_test(conn_options_checked),
        cmocka_unit_test(comm_options_checked),
        cmocka_unit_test(block_of),
        cmocka_unit_test(names_and_errors),
        cmocka_unit_test(allocator_replaced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
