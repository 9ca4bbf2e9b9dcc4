/* Requests on the request link.  Each carries its own deadline; while the
 * link is down they wait in order and are (re)sent once it is back (every
 * request here is idempotent).  Each is answered once: by its reply, its
 * deadline, or the store closing, through its kind's decoder. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "dir/redis/redis.h"

#define ARGS_MAX 8

struct req {
    struct mw__redis *st;
    struct mw__list link;        /* in st->waiting while not sent */
    int argc;
    char *argv[ARGS_MAX];
    size_t lens[ARGS_MAX];
    struct event *timer;
    int inflight;                /* sent to hiredis, its callback not yet run */
    bool finished;               /* answered, timed out or cancelled */
    mw__redis_decode_fn decode;
    struct mw__redis_caller to;
};

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
    r->decode(&r->to, err, why, rep);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata);

static int req_send(struct req *r)
{
    struct mw__redis_link *l = &r->st->req;
    if (redisAsyncCommandArgv(l->ac, on_reply, r, r->argc, (const char **)r->argv, r->lens) !=
        REDIS_OK)
        return -EIO;
    r->inflight++;
    return 0;
}

/* Send what waits, in order, while the request link is up. */
static void flush_waiting(struct mw__redis *st)
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

/* An error our scripts raise (requests.c): Redis 7 puts "ERR " before it. */
static bool script_error(const redisReply *rep, const char *tag)
{
    const char *s = !strncmp(rep->str, "ERR ", 4) ? rep->str + 4 : rep->str;
    return !strcmp(s, tag);
}

static void req_answer(struct req *r, const redisReply *rep)
{
    if (!rep)
        req_finish(r, -ECANCELED, "the directory closed", NULL);
    else if (rep->type == REDIS_REPLY_ERROR && (!strncmp(rep->str, "WRONGTYPE", 9) ||
                                                script_error(rep, "MWTYPE")))
        req_finish(r, -EPROTO, "not a meshwire entry (a key of another type)", NULL);
    else if (rep->type == REDIS_REPLY_ERROR && script_error(rep, "MWBIG"))
        req_finish(r, -EPROTO, "not a meshwire entry (over 8 KiB)", NULL);
    else if (rep->type == REDIS_REPLY_ERROR)
        req_finish(r, -EIO, rep->str, NULL);
    else
        req_finish(r, 0, NULL, rep);
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
    if (!r->finished)
        req_answer(r, rep);
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

/* Copies of @argc (string, size_t length) pairs: hiredis takes them only
 * when the request is sent, which may be after a reconnect. */
static int req_copy_args(struct req *r, int argc, va_list ap)
{
    for (int i = 0; i < argc; i++) {
        const char *s = va_arg(ap, const char *);
        size_t n = va_arg(ap, size_t);
        if (!(r->argv[i] = mw__malloc(n + 1)))
            return -ENOMEM;
        memcpy(r->argv[i], s, n);
        r->argv[i][n] = 0;
        r->lens[i] = n;
        r->argc++;
    }
    return 0;
}

int mw__redis_request(struct mw__redis *st, mw__redis_decode_fn decode,
                      struct mw__redis_caller to, int argc, ...)
{
    struct req *r = mw__calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    *r = (struct req){.st = st, .decode = decode, .to = to};
    mw__list_init(&r->link);
    va_list ap;
    va_start(ap, argc);
    int rc = req_copy_args(r, argc, ap);
    va_end(ap);
    if (rc || !(r->timer = evtimer_new(st->ctx->base, on_req_timeout, r))) {
        req_free(r);
        return -ENOMEM;
    }
    mw__ev_add_ms(st->ctx, r->timer, st->timeout_ms);
    mw__list_add_tail(&st->waiting, &r->link);
    flush_waiting(st);
    return 0;
}

void mw__redis_requests_ready(struct mw__redis_link *l)
{
    struct mw__redis *st = l->st;
    if (st->addr.db)
        redisAsyncCommand(l->ac, NULL, NULL, "SELECT %d", st->addr.db);
    mw__redis_link_up(l);
    flush_waiting(st);
    if (st->hooks.up)
        st->hooks.up(st->hooks.arg, true, 0);
}

void mw__redis_requests_cancel(struct mw__redis *st)
{
    while (!mw__list_empty(&st->waiting)) {
        struct req *r = mw__list_first(&st->waiting, struct req, link);
        mw__list_del(&r->link);
        req_finish(r, -ECANCELED, "the directory closed", NULL);
        req_free(r);
    }
}
