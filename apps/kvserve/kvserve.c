/* kvserve: the inference-server shape.  An HTTP front end (libevent's
 * evhttp) and meshwire share one event loop in one thread; each request
 * GET /block/K fetches block K of a back end's memory with a one-sided RDMA
 * READ and is answered when the future completes -- many requests in
 * flight, no thread ever blocked on RDMA.
 *
 *   kvserve backend ADDR[:PORT] [BLOCKS [BLOCK_SIZE]]
 *       export BLOCKS blocks (default 1024 of 65536 bytes) to every front end
 *   kvserve front BACKEND[:PORT] HTTP_PORT [--no-rdma]
 *       serve them over HTTP on 127.0.0.1:HTTP_PORT (and GET /metrics:
 *       meshwire's counters and its own, for Prometheus); --no-rdma answers
 *       from a local copy instead (the same server without the RDMA work)
 *
 * Byte j of block k is (k * 131 + j) & 0xff on both sides, so any client can
 * check what it gets.  Uses only the public meshwire API. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "meshwire.h"

#define POOL 128                  /* RDMA reads in flight at most */
#define DEFAULT_PORT 7475

struct geometry {                 /* what the back end tells each front end */
    uint32_t magic, blocks, block_size, pad;
    mw_remote_t region;
};
#define GEOMETRY_MAGIC 0x4b565356u /* "KVSV" */

static void fill_block(uint8_t *p, uint32_t k, uint32_t size)
{
    for (uint32_t j = 0; j < size; j++)
        p[j] = (uint8_t)(k * 131 + j);
}

static void die(const char *what, int rc, mw_future_t *f)
{
    fprintf(stderr, "kvserve: %s: %s%s%s\n", what, mw_strerror(rc), f ? ": " : "",
            f ? mw_future_message(f) : "");
    exit(1);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)sig, (void)what;
    event_base_loopexit(arg, NULL);
}

static struct event *stop_on_signals(struct event_base *base, struct event **second)
{
    struct event *a = evsignal_new(base, SIGINT, on_signal, base);
    *second = evsignal_new(base, SIGTERM, on_signal, base);
    evsignal_add(a, NULL);
    evsignal_add(*second, NULL);
    return a;
}

/* --- back end ---------------------------------------------------------------- */

struct backend {
    uint8_t *region;
    struct geometry g;
};

static void free_sent(mw_future_t *f, void *arg)
{
    (void)f;
    free(arg);
}

static void on_front_end(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    struct backend *b = arg;
    struct geometry *g = malloc(sizeof *g);
    if (!g || mw_mem_export(c, b->region, (size_t)b->g.blocks * b->g.block_size, &b->g.region)) {
        free(g);
        mw_conn_abort(c);
        return;
    }
    *g = b->g;
    mw_future_t *f = mw_send(c, g, sizeof *g);
    mw_future_then(f, free_sent, g);
    mw_future_unref(f);
    fprintf(stderr, "kvserve backend: a front end connected\n");
}

static int run_backend(const char *addr, uint32_t blocks, uint32_t size)
{
    struct event_base *base = event_base_new();
    mw_ctx_t *ctx;
    int rc = mw_ctx_new(&ctx, base, NULL);
    if (rc)
        die("context", rc, NULL);
    struct backend b = {.g = {.magic = GEOMETRY_MAGIC, .blocks = blocks, .block_size = size}};
    if (!(b.region = mw_alloc(ctx, (size_t)blocks * size)))
        die("memory", -ENOMEM, NULL);
    for (uint32_t k = 0; k < blocks; k++)
        fill_block(b.region + (size_t)k * size, k, size);
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.default_port = DEFAULT_PORT;
    mw_listener_t *l;
    if ((rc = mw_listen(ctx, addr, &o, on_front_end, &b, &l)))
        die("listen", rc, NULL);
    fprintf(stderr, "kvserve backend: %u blocks of %u bytes on port %d\n", blocks, size,
            mw_listener_port(l));
    struct event *s2, *s1 = stop_on_signals(base, &s2);
    event_base_dispatch(base);
    event_free(s1);
    event_free(s2);
    mw_listener_free(l);
    mw_free(ctx, b.region);
    mw_ctx_free(ctx);            /* aborts what front ends are still connected */
    event_base_free(base);
    return 0;
}

/* --- front end --------------------------------------------------------------- */

struct front {
    mw_ctx_t *ctx;
    mw_conn_t *c;                 /* NULL with --no-rdma */
    struct geometry g;
    uint8_t *local;               /* --no-rdma: the blocks, here */
    uint8_t *bufs;                /* POOL registered blocks */
    int free_list[POOL], nfree;
    struct fetch *wait_head, **wait_tail;   /* requests waiting for a buffer */
    unsigned long served, failed;
};

