/* epoll_client: hello's client (connect, take the server's descriptor,
 * write 1 MiB into its memory, say so), on a plain epoll loop that has
 * descriptors of its own.  meshwire joins it with one descriptor,
 * mw_ctx_fd(); each step starts the next from a future's callback, and
 * between steps the process sleeps in epoll_wait.
 *
 *   epoll_client HOST[:PORT]     (against `hello -l`)
 *
 * The loop is the README's epoll example, verbatim. */
#include <meshwire.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define SIZE (1 << 20)

struct client {
    mw_ctx_t *ctx;
    mw_conn_t *conn;
    char *buf;
    mw_remote_t remote;
    int finished, failed;
};

/* A step failed: say which and why, and stop. */
static int failed(struct client *cl, mw_future_t *f, const char *step)
{
    if (mw_future_state(f) == MW_FUTURE_DONE)
        return 0;
    fprintf(stderr, "epoll_client: %s: %s\n", step, mw_future_message(f));
    if (cl->conn)
        mw_conn_abort(cl->conn);
    cl->failed = cl->finished = 1;
    return 1;
}

/* Run @next once @f completes; the callback keeps @f alive until then. */
static void then(struct client *cl, mw_future_t *f, mw_then_fn next)
{
    if (!f || mw_future_then(f, next, cl) < 0) {
        fprintf(stderr, "epoll_client: out of memory\n");
        cl->failed = cl->finished = 1;
    }
    mw_future_unref(f);
}

static void on_closed(mw_future_t *f, void *arg)
{
    struct client *cl = arg;
    cl->conn = NULL;                               /* released by the close */
    if (!failed(cl, f, "close"))
        cl->finished = 1;
}

static void on_sent(mw_future_t *f, void *arg)
{
    struct client *cl = arg;
    if (!failed(cl, f, "send"))
        then(cl, mw_conn_close(cl->conn), on_closed);
}

static void on_written(mw_future_t *f, void *arg)
{
    struct client *cl = arg;
    if (!failed(cl, f, "write"))
        then(cl, mw_send(cl->conn, "done", 5), on_sent);
}

static void on_descriptor(mw_future_t *f, void *arg)
{
    struct client *cl = arg;
    if (failed(cl, f, "recv"))
        return;
    mw_msg_t *m = mw_future_value(f);
    int ok = m->len == sizeof cl->remote;
    if (ok)
        memcpy(&cl->remote, m->data, sizeof cl->remote);
    mw_msg_free(m);
    if (!ok || !(cl->buf = mw_alloc(cl->ctx, SIZE))) {
        fprintf(stderr, "epoll_client: %s\n", ok ? "out of memory" : "no descriptor");
        mw_conn_abort(cl->conn);
        cl->failed = cl->finished = 1;
        return;
    }
    memset(cl->buf, 'x', SIZE);
    then(cl, mw_write(cl->conn, cl->buf, SIZE, &cl->remote, 0), on_written);
}

static void on_connected(mw_future_t *f, void *arg)
{
    struct client *cl = arg;
    if (failed(cl, f, "connect"))
        return;
    cl->conn = mw_future_value(f);
    then(cl, mw_recv(cl->conn), on_descriptor);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: epoll_client HOST[:PORT]\n");
        return 2;
    }
    struct client cl = {0};
    int ep = epoll_create1(EPOLL_CLOEXEC);
    /* one descriptor of the program's own: a timer ticking every 100 ms */
    int tick = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    struct itimerspec its = {.it_interval = {0, 100000000}, .it_value = {0, 100000000}};
    timerfd_settime(tick, 0, &its, NULL);
    struct epoll_event te = {.events = EPOLLIN, .data.fd = tick};
    epoll_ctl(ep, EPOLL_CTL_ADD, tick, &te);
    unsigned long ticks = 0, wakeups = 0;

    /* README: begin */
    if (mw_ctx_new(&cl.ctx, NULL, NULL) < 0)       /* the context owns its base */
        return 1;
    int fd = mw_ctx_fd(cl.ctx);                    /* completions, rdma_cm, timers */
    struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
    then(&cl, mw_connect(cl.ctx, argv[1], NULL), on_connected);   /* the first step */
    while (!cl.finished) {
        struct epoll_event ev[8];
        int n = epoll_wait(ep, ev, 8, -1);         /* sleeps: nothing polls */
        for (int i = 0; i < n; i++) {
            if (ev[i].data.fd == fd)
                mw_ctx_progress(cl.ctx);           /* runs what is due, never blocks */
            else
                ticks += read(tick, &(uint64_t){0}, 8) == 8;   /* your own descriptors */
        }
        wakeups++;
    }
    /* README: end */
    printf("epoll_client: %s after %lu wake-ups (%lu of them ticks of its own timer)\n",
           cl.failed ? "failed" : "wrote 1 MiB", wakeups, ticks);
    mw_free(cl.ctx, cl.buf);
    mw_ctx_free(cl.ctx);
    close(tick);
    close(ep);
    return cl.failed;
}
