/* Futures: deferred callbacks, ordering, refcounts, chain, all, timeouts,
 * cancellation, mw_wait, teardown, and handles that outlived their future. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include <event2/event.h>

#include "meshwire.h"
#include "core/future.h"
#include "core/handle.h"

/* ------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------ */

static int order[32];
static size_t norder;

static int setup(void **state)
{
    mw_ctx_t *ctx;
    if (mw_ctx_new(&ctx, NULL, NULL) < 0)
        return -1;
    norder = 0;
    *state = ctx;
    return 0;
}

static int teardown(void **state)
{
    mw_ctx_free(*state);
    return 0;
}

static uint64_t live(mw_ctx_t *ctx)
{
    mw_ctx_stats_t st;
    mw_ctx_stats(ctx, &st);
    return st.futures_live;
}

/* A few non-blocking loop turns: enough for deferred tasks queued by
 * deferred tasks. */
static void spin(mw_ctx_t *ctx)
{
    for (int i = 0; i < 8; i++)
        event_base_loop(mw_ctx_base(ctx), EVLOOP_NONBLOCK);
}

/* Run the loop for about @ms milliseconds. */
static void loop_ms(mw_ctx_t *ctx, int ms)
{
    struct timeval tv = {0, ms * 1000};
    event_base_loopexit(mw_ctx_base(ctx), &tv);
    event_base_dispatch(mw_ctx_base(ctx));
}

static void count_cb(mw_future_t *f, void *arg)
{
    (void)f;
    ++*(int *)arg;
}

static void order_cb(mw_future_t *f, void *arg)
{
    (void)f;
    order[norder++] = (int)(intptr_t)arg;
}

/* A cancel hook: the future is still pending when it runs (its operation
 * completes it); here at once, with an error of its own that the recorded
 * cancel or deadline replaces. */
static void hook_count(mw_future_t *f, void *arg)
{
    assert_int_equal(mw_future_state(f), MW_FUTURE_PENDING);
    ++*(int *)arg;
    assert_int_equal(mw_future_fail(f, -EIO, "the operation's own words"), 0);
}

/* What a callback saw of its future. */
struct seen {
    int calls;
    int state;
    int err;
    char msg[256];
    void *value;
};

static void seen_cb(mw_future_t *f, void *arg)
{
    struct seen *s = arg;
    s->calls++;
    s->state = mw_future_state(f);
    s->err = mw_future_error(f);
    s->value = mw_future_value(f);
    strncpy(s->msg, mw_future_message(f), sizeof s->msg - 1);
}

/* A one-shot libevent timer that completes a future, to wake mw_wait. */
struct later {
    struct event *ev;
    mw_future_t *f;
    void *value;
    int err;
};

static void later_fire(evutil_socket_t fd, short what, void *arg)
{
    struct later *l = arg;
    (void)fd;
    (void)what;
    if (l->err)
        mw_future_fail(l->f, l->err, "failed later");
    else
        mw_future_resolve(l->f, l->value);
}

static void later_arm(struct later *l, mw_ctx_t *ctx, int ms)
{
    struct timeval tv = {.tv_sec = 0, .tv_usec = ms * 1000};
    l->ev = evtimer_new(mw_ctx_base(ctx), later_fire, l);
    assert_non_null(l->ev);
    assert_int_equal(evtimer_add(l->ev, &tv), 0);
}

/* ------------------------------------------------------------------------
 * then: always deferred, in order
 * ------------------------------------------------------------------------ */

static void then_on_pending_runs_from_loop(void **state)
{
    mw_ctx_t *ctx = *state;
    int x = 7;
    struct seen s = {0};
    mw_future_t *f = mw_future_new(ctx);
    assert_non_null(f);
    assert_int_equal(mw_future_state(f), MW_FUTURE_PENDING);
    assert_int_equal(mw_future_then(f, seen_cb, &s), 0);
    spin(ctx);
    assert_int_equal(s.calls, 0);
    assert_int_equal(mw_future_resolve(f, &x), 0);
    assert_int_equal(s.calls, 0); /* not inside resolve */
    spin(ctx);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.state, MW_FUTURE_DONE);
    assert_ptr_equal(s.value, &x);
    spin(ctx);
    assert_int_equal(s.calls, 1); /* once */
    mw_future_unref(f);
    assert_int_equal(live(ctx), 0);
}

static void then_on_complete_is_deferred(void **state)
{
    mw_ctx_t *ctx = *state;
    int n = 0;
    mw_future_t *f = mw_future_new(ctx);
    assert_int_equal(mw_future_fail(f, -EIO, "io"), 0);
    assert_int_equal(mw_future_then(f, count_cb, &n), 0);
    assert_int_equal(n, 0); /* not inside then */
    spin(ctx);
    assert_int_equal(n, 1);
    assert_int_equal(mw_future_then(f, count_cb, &n), 0);
    assert_int_equal(n, 1);
    spin(ctx);
    assert_int_equal(n, 2);
    mw_future_unref(f);
    assert_int_equal(live(ctx), 0);
}