struct fetch {
    struct front *fe;
    struct evhttp_request *req;
    uint32_t k;
    int buf;
    struct fetch *next;
};

static void start_fetch(struct fetch *x);

static void put_buf(struct front *fe, int buf)
{
    struct fetch *x = fe->wait_head;
    if (x) {                      /* hand it straight to the oldest waiter */
        if (!(fe->wait_head = x->next))
            fe->wait_tail = &fe->wait_head;
        x->buf = buf;
        start_fetch(x);
        return;
    }
    fe->free_list[fe->nfree++] = buf;
}

/* evbuffer is done with a block it referenced: the buffer is free again */
static void on_sent(const void *data, size_t len, void *arg)
{
    (void)data, (void)len;
    struct fetch *x = arg;
    struct front *fe = x->fe;
    int buf = x->buf;
    free(x);
    put_buf(fe, buf);
}

static void on_read(mw_future_t *f, void *arg)
{
    struct fetch *x = arg;
    struct front *fe = x->fe;
    if (mw_future_error(f)) {
        fe->failed++;
        evhttp_send_error(x->req, 502, mw_future_message(f));
        int buf = x->buf;
        free(x);
        put_buf(fe, buf);
        return;
    }
    struct evbuffer *out = evbuffer_new();
    uint8_t *p = fe->bufs + (size_t)x->buf * fe->g.block_size;
    evbuffer_add_reference(out, p, fe->g.block_size, on_sent, x);   /* no copy */
    evhttp_add_header(evhttp_request_get_output_headers(x->req), "Content-Type",
                      "application/octet-stream");
    evhttp_send_reply(x->req, 200, "OK", out);
    evbuffer_free(out);
    fe->served++;
}

static void start_fetch(struct fetch *x)
{
    struct front *fe = x->fe;
    uint8_t *p = fe->bufs + (size_t)x->buf * fe->g.block_size;
    mw_future_t *f = mw_read(fe->c, p, fe->g.block_size, &fe->g.region,
                             (uint64_t)x->k * fe->g.block_size);
    if (!f) {
        evhttp_send_error(x->req, 503, "out of memory");
        put_buf(fe, x->buf);
        free(x);
        return;
    }
    mw_future_then(f, on_read, x);
    mw_future_unref(f);
}

static bool parse_block(const struct front *fe, const char *uri, uint32_t *k)
{
    const char *p = strncmp(uri, "/block/", 7) ? NULL : uri + 7;
    char *end;
    unsigned long v = p && *p ? strtoul(p, &end, 10) : 0;
    if (!p || !*p || *end || v >= fe->g.blocks)
        return false;
    *k = (uint32_t)v;
    return true;
}

/* GET /metrics: meshwire's counters and the front end's own, in
 * Prometheus's text format. */
static void serve_metrics(struct front *fe, struct evhttp_request *req)
{
    long n = mw_ctx_metrics(fe->ctx, NULL, 0);
    struct evbuffer *out = evbuffer_new();
    struct evbuffer_iovec v;
    if (n < 0 || !out || evbuffer_reserve_space(out, n + 1, &v, 1) < 1) {
        evhttp_send_error(req, 503, "out of memory");
        if (out)
            evbuffer_free(out);
        return;
    }
    v.iov_len = (size_t)mw_ctx_metrics(fe->ctx, v.iov_base, (size_t)n + 1);
    evbuffer_commit_space(out, &v, 1);
    evbuffer_add_printf(out,
                        "# HELP kvserve_requests_total Block requests answered, by result.\n"
                        "# TYPE kvserve_requests_total counter\n"
                        "kvserve_requests_total{result=\"served\"} %lu\n"
                        "kvserve_requests_total{result=\"failed\"} %lu\n",
                        fe->served, fe->failed);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4");
    evhttp_send_reply(req, 200, "OK", out);
    evbuffer_free(out);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct front *fe = arg;
    uint32_t k;
    if (evhttp_request_get_command(req) == EVHTTP_REQ_GET &&
        !strcmp(evhttp_request_get_uri(req), "/metrics")) {
        serve_metrics(fe, req);
        return;
    }
    if (evhttp_request_get_command(req) != EVHTTP_REQ_GET ||
        !parse_block(fe, evhttp_request_get_uri(req), &k)) {
        evhttp_send_error(req, 404, "GET /block/K, K < the number of blocks");
        return;
    }
    if (!fe->c) {                 /* --no-rdma: the same answer from local memory */
        struct evbuffer *out = evbuffer_new();
        evbuffer_add_reference(out, fe->local + (size_t)k * fe->g.block_size,
                               fe->g.block_size, NULL, NULL);
        evhttp_send_reply(req, 200, "OK", out);
        evbuffer_free(out);
        fe->served++;
        return;
    }
    struct fetch *x = malloc(sizeof *x);
    if (!x) {
        evhttp_send_error(req, 503, "out of memory");
        return;
    }
    *x = (struct fetch){.fe = fe, .req = req, .k = k};
    if (fe->nfree) {
        x->buf = fe->free_list[--fe->nfree];
        start_fetch(x);
    } else {                      /* all buffers busy: wait for one */
        *fe->wait_tail = x;
        fe->wait_tail = &x->next;
    }
}

