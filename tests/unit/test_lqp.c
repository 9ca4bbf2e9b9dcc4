/* The local queue pair (cm/lqp.c) without RDMA: two of them over a
 * socketpair in one process (cross-memory attach to oneself is allowed),
 * checked as RC would be: messages inline and by CMA, writes with
 * immediate, reads, order, unsignalled requests, a refused access failing
 * its request and flushing the rest, flushes from the loop only; and a
 * hostile peer writing raw records, a peer that closes, the greeting. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <cmocka.h>

#include <event2/event.h>

#include "cm/lqp.h"
#include "core/ctx.h"
#include "core/op.h"

#define MAXWC 64

struct end {
    struct mw__lqp *q;
    struct ibv_wc wc[MAXWC];
    int nwc;
    int ended_err;
    char ended_why[128];
    uint8_t *mem;                 /* "exported" under rkey 7: [mem, mem + memlen) */
    size_t memlen;
};

struct fx {
    mw_ctx_t *ctx;
    struct end a, b;
};

static void on_done(struct mw__op *op, const struct ibv_wc *wc)
{
    struct end *e = op->owner;
    assert_true(e->nwc < MAXWC);
    e->wc[e->nwc++] = *wc;
}

static int access_ok(void *arg, uint32_t rkey, uint64_t addr, uint64_t len)
{
    struct end *e = arg;
    uint64_t lo = (uintptr_t)e->mem;
    return rkey == 7 && addr >= lo && addr <= lo + e->memlen && len <= lo + e->memlen - addr
               ? 0 : -EACCES;
}

static void on_ended(void *arg, int err, const char *why)
{
    struct end *e = arg;
    assert_int_equal(e->ended_err, 0);    /* once */
    e->ended_err = err;
    snprintf(e->ended_why, sizeof e->ended_why, "%s", why);
}

static const struct mw__lqp_ops ops = {access_ok, on_ended};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    assert_int_equal(mw_ctx_new(&f->ctx, NULL, NULL), 0);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(mw__lqp_new(f->ctx, &ops, &f->a, &f->a.q), 0);
    assert_int_equal(mw__lqp_new(f->ctx, &ops, &f->b, &f->b.q), 0);
    assert_int_equal(mw__lqp_attach(f->a.q, sv[0], 0, false), 0);
    assert_int_equal(mw__lqp_attach(f->b.q, sv[1], 0, false), 0);
    assert_int_equal(mw__lqp_peer(f->a.q), getpid());
    f->b.memlen = 1 << 20;
    f->b.mem = calloc(1, f->b.memlen);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    mw__lqp_free(f->a.q);
    mw__lqp_free(f->b.q);
    mw_ctx_free(f->ctx);
    free(f->b.mem);
    free(f);
    return 0;
}

/* Turn the loop until @e has @n completions (or 2 s). */
static void run_until(struct fx *f, const struct end *e, int n)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        event_base_loop(f->ctx->base, EVLOOP_NONBLOCK);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (e->nwc < n && !e->ended_err && t.tv_sec - t0.tv_sec < 2);
}

static void spin(struct fx *f, int turns)
{
    for (int i = 0; i < turns; i++)
        event_base_loop(f->ctx->base, EVLOOP_NONBLOCK);
}

static uint64_t wr_id(struct fx *f, struct end *e)
{
    return mw__op_get(f->ctx, on_done, NULL, e)->wr_id;
}

static void post_recv(struct fx *f, struct end *e, void *buf, uint32_t len)
{
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len};
    struct ibv_recv_wr wr = {.wr_id = wr_id(f, e), .sg_list = &sge, .num_sge = 1}, *bad;
    assert_int_equal(mw__lqp_post_recv(e->q, &wr, &bad), 0);
}

static void post(struct fx *f, struct end *e, enum ibv_wr_opcode op, void *buf, uint32_t len,
                 uint64_t remote, uint32_t rkey, bool signaled)
{
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len};
    struct ibv_send_wr wr = {.wr_id = wr_id(f, e), .sg_list = &sge, .num_sge = 1, .opcode = op,
                             .send_flags = signaled ? IBV_SEND_SIGNALED : 0,
                             .imm_data = htonl(0xfeed), .wr.rdma = {remote, rkey}}, *bad;
    assert_int_equal(mw__lqp_post_send(e->q, &wr, &bad), 0);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31 + seed);
}

