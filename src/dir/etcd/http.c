/* A link to etcd's JSON gateway: one HTTP/1.1 connection on the context's
 * loop, connected again with a growing pause while the store is away; and
 * on the request link, the requests, one in flight at a time, in order.
 * Each step of reaching the store (the name's lookup, the connect, the
 * link's first answer) is given up at the timeout, as for Redis. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <json-c/json.h>

#include "cm/nic.h"
#include "core/alloc.h"
#include "core/ctx.h"
#include "core/resolve.h"
#include "dir/etcd/etcd.h"

struct ereq {
    struct mw__etcd *st;
    struct mw__list link;              /* in st->waiting */
    char *path, *body;
    struct event *timer;
    bool sent;                         /* in flight on the request link */
    bool shared;                       /* a read others may join while unsent */
    bool joiner;                       /* in another's joined list, not waiting */
    struct mw__list joined;            /* callers of the same read, answered with it */
    mw__etcd_fn fn;
    void *arg;
};

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void flush_waiting(struct mw__etcd *st);
static int out_flush(struct mw__etcd_link *l);

/* ------------------------------------------------------------------------
 * The connection
 * ------------------------------------------------------------------------ */

static void link_retry_later(struct mw__etcd_link *l)
{
    if (l->st->closing)
        return;
    mw__ev_add_ms(l->st->ctx, l->retry_ev, l->retry_ms);
    l->retry_ms = l->retry_ms * 2 > MW__STORE_RETRY_MAX_MS ? MW__STORE_RETRY_MAX_MS : l->retry_ms * 2;
}

static void link_close_fd(struct mw__etcd_link *l)
{
    if (l->fd < 0)
        return;
    event_free(l->rev);
    event_free(l->wev);
    l->rev = l->wev = NULL;
    mw__unwatch_fd(l->st->ctx, l->fd);
    close(l->fd);
    l->fd = -1;
    l->connected = false;
    evbuffer_drain(l->out, evbuffer_get_length(l->out));
    evbuffer_drain(l->in, evbuffer_get_length(l->in));
    evbuffer_drain(l->body, evbuffer_get_length(l->body));
    l->resp = (struct mw__resp){.stream = l->events};
}

void mw__etcd_link_drop(struct mw__etcd_link *l, const char *why)
{
    struct mw__etcd *st = l->st;
    bool was_up = l->up;
    l->up = false;
    link_close_fd(l);
    mw__lookup_cancel(l->lookup);
    l->lookup = NULL;
    if (!l->events && st->closing)     /* what was left to send cannot go now */
        mw__etcd_requests_cancel(st, false);
    if (!l->events) {                  /* what was in flight goes again */
        struct ereq *r;
        mw__list_for_each(r, &st->waiting, link)
            r->sent = false;
    }
    MW_LOG(st->ctx, MW_LOG_DEBUG, "directory: etcd link: %s", why);
    link_retry_later(l);
    if (was_up && !st->closing && st->hooks.down)
        st->hooks.down(st->hooks.arg, !l->events, why);
}

void mw__etcd_link_up(struct mw__etcd_link *l)
{
    l->up = true;
    event_del(l->retry_ev);
    l->retry_ms = MW__STORE_RETRY_MIN_MS;
}

static void want_write(struct mw__etcd_link *l, bool on)
{
    if (on)
        event_add(l->wev, NULL);
    else
        event_del(l->wev);
    mw__watch_fd_out(l->st->ctx, l->fd, on);
}

static void link_write(struct mw__etcd_link *l, const char *path, const char *body)
{
    size_t n = strlen(body);
    evbuffer_add_printf(l->out, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: "
                        "application/json\r\nContent-Length: %zu\r\n\r\n", path,
                        l->st->hostport, n);
    evbuffer_add(l->out, body, n);
    if (l->connected)
        want_write(l, true);
}

void mw__etcd_send(struct mw__etcd_link *l, const char *path, const char *body)
{
    link_write(l, path, body);
}

