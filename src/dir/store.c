/* The directory's store on Redis: two hiredis asynchronous connections on
 * the context's event base -- one for requests, one subscribed to the
 * keyspace notifications of the directory's keys -- each reconnected with
 * a growing pause while the store is away.  Requests carry their own
 * deadline; while the request link is down they wait in order and are
 * (re)sent once it is back (every request here is idempotent). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/adapters/libevent.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/list.h"
#include "dir/store.h"

#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 2000
#define URL_MAX 512

/* The whole prefix in one round trip, and consistent: SCAN and GET inside
 * one script; a key of another type (not ours) is left out.  (etcd: one
 * range request.) */
static const char SCAN_LUA[] =
    "local c, out = '0', {} "
    "repeat local r = redis.call('SCAN', c, 'MATCH', ARGV[1], 'COUNT', 1000) c = r[1] "
    "for _, k in ipairs(r[2]) do local v = redis.pcall('GET', k) "
    "if type(v) == 'string' then out[#out + 1] = k out[#out + 1] = v end end "
    "until c == '0' return out";

enum req_kind { REQ_PUT, REQ_RENEW, REQ_DEL, REQ_GET, REQ_SCAN, REQ_PLAIN };

struct req {
    struct mw__store *st;
    struct mw__list link;        /* in st->waiting while not sent */
    enum req_kind kind;
    int argc;
    char *argv[6];
    size_t lens[6];
    struct event *timer;
    int inflight;                /* sent to hiredis, its callback not yet run */
    bool finished;               /* answered, timed out or cancelled */
    union {
        mw__store_fn plain;
        mw__store_renew_fn renew;
        mw__store_get_fn get;
        mw__store_scan_fn scan;
    } fn;
    void *arg;
};

struct link {
    struct mw__store *st;
    redisAsyncContext *ac;
    bool events;                 /* the subscribed one */
    bool up;
    unsigned retry_ms;
    struct event *retry_ev;      /* reconnect, or give up a connect in progress */
    void (*libevent_add_write)(void *), (*libevent_del_write)(void *),
        (*libevent_cleanup)(void *);
};

struct mw__store {
    mw_ctx_t *ctx;
    char host[256];
    char path[256];              /* unix socket, else host:port */
    int port, db;
    unsigned timeout_ms;
    char *prefix;
    struct mw__store_hooks hooks;
    struct link req, ev;
    struct mw__list waiting;     /* requests not sent, in order */
    bool closing;
};

static void link_connect(struct link *l);

/* ------------------------------------------------------------------------
 * URL
 * ------------------------------------------------------------------------ */

static int parse_db(const char *s, int *db)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 0 || v > 1000000)
        return -EINVAL;
    *db = (int)v;
    return 0;
}

static int parse_url(struct mw__store *st, const char *url, const char **why)
{
    *why = "expected redis://HOST[:PORT][/DB] or unix:PATH[?db=N]";
    if (!url || strlen(url) >= URL_MAX)
        return -EINVAL;
    st->port = 6379;
    if (!strncmp(url, "unix:", 5)) {
        const char *p = url + 5, *q = strstr(p, "?db=");
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (!n || n >= sizeof st->path || (q && parse_db(q + 4, &st->db)))
            return -EINVAL;
        memcpy(st->path, p, n);
        return 0;
    }
    if (strncmp(url, "redis://", 8))
        return -EINVAL;
    const char *h = url + 8, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    if (slash && parse_db(slash + 1, &st->db))
        return -EINVAL;
    const char *end = h + hl, *colon = NULL;
    if (*h == '[') {                              /* [v6]:port */
        const char *rb = memchr(h, ']', hl);
        if (!rb)
            return -EINVAL;
        colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
        if (rb + 1 != end && !colon)
            return -EINVAL;
        h++;
        hl = (size_t)(rb - h);
    } else if ((colon = memchr(h, ':', hl))) {
        hl = (size_t)(colon - h);
    }
    if (colon) {
        char port[8] = {0};
        size_t pl = (size_t)(end - colon - 1);
        char *pe;
        if (!pl || pl >= sizeof port)
            return -EINVAL;
        memcpy(port, colon + 1, pl);
        long v = strtol(port, &pe, 10);
        if (*pe || v < 1 || v > 65535)
            return -EINVAL;
        st->port = (int)v;
    }
    if (!hl || hl >= sizeof st->host)
        return -EINVAL;
    memcpy(st->host, h, hl);
    return 0;
}

/* ------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------ */