static void callbacks_run_in_registration_order(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *f = mw_future_new(ctx);
    for (intptr_t i = 1; i <= 3; i++)
        assert_int_equal(mw_future_then(f, order_cb, (void *)i), 0);
    mw_future_resolve(f, NULL);
    assert_int_equal(mw_future_then(f, order_cb, (void *)4), 0);
    assert_int_equal(norder, 0);
    spin(ctx);
    assert_int_equal(norder, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(order[i], i + 1);
    mw_future_unref(f);
}

static void callbacks_ordered_across_futures(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *a = mw_future_new(ctx), *b = mw_future_new(ctx);
    mw_future_then(a, order_cb, (void *)1);
    mw_future_then(b, order_cb, (void *)2);
    mw_future_then(a, order_cb, (void *)3);
    mw_future_resolve(b, NULL); /* b becomes due first */
    mw_future_resolve(a, NULL);
    spin(ctx);
    assert_int_equal(norder, 3);
    assert_int_equal(order[0], 2);
    assert_int_equal(order[1], 1);
    assert_int_equal(order[2], 3);
    mw_future_unref(a);
    mw_future_unref(b);
    assert_int_equal(live(ctx), 0);
}

static void nested_then_cb(mw_future_t *f, void *arg)
{
    (void)arg;
    order[norder++] = 1;
    assert_int_equal(mw_future_then(f, order_cb, (void *)3), 0);
    order[norder++] = 2; /* the inner callback has not run yet */
}

static void then_inside_callback_runs_after_it(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *f = mw_future_new(ctx);
    mw_future_then(f, nested_then_cb, NULL);
    mw_future_resolve(f, NULL);
    spin(ctx);
    assert_int_equal(norder, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(order[i], i + 1);
    mw_future_unref(f);
    assert_int_equal(live(ctx), 0);
}

/* ------------------------------------------------------------------------
 * resolve / fail / accessors
 * ------------------------------------------------------------------------ */

static void complete_twice_is_ealready(void **state)
{
    mw_ctx_t *ctx = *state;
    int x, y;
    mw_future_t *f = mw_future_new(ctx), *g = mw_future_new(ctx);
    assert_int_equal(mw_future_resolve(f, &x), 0);
    assert_int_equal(mw_future_resolve(f, &y), -EALREADY);
    assert_int_equal(mw_future_fail(f, -EIO, "late"), -EALREADY);
    assert_ptr_equal(mw_future_value(f), &x);
    assert_int_equal(mw_future_error(f), 0);
    assert_string_equal(mw_future_message(f), "");

    assert_int_equal(mw_future_fail(g, -EPIPE, "first"), 0);
    assert_int_equal(mw_future_fail(g, -EIO, "second"), -EALREADY);
    assert_int_equal(mw_future_resolve(g, &x), -EALREADY);
    assert_int_equal(mw_future_error(g), -EPIPE);
    assert_string_equal(mw_future_message(g), "first");
    assert_null(mw_future_value(g));
    mw_future_unref(f);
    mw_future_unref(g);
}

static void fail_rejects_nonnegative_error(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *f = mw_future_new(ctx);
    assert_int_equal(mw_future_fail(f, 0, "zero"), -EINVAL);
    assert_int_equal(mw_future_fail(f, EIO, "positive"), -EINVAL);
    assert_int_equal(mw_future_state(f), MW_FUTURE_PENDING);
    assert_int_equal(mw_future_error(f), 0);
    assert_string_equal(mw_future_message(f), "");
    assert_int_equal(mw_future_fail(f, -EIO, "negative"), 0);
    mw_future_unref(f);
}

static void fail_formats_message(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *f = mw_future_new(ctx), *g = mw_future_new(ctx);
    assert_string_equal(mw_future_message(f), "");
    assert_int_equal(mw_future_fail(f, -EIO, "disk %d of %s", 3, "sda"), 0);
    assert_int_equal(mw_future_state(f), MW_FUTURE_FAILED);
    assert_int_equal(mw_future_error(f), -EIO);
    assert_string_equal(mw_future_message(f), "disk 3 of sda");
    assert_null(mw_future_value(f));

    /* Long messages are kept whole, not cut. */
    char big[1001];
    memset(big, 'm', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(mw_future_fail(g, -E2BIG, "%s!", big), 0);
    assert_int_equal(strlen(mw_future_message(g)), 1001);
    assert_memory_equal(mw_future_message(g), big, 1000);
    mw_future_unref(f);
    mw_future_unref(g);
}

static void null_future_is_tolerated(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *f = mw_future_new(ctx);
    assert_null(mw_future_new(NULL));
    assert_null(mw_future_ref(NULL));
    mw_future_unref(NULL);
    assert_int_equal(mw_future_resolve(NULL, NULL), -EINVAL);
    assert_int_equal(mw_future_fail(NULL, -EIO, "x"), -EINVAL);
    assert_int_equal(mw_future_state(NULL), -EINVAL);
    assert_int_equal(mw_future_error(NULL), -EINVAL);
    assert_string_equal(mw_future_message(NULL), "");
    assert_null(mw_future_value(NULL));
    assert_int_equal(mw_future_then(NULL, count_cb, NULL), -EINVAL);
    assert_int_equal(mw_future_then(f, NULL, NULL), -EINVAL);
    assert_null(mw_future_chain(NULL, NULL, NULL));
    assert_null(mw_future_chain(f, NULL, NULL));
    assert_int_equal(mw_future_set_timeout(NULL, 1), -EINVAL);
    assert_int_equal(mw_future_cancel(NULL), -EINVAL);
    assert_int_equal(mw_wait(NULL), -EINVAL);
    mw_future_unref(f);
    assert_int_equal(live(ctx), 0);
}

/* ------------------------------------------------------------------------
 * Reference counting
 * ------------------------------------------------------------------------ */

static void refcount_balance(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_ctx_stats_t before, after;
    mw_ctx_stats(ctx, &before);
    mw_future_t *f = mw_future_new(ctx);
    assert_ptr_equal(mw_future_ref(f), f);
    mw_future_ref(f);
    assert_int_equal(live(ctx), 1);
    mw_future_unref(f);
    mw_future_unref(f);
    assert_int_equal(live(ctx), 1);
    mw_future_unref(f);
    mw_ctx_stats(ctx, &after);
    assert_int_equal(after.futures_live, 0);
    assert_int_equal(after.futures_created, before.futures_created + 1);
}

static void unref_cb(mw_future_t *f, void *arg)
{
    ++*(int *)arg;
    mw_future_unref(f);
}

static void unref_inside_callback(void **state)
{
    mw_ctx_t *ctx = *state;
    int x, n = 0;
    struct seen s = {0};
    mw_future_t *f = mw_future_new(ctx);
    mw_future_then(f, unref_cb, &n); /* drops the test's only reference */
    mw_future_then(f, seen_cb, &s);  /* f must still be whole here */
    mw_future_resolve(f, &x);
    spin(ctx);
    assert_int_equal(n, 1);
    assert_int_equal(s.calls, 1);
    assert_ptr_equal(s.value, &x);
    assert_int_equal(live(ctx), 0);
}

static void unref_before_callback_runs(void **state)
{
    mw_ctx_t *ctx = *state;
    int x;
    struct seen s = {0};
    mw_future_t *f = mw_future_new(ctx);
    mw_future_then(f, seen_cb, &s);
    mw_future_resolve(f, &x);
    mw_future_unref(f);
    assert_int_equal(live(ctx), 1); /* queued callbacks keep it */
    spin(ctx);
    assert_int_equal(s.calls, 1);
    assert_ptr_equal(s.value, &x);
    assert_int_equal(live(ctx), 0);
}

/* A callback holds its future: then() and unref() at once is the whole
 * "fire and forget" pattern, and the callback still runs exactly once --
 * when the future completes, or, for one nobody is left to complete, at
 * the context's teardown with -ECANCELED. */
static void callback_keeps_its_future(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    struct seen done = {0}, orphan = {0};
    mw_future_t *f = mw_future_new(ctx);
    mw_future_t *op = mw_future_ref(f);        /* what an operation holds */
    mw_future_then(f, seen_cb, &done);
    mw_future_unref(f);                         /* the caller lets go at once */
    mw_future_t *g = mw_future_new(ctx);
    mw_future_then(g, seen_cb, &orphan);
    mw_future_unref(g);                         /* nobody will complete it */
    assert_int_equal(live(ctx), 2);
    mw_future_resolve(op, NULL);
    mw_future_unref(op);
    spin(ctx);
    assert_int_equal(done.calls, 1);
    assert_int_equal(done.state, MW_FUTURE_DONE);
    assert_int_equal(live(ctx), 1);             /* g, kept by its callback */
    assert_int_equal(orphan.calls, 0);
    mw_ctx_free(ctx);
    assert_int_equal(orphan.calls, 1);
    assert_int_equal(orphan.err, -ECANCELED);
}

/* ------------------------------------------------------------------------
 * chain
 * ------------------------------------------------------------------------ */

struct step {
    int id;
    int calls;
    void *seen_value;
    mw_future_t *next;   /* returned (with a new reference) */
};

static mw_future_t *step_fn(mw_future_t *f, void *arg)
{
    struct step *s = arg;
    s->calls++;
    s->seen_value = mw_future_value(f);
    order[norder++] = s->id;
    return mw_future_ref(s->next);
}

static void chain_success(void **state)
{
    mw_ctx_t *ctx = *state;
    int a, b;
    struct seen seen = {0};
    struct step s = {.next = mw_future_new(ctx)};
    mw_future_t *f = mw_future_new(ctx);
    mw_future_t *r = mw_future_chain(f, step_fn, &s);
    assert_non_null(r);
    mw_future_then(r, seen_cb, &seen);
    mw_future_resolve(f, &a);
    assert_int_equal(s.calls, 0); /* not inside resolve */
    spin(ctx);
    assert_int_equal(s.calls, 1);
    assert_ptr_equal(s.seen_value, &a);
    assert_int_equal(mw_future_state(r), MW_FUTURE_PENDING);
    mw_future_resolve(s.next, &b);
    spin(ctx);
    assert_int_equal(mw_future_state(r), MW_FUTURE_DONE);
    assert_ptr_equal(mw_future_value(r), &b);
    assert_int_equal(seen.calls, 1);
    assert_ptr_equal(seen.value, &b);
    mw_future_unref(s.next);
    mw_future_unref(f);
    mw_future_unref(r);
    assert_int_equal(live(ctx), 0);
}

static void chain_first_fails_skips_fn(void **state)
{
    mw_ctx_t *ctx = *state;
    struct step s = {.next = NULL};
    mw_future_t *f = mw_future_new(ctx);
    mw_future_t *r = mw_future_chain(f, step_fn, &s);
    mw_future_fail(f, -EHOSTUNREACH, "no route to %s", "n1");
    spin(ctx);
    assert_int_equal(s.calls, 0);
    assert_int_equal(mw_future_state(r), MW_FUTURE_FAILED);
    assert_int_equal(mw_future_error(r), -EHOSTUNREACH);
    assert_string_equal(mw_future_message(r), "no route to n1");
    mw_future_unref(f);
    mw_future_unref(r);
    assert_int_equal(live(ctx), 0);
}

static void chain_fn_returns_null(void **state)
{
    mw_ctx_t *ctx = *state;
    struct step s = {.next = NULL};
    mw_future_t *f = mw_future_new(ctx);
    mw_future_t *r = mw_future_chain(f, step_fn, &s);
    mw_future_resolve(f, NULL);
    spin(ctx);
    assert_int_equal(s.calls, 1);
    assert_int_equal(mw_future_error(r), -ECANCELED);
    assert_true(strlen(mw_future_message(r)) > 0);
    mw_future_unref(f);
    mw_future_unref(r);
    assert_int_equal(live(ctx), 0);
}

static void chain_second_fails(void **state)
{
    mw_ctx_t *ctx = *state;
    struct step s = {.next = mw_future_new(ctx)};
    mw_future_t *f = mw_future_new(ctx);
    mw_future_t *r = mw_future_chain(f, step_fn, &s);
    mw_future_resolve(f, NULL);
    mw_future_fail(s.next, -EPIPE, "peer %d gone", 4);
    spin(ctx);
    assert_int_equal(s.calls, 1);
    assert_int_equal(mw_future_state(r), MW_FUTURE_FAILED);
    assert_int_equal(mw_future_error(r), -EPIPE);
    assert_string_equal(mw_future_message(r), "peer 4 gone");
    assert_null(mw_future_value(r));
    mw_future_unref(s.next);
    mw_future_unref(f);
    mw_future_unref(r);
    assert_int_equal(live(ctx), 0);
}

static void chain_of_chains(void **state)
{
    mw_ctx_t *ctx = *state;
    int a, b, c;
    struct step s1 = {.id = 1, .next = mw_future_new(ctx)};
    struct step s2 = {.id = 2, .next = mw_future_new(ctx)};
    mw_future_resolve(s1.next, &b); /* a step may return a done future */
    mw_future_resolve(s2.next, &c);
    mw_future_t *f = mw_future_new(ctx);
    mw_future_t *r1 = mw_future_chain(f, step_fn, &s1);
    mw_future_t *r2 = mw_future_chain(r1, step_fn, &s2);
    mw_future_resolve(f, &a);
    spin(ctx);
    assert_int_equal(mw_future_state(r2), MW_FUTURE_DONE);
    assert_ptr_equal(s1.seen_value, &a);
    assert_ptr_equal(s2.seen_value, &b);
    assert_ptr_equal(mw_future_value(r1), &b);
    assert_ptr_equal(mw_future_value(r2), &c);
    assert_int_equal(norder, 2); /* each step once, first before second */
    assert_int_equal(order[0], 1);
    assert_int_equal(order[1], 2);
    mw_future_unref(r2);
    mw_future_unref(r1);
    mw_future_unref(f);
    mw_future_unref(s1.next);
    mw_future_unref(s2.next);
    assert_int_equal(live(ctx), 0);
}

static void chain_holds_what_it_needs(void **state)
{
    mw_ctx_t *ctx = *state;
    int n = 0;
    struct step s = {.next = mw_future_new(ctx)};
    mw_future_resolve(s.next, NULL);
    mw_future_t *f = mw_future_new(ctx);
    mw_future_t *r = mw_future_chain(f, step_fn, &s);
    mw_future_then(r, count_cb, &n);
    mw_future_unref(r); /* the chain keeps its result */
    mw_future_resolve(f, NULL);
    mw_future_unref(f); /* and its input */
    spin(ctx);
    assert_int_equal(s.calls, 1);
    assert_int_equal(n, 1);
    mw_future_unref(s.next);
    assert_int_equal(live(ctx), 0);
}

static void chain_cancel_stops_step(void **state)
{
    mw_ctx_t *ctx = *state;
    int hook = 0;
    struct step s = {.next = mw_future_new(ctx)};
    mw__future_on_cancel(s.next, hook_count, &hook);
    mw_future_t *f = mw_future_new(ctx);
    mw_future_t *r = mw_future_chain(f, step_fn, &s);
    mw_future_resolve(f, NULL);
    spin(ctx);
    assert_int_equal(s.calls, 1);
    assert_int_equal(mw_future_cancel(r), 0);
    assert_int_equal(hook, 1);
    assert_int_equal(mw_future_error(s.next), -ECANCELED);
    /* R fails once the step it cancelled has let go: a loop turn later */
    assert_int_equal(mw_future_state(r), MW_FUTURE_PENDING);
    spin(ctx);
    assert_int_equal(mw_future_error(r), -ECANCELED);
    assert_int_equal(hook, 1);
    mw_future_unref(s.next);
    mw_future_unref(f);
    mw_future_unref(r);
    assert_int_equal(live(ctx), 0);
}

/* ------------------------------------------------------------------------
 * all
 * ------------------------------------------------------------------------ */

static void all_of_none(void **state)
{
    mw_ctx_t *ctx = *state;
    int n = 0;
    mw_future_t *dummy[1] = {NULL};
    mw_future_t *r = mw_future_all(ctx, NULL, 0);
    mw_future_t *r2 = mw_future_all(ctx, dummy, 0);
    assert_non_null(r);
    assert_non_null(r2);
    assert_int_equal(mw_future_state(r), MW_FUTURE_DONE);
    assert_null(mw_future_value(r));
    mw_future_then(r, count_cb, &n);
    assert_int_equal(n, 0);
    spin(ctx);
    assert_int_equal(n, 1);
    mw_future_unref(r);
    mw_future_unref(r2);
    assert_int_equal(live(ctx), 0);
}

static void all_of_one(void **state)
{
    mw_ctx_t *ctx = *state;
    int x;
    mw_future_t *f = mw_future_new(ctx);
    mw_future_t *r = mw_future_all(ctx, &f, 1);
    spin(ctx);
    assert_int_equal(mw_future_state(r), MW_FUTURE_PENDING);
    mw_future_resolve(f, &x);
    assert_int_equal(mw_future_state(r), MW_FUTURE_PENDING);
    spin(ctx);
    assert_int_equal(mw_future_state(r), MW_FUTURE_DONE);
    assert_null(mw_future_value(r));
    mw_future_unref(f);
    mw_future_unref(r);
    assert_int_equal(live(ctx), 0);
}

static void all_of_several(void **state)
{
    mw_ctx_t *ctx = *state;
    int n = 0;
    mw_future_t *fs[3];
    for (int i = 0; i < 3; i++)
        fs[i] = mw_future_new(ctx);
    mw_future_resolve(fs[1], NULL); /* one already done */
    mw_future_t *r = mw_future_all(ctx, fs, 3);
    mw_future_then(r, count_cb, &n);
    mw_future_resolve(fs[2], NULL);
    spin(ctx);
    assert_int_equal(mw_future_state(r), MW_FUTURE_PENDING);
    assert_int_equal(n, 0);
    mw_future_resolve(fs[0], NULL);
    spin(ctx);
    assert_int_equal(mw_future_state(r), MW_FUTURE_DONE);
    assert_int_equal(n, 1);
    for (int i = 0; i < 3; i++)
        mw_future_unref(fs[i]);
    mw_future_unref(r);
    assert_int_equal(live(ctx), 0);
}

static void all_fails_fast(void **state)
{
    mw_ctx_t *ctx = *state;
    struct seen s = {0};
    mw_future_t *fs[5];
    for (int i = 0; i < 5; i++)
        fs[i] = mw_future_new(ctx);
    mw_future_t *r = mw_future_all(ctx, fs, 5);
    mw_future_then(r, seen_cb, &s);
    mw_future_resolve(fs[0], NULL);
    mw_future_fail(fs[3], -EIO, "boom %d", 3);
    spin(ctx);
    /* failed while three members are still pending */
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.state, MW_FUTURE_FAILED);
    assert_int_equal(s.err, -EIO);
    assert_string_equal(s.msg, "future 4 of 5: boom 3");
    mw_future_fail(fs[1], -EPIPE, "later");
    mw_future_resolve(fs[2], NULL);
    mw_future_resolve(fs[4], NULL);
    spin(ctx);
    assert_int_equal(s.calls, 1);
    assert_int_equal(mw_future_error(r), -EIO); /* the first failure stays */
    for (int i = 0; i < 5; i++)
        mw_future_unref(fs[i]);
    mw_future_unref(r);
    assert_int_equal(live(ctx), 0);
}

static void all_rejects_bad_input(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *fs[2] = {mw_future_new(ctx), NULL};
    assert_null(mw_future_all(ctx, NULL, 2));
    assert_null(mw_future_all(ctx, fs, 2));
    assert_null(mw_future_all(NULL, fs, 1));
    mw_future_unref(fs[0]);
    assert_int_equal(live(ctx), 0);
}

/* ------------------------------------------------------------------------
 * Timeouts and cancellation
 * ------------------------------------------------------------------------ */

static void timeout_fires(void **state)
{
    mw_ctx_t *ctx = *state;
    int hook = 0, n = 0;
    mw_future_t *f = mw_future_new(ctx);
    mw__future_on_cancel(f, hook_count, &hook);
    mw_future_then(f, count_cb, &n);
    assert_int_equal(mw_future_set_timeout(f, 20), 0);
    assert_int_equal(mw_wait(f), -ETIMEDOUT);
    assert_string_equal(mw_future_message(f), "timed out after 20 ms");
    assert_int_equal(hook, 1);
    spin(ctx);
    assert_int_equal(n, 1);
    assert_int_equal(mw_future_set_timeout(f, 20), -EALREADY);
    assert_int_equal(mw_future_cancel(f), -EALREADY);
    assert_int_equal(hook, 1);
    mw_future_unref(f);
    assert_int_equal(live(ctx), 0);
}

static void flag_fire(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    ++*(int *)arg;
}

static void timeout_resolved_first_does_not_fire(void **state)
{
    mw_ctx_t *ctx = *state;
    int hook = 0, fired = 0, x;
    mw_future_t *f = mw_future_new(ctx);
    mw__future_on_cancel(f, hook_count, &hook);
    assert_int_equal(mw_future_set_timeout(f, 10), 0);
    mw_future_resolve(f, &x);
    /* let well past the deadline elapse on the loop */
    struct event *ev = evtimer_new(mw_ctx_base(ctx), flag_fire, &fired);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 50 * 1000};
    evtimer_add(ev, &tv);
    event_base_loop(mw_ctx_base(ctx), 0);
    event_free(ev);
    assert_int_equal(fired, 1);
    assert_int_equal(hook, 0);
    assert_int_equal(mw_future_state(f), MW_FUTURE_DONE);
    assert_ptr_equal(mw_future_value(f), &x);
    mw_future_unref(f);
    assert_int_equal(live(ctx), 0);
}

static void timeout_replaced_by_later_call(void **state)
{
    mw_ctx_t *ctx = *state;
    struct timespec t0, t1;
    mw_future_t *f = mw_future_new(ctx);
    assert_int_equal(mw_future_set_timeout(f, 60000), 0);
    assert_int_equal(mw_future_set_timeout(f, 10), 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(mw_wait(f), -ETIMEDOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 5);
    assert_string_equal(mw_future_message(f), "timed out after 10 ms");
    mw_future_unref(f);
}

static void hook_unref(mw_future_t *f, void *arg)
{
    ++*(int *)arg;
    mw_future_resolve(f, NULL);   /* turns into the recorded failure */
    mw_future_unref(f); /* an operation releasing its reference */
}

/* A hook that cannot stop its operation at once (work on the device): the
 * future stays pending until the operation completes it, and then fails
 * with the cancel, whatever the operation reports. */
struct fence {
    mw_future_t *op;              /* the operation's reference */
    int hooked;
};

static void hook_later(mw_future_t *f, void *arg)
{
    struct fence *fc = arg;
    (void)f;
    fc->hooked++;
}

static void cancel_waits_for_the_operation(void **state)
{
    mw_ctx_t *ctx = *state;
    struct fence fc = {0};
    struct seen s = {0};
    mw_future_t *f = mw_future_new(ctx);
    fc.op = mw_future_ref(f);
    mw__future_on_cancel(f, hook_later, &fc);
    mw_future_then(f, seen_cb, &s);
    assert_int_equal(mw_future_cancel(f), 0);
    assert_int_equal(fc.hooked, 1);
    assert_int_equal(mw_future_state(f), MW_FUTURE_PENDING);   /* still fenced */
    assert_int_equal(mw_future_error(f), 0);
    assert_int_equal(mw_future_cancel(f), -EALREADY);
    assert_int_equal(mw_future_set_timeout(f, 1), 0);          /* a deadline changes nothing */
    loop_ms(ctx, 20);
    assert_int_equal(mw_future_state(f), MW_FUTURE_PENDING);
    assert_int_equal(s.calls, 0);
    mw_future_resolve(fc.op, NULL);                            /* the device let go */
    mw_future_unref(fc.op);
    assert_int_equal(mw_future_error(f), -ECANCELED);
    assert_string_equal(mw_future_message(f), "cancelled");
    spin(ctx);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.err, -ECANCELED);
    assert_int_equal(fc.hooked, 1);
    mw_future_unref(f);
    assert_int_equal(live(ctx), 0);
}

static void timeout_hook_may_drop_last_ref(void **state)
{
    mw_ctx_t *ctx = *state;
    int hook = 0;
    mw_future_t *f = mw_future_new(ctx); /* held by the "operation" only */
    mw__future_on_cancel(f, hook_unref, &hook);
    mw_future_set_timeout(f, 5);
    event_base_loop(mw_ctx_base(ctx), 0);
    assert_int_equal(hook, 1);
    assert_int_equal(live(ctx), 0);
}

static void cancel_runs_hook_once(void **state)
{
    mw_ctx_t *ctx = *state;
    int hook = 0;
    struct seen s = {0};
    mw_future_t *f = mw_future_new(ctx);
    mw__future_on_cancel(f, hook_count, &hook);
    mw_future_then(f, seen_cb, &s);
    assert_int_equal(mw_future_cancel(f), 0);
    assert_int_equal(hook, 1);
    assert_int_equal(s.calls, 0);
    assert_int_equal(mw_future_error(f), -ECANCELED);
    assert_int_equal(mw_future_cancel(f), -EALREADY);
    assert_int_equal(hook, 1);
    spin(ctx);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.err, -ECANCELED);
    mw_future_unref(f);
    assert_int_equal(live(ctx), 0);
}

