/* The directory's store (dir/store.h) on Redis, inside: what the files of
 * this folder share.  The directory sees store.h only, so that another
 * backend could stand behind it.
 *
 *   open.c      open, close: the store's life, both links started
 *   url.c       the URL: where the store is
 *   link.c      a connection to Redis: look up, connect, lose, retry
 *   queue.c     requests: a deadline each, waiting in order, sent again
 *   requests.c  each request kind: its command, and the decoder of its reply
 *   scan.c      a list: the prefix's index read a page per request
 *   events.c    the event link: values put, keys gone
 *
 * Two links on the context's event base: one for requests, one subscribed
 * to what happens to the directory's keys, each reconnected with a growing
 * pause while the store is away.  Internal (mw__ names).
 *
 * The work asked of a store shared with others stays proportional to the
 * directory's own keys: beside its entries ('#' is never in a name) the
 * directory keeps PREFIX#index, a sorted set of its entries' keys (lists
 * read it a page at a time, never the keyspace), and PREFIX#events, the
 * channel where a put announces "KEY\nVALUE" (watchers get the value there,
 * with no GET).  Keys gone (deleted, expired) come as keyspace
 * notifications ("Kgx").  A value is read only when it is a string of at
 * most MW__STORE_VALUE_MAX bytes: a stranger's 512 MB value, or a key of
 * another type, is never sent. */
#ifndef MW_DIR_REDIS_H
#define MW_DIR_REDIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/list.h"
#include "dir/store.h"
#include "meshwire.h"

struct event;
struct mw__lookup;
struct redisAsyncContext;
struct redisReply;
struct mw__redis;

/* url.c: "redis://HOST[:PORT][/DB]" or "unix:PATH[?db=N]" */
struct mw__redis_addr {
    char host[256];
    char path[256];               /* unix socket, else host:port */
    int port, db;
    char user[128], pass[256];    /* AUTH, when pass is set */
};

/* mw__redis_parse_url() - fill @a from @url.
 * Return: 0, or -EINVAL with @why. */
int mw__redis_parse_url(const char *url, struct mw__redis_addr *a, const char **why);

/* mw__redis_side_key() - PREFIX#@what in @buf. */
void mw__redis_side_key(const struct mw__redis *st, const char *what, char *buf, size_t cap);

/* Lua, for a key @k: t its type, big whether it is a string too long to read. */
#define MW__REDIS_STR_(x) #x
#define MW__REDIS_STR(x) MW__REDIS_STR_(x)
#define MW__REDIS_CHECK_LUA(k)                                                           \
    "local t = redis.call('TYPE', " k ").ok "                                           \
    "local big = t == 'string' and redis.call('STRLEN', " k ") > "                      \
    MW__REDIS_STR(MW__STORE_VALUE_MAX) " "

/* link.c: one hiredis asynchronous connection */
struct mw__redis_link {
    struct mw__redis *st;
    struct redisAsyncContext *ac;
    struct mw__lookup *lookup;    /* the store's name, being looked up */
    bool events;                  /* the subscribed one */
    bool up;
    unsigned retry_ms;
    struct event *retry_ev;       /* reconnect, or give up a connect in progress */
    /* connected: the link's own setup, which calls mw__redis_link_up() */
    void (*ready)(struct mw__redis_link *l);
    const char *dropped;          /* why the link was dropped, for its loss */
};

struct mw__redis {
    struct mw__store base;        /* first: what the directory holds */
    mw_ctx_t *ctx;
    struct mw__redis_addr addr;
    unsigned timeout_ms;
    bool configure;               /* CONFIG SET the notifications watches need */
    char *prefix;
    struct mw__store_hooks hooks;
    struct mw__redis_link req, ev;
    struct mw__list waiting;      /* requests not sent, in order */
    bool closing;
};

/* open.c: the backend's entry (store.h's mw__store_open, for redis:// and
 * unix: URLs), and its end */
int mw__redis_open(mw_ctx_t *ctx, const char *url, const char *prefix,
                   const struct mw__store_cfg *cfg, const struct mw__store_hooks *hooks,
                   struct mw__store **out, const char **why);
void mw__redis_close(struct mw__redis *st);

/* requests.c, scan.c: the store's operations (store.h) */
int mw__redis_put(struct mw__redis *st, const char *key, const char *val, size_t len,
                  unsigned lease_ms, mw__store_fn fn, void *arg);
int mw__redis_renew(struct mw__redis *st, const char *key, uint64_t instance,
                    unsigned lease_ms, mw__store_renew_fn fn, void *arg);
int mw__redis_del(struct mw__redis *st, const char *key, uint64_t instance, mw__store_fn fn,
                  void *arg);
int mw__redis_get(struct mw__redis *st, const char *key, mw__store_get_fn fn, void *arg);
int mw__redis_scan(struct mw__redis *st, const char *prefix, mw__store_scan_fn fn, void *arg);

/* mw__redis_link_init() - @l of @st, not connected yet.  Return: 0 or -ENOMEM. */
int mw__redis_link_init(struct mw__redis *st, struct mw__redis_link *l, bool events,
                        void (*ready)(struct mw__redis_link *l));
/* mw__redis_link_connect() - start connecting; on failure, retry later. */
void mw__redis_link_connect(struct mw__redis_link *l);
/* mw__redis_link_up() - @l's setup is done (its ready, at the end): it
 * carries traffic, and the timer that gives up a setup is stopped. */
void mw__redis_link_up(struct mw__redis_link *l);
/* mw__redis_link_close() - what was just asked goes out; pending replies'
 * callbacks run now, with no reply. */
void mw__redis_link_close(struct mw__redis_link *l);

/* events.c: the event link's setup, and the events it brings */
void mw__redis_events_ready(struct mw__redis_link *l);

/* Whom a request answers: the caller's callback, of its kind's type. */
struct mw__redis_caller {
    union {
        mw__store_fn plain;
        mw__store_renew_fn renew;
        mw__store_get_fn get;
        mw__store_scan_fn scan;
    } fn;                         /* (a list's pages: unused) */
    void *arg;
};

/* A request kind's decoder (requests.c): calls @to with what reply @rep
 * says, or with @err and @why (then @rep is NULL). */
typedef void (*mw__redis_decode_fn)(const struct mw__redis_caller *to, int err,
                                    const char *why, const struct redisReply *rep);

/* queue.c */
/* mw__redis_request() - send the command of @argc (string, size_t length)
 * pairs, now or once the request link is up; its reply, or a timeout or
 * cancellation, goes through @decode to @to, once.  Return: 0 or -ENOMEM. */
int mw__redis_request(struct mw__redis *st, mw__redis_decode_fn decode,
                      struct mw__redis_caller to, int argc, ...);
/* The request link is (back) up: what waits goes out.  (Its ready.) */
void mw__redis_requests_ready(struct mw__redis_link *l);
/* Closing: what waits fails -ECANCELED. */
void mw__redis_requests_cancel(struct mw__redis *st);

#endif