static void on_connected(struct mw__etcd_link *l)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
        mw__etcd_link_drop(l, strerror(err ? err : errno));
        return;
    }
    l->connected = true;
    int one = 1;
    setsockopt(l->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    event_add(l->rev, NULL);
    want_write(l, false);
    l->ready(l);                       /* its first request */
}

static void link_start(struct mw__etcd_link *l, const char *numeric)
{
    struct mw__etcd *st = l->st;
    struct sockaddr_storage sa;
    char where[300];
    snprintf(where, sizeof where, strchr(numeric, ':') ? "[%s]:%d" : "%s:%d", numeric,
             st->port);
    if (mw__parse_addr(where, (uint16_t)st->port, &sa) < 0) {
        mw__etcd_link_drop(l, "the store's address is malformed");
        return;
    }
    socklen_t salen = sa.ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                              : sizeof(struct sockaddr_in6);
    l->fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0) {
        mw__etcd_link_drop(l, strerror(errno));
        return;
    }
    l->rev = event_new(st->ctx->base, l->fd, EV_READ | EV_PERSIST, on_read, l);
    l->wev = event_new(st->ctx->base, l->fd, EV_WRITE | EV_PERSIST, on_write, l);
    if (!l->rev || !l->wev || mw__watch_fd(st->ctx, l->fd) < 0) {
        if (l->rev)
            event_free(l->rev);
        if (l->wev)
            event_free(l->wev);
        l->rev = l->wev = NULL;
        close(l->fd);
        l->fd = -1;
        link_retry_later(l);
        return;
    }
    if (connect(l->fd, (struct sockaddr *)&sa, salen) < 0 && errno != EINPROGRESS) {
        mw__etcd_link_drop(l, strerror(errno));
        return;
    }
    want_write(l, true);               /* writable: connected, or failed */
    mw__ev_add_ms(st->ctx, l->retry_ev, st->timeout_ms);
}

static void on_lookup(void *arg, int err, const char *numeric, const char *why)
{
    struct mw__etcd_link *l = arg;
    l->lookup = NULL;
    if (err)
        mw__etcd_link_drop(l, why);
    else
        link_start(l, numeric);
}

void mw__etcd_link_connect(struct mw__etcd_link *l)
{
    struct mw__etcd *st = l->st;
    if (l->lookup || l->fd >= 0)
        return;
    int rc = mw__lookup_start(st->ctx, st->host, on_lookup, l, &l->lookup);
    if (rc < 0) {
        link_retry_later(l);
        return;
    }
    mw__ev_add_ms(st->ctx, l->retry_ev, st->timeout_ms);
}

/* The retry timer: connect again, or give up the step still under way. */
static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__etcd_link *l = arg;
    if (l->lookup)
        mw__etcd_link_drop(l, "the store's name was not looked up in time");
    else if (l->fd >= 0 && !l->up)
        mw__etcd_link_drop(l, l->connected ? "the store did not answer in time"
                                           : "the store was not reached in time");
    else if (l->fd < 0)
        mw__etcd_link_connect(l);
}

/* Send what is buffered, as far as the socket takes it: send() with
 * MSG_NOSIGNAL, so a store that closed raises no SIGPIPE (signals are the
 * application's).  Return: 0, or -1 with errno. */