static void cancel_after_completion_is_ealready(void **state)
{
    mw_ctx_t *ctx = *state;
    int hook = 0;
    mw_future_t *f = mw_future_new(ctx), *g = mw_future_new(ctx);
    mw__future_on_cancel(f, hook_count, &hook);
    mw__future_on_cancel(g, hook_count, &hook);
    mw_future_resolve(f, NULL);
    mw_future_fail(g, -EIO, "plain failure");
    assert_int_equal(mw_future_cancel(f), -EALREADY);
    assert_int_equal(mw_future_cancel(g), -EALREADY);
    assert_int_equal(hook, 0); /* ordinary completion never runs it */
    assert_int_equal(mw_future_state(f), MW_FUTURE_DONE);
    assert_int_equal(mw_future_error(g), -EIO);
    mw_future_unref(f);
    mw_future_unref(g);
}

static void cancel_hook_may_drop_last_ref(void **state)
{
    mw_ctx_t *ctx = *state;
    int hook = 0;
    mw_future_t *f = mw_future_new(ctx);   /* the operation's reference */
    mw_future_t *mine = mw_future_ref(f);
    mw__future_on_cancel(f, hook_unref, &hook);
    assert_int_equal(mw_future_cancel(mine), 0);
    assert_int_equal(hook, 1);
    assert_int_equal(mw_future_error(mine), -ECANCELED);
    mw_future_unref(mine);
    assert_int_equal(live(ctx), 0);
}

