/* The directory's store (dir/store.h) on Redis, inside: what the files of
 * this folder share.  The directory sees store.h only, so that another
 * backend could stand behind it.
 *
 *   open.c      open, close: the store's life, both links started
 *   url.c       the URL: where the store is
 *   link.c      a connection to Redis: look up, connect, lose, retry
 *   queue.c     requests: a deadline each, waiting in order, sent again
 *   requests.c  each request kind: its command, and the decoder of its reply
 *   events.c    the event link: keyspace notifications
 *
 * Two links on the context's event base: one for requests, one subscribed
 * to the keyspace notifications of the directory's keys, each reconnected
 * with a growing pause while the store is away.  Internal (mw__ names). */
#ifndef MW_DIR_REDIS_H
#define MW_DIR_REDIS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/list.h"
#include "dir/store.h"
#include "meshwire.h"

struct event;
struct mw__lookup;
struct redisAsyncContext;
struct redisReply;

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

/* link.c: one hiredis asynchronous connection */
struct mw__redis_link {
    struct mw__store *st;
    struct redisAsyncContext *ac;
    struct mw__lookup *lookup;    /* the store's name, being looked up */
    bool events;                  /* the subscribed one */
    bool up;
    unsigned retry_ms;
    struct event *retry_ev;       /* reconnect, or give up a connect in progress */
    /* connected: the link's own setup, which sets @up once it is done */
    void (*ready)(struct mw__redis_link *l);
    void (*libevent_add_write)(void *), (*libevent_del_write)(void *),
        (*libevent_cleanup)(void *);
};

struct mw__store {
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

/* mw__redis_link_init() - @l of @st, not connected yet.  Return: 0 or -ENOMEM. */
int mw__redis_link_init(struct mw__store *st, struct mw__redis_link *l, bool events,
                        void (*ready)(struct mw__redis_link *l));
/* mw__redis_link_connect() - start connecting; on failure, retry later. */
void mw__redis_link_connect(struct mw__redis_link *l);
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
    } fn;
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
int mw__redis_request(struct mw__store *st, mw__redis_decode_fn decode,
                      struct mw__redis_caller to, int argc, ...);
/* The request link is (back) up: what waits goes out.  (Its ready.) */
void mw__redis_requests_ready(struct mw__redis_link *l);
/* Closing: what waits fails -ECANCELED. */
void mw__redis_requests_cancel(struct mw__store *st);

#endif