static int out_flush(struct mw__etcd_link *l)
{
    size_t n;
    while ((n = evbuffer_get_contiguous_space(l->out))) {
        const unsigned char *p = evbuffer_pullup(l->out, (ev_ssize_t)n);
        ssize_t w = send(l->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -1;
        evbuffer_drain(l->out, (size_t)w);
    }
    return 0;
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__etcd_link *l = arg;
    if (!l->connected) {
        on_connected(l);
        return;
    }
    if (out_flush(l) < 0) {
        mw__etcd_link_drop(l, strerror(errno));
        return;
    }
    if (!evbuffer_get_length(l->out))
        want_write(l, false);
}

/* ------------------------------------------------------------------------
 * Responses
 * ------------------------------------------------------------------------ */

static void request_answered(struct mw__etcd_link *l);

/* Read what came (resp.c); false once the link dropped. */
static bool parse(struct mw__etcd_link *l)
{
    for (;;) {
        switch (mw__resp_step(&l->resp, l->in, l->body)) {
        case MW__RESP_MORE:
            return true;
        case MW__RESP_DATA:            /* the watch's stream */
            l->data(l, l->body);
            break;
        case MW__RESP_DONE:
            if (l->events)
                mw__etcd_link_drop(l, "the store ended the watch");
            else
                request_answered(l);
            break;
        case MW__RESP_BAD:
            mw__etcd_link_drop(l, "the store's answer is malformed");
            return false;
        }
        if (l->fd < 0)
            return false;
    }
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__etcd_link *l = arg;
    int n = evbuffer_read(l->in, l->fd, 16384);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        mw__etcd_link_drop(l, n ? strerror(errno) : "closed by the store");
        return;
    }
    parse(l);
}

/* ------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------ */

static void req_free(struct ereq *r)
{
    mw__list_del(&r->link);
    mw__free(r->path);
    mw__free(r->body);
    if (r->timer)
        event_free(r->timer);
    mw__free(r);
}

/* @r leaves: the first caller that joined it takes its place in the
 * queue, with its state, and the others' (their own deadlines go on). */
static void req_hand_over(struct ereq *r)
{
    if (mw__list_empty(&r->joined))
        return;
    struct ereq *h = mw__list_first(&r->joined, struct ereq, link);
    mw__list_del(&h->link);
    h->sent = r->sent;
    h->joiner = false;
    mw__list_add_tail(&r->link, &h->link);          /* right where r is */
    mw__list_move_all(&h->joined, &r->joined);
}

static void req_finish(struct ereq *r, int err, const char *why, struct json_object *res)
{
    struct mw__etcd *st = r->st;
    mw__etcd_fn fn = r->fn;
    void *arg = r->arg;
    req_free(r);
    if (fn)
        fn(arg, err, why, res);
    else
        mw__etcd_done_maybe(st);      /* closing: was it the last? */
}

/* @r and every caller that joined it get the one answer; those after a
 * callback that closed the directory, -ECANCELED as closing gives. */
static void req_finish_all(struct ereq *r, int err, const char *why, struct json_object *res)
{
    struct mw__etcd *st = r->st;
    struct mw__list all;
    mw__list_init(&all);
    mw__list_del(&r->link);
    mw__list_add_tail(&all, &r->link);
    mw__list_move_all(&all, &r->joined);
    while (!mw__list_empty(&all)) {
        struct ereq *x = mw__list_first(&all, struct ereq, link);
        if (st->closing)
            req_finish(x, -ECANCELED, "the directory closed", NULL);
        else
            req_finish(x, err, why, res);
    }
}

/* etcd's error answer: {"error": "...", "message": "...", "code": N}. */
static void answer_error(struct mw__etcd *st, struct ereq *r, int status,
                         struct json_object *o)
{
    char why[256];
    const char *m = mw__json_str(o, "message") ? mw__json_str(o, "message")
                                               : mw__json_str(o, "error");
    snprintf(why, sizeof why, "etcd answered %d: %.200s", status, m ? m : "(no message)");
    if ((status == 401 || status == 403) && st->hooks.refused)
        st->hooks.refused(st->hooks.arg, -EACCES, why);
    req_finish_all(r, status == 401 || status == 403 ? -EACCES : -EIO, why, NULL);
}