/* ------------------------------------------------------------------------
 * mw_wait
 * ------------------------------------------------------------------------ */

static void wait_returns_value(void **state)
{
    mw_ctx_t *ctx = *state;
    int x;
    mw_future_t *f = mw_future_new(ctx);
    struct later l = {.f = f, .value = &x};
    later_arm(&l, ctx, 10);
    assert_int_equal(mw_wait(f), 0);
    assert_ptr_equal(mw_future_value(f), &x);
    assert_int_equal(mw_wait(f), 0); /* done: returns at once */
    event_free(l.ev);
    mw_future_unref(f);
}

static void wait_returns_error(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *f = mw_future_new(ctx);
    struct later l = {.f = f, .err = -ECONNRESET};
    later_arm(&l, ctx, 10);
    assert_int_equal(mw_wait(f), -ECONNRESET);
    assert_string_equal(mw_future_message(f), "failed later");
    event_free(l.ev);
    mw_future_unref(f);
}

struct wait_in_cb {
    mw_future_t *other;
    int rc_self, rc_other;
};

static void wait_cb(mw_future_t *f, void *arg)
{
    struct wait_in_cb *w = arg;
    w->rc_self = mw_wait(f);
    w->rc_other = mw_wait(w->other);
}

static void wait_inside_callback_is_edeadlk(void **state)
{
    mw_ctx_t *ctx = *state;
    struct wait_in_cb w = {.other = mw_future_new(ctx)};
    mw_future_t *f = mw_future_new(ctx);
    mw_future_then(f, wait_cb, &w);
    mw_future_resolve(f, NULL);
    spin(ctx);
    assert_int_equal(w.rc_self, -EDEADLK);
    assert_int_equal(w.rc_other, -EDEADLK);
    mw_future_unref(f);
    mw_future_unref(w.other);
}

