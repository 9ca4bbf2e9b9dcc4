/* The key-value store under the directory, on the context's own event
 * base: Redis (dir/redis/, through hiredis's asynchronous client) or etcd
 * (dir/etcd/, its v3 JSON gateway through libevent's HTTP client), chosen
 * by the URL's scheme (store.c).  Internal (mw__ names).
 *
 * This file is the whole contract the directory needs from a store, which
 * each backend implements:
 *   - put a key with a lease (etcd: a lease granted and kept alive; Redis:
 *     SET PX) and renew it; delete a key;
 *   - get one key; get every key under a prefix (etcd: a range), with
 *     work proportional to the keys under it, not to the whole store;
 *   - events for keys under the directory's prefix: set (with the value),
 *     or gone (deleted or expired) (etcd: a watch on the prefix; Redis:
 *     values published by puts, keyspace notifications for the rest);
 *   - no value longer than MW__STORE_VALUE_MAX is ever read;
 *   - a link that goes down and comes back: requests wait (up to their
 *     deadline) and are sent once it is back; the owner hears "down" and
 *     "up" to re-register and re-read what it watches.
 */
#ifndef MW_DIR_STORE_H
#define MW_DIR_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/list.h"
#include "meshwire.h"

struct mw__store;

/* A backend's operations; the functions below dispatch to them. */
struct mw__store_ops;

/* What the directory holds: the first member of a backend's store. */
struct mw__store {
    const struct mw__store_ops *ops;
    struct mw__list finishing;    /* in the owner's list while it finishes */
};

#define MW__STORE_VALUE_MAX 8192   /* longer values are never read */
#define MW__STORE_SCAN_MAX 100000  /* entries one scan may return */
#define MW__STORE_KEY_MAX 400      /* longer keys are not the directory's */
/* A link that went down is tried again after 0.1 s, doubling up to 2 s:
 * a store back after an outage is noticed within MW__STORE_RETRY_MAX_MS. */
#define MW__STORE_RETRY_MIN_MS 100
#define MW__STORE_RETRY_MAX_MS 2000

enum mw__store_event { MW__STORE_SET = 1, MW__STORE_GONE };

struct mw__store_hooks {
    /* The store is reachable (again): @requests for the request link,
     * else the event link (events flow from now on; what happened while
     * it was down was missed).  @err on the event link: 0, or -ENOTSUP
     * when the store will not send events (its notifications cannot be
     * enabled). */
    void (*up)(void *arg, bool requests, int err);
    /* A link went down; the store is retried every so often. */
    void (*down)(void *arg, bool requests, const char *why);
    /* The store refused us (-EACCES: a password wanted, or the one given
     * refused; @why is its reply).  The link is retried as when down. */
    void (*refused)(void *arg, int err, const char *why);
    /* A key under the prefix was set (to @val, @len bytes, at most
     * MW__STORE_VALUE_MAX), or is gone (@val NULL). */
    void (*event)(void *arg, const char *key, enum mw__store_event ev, const char *val,
                  size_t len);
    void *arg;
};

/* A reply: err 0 with what the request asks for, else a negative errno
 * (-ETIMEDOUT: no answer by the deadline; -ENOENT: get of an absent key;
 * -EPROTO: get of a key of another type or a value too long; -E2BIG: a
 * scan over MW__STORE_SCAN_MAX entries; -EIO: the store refused, @why
 * says what it said; -ECANCELED: the store closed).  Strings are valid
 * during the call only. */
typedef void (*mw__store_fn)(void *arg, int err, const char *why);
typedef void (*mw__store_get_fn)(void *arg, int err, const char *why, const char *val,
                                 size_t len);
typedef void (*mw__store_scan_fn)(void *arg, int err, const char *why, size_t n,
                                  const char *const *keys, const char *const *vals,
                                  const size_t *lens);
/* What a renewal found under the key: the caller's entry (renewed), none
 * (expired, or the store restarted empty: the caller puts it again), or
 * another publisher's (left alone: the last to publish a name holds it,
 * and the one it replaced takes it back only once that entry is gone). */
enum mw__store_held { MW__HELD_OURS, MW__HELD_NONE, MW__HELD_THEIRS };
typedef void (*mw__store_renew_fn)(void *arg, int err, const char *why,
                                   enum mw__store_held held);

/* What the directory asks of its store's links. */
struct mw__store_cfg {
    unsigned timeout_ms;          /* a request's deadline, and a connect attempt's */
    bool configure;               /* turn the store's events on if they are off */
};

struct mw__store_ops {
    void (*close)(struct mw__store *st, struct mw__list *finishing);
    void (*reap)(struct mw__store *st);
    bool (*up)(const struct mw__store *st);
    int (*put)(struct mw__store *st, const char *key, const char *val, size_t len,
               unsigned lease_ms, mw__store_fn fn, void *arg);
    int (*renew)(struct mw__store *st, const char *key, uint64_t instance, unsigned lease_ms,
                 mw__store_renew_fn fn, void *arg);
    int (*del)(struct mw__store *st, const char *key, uint64_t instance, mw__store_fn fn,
               void *arg);
    int (*get)(struct mw__store *st, const char *key, mw__store_get_fn fn, void *arg);
    int (*scan)(struct mw__store *st, const char *prefix, mw__store_scan_fn fn, void *arg);
};

/**
 * mw__store_open() - parse @url ("redis://HOST[:PORT][/DB]",
 * "unix:PATH[?db=N]" or "etcd://HOST[:PORT]") and start connecting;
 * requests may be made at once.
 * @prefix: keys the events are for (events for "PREFIX*").
 * Return: 0 or -EINVAL (with @why), -ENOMEM.
 */
int mw__store_open(mw_ctx_t *ctx, const char *url, const char *prefix,
                   const struct mw__store_cfg *cfg,
                   const struct mw__store_hooks *hooks, struct mw__store **out,
                   const char **why);
/* mw__store_close() - pending requests fail -ECANCELED (their callbacks
 * run inside this call); links close.  Deletes just asked still reach the
 * store: a backend that must wait for their answers to get them done
 * (etcd: a request whose connection closes is dropped) goes on in the
 * background, on @finishing, for at most the timeout, and leaves it when
 * done. */
void mw__store_close(struct mw__store *st, struct mw__list *finishing);
/* mw__store_reap() - end a store still on a finishing list at once (the
 * context is going); it leaves the list. */
void mw__store_reap(struct mw__store *st);
bool mw__store_up(const struct mw__store *st);

int mw__store_put(struct mw__store *st, const char *key, const char *val, size_t len,
                  unsigned lease_ms, mw__store_fn fn, void *arg);
/* renew and del touch @key only while it holds the entry of @instance
 * (the publication's): never a later publisher's. */
int mw__store_renew(struct mw__store *st, const char *key, uint64_t instance,
                    unsigned lease_ms, mw__store_renew_fn fn, void *arg);
int mw__store_del(struct mw__store *st, const char *key, uint64_t instance, mw__store_fn fn,
                  void *arg);
int mw__store_get(struct mw__store *st, const char *key, mw__store_get_fn fn, void *arg);
int mw__store_scan(struct mw__store *st, const char *prefix, mw__store_scan_fn fn, void *arg);

#endif
