/* A link to the store: one hiredis asynchronous connection on the
 * context's event base, connected again with a growing pause while the
 * store is away.  What a link does once connected is its own (ready). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/resolve.h"
#include "dir/redis/redis.h"

/* The link's events on the context's base: hiredis's libevent adapter,
 * with two differences.  mw_ctx_fd's set knows the descriptor, so a caller
 * driving meshwire through mw_ctx_fd sees the store's traffic too.  And a
 * reply that grows past REPLY_MAX drops the link: hiredis 0.14 buffers a
 * bulk string whole, so a value or message a stranger put in the store
 * would otherwise be read whatever its size (the buffer is checked before
 * each read of at most 16 KiB). */
#define REPLY_MAX (2u << 20)

struct adapter {
    redisAsyncContext *ac;
    struct mw__redis_link *l;
    struct event *rev, *wev;
    int fd;
};

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct adapter *a = arg;
    const redisReader *r = a->ac->c.reader;
    if (r && r->len - r->pos > REPLY_MAX) {
        struct mw__redis_link *l = a->l;
        MW_LOG(l->st->ctx, MW_LOG_WARN,
               "directory: the store sent a reply over 2 MiB: link dropped, retrying");
        l->dropped = "the store sent a reply over 2 MiB";
        l->ac = NULL;
        redisAsyncFree(a->ac);             /* on_disconnect, then adapter_cleanup */
        return;
    }
    redisAsyncHandleRead(a->ac);
}

/* hiredis writes with write(): to a store that closed the connection, that
 * raises SIGPIPE, whose default ends the process.  Signals are the
 * application's, so rather than ignore it for the whole process, the
 * write runs with SIGPIPE blocked, and one it raised is taken back. */
struct sigpipe_guard {
    sigset_t old;
    bool was_pending;
};

static void sigpipe_block(struct sigpipe_guard *g)
{
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &g->old);
}