static void wait_with_nothing_to_wake_is_edeadlk(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *f = mw_future_new(ctx);
    assert_int_equal(mw_wait(f), -EDEADLK);
    assert_int_equal(mw_future_state(f), MW_FUTURE_PENDING);
    mw_future_unref(f);
}

/* ------------------------------------------------------------------------
 * Teardown and a caller's base
 * ------------------------------------------------------------------------ */

static void ctx_free_fails_pending(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    int hook = 0, n_done = 0;
    struct seen s = {0}, sr = {0};
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_future_t *f = mw_future_new(ctx);
    mw_future_t *done = mw_future_new(ctx);
    struct step st = {.next = NULL};
    mw_future_t *r = mw_future_chain(f, step_fn, &st);
    mw__future_on_cancel(f, hook_count, &hook);
    mw_future_set_timeout(f, 60000);
    mw_future_then(f, seen_cb, &s);
    mw_future_then(r, seen_cb, &sr);
    mw_future_resolve(done, NULL);
    mw_future_then(done, count_cb, &n_done); /* due, not yet run */

    mw_ctx_free(ctx);

    /* every callback ran before mw_ctx_free returned */
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.err, -ECANCELED);
    assert_string_equal(s.msg, "context closed");
    assert_int_equal(hook, 1);
    assert_int_equal(n_done, 1);
    assert_int_equal(sr.calls, 1);
    assert_int_equal(sr.err, -ECANCELED);
    assert_int_equal(st.calls, 0);
    /* what the caller still holds stays readable */
    assert_int_equal(mw_future_state(f), MW_FUTURE_FAILED);
    assert_int_equal(mw_future_error(f), -ECANCELED);
    assert_string_equal(mw_future_message(f), "context closed");
    assert_int_equal(mw_future_state(done), MW_FUTURE_DONE);
    assert_int_equal(mw_future_then(f, count_cb, &n_done), -ESHUTDOWN);
    assert_int_equal(mw_future_set_timeout(f, 1), -ESHUTDOWN);
    assert_null(mw_future_chain(f, step_fn, &st));
    assert_int_equal(mw_wait(f), -ESHUTDOWN);
    assert_int_equal(mw_future_cancel(f), -EALREADY);
    assert_int_equal(mw_future_resolve(done, NULL), -EALREADY);
    assert_ptr_equal(mw_future_ref(f), f);
    mw_future_unref(f);
    mw_future_unref(f);
    mw_future_unref(done);
    mw_future_unref(r);
}

