/* libFuzzer target: a stream channel (src/cm/lqp.c) reading what a remote
 * peer sends.  The input is the peer's bytes; our end has posted two
 * receives, two reads and a send, and exports one region.  Beyond not
 * crashing (ASan/UBSan watch every write into the receives, the region
 * and the read buffers), what the channel promises a caller must hold
 * whatever the peer sent: every request and receive posted completes
 * exactly once, by the time the channel failed and its flushes ran, and
 * nothing completes that was not posted.
 *
 * lqp.c links alone: the few services of the context's loop it uses are
 * stood in for here (deferred tasks run by this harness, a turn that always
 * may go on, no log). */
#include <assert.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "cm/lqp.h"
#include "core/alloc.h"
#include "core/cq.h"
#include "core/ctx.h"

/* --- the loop's services, stood in for -------------------------------------- */

const struct timeval mw__zero_tv = {0, 0};
static struct mw__task *tasks;

void *mw__malloc(size_t size) { return malloc(size); }
void *mw__calloc(size_t n, size_t size) { return calloc(n, size); }
void *mw__realloc(void *p, size_t size) { return realloc(p, size); }
void mw__free(void *p) { free(p); }
void mw__log(const mw_ctx_t *ctx, int level, const char *fmt, ...) { (void)ctx, (void)level, (void)fmt; }
bool mw__turn_may(mw_ctx_t *ctx) { (void)ctx; return true; }
int mw__watch_fd(mw_ctx_t *ctx, int fd) { (void)ctx, (void)fd; return 0; }
void mw__unwatch_fd(mw_ctx_t *ctx, int fd) { (void)ctx, (void)fd; }
void mw__watch_fd_out(mw_ctx_t *ctx, int fd, bool out) { (void)ctx, (void)fd, (void)out; }
int mw__ev_add(mw_ctx_t *ctx, struct event *ev, const struct timeval *tv) { (void)ctx; return event_add(ev, tv); }

uint64_t mw__now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

void mw__defer(mw_ctx_t *ctx, struct mw__task *t)
{
    (void)ctx;
    if (t->queued)
        return;
    t->queued = true;
    t->next = NULL;
    struct mw__task **p = &tasks;
    while (*p)
        p = &(*p)->next;
    *p = t;
}

void mw__defer_cancel(mw_ctx_t *ctx, struct mw__task *t)
{
    (void)ctx;
    for (struct mw__task **p = &tasks; *p; p = &(*p)->next)
        if (*p == t) {
            *p = t->next;
            break;
        }
    t->queued = false;
}

static bool run_tasks(void)
{
    bool ran = false;
    while (tasks) {
        struct mw__task *t = tasks;
        tasks = t->next;
        t->queued = false;
        t->fn(t);
        ran = true;
    }
    return ran;
}

/* --- our end ------------------------------------------------------------------ */

enum { RECV0, RECV1, READ0, READ1, SEND0, NPOSTED };
static int completed[NPOSTED];
/* Exported under rkey 7, at an address the seeds name, a page that
 * cannot be touched right after it. */
#define REGION ((uint8_t *)0x7e5600000000ull)
#define REGION_LEN 4096
static uint8_t *region;

void mw__cq_dispatch(mw_ctx_t *ctx, const struct ibv_wc *wc, int n)
{
    (void)ctx;
    for (int i = 0; i < n; i++) {
        assert(wc[i].wr_id < NPOSTED);            /* nothing completes unposted */
        completed[wc[i].wr_id]++;
    }
}

static int access_ok(void *arg, uint32_t rkey, uint64_t addr, uint64_t len)
{
    (void)arg;
    uint64_t lo = (uintptr_t)region;
    return rkey == 7 && addr >= lo && addr <= lo + REGION_LEN && len <= lo + REGION_LEN - addr
               ? 0 : -EACCES;
}

static void on_ended(void *arg, int err, const char *why)
{
    (void)arg;
    assert(err < 0 && why && *why);
}

static const struct mw__lqp_ops ops = {access_ok, on_ended};

static void post_all(struct mw__lqp *q, uint8_t *rbuf[2], uint8_t *dst[2], uint8_t *msg)
{
    for (int i = 0; i < 2; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)rbuf[i], .length = 64};
        struct ibv_recv_wr wr = {.wr_id = RECV0 + i, .sg_list = &sge, .num_sge = 1}, *bad;
        assert(mw__lqp_post_recv(q, &wr, &bad) == 0);
    }
    for (int i = 0; i < 2; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)dst[i], .length = 16};
        struct ibv_send_wr wr = {.wr_id = READ0 + i, .sg_list = &sge, .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
                                 .wr.rdma = {0x1000, 9}}, *bad;
        assert(mw__lqp_post_send(q, &wr, &bad) == 0);
    }
    struct ibv_sge sge = {.addr = (uintptr_t)msg, .length = 8};
    struct ibv_send_wr wr = {.wr_id = SEND0, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
    assert(mw__lqp_post_send(q, &wr, &bad) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (len > 32768)              /* within what the socket takes at once */
        return 0;
    static struct mw_ctx ctx;
    if (!ctx.base) {
        ctx.base = event_base_new();
        region = mmap(REGION, 2 * REGION_LEN, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        assert(region == REGION && mprotect(region + REGION_LEN, REGION_LEN, PROT_NONE) == 0);
    }
    memset(completed, 0, sizeof completed);
    uint8_t *rbuf[2] = {malloc(64), malloc(64)}, *dst[2] = {malloc(16), malloc(16)},
            *msg = calloc(1, 8);
    int sv[2];
    assert(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
    struct mw__lqp *q;
    assert(mw__lqp_new(&ctx, &ops, NULL, 1000, &q) == 0);
    assert(mw__lqp_attach_stream(q, sv[1], NULL) == 0);
    post_all(q, rbuf, dst, msg);
    if (len && write(sv[0], data, len) != (ssize_t)len)
        abort();
    if (len && data[0] & 1)       /* the peer leaves, or stays */
        shutdown(sv[0], SHUT_WR);
    for (int i = 0; i < 64; i++) {
        event_base_loop(ctx.base, EVLOOP_NONBLOCK);
        run_tasks();
    }
    mw__lqp_error(q);             /* our end fails: everything comes back */
    for (int i = 0; i < 8; i++) {
        event_base_loop(ctx.base, EVLOOP_NONBLOCK);
        run_tasks();
    }
    for (int i = 0; i < NPOSTED; i++)
        assert(completed[i] == 1);
    mw__lqp_free(q);
    run_tasks();
    close(sv[0]);
    free(rbuf[0]), free(rbuf[1]), free(dst[0]), free(dst[1]), free(msg);
    return 0;
}
