/* The completion engine against a fake CQ: events, drain, the re-arm race,
 * error and stray completions, batched acks, the per-turn budget (in
 * completions and in time); and the operation table behind wr_ids. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <event2/event.h>

#include "core/cq.h"
#include "core/ctx.h"
#include "core/op.h"

#define QCAP 4096

struct fake {
    int efd;                     /* the "channel" fd */
    unsigned events;             /* events the channel holds */
    struct ibv_wc q[QCAP];
    unsigned head, tail;
    bool armed;
    unsigned notify_calls, ack_calls, acked;
    unsigned land_on_arm;        /* completions that land as the CQ re-arms */
    int arm_error;               /* req_notify fails with this */
    uint64_t land_wr_id;
};

struct fixture {
    mw_ctx_t *ctx;
    struct fake fk;
    struct mw__cq cq;
    unsigned done_calls;
    uint64_t last_wr_id;
    enum ibv_wc_status last_status;
};

static void push(struct fake *fk, uint64_t wr_id, enum ibv_wc_status st)
{
    fk->q[fk->tail++ % QCAP] = (struct ibv_wc){.wr_id = wr_id, .status = st};
}

/* A completion arrives: an armed CQ raises one event and disarms. */
static void complete(struct fake *fk, uint64_t wr_id, enum ibv_wc_status st)
{
    push(fk, wr_id, st);
    if (fk->armed) {
        fk->armed = false;
        fk->events++;
        uint64_t one = 1;
        assert_int_equal(write(fk->efd, &one, sizeof one), sizeof one);
    }
}

static int f_get_event(void *chan, void **cq_context)
{
    struct fake *fk = chan;
    if (!fk->events) {
        uint64_t v;
        (void)!read(fk->efd, &v, sizeof v);     /* clear readability */
        return -EAGAIN;
    }
    fk->events--;
    *cq_context = NULL;
    return 0;
}

static void f_ack(void *cq, unsigned n)
{
    struct fake *fk = cq;
    fk->ack_calls++;
    fk->acked += n;
}

static int f_poll(void *cq, int n, struct ibv_wc *wc)
{
    struct fake *fk = cq;
    int got = 0;
    while (got < n && fk->head != fk->tail)
        wc[got++] = fk->q[fk->head++ % QCAP];
    return got;
}

static int f_req_notify(void *cq)
{
    struct fake *fk = cq;
    fk->notify_calls++;
    if (fk->arm_error)
        return fk->arm_error;
    /* The race: these land after the engine's last poll, just before the
     * arm takes effect -- in the CQ, but no event will ever say so. */
    for (; fk->land_on_arm; fk->land_on_arm--)
        push(fk, fk->land_wr_id, IBV_WC_SUCCESS);
    fk->armed = true;
    return 0;
}

static const struct mw__cq_driver fake_driver = {
    .get_event = f_get_event, .ack_events = f_ack, .poll = f_poll, .req_notify = f_req_notify,
};

static void on_done(struct mw__op *op, const struct ibv_wc *wc)
{
    struct fixture *fx = op->owner;
    fx->done_calls++;
    fx->last_wr_id = wc->wr_id;
    fx->last_status = wc->status;
    op->u64[0]++;
}

static int setup_budget(void **state, unsigned budget)
{
    struct fixture *fx = calloc(1, sizeof *fx);
    mw_ctx_opts_t o;
    mw_ctx_opts_init(&o);
    o.max_wc_per_turn = budget;
    assert_int_equal(mw_ctx_new(&fx->ctx, NULL, &o), 0);
    fx->fk.efd = eventfd(0, EFD_NONBLOCK);
    assert_true(fx->fk.efd >= 0);
    assert_int_equal(mw__cq_start(fx->ctx, &fx->cq, &fake_driver, fx->fk.efd, &fx->fk, &fx->fk), 0);
    assert_true(fx->fk.armed);
    *state = fx;
    return 0;
}

static int setup(void **state) { return setup_budget(state, 0); }
static int setup_small_budget(void **state) { return setup_budget(state, 10); }

static int teardown(void **state)
{
    struct fixture *fx = *state;
    mw__cq_stop(&fx->cq);
    mw_ctx_free(fx->ctx);
    close(fx->fk.efd);
    free(fx);
    return 0;
}

static void run_loop(struct fixture *fx)
{
    while (event_base_loop(fx->ctx->base, EVLOOP_NONBLOCK) == 0 &&
           (fx->fk.events || fx->cq.backlog))
        ;
}

