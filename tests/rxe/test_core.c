/* Core on real soft-RoCE devices: memory from the registered arena and from
 * mw_reg moved by RDMA between two devices on two subnets; a burst of
 * signalled writes drained by events, not spinning; an idle context with
 * armed CQs costs no CPU. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <event2/event.h>

#include "core/cq.h"
#include "mem/mem.h"
#include "core/op.h"
#include "mem/region.h"
#include "rxe_util.h"

static const char *addrs[2];

struct fx {
    mw_ctx_t *ctx;
    struct qp_pair qp;
};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    assert_int_equal(mw_ctx_new(&f->ctx, NULL, NULL), 0);
    int rc = qp_pair_connect(f->ctx, addrs[0], addrs[1], 256, &f->qp);
    if (rc < 0)
        fail_msg("connecting %s -> %s: %s", addrs[0], addrs[1], mw_strerror(rc));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    qp_pair_close(&f->qp);
    mw_ctx_free(f->ctx);
    free(f);
    return 0;
}

/* --- posting a write and counting its completion ------------------------ */

struct writer {
    mw_ctx_t *ctx;
    struct ibv_qp *qp;
    uint32_t lkey, rkey;
    struct ibv_mr *export;      /* the target's remote-access registration */
    char *src, *dst;            /* local source, remote target */
    size_t len;
    unsigned posted, completed, errors, target, window;
};

static void post_one(struct writer *w);

static void on_write_done(struct mw__op *op, const struct ibv_wc *wc)
{
    struct writer *w = op->owner;
    w->completed++;
    if (wc->status != IBV_WC_SUCCESS)
        w->errors++;
    mw__op_put(w->ctx, op);
    if (w->posted < w->target)
        post_one(w);          /* keep the window full, from the callback */
    else if (w->completed == w->target)
        event_base_loopbreak(w->ctx->base);
}

static void post_one(struct writer *w)
{
    struct mw__op *op = mw__op_get(w->ctx, on_write_done, NULL, w);
    assert_non_null(op);
    struct ibv_sge sge = {.addr = (uintptr_t)w->src, .length = w->len, .lkey = w->lkey};
    struct ibv_send_wr wr = {
        .wr_id = op->wr_id, .sg_list = &sge, .num_sge = 1,
        .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
        .wr.rdma = {.remote_addr = (uintptr_t)w->dst, .rkey = w->rkey},
    }, *bad;
    int rc = ibv_post_send(w->qp, &wr, &bad);
    if (rc)
        fail_msg("ibv_post_send: %s", strerror(rc));
    w->posted++;
}

static void run_writes(struct writer *w)
{
    for (unsigned i = 0; i < w->window && w->posted < w->target; i++)
        post_one(w);
    assert_int_equal(event_base_dispatch(w->ctx->base), 0);
}

/* The source goes by the context's own (local-only) registration; the
 * target is exported as mw_mem_export does: a registration of its own. */
static struct writer writer_for(struct fx *f, char *src, char *dst, size_t len)
{
    struct writer w = {.ctx = f->ctx, .qp = f->qp.client->qp, .src = src, .dst = dst,
                       .len = len, .target = 1, .window = 1};
    uint32_t rk;
    assert_int_equal(mw__mem_dev_keys(f->ctx, f->qp.cdev, src, len, &w.lkey, &rk), 0);
    w.export = ibv_reg_mr(f->qp.sdev->pd, dst, len, IBV_ACCESS_LOCAL_WRITE |
                                                        IBV_ACCESS_REMOTE_WRITE);
    assert_non_null(w.export);
    w.rkey = w.export->rkey;
    return w;
}

static void writer_done(struct writer *w)
{
    ibv_dereg_mr(w->export);
}

/* --- tests --------------------------------------------------------------- */

static void two_devices_on_two_subnets(void **state)
{
    struct fx *f = *state;
    assert_ptr_not_equal(f->qp.cdev, f->qp.sdev);
    assert_string_not_equal(f->qp.cdev->name, f->qp.sdev->name);
    mw_ctx_stats_t st;
    mw_ctx_stats(f->ctx, &st);
    assert_int_equal(st.devices, 2);
    printf("client %s on %s, server %s on %s\n", addrs[0], f->qp.cdev->name, addrs[1],
           f->qp.sdev->name);
}

static void arena_memory_moves_between_devices(void **state)
{
    struct fx *f = *state;
    size_t len = 1 << 20;
    char *src = mw_alloc(f->ctx, len), *dst = mw_alloc(f->ctx, len);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < len; i++)
        src[i] = (char)(i * 7 + 3);
    memset(dst, 0, len);
    struct writer w = writer_for(f, src, dst, len);
    run_writes(&w);
    assert_int_equal(w.errors, 0);
    assert_memory_equal(src, dst, len);
    writer_done(&w);
    mw_ctx_stats_t st;
    mw_ctx_stats(f->ctx, &st);
    assert_true(st.registrations >= 2);        /* each extent, on both devices */
    mw_free(f->ctx, src);
    mw_free(f->ctx, dst);
}

