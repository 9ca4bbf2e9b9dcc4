/* Four worker threads drive real RDMA through one context at once: each
 * hands writes (and reads back) to the loop thread with mw_ctx_call and
 * waits on its own thread for the result, while the main thread only runs
 * the loop.  Every byte is checked; the thread sanitizer runs it too
 * (scripts/test tsan).  And calls on a connection or listener from another
 * thread are refused. */
#include <errno.h>
#include <pthread.h>
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

#define THREADS 4
#define OPS 100
#define BLOCK 65536

static const char *addrs[2];

struct shared {
    mw_ctx_t *ctx;
    mw_conn_t *c;                 /* the writing end */
    mw_remote_t r;                /* the peer's region: a block per thread */
    uint8_t *src, *back;          /* registered, a block per thread each */
};

struct worker {
    struct shared *s;
    int id, bad;
    unsigned op;                  /* the op in progress (written on the worker) */
};

static mw_future_t *start_write(mw_ctx_t *ctx, void *arg)
{
    (void)ctx;
    struct worker *w = arg;
    uint8_t *src = w->s->src + (size_t)w->id * BLOCK;
    return mw_write(w->s->c, src, BLOCK, &w->s->r, (uint64_t)w->id * BLOCK);
}

static mw_future_t *start_read(mw_ctx_t *ctx, void *arg)
{
    (void)ctx;
    struct worker *w = arg;
    uint8_t *back = w->s->back + (size_t)w->id * BLOCK;
    return mw_read(w->s->c, back, BLOCK, &w->s->r, (uint64_t)w->id * BLOCK);
}

static void *work(void *arg)
{
    struct worker *w = arg;
    uint8_t *src = w->s->src + (size_t)w->id * BLOCK, *back = w->s->back + (size_t)w->id * BLOCK;
    for (w->op = 0; w->op < OPS; w->op++) {
        /* the buffers are this thread's; the loop thread only posts them */
        memset(src, (int)(w->id * 31 + w->op), BLOCK);
        memset(back, 0, BLOCK);
        if (mw_ctx_call(w->s->ctx, start_write, w, NULL) ||
            mw_ctx_call(w->s->ctx, start_read, w, NULL) ||
            memcmp(src, back, BLOCK))
            w->bad++;
    }
    return NULL;
}

static void on_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    *(mw_conn_t **)arg = c;
}

static void stop_loop(mw_ctx_t *ctx, void *arg)
{
    (void)ctx;
    mw_future_resolve(arg, NULL);
}

struct joiner_args {
    pthread_t *t;
    mw_ctx_t *ctx;
    mw_future_t *stop;
};

static void *joiner(void *arg)
{
    struct joiner_args *a = arg;
    for (int i = 0; i < THREADS; i++)
        pthread_join(a->t[i], NULL);
    mw_ctx_post(a->ctx, stop_loop, a->stop);
    return NULL;
}

static void four_threads_write_and_read(void **state)
{
    (void)state;
    mw_ctx_opts_t o;
    mw_ctx_opts_init(&o);
    o.threads = 1;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, &o), 0);
    char la[64], target[80];
    snprintf(la, sizeof la, "%s:0", addrs[1]);
    mw_listener_t *l;
    mw_conn_t *server = NULL;
    assert_int_equal(mw_listen(ctx, la, NULL, on_accept, &server, &l), 0);
    snprintf(target, sizeof target, "%s:%d", addrs[1], mw_listener_port(l));
    mw_future_t *cf = mw_connect(ctx, target, NULL);
    assert_int_equal(mw_wait(cf), 0);
    while (!server)
        loop_for(ctx, 5);
    struct shared s = {.ctx = ctx, .c = mw_future_value(cf)};
    mw_future_unref(cf);
    uint8_t *dst = mw_alloc(ctx, THREADS * BLOCK);
    s.src = mw_alloc(ctx, THREADS * BLOCK);
    s.back = mw_alloc(ctx, THREADS * BLOCK);
    assert_int_equal(mw_mem_export(server, dst, THREADS * BLOCK, &s.r), 0);

    struct worker w[THREADS];
    pthread_t t[THREADS], j;
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){.s = &s, .id = i};
        assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
    }
    struct joiner_args ja = {t, ctx, mw_future_new(ctx)};
    assert_int_equal(pthread_create(&j, NULL, joiner, &ja), 0);
    double c0 = cpu_seconds();
    assert_int_equal(mw_wait(ja.stop), 0);          /* this thread runs the loop */
    pthread_join(j, NULL);
    printf("%d threads x %d write+read of %d KiB: %.2f s CPU\n", THREADS, OPS, BLOCK / 1024,
           cpu_seconds() - c0);
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(w[i].bad, 0);
        uint8_t want[BLOCK];
        memset(want, (int)(i * 31 + OPS - 1), BLOCK);
        assert_memory_equal(dst + (size_t)i * BLOCK, want, BLOCK);
    }
    mw_future_unref(ja.stop);
    mw_free(ctx, dst);
    mw_free(ctx, s.src);
    mw_free(ctx, s.back);
    mw_conn_abort(s.c);
    mw_conn_abort(server);
    mw_listener_free(l);
    mw_ctx_free(ctx);
}

struct off_thread {
    mw_conn_t *c;
    mw_listener_t *l;
    uint8_t *buf;
    int send_errno, abort, stats, export, port;
};

static void *touch_off_thread(void *arg)
{
    struct off_thread *o = arg;
    mw_conn_stats_t st;
    mw_remote_t r;
    errno = 0;
    if (!mw_send(o->c, "x", 1))
        o->send_errno = errno;
    o->abort = mw_conn_abort(o->c);
    o->stats = mw_conn_stats(o->c, &st);
    o->export = mw_mem_export(o->c, o->buf, 4096, &r);
    o->port = mw_listener_port(o->l);
    return NULL;
}

/* Connections and listeners belong to the loop thread: from another thread
 * each call is refused with EPERM and changes nothing. */
static void calls_off_the_loop_thread_are_refused(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    struct rxe_server s;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    rxe_server_start(&s, ctx, "*", NULL);
    mw_conn_t *c = rxe_connect(ctx, addrs[1], s.port, NULL);
    rxe_wait_accepted(&s, 1);
    struct off_thread o = {.c = c, .l = s.l, .buf = mw_alloc(ctx, 4096)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, touch_off_thread, &o), 0);
    pthread_join(t, NULL);
    assert_int_equal(o.send_errno, EPERM);
    assert_int_equal(o.abort, -EPERM);
    assert_int_equal(o.stats, -EPERM);
    assert_int_equal(o.export, -EPERM);
    assert_int_equal(o.port, -EPERM);
    assert_int_equal(mw_listener_port(s.l), s.port);
    rxe_round_trip(c, s.conns[0]);              /* not aborted: still works */
    mw_free(ctx, o.buf);
    rxe_close_conn(c);
    rxe_server_close(&s);
    mw_ctx_free(ctx);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rxe_require(2, addrs);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(four_threads_write_and_read),
        cmocka_unit_test(calls_off_the_loop_thread_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