static void req_free(struct req *r)
{
    for (int i = 0; i < r->argc; i++)
        mw__free(r->argv[i]);
    if (r->timer)
        event_free(r->timer);
    mw__free(r);
}

/* Answer @r once: its callback, with a reply or an error. */
static void req_finish(struct req *r, int err, const char *why, const redisReply *rep)
{
    if (r->finished)
        return;
    r->finished = true;
    if (r->timer)
        event_del(r->timer);
    switch (r->kind) {
    case REQ_PUT:
    case REQ_DEL:
    case REQ_PLAIN:
        if (r->fn.plain)
            r->fn.plain(r->arg, err, why);
        break;
    case REQ_RENEW:
        r->fn.renew(r->arg, err, why, !err && rep && rep->type == REDIS_REPLY_INTEGER &&
                                          rep->integer == 1);
        break;
    case REQ_GET:
        if (!err && rep && rep->type == REDIS_REPLY_NIL)
            r->fn.get(r->arg, -ENOENT, "no such entry", NULL, 0);
        else if (!err && (!rep || rep->type != REDIS_REPLY_STRING))
            r->fn.get(r->arg, -EPROTO, "the store answered GET with a non-string", NULL, 0);
        else
            r->fn.get(r->arg, err, why, err ? NULL : rep->str, err ? 0 : rep->len);
        break;
    case REQ_SCAN: {
        size_t n = 0;
        const char **keys = NULL, **vals = NULL;
        size_t *lens = NULL;
        if (!err && (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements % 2)) {
            err = -EPROTO;
            why = "the store answered the scan with something else than key/value pairs";
        }
        if (!err && rep->elements) {
            n = rep->elements / 2;
            keys = mw__calloc(n, sizeof *keys);
            vals = mw__calloc(n, sizeof *vals);
            lens = mw__calloc(n, sizeof *lens);
            if (!keys || !vals || !lens) {
                err = -ENOMEM;
                why = "out of memory";
                n = 0;
            }
            for (size_t i = 0; i < n && !err; i++) {
                const redisReply *k = rep->element[2 * i], *v = rep->element[2 * i + 1];
                if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) {
                    err = -EPROTO;
                    why = "the store's scan held a non-string";
                    n = 0;
                    break;
                }
                keys[i] = k->str;
                vals[i] = v->str;
                lens[i] = v->len;
            }
        }
        r->fn.scan(r->arg, err, why, n, keys, vals, lens);
        mw__free(keys);
        mw__free(vals);
        mw__free(lens);
        break;
    }
    }
}

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata);

static int req_send(struct req *r)
{
    struct link *l = &r->st->req;
    if (redisAsyncCommandArgv(l->ac, on_reply, r, r->argc, (const char **)r->argv, r->lens) !=
        REDIS_OK)
        return -EIO;
    r->inflight++;
    return 0;
}

/* Send what waits, in order, while the request link is up. */
static void flush_waiting(struct mw__store *st)
{
    while (st->req.up && !mw__list_empty(&st->waiting)) {
        struct req *r = mw__list_first(&st->waiting, struct req, link);
        mw__list_del(&r->link);
        mw__list_init(&r->link);
        if (req_send(r) < 0) {                      /* the link is going down */
            mw__list_add_tail(&st->waiting, &r->link);
            return;
        }
    }
}

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    (void)ac;
    struct req *r = privdata;
    const redisReply *rep = reply;
    r->inflight--;
    if (!r->finished && !rep && !r->st->closing) {
        /* the link went down under it: send it again once back.  Nothing
         * waits while the link is up, and pending replies come back in
         * order: these go first, in the order they were sent */
        mw__list_add_tail(&r->st->waiting, &r->link);
        return;
    }
    if (!r->finished) {
        if (!rep)
            req_finish(r, -ECANCELED, "the directory closed", NULL);
        else if (rep->type == REDIS_REPLY_ERROR)
            req_finish(r, -EIO, rep->str, NULL);
        else
            req_finish(r, 0, NULL, rep);
    }
    if (!r->inflight)
        req_free(r);
}

static void on_req_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct req *r = arg;
    req_finish(r, -ETIMEDOUT, "the store did not answer in time", NULL);
    if (!r->inflight) {                 /* never sent: drop it from the queue */
        mw__list_del(&r->link);
        req_free(r);
    }
}