/* Two messages, one in the record and one by CMA, arrive whole and in
 * order, and each send completes once the receiver has it. */
static void messages_inline_and_by_cma(void **state)
{
    struct fx *f = *state;
    static uint8_t small[100], big[40000], r1[65536], r2[65536];
    fill(small, sizeof small, 1);
    fill(big, sizeof big, 2);
    post_recv(f, &f->b, r1, sizeof r1);
    post_recv(f, &f->b, r2, sizeof r2);
    post(f, &f->a, IBV_WR_SEND, small, sizeof small, 0, 0, true);
    post(f, &f->a, IBV_WR_SEND, big, sizeof big, 0, 0, true);
    assert_int_equal(f->a.nwc + f->b.nwc, 0);     /* never inside a post */
    run_until(f, &f->a, 2);
    assert_int_equal(f->b.nwc, 2);
    assert_int_equal(f->a.nwc, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(f->b.wc[i].status, IBV_WC_SUCCESS);
        assert_int_equal(f->b.wc[i].opcode, IBV_WC_RECV);
        assert_int_equal(f->a.wc[i].status, IBV_WC_SUCCESS);
        assert_int_equal(f->a.wc[i].opcode, IBV_WC_SEND);
    }
    assert_int_equal(f->b.wc[0].byte_len, sizeof small);
    assert_int_equal(f->b.wc[1].byte_len, sizeof big);
    assert_memory_equal(r1, small, sizeof small);
    assert_memory_equal(r2, big, sizeof big);
}

/* A write with immediate lands before its immediate is delivered; a read
 * brings the bytes back; a chain's unsignalled requests complete silently. */