/* The link's first answer (its setup), or the first request's. */
static void request_answered(struct mw__etcd_link *l)
{
    struct mw__etcd *st = l->st;
    size_t n = evbuffer_get_length(l->body);
    char *text = (char *)evbuffer_pullup(l->body, (ev_ssize_t)n);
    struct json_object *o = n && text ? mw__json_parse(text, n) : NULL;
    evbuffer_drain(l->body, n);
    if (!l->up) {                      /* the status probe */
        if (l->resp.status == 200) {
            mw__etcd_link_up(l);
            mw__etcd_requests_ready(l);
        } else {
            char why[128];
            snprintf(why, sizeof why, "etcd answered %d to its status", l->resp.status);
            if ((l->resp.status == 401 || l->resp.status == 403) && st->hooks.refused)
                st->hooks.refused(st->hooks.arg, -EACCES, why);
            mw__etcd_link_drop(l, why);
        }
    } else if (!mw__list_empty(&st->waiting)) {
        struct ereq *r = mw__list_first(&st->waiting, struct ereq, link);
        if (l->resp.too_long)
            req_finish_all(r, -EMSGSIZE, "the store's answer is over 4 MiB", NULL);
        else if (l->resp.status != 200)
            answer_error(st, r, l->resp.status, o);
        else if (!o)
            req_finish_all(r, -EPROTO, "the store's answer is not JSON", NULL);
        else
            req_finish_all(r, 0, NULL, o);
        flush_waiting(st);
    }
    if (o)
        json_object_put(o);
}

/* Send the first request if it waits (one in flight at a time). */
static void flush_waiting(struct mw__etcd *st)
{
    if (!st->req.up || mw__list_empty(&st->waiting))
        return;
    struct ereq *r = mw__list_first(&st->waiting, struct ereq, link);
    if (r->sent)
        return;
    r->sent = true;
    link_write(&st->req, r->path, r->body);
}

static void on_req_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct ereq *r = arg;
    struct mw__etcd *st = r->st;
    bool was_sent = r->sent, leads = !r->joiner;
    if (leads)
        req_hand_over(r);
    req_finish(r, -ETIMEDOUT, "the store did not answer in time", NULL);
    if (leads && was_sent)             /* its answer would answer the next one */
        mw__etcd_link_drop(&st->req, "the store did not answer in time");
}

/* A read of @path with @body that waits unsent: a new caller of the same
 * read may join it, as its answer is made after both asked. */
static struct ereq *shared_read(struct mw__etcd *st, const char *path, const char *body)
{
    struct ereq *r;
    mw__list_for_each(r, &st->waiting, link)
        if (r->shared && !r->sent && !strcmp(r->path, path) && !strcmp(r->body, body))
            return r;
    return NULL;
}

/* Where a new request goes: behind what waits; next (an operation's next
 * step); or joined to the same read if one waits unsent, else behind. */
enum place { LAST, NEXT, SHARED };

static int request(struct mw__etcd *st, const char *path, const char *body, mw__etcd_fn fn,
                   void *arg, enum place at)
{
    struct ereq *r = mw__calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    *r = (struct ereq){.st = st, .fn = fn, .arg = arg, .shared = at == SHARED};
    mw__list_init(&r->link);
    mw__list_init(&r->joined);
    r->path = mw__malloc(strlen(path) + 1);
    r->body = mw__malloc(strlen(body) + 1);
    r->timer = evtimer_new(st->ctx->base, on_req_timeout, r);
    if (!r->path || !r->body || !r->timer) {
        req_free(r);
        return -ENOMEM;
    }
    strcpy(r->path, path);
    strcpy(r->body, body);
    mw__ev_add_ms(st->ctx, r->timer, st->timeout_ms);
    struct ereq *head = mw__list_empty(&st->waiting)
                            ? NULL : mw__list_first(&st->waiting, struct ereq, link);
    struct ereq *same = at == SHARED ? shared_read(st, path, body) : NULL;
    if (same) {                                         /* kept whole, should it lead */
        r->joiner = true;
        mw__list_add_tail(&same->joined, &r->link);
    } else if (at == NEXT && head && !head->sent)
        mw__list_add_tail(st->waiting.next, &r->link);  /* before what waits */
    else if (at == NEXT && head)
        mw__list_add_tail(head->link.next, &r->link);   /* right after the one in flight */
    else
        mw__list_add_tail(&st->waiting, &r->link);
    flush_waiting(st);
    return 0;
}