static struct req *req_new(struct mw__store *st, enum req_kind kind, void *arg, int argc, ...)
{
    struct req *r = mw__calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->st = st;
    r->kind = kind;
    r->arg = arg;
    mw__list_init(&r->link);
    va_list ap;
    va_start(ap, argc);
    for (int i = 0; i < argc; i++) {
        const char *s = va_arg(ap, const char *);
        size_t n = va_arg(ap, size_t);
        if (!(r->argv[i] = mw__malloc(n + 1)))
            break;
        memcpy(r->argv[i], s, n);
        r->argv[i][n] = 0;
        r->lens[i] = n;
        r->argc++;
    }
    va_end(ap);
    if (r->argc < argc || !(r->timer = evtimer_new(st->ctx->base, on_req_timeout, r))) {
        req_free(r);
        return NULL;
    }
    return r;
}

static int req_start(struct req *r)
{
    struct mw__store *st = r->st;
    struct timeval tv = {st->timeout_ms / 1000, (st->timeout_ms % 1000) * 1000};
    mw__ev_add(st->ctx, r->timer, &tv);
    mw__list_add_tail(&st->waiting, &r->link);
    flush_waiting(st);
    return 0;
}

#define S(s) (s), strlen(s)

int mw__store_put(struct mw__store *st, const char *key, const char *val, size_t len,
                  unsigned lease_ms, mw__store_fn fn, void *arg)
{
    char px[16];
    snprintf(px, sizeof px, "%u", lease_ms);
    struct req *r = req_new(st, REQ_PUT, arg, 5, S("SET"), S(key), val, len, S("PX"), S(px));
    if (!r)
        return -ENOMEM;
    r->fn.plain = fn;
    return req_start(r);
}

int mw__store_renew(struct mw__store *st, const char *key, unsigned lease_ms,
                    mw__store_renew_fn fn, void *arg)
{
    char px[16];
    snprintf(px, sizeof px, "%u", lease_ms);
    struct req *r = req_new(st, REQ_RENEW, arg, 3, S("PEXPIRE"), S(key), S(px));
    if (!r)
        return -ENOMEM;
    r->fn.renew = fn;
    return req_start(r);
}

int mw__store_del(struct mw__store *st, const char *key, mw__store_fn fn, void *arg)
{
    struct req *r = req_new(st, REQ_DEL, arg, 2, S("DEL"), S(key));
    if (!r)
        return -ENOMEM;
    r->fn.plain = fn;
    return req_start(r);
}

int mw__store_get(struct mw__store *st, const char *key, mw__store_get_fn fn, void *arg)
{
    struct req *r = req_new(st, REQ_GET, arg, 2, S("GET"), S(key));
    if (!r)
        return -ENOMEM;
    r->fn.get = fn;
    return req_start(r);
}

int mw__store_scan(struct mw__store *st, const char *prefix, mw__store_scan_fn fn, void *arg)
{
    /* the prefix is plain text (names exclude glob characters): match it
     * and anything after */
    size_t n = strlen(prefix);
    char *pat = mw__malloc(n + 2);
    if (!pat)
        return -ENOMEM;
    memcpy(pat, prefix, n);
    memcpy(pat + n, "*", 2);
    struct req *r = req_new(st, REQ_SCAN, arg, 4, S("EVAL"), S(SCAN_LUA), S("0"), S(pat));
    mw__free(pat);
    if (!r)
        return -ENOMEM;
    r->fn.scan = fn;
    return req_start(r);
}

/* ------------------------------------------------------------------------
 * Links: connect, lose, retry
 * ------------------------------------------------------------------------ */

/* hiredis's libevent adapter adds its events to the base directly; these
 * wrappers also tell mw_ctx_fd's set about the descriptor, so a caller
 * driving meshwire through mw_ctx_fd sees the store's traffic too. */
static struct link *link_of_events(void *privdata)
{
    redisLibeventEvents *e = privdata;
    return e->context->data;
}

static int fd_of_events(void *privdata)
{
    return ((redisLibeventEvents *)privdata)->context->c.fd;
}

static void hook_add_write(void *privdata)
{
    struct link *l = link_of_events(privdata);
    l->libevent_add_write(privdata);
    mw__watch_fd_out(l->st->ctx, fd_of_events(privdata), true);
}

static void hook_del_write(void *privdata)
{
    struct link *l = link_of_events(privdata);
    l->libevent_del_write(privdata);
    mw__watch_fd_out(l->st->ctx, fd_of_events(privdata), false);
}

static void hook_cleanup(void *privdata)
{
    struct link *l = link_of_events(privdata);
    mw__unwatch_fd(l->st->ctx, fd_of_events(privdata));
    l->libevent_cleanup(privdata);
}