static void one_event_drains_everything(void **state)
{
    struct fixture *fx = *state;
    struct mw__op *op = mw__op_get(fx->ctx, on_done, NULL, fx);
    for (int i = 0; i < 5; i++)
        complete(&fx->fk, op->wr_id, IBV_WC_SUCCESS);
    assert_int_equal(fx->fk.events, 1);           /* only the first raised one */
    run_loop(fx);
    assert_int_equal(fx->done_calls, 5);
    assert_int_equal(op->u64[0], 5);
    assert_int_equal(fx->ctx->stats.events, 1);
    assert_int_equal(fx->ctx->stats.completions, 5);
    assert_true(fx->fk.armed);                    /* re-armed for the next */
    assert_int_equal(fx->fk.acked, 1);
    mw__op_put(fx->ctx, op);
}

static void count_broken(void *arg, int err)
{
    int *seen = arg;
    assert_int_equal(err, -EIO);
    ++*seen;
}

/* A CQ that cannot be re-armed would never raise another event: whatever
 * waits on it is failed (its owner told once) and its channel is no longer
 * watched, so neither the loop nor mw_ctx_fd keeps waking for it. */
static void broken_cq_is_reported_once_and_unwatched(void **state)
{
    struct fixture *fx = *state;
    int seen = 0;
    fx->cq.broken_fn = count_broken;
    fx->cq.broken_arg = &seen;
    int fd = mw_ctx_fd(fx->ctx);      /* covers the channel mw__cq_start watches */
    assert_true(fd >= 0);
    struct mw__op *op = mw__op_get(fx->ctx, on_done, NULL, fx);
    fx->fk.arm_error = -EIO;
    complete(&fx->fk, op->wr_id, IBV_WC_SUCCESS);
    run_loop(fx);
    assert_int_equal(fx->done_calls, 1);          /* what was there still counts */
    assert_true(fx->cq.broken);
    assert_int_equal(seen, 1);
    complete(&fx->fk, op->wr_id, IBV_WC_SUCCESS);   /* an event, unheard now */
    uint64_t one = 1;
    assert_int_equal(write(fx->fk.efd, &one, sizeof one), sizeof one);
    for (int i = 0; i < 5; i++)
        mw_ctx_progress(fx->ctx);
    assert_int_equal(seen, 1);
    assert_int_equal(fx->done_calls, 1);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 50), 0);         /* the context's descriptor stays quiet */
    mw__op_put(fx->ctx, op);
}

static void rearm_race_is_closed(void **state)
{
    struct fixture *fx = *state;
    struct mw__op *op = mw__op_get(fx->ctx, on_done, NULL, fx);
    complete(&fx->fk, op->wr_id, IBV_WC_SUCCESS);
    fx->fk.land_on_arm = 3;
    fx->fk.land_wr_id = op->wr_id;
    run_loop(fx);
    /* Without the poll after the re-arm these three would sit in the CQ
     * until some unrelated completion raised the next event. */
    assert_int_equal(fx->done_calls, 4);
    assert_int_equal(fx->fk.head, fx->fk.tail);
    assert_int_equal(fx->fk.events, 0);
    assert_int_equal(fx->ctx->stats.events, 1);
    mw__op_put(fx->ctx, op);
}

static void error_completion_reaches_its_op(void **state)
{
    struct fixture *fx = *state;
    struct mw__op *ok = mw__op_get(fx->ctx, on_done, NULL, fx);
    struct mw__op *bad = mw__op_get(fx->ctx, on_done, NULL, fx);
    complete(&fx->fk, ok->wr_id, IBV_WC_SUCCESS);
    complete(&fx->fk, bad->wr_id, IBV_WC_REM_ACCESS_ERR);
    run_loop(fx);
    assert_int_equal(fx->done_calls, 2);
    assert_int_equal(fx->last_wr_id, bad->wr_id);
    assert_int_equal(fx->last_status, IBV_WC_REM_ACCESS_ERR);
    assert_int_equal(fx->ctx->stats.completion_errors, 1);
    assert_int_equal(mw__wc_errno(IBV_WC_REM_ACCESS_ERR), -EACCES);
    assert_int_equal(mw__wc_errno(IBV_WC_WR_FLUSH_ERR), -ECANCELED);
    assert_int_equal(mw__wc_errno(IBV_WC_RETRY_EXC_ERR), -ETIMEDOUT);
    mw__op_put(fx->ctx, ok);
    mw__op_put(fx->ctx, bad);
}