static void sigpipe_restore(struct sigpipe_guard *g)
{
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending);
    if (!g->was_pending && sigismember(&pending, SIGPIPE)) {
        const struct timespec now = {0, 0};
        while (sigtimedwait(&pipe, NULL, &now) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct sigpipe_guard g;
    sigpipe_block(&g);
    redisAsyncHandleWrite(((struct adapter *)arg)->ac);
    sigpipe_restore(&g);
}

static void adapter_add_read(void *privdata)
{
    struct adapter *a = privdata;
    event_add(a->rev, NULL);
}

static void adapter_del_read(void *privdata)
{
    event_del(((struct adapter *)privdata)->rev);
}

static void adapter_add_write(void *privdata)
{
    struct adapter *a = privdata;
    event_add(a->wev, NULL);
    mw__watch_fd_out(a->l->st->ctx, a->fd, true);
}

static void adapter_del_write(void *privdata)
{
    struct adapter *a = privdata;
    event_del(a->wev);
    mw__watch_fd_out(a->l->st->ctx, a->fd, false);
}

static void adapter_cleanup(void *privdata)
{
    struct adapter *a = privdata;
    mw__unwatch_fd(a->l->st->ctx, a->fd);
    event_free(a->rev);
    event_free(a->wev);
    mw__free(a);
}

static int adapter_attach(struct mw__redis_link *l, redisAsyncContext *ac)
{
    struct adapter *a = mw__calloc(1, sizeof *a);
    if (!a)
        return -ENOMEM;
    *a = (struct adapter){.ac = ac, .l = l, .fd = ac->c.fd};
    struct event_base *base = l->st->ctx->base;
    a->rev = event_new(base, a->fd, EV_READ, on_readable, a);
    a->wev = event_new(base, a->fd, EV_WRITE, on_writable, a);
    if (!a->rev || !a->wev || mw__watch_fd(l->st->ctx, a->fd) < 0) {
        if (a->rev)
            event_free(a->rev);
        if (a->wev)
            event_free(a->wev);
        mw__free(a);
        return -ENOMEM;
    }
    ac->ev.data = a;
    ac->ev.addRead = adapter_add_read;
    ac->ev.delRead = adapter_del_read;
    ac->ev.addWrite = adapter_add_write;
    ac->ev.delWrite = adapter_del_write;
    ac->ev.cleanup = adapter_cleanup;
    return 0;
}

static void link_retry_later(struct mw__redis_link *l)
{
    if (l->st->closing)
        return;
    mw__ev_add_ms(l->st->ctx, l->retry_ev, l->retry_ms);
    l->retry_ms = l->retry_ms * 2 > MW__STORE_RETRY_MAX_MS ? MW__STORE_RETRY_MAX_MS : l->retry_ms * 2;
}

static void link_lost(struct mw__redis_link *l, const char *why)
{
    struct mw__redis *st = l->st;
    bool was_up = l->up;
    l->up = false;
    l->ac = NULL;
    link_retry_later(l);
    if (was_up && !st->closing && st->hooks.down)
        st->hooks.down(st->hooks.arg, !l->events, why);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    struct mw__redis_link *l = ac->data;
    const char *why = l->dropped ? l->dropped : status == REDIS_OK ? "closed" : ac->errstr;
    l->dropped = NULL;
    link_lost(l, why);
}

/* Whether @r, an error answer to a link's first command, refuses our
 * credentials (a password wanted, or the one given wrong or not allowed);
 * any other error (LOADING, BUSY) is the store not ready yet. */
static bool refuses_us(const redisReply *r)
{
    return !strncmp(r->str, "NOAUTH", 6) || !strncmp(r->str, "WRONGPASS", 9) ||
           !strncmp(r->str, "NOPERM", 6);
}

/* The answer to the first command on a link (AUTH, or a PING without
 * credentials): an error drops the link (retried later); else the link's
 * own setup runs.  The retry timer stays armed until the setup is done
 * (mw__redis_link_up): a store that accepts and never answers is given up
 * at the timeout, like one that never accepts. */
static void on_hello(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct mw__redis_link *l = privdata;
    const redisReply *r = reply;
    if (!r)                             /* the link went meanwhile */
        return;
    if (r->type == REDIS_REPLY_ERROR) {
        struct mw__redis *st = l->st;
        if (refuses_us(r) && !l->events && st->hooks.refused)
            st->hooks.refused(st->hooks.arg, -EACCES, r->str);
        else if (!refuses_us(r))
            MW_LOG(st->ctx, MW_LOG_DEBUG, "directory: the store is not ready: %s", r->str);
        redisAsyncDisconnect(ac);       /* on_disconnect: retried later */
        return;
    }
    l->ready(l);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    struct mw__redis_link *l = ac->data;
    if (status != REDIS_OK) {           /* hiredis frees the context after this */
        MW_LOG(l->st->ctx, MW_LOG_DEBUG, "directory: store unreachable: %s", ac->errstr);
        link_lost(l, ac->errstr);
        return;
    }
    const struct mw__redis_addr *a = &l->st->addr;
    redisAsyncContext *c = (redisAsyncContext *)ac;   /* hiredis 0.14's const */
    if (a->pass[0] && a->user[0])
        redisAsyncCommand(c, on_hello, l, "AUTH %s %s", a->user, a->pass);
    else if (a->pass[0])
        redisAsyncCommand(c, on_hello, l, "AUTH %s", a->pass);
    else
        redisAsyncCommand(c, on_hello, l, "PING");  /* a store that wants a password says so */
}

void mw__redis_link_up(struct mw__redis_link *l)
{
    l->up = true;
    event_del(l->retry_ev);
    l->retry_ms = MW__STORE_RETRY_MIN_MS;
}

/* The retry timer: connect again; or, at the timeout, give up what is
 * still under way: a lookup (its thread ends alone), a connect (a store
 * that drops packets never answers), or a link's setup (a store that
 * accepted and does not answer). */
static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__redis_link *l = arg;
    if (l->lookup) {
        MW_LOG(l->st->ctx, MW_LOG_DEBUG, "directory: looking up %s took over %u ms",
               l->st->addr.host, l->st->timeout_ms);
        mw__lookup_cancel(l->lookup);
        l->lookup = NULL;
        link_lost(l, "the store's name was not looked up in time");
        return;
    }
    if (l->ac && !l->up && (l->ac->c.flags & REDIS_CONNECTED)) {
        l->dropped = "the store did not answer in time";
        redisAsyncFree(l->ac);             /* on_disconnect: retried later */
        return;
    }
    if (l->ac && !l->up) {
        redisAsyncFree(l->ac);             /* on_connect is not called: no onDisconnect */
        l->ac = NULL;
        link_retry_later(l);
        return;
    }
    if (!l->ac)
        mw__redis_link_connect(l);
}