struct late {
    mw_ctx_t *ctx;
    mw_future_t *made;
    struct seen seen;
};

static void make_during_teardown(mw_future_t *f, void *arg)
{
    struct late *l = arg;
    (void)f;
    /* nothing could complete it after the ctx is gone: it fails now, and
     * its callbacks still run before mw_ctx_free returns */
    l->made = mw_future_new(l->ctx);
    assert_int_equal(mw_future_then(l->made, seen_cb, &l->seen), 0);
}

static void future_made_during_teardown(void **state)
{
    (void)state;
    struct late l = {0};
    assert_int_equal(mw_ctx_new(&l.ctx, NULL, NULL), 0);
    mw_future_t *f = mw_future_new(l.ctx);
    mw_future_then(f, make_during_teardown, &l);
    mw_ctx_free(l.ctx);
    assert_non_null(l.made);
    assert_int_equal(l.seen.calls, 1);
    assert_int_equal(l.seen.err, -ECANCELED);
    assert_int_equal(mw_future_error(l.made), -ECANCELED);
    mw_future_unref(l.made);
    mw_future_unref(f);
}

static void callers_base(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    mw_ctx_t *ctx;
    int n = 0, x, fired = 0;
    assert_non_null(base);
    assert_int_equal(mw_ctx_new(&ctx, base, NULL), 0);
    assert_ptr_equal(mw_ctx_base(ctx), base);

    mw_future_t *f = mw_future_new(ctx), *g = mw_future_new(ctx);
    mw_future_then(f, count_cb, &n);
    mw_future_set_timeout(f, 10);
    assert_int_equal(mw_wait(f), -ETIMEDOUT);
    struct later l = {.f = g, .value = &x};
    later_arm(&l, ctx, 5);
    assert_int_equal(mw_wait(g), 0);
    assert_ptr_equal(mw_future_value(g), &x);
    event_base_loop(base, EVLOOP_NONBLOCK);
    assert_int_equal(n, 1);
    event_free(l.ev);
    mw_future_unref(f);
    mw_future_unref(g);
    assert_int_equal(live(ctx), 0);
    mw_ctx_free(ctx);

    /* the base is still the caller's, and still works */
    struct event *ev = evtimer_new(base, flag_fire, &fired);
    struct timeval tv = {0, 1000};
    evtimer_add(ev, &tv);
    assert_true(event_base_loop(base, 0) >= 0);
    assert_int_equal(fired, 1);
    event_free(ev);
    event_base_free(base);
}