static void stray_and_forged_wr_ids_are_dropped(void **state)
{
    struct fixture *fx = *state;
    struct mw__op *op = mw__op_get(fx->ctx, on_done, NULL, fx);
    uint64_t old = op->wr_id;
    mw__op_put(fx->ctx, op);
    struct mw__op *reused = mw__op_get(fx->ctx, on_done, NULL, fx);
    assert_ptr_equal(reused, op);                 /* same slot ... */
    assert_int_not_equal(reused->wr_id, old);     /* ... new generation */
    complete(&fx->fk, old, IBV_WC_WR_FLUSH_ERR);  /* flush of the released op */
    complete(&fx->fk, 0xdeadbeefcafeULL, IBV_WC_SUCCESS);
    complete(&fx->fk, 0, IBV_WC_SUCCESS);
    run_loop(fx);
    assert_int_equal(fx->done_calls, 0);
    assert_int_equal(fx->ctx->stats.stray_completions, 3);
    /* the flush is counted as one, not as an error */
    assert_int_equal(fx->ctx->stats.flushes, 1);
    assert_int_equal(fx->ctx->stats.completion_errors, 0);
    assert_int_equal(reused->u64[0], 0);
    mw__op_put(fx->ctx, reused);
}

/* Several events queued on the channel before the loop gets to it: the
 * first wake-up drains every completion, each event is read (one per
 * wake-up, no failing read) and acknowledged, and nothing runs twice. */
static void queued_events_are_each_read_and_acked(void **state)
{
    struct fixture *fx = *state;
    struct mw__op *op = mw__op_get(fx->ctx, on_done, NULL, fx);
    for (int i = 0; i < 4; i++) {
        complete(&fx->fk, op->wr_id, IBV_WC_SUCCESS);
        fx->fk.armed = true;
    }
    fx->fk.armed = false;
    assert_int_equal(fx->fk.events, 4);
    run_loop(fx);
    assert_int_equal(fx->done_calls, 4);
    assert_int_equal(fx->fk.acked, 4);
    assert_int_equal(fx->fk.events, 0);
    assert_int_equal(fx->ctx->stats.events, 4);
    mw__op_put(fx->ctx, op);
}

static void budget_yields_and_resumes_without_new_events(void **state)
{
    struct fixture *fx = *state;                 /* max_wc_per_turn = 10 */
    struct mw__op *op = mw__op_get(fx->ctx, on_done, NULL, fx);
    for (int i = 0; i < 35; i++)
        complete(&fx->fk, op->wr_id, IBV_WC_SUCCESS);
    assert_int_equal(event_base_loop(fx->ctx->base, EVLOOP_ONCE), 0);
    assert_int_equal(fx->done_calls, 10);         /* one turn, one budget */
    assert_true(fx->cq.backlog);
    assert_false(fx->fk.armed);                   /* not re-armed mid-backlog */
    run_loop(fx);
    assert_int_equal(fx->done_calls, 35);
    assert_false(fx->cq.backlog);
    assert_true(fx->fk.armed);
    assert_int_equal(fx->ctx->stats.events, 1);
    assert_int_equal(fx->fk.acked, 1);
    mw__op_put(fx->ctx, op);
}

static void completions_per_event_grow_with_bursts(void **state)
{
    struct fixture *fx = *state;
    struct mw__op *op = mw__op_get(fx->ctx, on_done, NULL, fx);
    for (int burst = 0; burst < 10; burst++) {
        for (int i = 0; i < 100; i++)
            complete(&fx->fk, op->wr_id, IBV_WC_SUCCESS);
        run_loop(fx);
    }
    assert_int_equal(fx->done_calls, 1000);
    assert_int_equal(fx->ctx->stats.events, 10);
    /* 100 completions per event, in batches: 4 polls to drain 100 (32 each),
     * plus the poll after the re-arm. */
    assert_true(fx->ctx->stats.polls <= 10 * 6);
    mw__op_put(fx->ctx, op);
}

static void ops_table_grows_and_validates(void **state)
{
    struct fixture *fx = *state;
    enum { N = 1000 };
    struct mw__op *ops[N];
    for (int i = 0; i < N; i++) {
        ops[i] = mw__op_get(fx->ctx, on_done, NULL, fx);
        assert_non_null(ops[i]);
    }
    assert_int_equal(mw__ops_live(fx->ctx), N);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(mw__op_lookup(fx->ctx, ops[i]->wr_id), ops[i]);
    /* a position (chained requests number themselves) finds the same op */
    for (unsigned pos = 0; pos < 256; pos += 51) {
        struct ibv_wc wc = {.wr_id = mw__op_wr_id_at(ops[7], (uint8_t)pos)};
        assert_ptr_equal(mw__op_lookup(fx->ctx, wc.wr_id), ops[7]);
        assert_int_equal(mw__wc_pos(&wc), pos);
    }
    for (int i = 0; i < N; i += 2) {
        uint64_t id = ops[i]->wr_id;
        mw__op_put(fx->ctx, ops[i]);
        assert_null(mw__op_lookup(fx->ctx, id));
        assert_null(mw__op_lookup(fx->ctx, mw__op_wr_id_at(ops[i], 200)));
    }
    assert_int_equal(mw__ops_live(fx->ctx), N / 2);
    assert_null(mw__op_lookup(fx->ctx, (uint64_t)1 << 32 | 0xffffffu));   /* out of range */
    /* an owner's records go together; others stay */
    int other;
    for (int i = 1; i < 20; i += 2)
        ops[i]->owner = &other;
    mw__ops_drop_owner(fx->ctx, &other);
    assert_int_equal(mw__ops_live(fx->ctx), N / 2 - 10);
    for (int i = 1; i < N; i += 2)
        if (i < 20)
            assert_null(mw__op_lookup(fx->ctx, ops[i]->wr_id));
        else
            assert_ptr_equal(mw__op_lookup(fx->ctx, ops[i]->wr_id), ops[i]);
    for (int i = 21; i < N; i += 2)
        mw__op_put(fx->ctx, ops[i]);
    assert_int_equal(mw__ops_live(fx->ctx), 0);
}