static void link_retry_later(struct link *l)
{
    if (l->st->closing)
        return;
    struct timeval tv = {l->retry_ms / 1000, (l->retry_ms % 1000) * 1000};
    mw__ev_add(l->st->ctx, l->retry_ev, &tv);
    l->retry_ms = l->retry_ms * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : l->retry_ms * 2;
}

static void link_lost(struct link *l, const char *why)
{
    struct mw__store *st = l->st;
    bool was_up = l->up;
    l->up = false;
    l->ac = NULL;
    link_retry_later(l);
    if (was_up && !st->closing && st->hooks.down)
        st->hooks.down(st->hooks.arg, !l->events, why);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    struct link *l = ac->data;
    link_lost(l, status == REDIS_OK ? "closed" : ac->errstr);
}

static void on_event_msg(redisAsyncContext *ac, void *reply, void *privdata);
static void on_config(redisAsyncContext *ac, void *reply, void *privdata);

static void link_ready(struct link *l)
{
    struct mw__store *st = l->st;
    event_del(l->retry_ev);
    l->retry_ms = RETRY_MIN_MS;
    if (!l->events) {
        if (st->db)
            redisAsyncCommand(l->ac, NULL, NULL, "SELECT %d", st->db);
        l->up = true;
        flush_waiting(st);
        if (st->hooks.up)
            st->hooks.up(st->hooks.arg, true, 0);
        return;
    }
    /* Keyspace notifications for set, del and expired ("K$gx"): the store
     * restarted may have lost the setting, so ask each time. */
    redisAsyncCommand(l->ac, on_config, l, "CONFIG GET notify-keyspace-events");
}

/* Whether @flags (a notify-keyspace-events value) covers K, $, g, x. */
static bool config_covers(const char *flags)
{
    bool all = strchr(flags, 'A') != NULL;
    return strchr(flags, 'K') && (all || (strchr(flags, '$') && strchr(flags, 'g') &&
                                          strchr(flags, 'x')));
}

static void subscribe(struct link *l)
{
    struct mw__store *st = l->st;
    redisAsyncCommand(l->ac, on_event_msg, l, "PSUBSCRIBE __keyspace@%d__:%s*", st->db,
                      st->prefix);
}

static void on_config_set(redisAsyncContext *ac, void *reply, void *privdata)
{
    (void)ac;
    struct link *l = privdata;
    const redisReply *rep = reply;
    if (!rep)
        return;
    if (rep->type == REDIS_REPLY_ERROR) {
        mw__log(l->st->ctx, MW_LOG_ERROR,
                "directory: the store refused to send keyspace notifications (%s): set "
                "notify-keyspace-events to include K$gx in its configuration to watch",
                rep->str);
        l->up = true;
        if (l->st->hooks.up)
            l->st->hooks.up(l->st->hooks.arg, false, -ENOTSUP);
        return;
    }
    subscribe(l);
}

static void on_config(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct link *l = privdata;
    const redisReply *rep = reply;
    if (!rep)
        return;
    const char *cur = rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
                              rep->element[1]->type == REDIS_REPLY_STRING
                          ? rep->element[1]->str
                          : NULL;
    if (cur && config_covers(cur)) {
        subscribe(l);
        return;
    }
    char want[64];
    snprintf(want, sizeof want, "%sK$gx", cur && strlen(cur) < 32 ? cur : "");
    redisAsyncCommand(ac, on_config_set, l, "CONFIG SET notify-keyspace-events %s", want);
}

/* ["psubscribe", pattern, n] once, then ["pmessage", pattern, channel, event]. */
static void on_event_msg(redisAsyncContext *ac, void *reply, void *privdata)
{
    (void)ac;
    struct link *l = privdata;
    struct mw__store *st = l->st;
    const redisReply *rep = reply;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3 ||
        rep->element[0]->type != REDIS_REPLY_STRING)
        return;
    if (!strcmp(rep->element[0]->str, "psubscribe")) {
        l->up = true;
        if (st->hooks.up)
            st->hooks.up(st->hooks.arg, false, 0);
        return;
    }
    if (strcmp(rep->element[0]->str, "pmessage") || rep->elements != 4 ||
        rep->element[2]->type != REDIS_REPLY_STRING ||
        rep->element[3]->type != REDIS_REPLY_STRING)
        return;
    const char *key = strchr(rep->element[2]->str, ':');   /* __keyspace@N__:KEY */
    const char *what = rep->element[3]->str;
    if (!key || !st->hooks.event)
        return;
    if (!strcmp(what, "set"))
        st->hooks.event(st->hooks.arg, key + 1, MW__STORE_SET);
    else if (!strcmp(what, "del") || !strcmp(what, "expired"))
        st->hooks.event(st->hooks.arg, key + 1, MW__STORE_GONE);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    struct link *l = ac->data;
    if (status != REDIS_OK) {           /* hiredis frees the context after this */
        mw__log(l->st->ctx, MW_LOG_DEBUG, "directory: store unreachable: %s", ac->errstr);
        link_lost(l, ac->errstr);
        return;
    }
    link_ready(l);
}