/* ------------------------------------------------------------------------
 * Handles: released, reused, foreign, off the loop thread
 * ------------------------------------------------------------------------ */

static mw_future_t *chain_never(mw_future_t *f, void *arg)
{
    (void)f;
    (void)arg;
    fail_msg("a chain on a released future must not run");
    return NULL;
}

/* Every call on a handle whose future is gone is refused with -ESTALE
 * (the double unref among them), and nothing else is touched. */
static void released_future_is_refused_everywhere(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *f = mw_future_new(ctx);
    assert_int_equal(mw_future_resolve(f, &order[0]), 0);
    assert_int_equal(mw_future_unref(f), 0);
    assert_int_equal(live(ctx), 0);

    assert_int_equal(mw_future_unref(f), -ESTALE);           /* double unref */
    assert_null(mw_future_ref(f));
    assert_int_equal(mw_future_state(f), -ESTALE);
    assert_int_equal(mw_future_error(f), -ESTALE);
    assert_string_equal(mw_future_message(f), mw_strerror(-ESTALE));
    errno = 0;
    assert_null(mw_future_value(f));
    assert_int_equal(errno, ESTALE);
    assert_int_equal(mw_future_resolve(f, NULL), -ESTALE);
    assert_int_equal(mw_future_fail(f, -EIO, "x"), -ESTALE);
    assert_int_equal(mw_future_then(f, count_cb, NULL), -ESTALE);
    assert_int_equal(mw_future_set_timeout(f, 1), -ESTALE);
    assert_int_equal(mw_future_cancel(f), -ESTALE);
    assert_int_equal(mw_wait(f), -ESTALE);
    errno = 0;
    assert_null(mw_future_chain(f, chain_never, NULL));
    assert_int_equal(errno, ESTALE);
    mw_future_t *g = mw_future_new(ctx);
    mw_future_t *pair[] = {g, f};
    errno = 0;
    assert_null(mw_future_all(ctx, pair, 2));
    assert_int_equal(errno, ESTALE);
    mw_future_unref(g);
    spin(ctx);
    assert_int_equal(live(ctx), 0);
    assert_true(strstr(mw_strerror(-ESTALE), "stale handle") != NULL);
}

/* A released handle never names the future made after it, even when that
 * one reuses the same memory and table slot: the stale unref is refused
 * and the new future is untouched. */
static void stale_handle_never_reaches_a_new_future(void **state)
{
    mw_ctx_t *ctx = *state;
    for (int i = 0; i < 10000; i++) {
        mw_future_t *old = mw_future_new(ctx);
        assert_int_equal(mw_future_unref(old), 0);
        mw_future_t *f = mw_future_new(ctx);
        assert_ptr_not_equal(f, old);
        assert_int_equal(mw_future_unref(old), -ESTALE);
        assert_int_equal(mw_future_state(f), MW_FUTURE_PENDING);
        assert_int_equal(mw_future_resolve(f, NULL), 0);
        assert_int_equal(mw_future_unref(f), 0);
    }
    assert_int_equal(live(ctx), 0);
}

/* An extra unref while others still hold the future frees it early (it
 * cannot know whose reference it was), but every later use by those
 * holders, including the operation's own completion, is refused. */
static void extra_unref_leaves_holders_refused_not_corrupted(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_future_t *f = mw_future_new(ctx);
    mw_future_ref(f);                          /* an "operation" holds one */
    assert_int_equal(mw_future_unref(f), 0);
    assert_int_equal(mw_future_unref(f), 0);   /* the caller's bug: one too many */
    assert_int_equal(live(ctx), 0);
    assert_int_equal(mw_future_resolve(f, NULL), -ESTALE);   /* the operation */
    assert_int_equal(mw_future_unref(f), -ESTALE);
}