static unsigned aborted;
static void on_abort(struct mw__op *op, int err)
{
    assert_int_equal(err, -ECANCELED);
    aborted++;
    mw__op_put(((struct fixture *)op->owner)->ctx, op);
}

static void teardown_aborts_live_ops(void **state)
{
    (void)state;
    struct fixture fx = {0};
    assert_int_equal(mw_ctx_new(&fx.ctx, NULL, NULL), 0);
    aborted = 0;
    for (int i = 0; i < 3; i++)
        assert_non_null(mw__op_get(fx.ctx, on_done, on_abort, &fx));
    mw_ctx_free(fx.ctx);
    assert_int_equal(aborted, 3);
}

/* --- the turn budget -------------------------------------------------------- */

static double wall_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

struct turn_probe {
    mw_ctx_t *ctx;
    double ms;                    /* how long the turn worked */
    double limit_ms;              /* the budget and a coarse tick */
    int pieces;
    int late;                     /* pieces begun past limit_ms */
};

/* A loop callback working in 0.25 ms pieces while the budget allows. */
static void work_while_allowed(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct turn_probe *t = arg;
    double t0 = wall_ms();
    for (t->pieces = 0; t->pieces < 2000 && mw__turn_may(t->ctx); t->pieces++) {
        double start = wall_ms();
        t->late += start - t0 > t->limit_ms;
        for (double end = start + 0.25; wall_ms() < end;)
            ;
    }
    t->ms = wall_ms() - t0;
}

/* The budget goes by the coarse clock (free to read, a tick's resolution):
 * no piece begins past the budget plus a tick, so a turn works at most
 * that long, and at least one piece -- never the 500 ms the pieces would
 * take unbounded.  A preemption only makes a turn stop sooner (the piece
 * after it finds the budget spent), so what is asserted holds on a busy
 * machine too: the turns' lengths are printed, the pieces counted.  (One
 * late piece is allowed: a preemption between mw__turn_may and reading
 * the clock.) */
static void turn_budget_binds_by_the_coarse_clock(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    struct timespec res;
    assert_int_equal(clock_getres(CLOCK_MONOTONIC_COARSE, &res), 0);
    double tick_ms = res.tv_sec * 1e3 + res.tv_nsec / 1e6;
    struct turn_probe t = {.ctx = ctx, .limit_ms = MW__TURN_NS / 1e6 + tick_ms + 0.5};
    int max_pieces = (int)(t.limit_ms / 0.25) + 1;
    struct event *ev = evtimer_new(ctx->base, work_while_allowed, &t);
    const struct timeval zero = {0, 0};
    for (int i = 0; i < 10; i++) {
        assert_int_equal(event_add(ev, &zero), 0);
        assert_int_equal(event_base_loop(ctx->base, EVLOOP_ONCE), 0);
        print_message("turn %d: %d pieces, %.2f ms (budget %.0f ms, tick %.1f ms)\n", i,
                      t.pieces, t.ms, MW__TURN_NS / 1e6, tick_ms);
        assert_true(t.pieces >= 1);
        assert_true(t.pieces <= max_pieces);
    }
    assert_true(t.late <= 1);
    event_free(ev);
    mw_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(one_event_drains_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(rearm_race_is_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(broken_cq_is_reported_once_and_unwatched, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(error_completion_reaches_its_op, setup, teardown),
        cmocka_unit_test_setup_teardown(stray_and_forged_wr_ids_are_dropped, setup, teardown),
        cmocka_unit_test_setup_teardown(queued_events_are_each_read_and_acked, setup, teardown),
        cmocka_unit_test_setup_teardown(budget_yields_and_resumes_without_new_events,
                                        setup_small_budget, teardown),
        cmocka_unit_test_setup_teardown(completions_per_event_grow_with_bursts, setup, teardown),
        cmocka_unit_test_setup_teardown(ops_table_grows_and_validates, setup, teardown),
        cmocka_unit_test(teardown_aborts_live_ops),
        cmocka_unit_test(turn_budget_binds_by_the_coarse_clock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