static void connect_backend(struct front *fe, const char *backend)
{
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.default_port = DEFAULT_PORT;
    o.max_rdma_inflight = 64;
    mw_future_t *f = mw_connect(fe->ctx, backend, &o);
    int rc = mw_wait(f);
    if (rc)
        die("connect to the back end", rc, f);
    fe->c = mw_future_value(f);
    mw_future_unref(f);
    f = mw_recv(fe->c);
    mw_future_set_timeout(f, 10000);
    if ((rc = mw_wait(f)))
        die("back end geometry", rc, f);
    mw_msg_t *m = mw_future_value(f);
    if (m->len != sizeof fe->g || ((struct geometry *)m->data)->magic != GEOMETRY_MAGIC)
        die("back end geometry", -EPROTO, NULL);
    memcpy(&fe->g, m->data, sizeof fe->g);
    mw_msg_free(m);
    mw_future_unref(f);
}

static int run_front(const char *backend, int http_port, bool no_rdma)
{
    struct event_base *base = event_base_new();
    struct front fe = {.wait_tail = &fe.wait_head};
    int rc = mw_ctx_new(&fe.ctx, base, NULL);   /* meshwire joins the HTTP loop */
    if (rc)
        die("context", rc, NULL);
    connect_backend(&fe, backend);
    if (no_rdma) {
        fe.local = malloc((size_t)fe.g.blocks * fe.g.block_size);
        for (uint32_t k = 0; k < fe.g.blocks; k++)
            fill_block(fe.local + (size_t)k * fe.g.block_size, k, fe.g.block_size);
        mw_conn_abort(fe.c);
        fe.c = NULL;
    }
    if (!(fe.bufs = mw_alloc(fe.ctx, (size_t)POOL * fe.g.block_size)))
        die("memory", -ENOMEM, NULL);
    for (int i = POOL; i-- > 0;)
        fe.free_list[fe.nfree++] = i;
    struct evhttp *http = evhttp_new(base);
    if (!http || evhttp_bind_socket(http, "127.0.0.1", (uint16_t)http_port) < 0)
        die("HTTP port", -EADDRINUSE, NULL);
    evhttp_set_gencb(http, on_request, &fe);
    fprintf(stderr, "kvserve front: http://127.0.0.1:%d/block/K (K < %u, %u bytes each)%s\n",
            http_port, fe.g.blocks, fe.g.block_size, no_rdma ? ", without RDMA" : "");
    struct event *s2, *s1 = stop_on_signals(base, &s2);
    event_base_dispatch(base);
    fprintf(stderr, "kvserve front: served %lu, failed %lu\n", fe.served, fe.failed);
    event_free(s1);
    event_free(s2);
    evhttp_free(http);
    if (fe.c)
        mw_conn_abort(fe.c);
    while (fe.wait_head) {
        struct fetch *x = fe.wait_head;
        fe.wait_head = x->next;
        free(x);
    }
    mw_free(fe.ctx, fe.bufs);
    free(fe.local);
    mw_ctx_free(fe.ctx);
    event_base_free(base);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    if (argc >= 3 && argc <= 5 && !strcmp(argv[1], "backend")) {
        long blocks = argc > 3 ? atol(argv[3]) : 1024, size = argc > 4 ? atol(argv[4]) : 65536;
        if (blocks < 1 || blocks > (1 << 20) || size < 1 || size > (16 << 20) ||
            blocks * size > (4l << 30)) {
            fprintf(stderr, "kvserve: BLOCKS 1..1048576, BLOCK_SIZE 1..16 MiB, 4 GiB in all\n");
            return 2;
        }
        return run_backend(argv[2], (uint32_t)blocks, (uint32_t)size);
    }
    if ((argc == 4 || (argc == 5 && !strcmp(argv[4], "--no-rdma"))) &&
        !strcmp(argv[1], "front")) {
        int port = atoi(argv[3]);
        if (port < 1 || port > 65535) {
            fprintf(stderr, "kvserve: HTTP_PORT 1..65535\n");
            return 2;
        }
        return run_front(argv[2], port, argc == 5);
    }
    fprintf(stderr, "usage: kvserve backend ADDR[:PORT] [BLOCKS [BLOCK_SIZE]]\n"
                    "       kvserve front BACKEND[:PORT] HTTP_PORT [--no-rdma]\n");
    return 2;
}