/* A communicator of one rank: a handle of another kind, no RDMA needed. */
static mw_comm_t *one_rank_comm(mw_ctx_t *ctx)
{
    const char *peers[] = {"127.0.0.1:1"};
    mw_future_t *cf = mw_comm_create(ctx, 0, 1, peers, NULL);
    assert_int_equal(mw_wait(cf), 0);
    mw_comm_t *comm = mw_future_value(cf);
    mw_future_unref(cf);
    return comm;
}

/* A handle of another kind is refused with -EINVAL, and so is a value that
 * never was a handle (here the address of a real object). */
static void foreign_handles_are_refused(void **state)
{
    mw_ctx_t *ctx = *state;
    mw_comm_t *comm = one_rank_comm(ctx);
    assert_int_equal(mw_comm_size(comm), 1);

    assert_int_equal(mw_future_state((mw_future_t *)comm), -EINVAL);
    assert_int_equal(mw_future_unref((mw_future_t *)comm), -EINVAL);
    assert_int_equal(mw_comm_size(comm), 1);                    /* untouched */
    mw_future_t *f = mw_future_new(ctx);
    assert_int_equal(mw_comm_rank((mw_comm_t *)f), -EINVAL);
    assert_int_equal(mw_conn_abort((mw_conn_t *)f), -EINVAL);
    assert_int_equal(mw_future_state(f), MW_FUTURE_PENDING);
    mw_future_unref(f);

    int object = 0;
    assert_int_equal(mw_future_unref((mw_future_t *)&object), -ESTALE);
    assert_int_equal(mw_comm_free((mw_comm_t *)&object), -ESTALE);

    assert_int_equal(mw_comm_free(comm), 0);
    assert_int_equal(mw_comm_free(comm), -ESTALE);              /* double free */
    assert_int_equal(mw_comm_rank(comm), -ESTALE);
    int x = 0;
    errno = 0;
    assert_null(mw_allreduce(comm, &x, &x, 1, MW_INT32, MW_SUM));
    assert_int_equal(errno, ESTALE);
    spin(ctx);
    assert_int_equal(live(ctx), 0);
}

struct off_thread {
    mw_future_t *f;
    int resolve, state, unref, then;
};

static void *touch_off_thread(void *arg)
{
    struct off_thread *o = arg;
    o->resolve = mw_future_resolve(o->f, NULL);
    o->state = mw_future_state(o->f);
    o->then = mw_future_then(o->f, count_cb, NULL);
    o->unref = mw_future_unref(o->f);
    return NULL;
}

/* Futures belong to their context's loop thread: from another thread every
 * call is refused with -EPERM and the future is left as it was. */
static void future_touched_off_thread_is_refused(void **state)
{
    mw_ctx_t *ctx = *state;
    struct off_thread o = {.f = mw_future_new(ctx)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, touch_off_thread, &o), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(o.resolve, -EPERM);
    assert_int_equal(o.state, -EPERM);
    assert_int_equal(o.then, -EPERM);
    assert_int_equal(o.unref, -EPERM);
    assert_int_equal(mw_future_state(o.f), MW_FUTURE_PENDING);
    assert_int_equal(live(ctx), 1);
    assert_int_equal(mw_future_unref(o.f), 0);
    assert_int_equal(live(ctx), 0);
}

/* A future the caller still holds after mw_ctx_free() stays readable, and
 * its last unref releases its handle like any other. */
static void future_outliving_its_ctx_releases_its_handle(void **state)
{
    (void)state;
    uint64_t before = mw__handles_live();
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_future_t *f = mw_future_new(ctx);
    mw_ctx_free(ctx);
    assert_int_equal(mw_future_error(f), -ECANCELED);
    assert_int_equal(mw_future_unref(f), 0);
    assert_int_equal(mw_future_unref(f), -ESTALE);
    assert_int_equal(mw__handles_live(), before);
}

/* A communicator the caller never freed goes with its context, and its
 * handle turns stale. */
static void communicator_left_at_context_free_is_released(void **state)
{
    (void)state;
    uint64_t before = mw__handles_live();
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_comm_t *comm = one_rank_comm(ctx);
    mw_ctx_free(ctx);
    assert_int_equal(mw_comm_rank(comm), -ESTALE);
    assert_int_equal(mw_comm_free(comm), -ESTALE);
    assert_int_equal(mw__handles_live(), before);
}

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(then_on_pending_runs_from_loop),
        T(then_on_complete_is_deferred),
        T(callbacks_run_in_registration_order),
        T(callbacks_ordered_across_futures),
        T(then_inside_callback_runs_after_it),
        T(complete_twice_is_ealready),
        T(fail_rejects_nonnegative_error),
        T(fail_formats_message),
        T(null_future_is_tolerated),
        T(refcount_balance),
        T(unref_inside_callback),
        T(unref_before_callback_runs),
        T(callback_keeps_its_future),
        T(chain_success),
        T(chain_first_fails_skips_fn),
        T(chain_fn_returns_null),
        T(chain_second_fails),
        T(chain_of_chains),
        T(chain_holds_what_it_needs),
        T(chain_cancel_stops_step),
        T(all_of_none),
        T(all_of_one),
        T(all_of_several),
        T(all_fails_fast),
        T(all_rejects_bad_input),
        T(timeout_fires),
        T(timeout_resolved_first_does_not_fire),
        T(timeout_replaced_by_later_call),
        T(timeout_hook_may_drop_last_ref),
        T(cancel_runs_hook_once),
        T(cancel_after_completion_is_ealready),
        T(cancel_hook_may_drop_last_ref),
        T(cancel_waits_for_the_operation),
        T(wait_returns_value),
        T(wait_returns_error),
        T(wait_inside_callback_is_edeadlk),
        T(wait_with_nothing_to_wake_is_edeadlk),
        T(released_future_is_refused_everywhere),
        T(stale_handle_never_reaches_a_new_future),
        T(extra_unref_leaves_holders_refused_not_corrupted),
        T(foreign_handles_are_refused),
        T(future_touched_off_thread_is_refused),
        cmocka_unit_test(future_outliving_its_ctx_releases_its_handle),
        cmocka_unit_test(communicator_left_at_context_free_is_released),
        cmocka_unit_test(ctx_free_fails_pending),
        cmocka_unit_test(future_made_during_teardown),
        cmocka_unit_test(callers_base),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