static void user_memory_registered_and_cached(void **state)
{
    struct fx *f = *state;
    size_t len = 64 << 10;
    char *src = aligned_alloc(4096, len), *dst = aligned_alloc(4096, len);
    mw_mr_t *ms, *md, *again;
    assert_int_equal(mw_reg(f->ctx, src, len, &ms), 0);
    assert_int_equal(mw_reg(f->ctx, dst, len, &md), 0);
    mw_ctx_stats_t before, after;
    mw_ctx_stats(f->ctx, &before);
    assert_int_equal(mw_reg(f->ctx, src + 100, 1000, &again), 0);   /* inside: reused */
    mw_ctx_stats(f->ctx, &after);
    assert_int_equal(after.registrations, before.registrations);
    assert_int_equal(after.reg_cache_hits, before.reg_cache_hits + 1);
    memset(src, 0x5a, len);
    memset(dst, 0, len);
    struct writer w = writer_for(f, src, dst, len);
    run_writes(&w);
    assert_int_equal(w.errors, 0);
    assert_memory_equal(src, dst, len);
    writer_done(&w);
    assert_int_equal(mw_dereg(f->ctx, again), 0);
    assert_int_equal(mw_dereg(f->ctx, ms), 0);
    assert_int_equal(mw_dereg(f->ctx, md), 0);
    /* dropped: without userfaultfd the lookup refuses at once, so nothing
     * can post from it; with it the registration is kept, valid for
     * these very pages until they go (test_mem shows them go) */
    uint32_t lk, rk;
    assert_int_equal(mw__mem_dev_keys(f->ctx, f->qp.cdev, src, len, &lk, &rk),
                     mw__mem_of(f->ctx)->uffd ? 0 : -EFAULT);
    free(src);
    free(dst);
}

static void write_without_an_export_fails_with_its_status(void **state)
{
    struct fx *f = *state;
    char *src = mw_alloc(f->ctx, 4096), *dst = mw_alloc(f->ctx, 4096);
    struct writer w = writer_for(f, src, dst, 4096);
    /* the target's own registration (not an export) grants no remote access */
    uint32_t lk;
    assert_int_equal(mw__mem_dev_keys(f->ctx, f->qp.sdev, dst, 4096, &lk, &w.rkey), 0);
    run_writes(&w);
    writer_done(&w);
    assert_int_equal(w.completed, 1);
    assert_int_equal(w.errors, 1);
    mw_ctx_stats_t st;
    mw_ctx_stats(f->ctx, &st);
    assert_true(st.completion_errors >= 1);
    mw_free(f->ctx, src);
    mw_free(f->ctx, dst);
}

static void burst_of_10000_is_drained_by_events(void **state)
{
    struct fx *f = *state;
    char *src = mw_alloc(f->ctx, 4096), *dst = mw_alloc(f->ctx, 4096);
    struct writer w = writer_for(f, src, dst, 64);
    w.target = 10000;
    w.window = 128;
    mw_ctx_stats_t a, b;
    mw_ctx_stats(f->ctx, &a);
    double cpu0 = cpu_seconds();
    run_writes(&w);
    double cpu = cpu_seconds() - cpu0;
    mw_ctx_stats(f->ctx, &b);
    uint64_t events = b.events - a.events, comps = b.completions - a.completions;
    uint64_t polls = b.polls - a.polls;
    printf("10000 signalled writes: %llu completions, %llu events, %llu polls, "
           "%.1f completions/event, %.2f polls/event, %.3f s CPU\n",
           (unsigned long long)comps, (unsigned long long)events, (unsigned long long)polls,
           (double)comps / events, (double)polls / events, cpu);
    assert_int_equal(w.errors, 0);
    assert_int_equal(comps, 10000);
    assert_true(events > 0);
    assert_true(comps >= 4 * events);          /* batches per wake-up, well above 1 */
    writer_done(&w);
    mw_free(f->ctx, src);
    mw_free(f->ctx, dst);
}

static void stop_loop(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

static void idle_context_uses_no_cpu(void **state)
{
    struct fx *f = *state;
    /* CQs are armed on both devices, QPs connected: wait 5 s in the loop. */
    struct event *t = evtimer_new(f->ctx->base, stop_loop, f->ctx->base);
    struct timeval five = {5, 0};
    evtimer_add(t, &five);
    mw_ctx_stats_t a, b;
    mw_ctx_stats(f->ctx, &a);
    double cpu0 = cpu_seconds();
    event_base_dispatch(f->ctx->base);
    double cpu = cpu_seconds() - cpu0;
    mw_ctx_stats(f->ctx, &b);
    event_free(t);
    printf("idle 5 s with armed CQs: %.4f s CPU = %.3f%% of a core, %llu wake-ups\n", cpu,
           cpu / 5 * 100, (unsigned long long)(b.events - a.events));
    assert_true(cpu < 0.05);                   /* < 1% of one core */
    assert_int_equal(b.events, a.events);
    assert_int_equal(b.polls, a.polls);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* progress shows even if killed */
    if (getenv("MW_TEST_FILTER"))         /* e.g. MW_TEST_FILTER='*order*' */
        cmocka_set_test_filter(getenv("MW_TEST_FILTER"));
    rxe_require(2, addrs);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(two_devices_on_two_subnets, setup, teardown),
        cmocka_unit_test_setup_teardown(arena_memory_moves_between_devices, setup, teardown),
        cmocka_unit_test_setup_teardown(user_memory_registered_and_cached, setup, teardown),
        cmocka_unit_test_setup_teardown(write_without_an_export_fails_with_its_status, setup, teardown),
        cmocka_unit_test_setup_teardown(burst_of_10000_is_drained_by_events, setup, teardown),
        cmocka_unit_test_setup_teardown(idle_context_uses_no_cpu, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