int mw__etcd_request(struct mw__etcd *st, const char *path, const char *body, mw__etcd_fn fn,
                     void *arg)
{
    return request(st, path, body, fn, arg, LAST);
}

int mw__etcd_request_next(struct mw__etcd *st, const char *path, const char *body,
                          mw__etcd_fn fn, void *arg)
{
    return request(st, path, body, fn, arg, NEXT);
}

int mw__etcd_read(struct mw__etcd *st, const char *path, const char *body, mw__etcd_fn fn,
                  void *arg)
{
    return request(st, path, body, fn, arg, SHARED);
}

void mw__etcd_requests_ready(struct mw__etcd_link *l)
{
    struct mw__etcd *st = l->st;
    flush_waiting(st);
    if (st->hooks.up)
        st->hooks.up(st->hooks.arg, true, 0);
}

bool mw__etcd_requests_cancel(struct mw__etcd *st, bool keep_deletes)
{
    bool kept = false;
    struct mw__list *n = st->waiting.next;
    while (n != &st->waiting) {
        struct ereq *r = mw__container_of(n, struct ereq, link);
        n = n->next;
        while (!mw__list_empty(&r->joined))
            req_finish(mw__list_first(&r->joined, struct ereq, link), -ECANCELED,
                       "the directory closed", NULL);
        bool keep = keep_deletes && st->req.up &&
                    (r->sent || !strcmp(r->path, "/v3/lease/revoke"));
        if (!keep) {
            req_finish(r, -ECANCELED, "the directory closed", NULL);
            continue;
        }
        mw__etcd_fn fn = r->fn;
        r->fn = NULL;                  /* goes on alone, its answer dropped */
        if (fn)
            fn(r->arg, -ECANCELED, "the directory closed", NULL);
        if (!r->sent) {                /* all at once (HTTP/1.1 pipelining), so the
                                          store has them before anyone asks after */
            r->sent = true;
            link_write(&st->req, r->path, r->body);
        }
        kept = true;
    }
    return kept;
}

void mw__etcd_done_maybe(struct mw__etcd *st)
{
    if (st->closing && mw__list_empty(&st->waiting))
        event_active(st->reap_ev, EV_TIMEOUT, 1);
}

/* ------------------------------------------------------------------------
 * Life
 * ------------------------------------------------------------------------ */

int mw__etcd_link_init(struct mw__etcd *st, struct mw__etcd_link *l, bool events,
                       void (*ready)(struct mw__etcd_link *l))
{
    *l = (struct mw__etcd_link){.st = st, .events = events, .fd = -1, .ready = ready,
                                .retry_ms = MW__STORE_RETRY_MIN_MS, .resp.stream = events};
    l->data = mw__etcd_events_data;
    l->out = evbuffer_new();
    l->in = evbuffer_new();
    l->body = evbuffer_new();
    l->retry_ev = evtimer_new(st->ctx->base, on_retry, l);
    return l->out && l->in && l->body && l->retry_ev ? 0 : -ENOMEM;
}

void mw__etcd_link_close(struct mw__etcd_link *l)
{
    if (l->fd >= 0 && l->connected)
        out_flush(l);                   /* what was just asked (a revoke) goes out */
    if (l->out)
        link_close_fd(l);
    mw__lookup_cancel(l->lookup);
    l->lookup = NULL;
    if (l->retry_ev)
        event_free(l->retry_ev);
    if (l->out)
        evbuffer_free(l->out);
    if (l->in)
        evbuffer_free(l->in);
    if (l->body)
        evbuffer_free(l->body);
    l->retry_ev = NULL;                /* closed twice: nothing more */
    l->out = l->in = l->body = NULL;
}