/* The retry timer: connect again, or give up a connect still in progress
 * after the timeout (a store that drops packets never answers). */
static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct link *l = arg;
    if (l->ac && !l->up) {
        redisAsyncFree(l->ac);             /* on_connect is not called: no onDisconnect */
        l->ac = NULL;
        link_retry_later(l);
        return;
    }
    if (!l->ac)
        link_connect(l);
}

static void link_connect(struct link *l)
{
    struct mw__store *st = l->st;
    redisAsyncContext *ac =
        st->path[0] ? redisAsyncConnectUnix(st->path) : redisAsyncConnect(st->host, st->port);
    if (!ac || ac->err) {
        mw__log(st->ctx, MW_LOG_DEBUG, "directory: cannot reach the store: %s",
                ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        link_retry_later(l);
        return;
    }
    ac->data = l;
    if (redisLibeventAttach(ac, st->ctx->base) != REDIS_OK) {
        redisAsyncFree(ac);
        link_retry_later(l);
        return;
    }
    l->ac = ac;
    l->libevent_add_write = ac->ev.addWrite;
    l->libevent_del_write = ac->ev.delWrite;
    l->libevent_cleanup = ac->ev.cleanup;
    ac->ev.addWrite = hook_add_write;
    ac->ev.delWrite = hook_del_write;
    ac->ev.cleanup = hook_cleanup;
    mw__watch_fd(st->ctx, ac->c.fd);
    mw__watch_fd_out(st->ctx, ac->c.fd, true);
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    /* a connect that hangs is given up at the timeout */
    struct timeval tv = {st->timeout_ms / 1000, (st->timeout_ms % 1000) * 1000};
    mw__ev_add(st->ctx, l->retry_ev, &tv);
}

static int link_init(struct mw__store *st, struct link *l, bool events)
{
    l->st = st;
    l->events = events;
    l->retry_ms = RETRY_MIN_MS;
    if (!(l->retry_ev = evtimer_new(st->ctx->base, on_retry, l)))
        return -ENOMEM;
    return 0;
}

int mw__store_open(mw_ctx_t *ctx, const char *url, const char *prefix, unsigned timeout_ms,
                   const struct mw__store_hooks *hooks, struct mw__store **out,
                   const char **why)
{
    struct mw__store *st = mw__calloc(1, sizeof *st);
    *why = "out of memory";
    if (!st)
        return -ENOMEM;
    st->ctx = ctx;
    st->timeout_ms = timeout_ms;
    st->hooks = *hooks;
    mw__list_init(&st->waiting);
    int rc = parse_url(st, url, why);
    if (!rc && !(st->prefix = mw__malloc(strlen(prefix) + 1)))
        rc = -ENOMEM;
    if (!rc)
        strcpy(st->prefix, prefix);
    if (!rc && ((rc = link_init(st, &st->req, false)) || (rc = link_init(st, &st->ev, true))))
        *why = "out of memory";
    if (rc) {
        st->closing = true;
        mw__store_close(st);
        return rc;
    }
    link_connect(&st->req);
    link_connect(&st->ev);
    *out = st;
    return 0;
}

static void link_close(struct link *l)
{
    int done = 0;
    if (l->ac && l->up)          /* what was just asked (a last DEL) goes out */
        redisBufferWrite(&l->ac->c, &done);
    if (l->ac)
        redisAsyncFree(l->ac);   /* pending replies' callbacks run now, with NULL */
    l->ac = NULL;
    if (l->retry_ev)
        event_free(l->retry_ev);
}

void mw__store_close(struct mw__store *st)
{
    if (!st)
        return;
    st->closing = true;
    link_close(&st->req);
    link_close(&st->ev);
    while (!mw__list_empty(&st->waiting)) {
        struct req *r = mw__list_first(&st->waiting, struct req, link);
        mw__list_del(&r->link);
        req_finish(r, -ECANCELED, "the directory closed", NULL);
        req_free(r);
    }
    mw__free(st->prefix);
    mw__free(st);
}

bool mw__store_up(const struct mw__store *st)
{
    return st->req.up;
}