/* A new hiredis context on the context's base, or NULL (logged).  @numeric:
 * the store's address as a literal, so hiredis's own getaddrinfo() answers
 * at once; NULL for a unix socket. */
static redisAsyncContext *link_dial(struct mw__redis_link *l, const char *numeric)
{
    struct mw__redis *st = l->st;
    const struct mw__redis_addr *a = &st->addr;
    redisAsyncContext *ac = numeric ? redisAsyncConnect(numeric, a->port)
                                    : redisAsyncConnectUnix(a->path);
    if (!ac || ac->err) {
        MW_LOG(st->ctx, MW_LOG_DEBUG, "directory: cannot reach the store: %s",
                ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        return NULL;
    }
    ac->data = l;
    if (adapter_attach(l, ac) < 0) {
        redisAsyncFree(ac);
        return NULL;
    }
    return ac;
}

static void link_start(struct mw__redis_link *l, const char *numeric)
{
    redisAsyncContext *ac = link_dial(l, numeric);
    if (!ac) {
        link_retry_later(l);
        return;
    }
    l->ac = ac;
    mw__watch_fd_out(l->st->ctx, ac->c.fd, true);   /* connecting: writable when done */
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    /* a connect that hangs is given up at the timeout */
    mw__ev_add_ms(l->st->ctx, l->retry_ev, l->st->timeout_ms);
}

static void on_lookup(void *arg, int err, const char *numeric, const char *why)
{
    struct mw__redis_link *l = arg;
    l->lookup = NULL;
    if (err) {
        MW_LOG(l->st->ctx, MW_LOG_DEBUG, "directory: %s", why);
        link_lost(l, why);
        return;
    }
    link_start(l, numeric);
}

/* The store's name is looked up off the loop (core/resolve.h) on every
 * attempt, bounded by the timeout like the connect that follows: a lookup
 * that hangs is given up then (and its thread left to end alone; there are
 * never more than a few such threads in a process, resolve.h). */
void mw__redis_link_connect(struct mw__redis_link *l)
{
    struct mw__redis *st = l->st;
    if (st->addr.path[0]) {
        link_start(l, NULL);
        return;
    }
    if (l->lookup)
        return;
    int rc = mw__lookup_start(st->ctx, st->addr.host, on_lookup, l, &l->lookup);
    if (rc < 0) {
        MW_LOG(st->ctx, MW_LOG_DEBUG, "directory: cannot look up %s: %s", st->addr.host,
               mw_strerror(rc));
        link_retry_later(l);
        return;
    }
    mw__ev_add_ms(st->ctx, l->retry_ev, st->timeout_ms);
}

int mw__redis_link_init(struct mw__redis *st, struct mw__redis_link *l, bool events,
                        void (*ready)(struct mw__redis_link *l))
{
    l->st = st;
    l->events = events;
    l->ready = ready;
    l->retry_ms = MW__STORE_RETRY_MIN_MS;
    if (!(l->retry_ev = evtimer_new(st->ctx->base, on_retry, l)))
        return -ENOMEM;
    return 0;
}

void mw__redis_link_close(struct mw__redis_link *l)
{
    int done = 0;
    if (l->ac && l->up) {        /* what was just asked (a last DEL) goes out */
        struct sigpipe_guard g;
        sigpipe_block(&g);
        redisBufferWrite(&l->ac->c, &done);
        sigpipe_restore(&g);
    }
    if (l->ac)
        redisAsyncFree(l->ac);   /* pending replies' callbacks run now, with NULL */
    l->ac = NULL;
    mw__lookup_cancel(l->lookup);
    l->lookup = NULL;
    if (l->retry_ev)
        event_free(l->retry_ev);
}