static void writes_reads_and_immediates(void **state)
{
    struct fx *f = *state;
    static uint8_t src[300000], back[300000], slot[64];
    fill(src, sizeof src, 3);
    uint64_t at = (uintptr_t)f->b.mem + 4096;
    post_recv(f, &f->b, slot, sizeof slot);
    post(f, &f->a, IBV_WR_RDMA_WRITE, src, 100, at, 7, false);           /* inline */
    post(f, &f->a, IBV_WR_RDMA_WRITE_WITH_IMM, src, sizeof src, at, 7, true);   /* CMA */
    run_until(f, &f->a, 1);
    assert_int_equal(f->a.nwc, 1);                /* the unsignalled one: silent */
    assert_int_equal(f->a.wc[0].opcode, IBV_WC_RDMA_WRITE);
    assert_int_equal(f->b.nwc, 1);
    assert_int_equal(f->b.wc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    assert_int_equal(ntohl(f->b.wc[0].imm_data), 0xfeed);
    assert_memory_equal(f->b.mem + 4096, src, sizeof src);
    post(f, &f->a, IBV_WR_RDMA_READ, back, sizeof back, at, 7, true);
    run_until(f, &f->a, 2);
    assert_int_equal(f->a.wc[1].status, IBV_WC_SUCCESS);
    assert_int_equal(f->a.wc[1].opcode, IBV_WC_RDMA_READ);
    assert_memory_equal(back, src, sizeof back);
}

/* The target checks key and bounds: a write past the end fails
 * REM_ACCESS_ERR and touches nothing, and what was posted after it comes
 * back flushed (its receive stays unused); then the queue pair is in error:
 * a later post completes as a flush too, from the loop. */
static void refused_access_fails_it_and_flushes_the_rest(void **state)
{
    struct fx *f = *state;
    static uint8_t src[8192], msg[16], slot[64];
    memset(src, 0x5a, sizeof src);
    uint64_t end = (uintptr_t)f->b.mem + f->b.memlen;
    post_recv(f, &f->b, slot, sizeof slot);
    post(f, &f->a, IBV_WR_RDMA_WRITE, src, sizeof src, end - 4096, 7, false);  /* 4 KiB over */
    post(f, &f->a, IBV_WR_SEND, msg, sizeof msg, 0, 0, true);
    run_until(f, &f->a, 2);
    assert_int_equal(f->a.nwc, 2);
    assert_int_equal(f->a.wc[0].status, IBV_WC_REM_ACCESS_ERR);   /* unsignalled, failed: there */
    assert_int_equal(f->a.wc[1].status, IBV_WC_WR_FLUSH_ERR);
    assert_int_equal(f->b.nwc, 0);
    for (size_t i = 0; i < f->b.memlen; i++)
        assert_int_equal(f->b.mem[i], 0);
    post(f, &f->a, IBV_WR_SEND, msg, sizeof msg, 0, 0, true);
    assert_int_equal(f->a.nwc, 2);                /* not inside the post */
    run_until(f, &f->a, 3);
    assert_int_equal(f->a.wc[2].status, IBV_WC_WR_FLUSH_ERR);
}

/* mw__lqp_error flushes every receive and request posted, from the loop,
 * and the peer sees the channel end (-ECONNRESET) after taking what came
 * before it. */
static void error_flushes_and_the_peer_sees_the_end(void **state)
{
    struct fx *f = *state;
    static uint8_t ra[64], rb[64], msg[32];
    fill(msg, sizeof msg, 9);
    post_recv(f, &f->a, ra, sizeof ra);
    post_recv(f, &f->b, rb, sizeof rb);
    post(f, &f->a, IBV_WR_SEND, msg, sizeof msg, 0, 0, true);
    mw__lqp_error(f->a.q);        /* the message went out first */
    assert_int_equal(f->a.nwc, 0);
    run_until(f, &f->a, 2);
    spin(f, 5);
    assert_int_equal(f->a.nwc, 2);
    for (int i = 0; i < 2; i++)
        assert_int_equal(f->a.wc[i].status, IBV_WC_WR_FLUSH_ERR);
    assert_int_equal(f->b.nwc, 1);                /* delivered before the end */
    assert_memory_equal(rb, msg, sizeof msg);
    assert_int_equal(f->b.ended_err, -ECONNRESET);
    assert_int_equal(f->a.ended_err, 0);          /* its own error is no news to it */
}

/* A message that reached us before we closed counts, as it would on a
 * device: it is executed and acknowledged as the queue pair closes, so the
 * sender's completes; ours completes first, then the flushes. */
static void closing_takes_what_already_came(void **state)
{
    struct fx *f = *state;
    static uint8_t r1[64], r2[64], msg[48];
    fill(msg, sizeof msg, 5);
    post_recv(f, &f->a, r1, sizeof r1);
    post_recv(f, &f->a, r2, sizeof r2);
    post(f, &f->b, IBV_WR_SEND, msg, sizeof msg, 0, 0, true);
    mw__lqp_error(f->a.q);        /* before a's loop read it */
    run_until(f, &f->b, 1);
    run_until(f, &f->a, 2);
    assert_int_equal(f->b.nwc, 1);
    assert_int_equal(f->b.wc[0].status, IBV_WC_SUCCESS);
    assert_int_equal(f->a.nwc, 2);
    assert_int_equal(f->a.wc[0].status, IBV_WC_SUCCESS);
    assert_int_equal(f->a.wc[0].byte_len, sizeof msg);
    assert_memory_equal(r1, msg, sizeof msg);
    assert_int_equal(f->a.wc[1].status, IBV_WC_WR_FLUSH_ERR);
}

/* Raw records from a hostile peer (ours has one request out): each
 * violation ends the channel -EPROTO, naming it; nothing is executed. */
static void hostile_records_end_the_channel(void **state)
{
    (void)state;
    struct {
        const char *what;
        uint8_t rec[32];
    } cases[] = {
        {"unknown record type", {0x42}},
        {"unknown record flags", {1, 0x80}},
        {"inline payload too long", {1, 1, 0, 0, 0, 0, 0x20, 0x01}},
        {"a message with no receive posted (beyond its credits)", {1, 1}},
        {"an answer for requests never made", {4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                               0, 0, 0, 0, 0, 0, 0, 5}},
        {"a failure without a failure status", {5}},
        {"a second greeting", {6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                               0, 1}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        mw_ctx_t *ctx;
        assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
        struct fx f = {.ctx = ctx};
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
        assert_int_equal(mw__lqp_new(ctx, &ops, &f.b, &f.b.q), 0);
        assert_int_equal(mw__lqp_attach(f.b.q, sv[1], 0, false), 0);
        static uint8_t msg[8];
        post(&f, &f.b, IBV_WR_SEND, msg, sizeof msg, 0, 0, true);   /* one request out */
        assert_int_equal(write(sv[0], cases[k].rec, 32), 32);
        run_until(&f, &f.b, 1);
        printf("%s: %s\n", cases[k].what, f.b.ended_why);
        assert_int_equal(f.b.ended_err, -EPROTO);
        assert_string_equal(f.b.ended_why, cases[k].what);
        mw__lqp_free(f.b.q);
        close(sv[0]);
        mw_ctx_free(ctx);
    }
}

/* The connecting side's greeting goes first, before what it posted, and
 * is read without taking what follows; anything else is refused. */
static void greeting_goes_first(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    struct fx f = {.ctx = ctx};
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    assert_int_equal(mw__lqp_new(ctx, &ops, &f.a, &f.a.q), 0);
    static uint8_t msg[8] = "12345678";
    post(&f, &f.a, IBV_WR_SEND, msg, sizeof msg, 0, 0, true);   /* before the socket */
    assert_int_equal(mw__lqp_attach(f.a.q, sv[0], 0x1234abcdull, true), 0);
    uint8_t buf[32];
    size_t got = 0;
    uint64_t token = 0;
    assert_int_equal(mw__lqp_read_greeting(sv[1], buf, &got, &token), 1);
    assert_int_equal(token, 0x1234abcdull);
    uint8_t rec[32 + 8];
    assert_int_equal(read(sv[1], rec, sizeof rec), sizeof rec);   /* then the message */
    assert_int_equal(rec[0], 1);
    assert_memory_equal(rec + 32, msg, 8);
    /* a peer that sends something else first */
    assert_int_equal(write(sv[0], rec, 32), 32);
    got = 0;
    assert_int_equal(mw__lqp_read_greeting(sv[1], buf, &got, &token), -EPROTO);
    got = 0;
    assert_int_equal(mw__lqp_read_greeting(sv[1], buf, &got, &token), 0);   /* nothing yet */
    mw__lqp_free(f.a.q);
    assert_int_equal(mw__lqp_read_greeting(sv[1], buf, &got, &token), -ECONNRESET);
    close(sv[1]);
    /* the connecting side waits for the answer: a wrong one breaks the
     * protocol, an end before it is a refusal, the right one is taken */
    const struct { uint64_t answer; bool close; int err; } ways[] = {
        {0x99, false, -EPROTO}, {0, true, -ECONNREFUSED}, {0x1234abcdull, false, 0}};
    for (int k = 0; k < 3; k++) {
        struct fx g = {.ctx = ctx};
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
        assert_int_equal(mw__lqp_new(ctx, &ops, &g.a, &g.a.q), 0);
        assert_int_equal(mw__lqp_attach(g.a.q, sv[0], 0x1234abcdull, true), 0);
        uint8_t ans[32] = {6};
        for (int i = 0; i < 8; i++)
            ans[16 + i] = (uint8_t)(ways[k].answer >> (56 - 8 * i));
        if (ways[k].close)
            close(sv[1]);
        else
            assert_int_equal(write(sv[1], ans, 32), 32);
        spin(&g, 20);
        printf("answer %#llx%s: %s\n", (unsigned long long)ways[k].answer,
               ways[k].close ? " (closed instead)" : "", g.a.ended_err ? g.a.ended_why : "taken");
        assert_int_equal(g.a.ended_err, ways[k].err);
        mw__lqp_free(g.a.q);
        if (!ways[k].close)
            close(sv[1]);
    }
    mw_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(messages_inline_and_by_cma, setup, teardown),
        cmocka_unit_test_setup_teardown(writes_reads_and_immediates, setup, teardown),
        cmocka_unit_test_setup_teardown(refused_access_fails_it_and_flushes_the_rest, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(error_flushes_and_the_peer_sees_the_end, setup, teardown),
        cmocka_unit_test_setup_teardown(closing_takes_what_already_came, setup, teardown),
        cmocka_unit_test(hostile_records_end_the_channel),
        cmocka_unit_test(greeting_goes_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
