/* The directory's store on Redis (redis.h: its parts): opening it starts
 * both links; closing it fails what still waits. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "dir/redis/redis.h"

static int store_init(struct mw__redis *st, const char *prefix)
{
    if (!(st->prefix = mw__malloc(strlen(prefix) + 1)))
        return -ENOMEM;
    strcpy(st->prefix, prefix);
    if (mw__redis_link_init(st, &st->req, false, mw__redis_requests_ready) ||
        mw__redis_link_init(st, &st->ev, true, mw__redis_events_ready))
        return -ENOMEM;
    return 0;
}

void mw__redis_close(struct mw__redis *st)
{
    if (!st)
        return;
    st->closing = true;
    mw__redis_link_close(&st->req);
    mw__redis_link_close(&st->ev);
    mw__redis_requests_cancel(st);
    mw__free(st->prefix);
    mw__free(st);
}

/* The store's operations (store.h), on this backend. */
#define R(s) mw__container_of(s, struct mw__redis, base)

/* Redis runs what it read before the connection closed: nothing to wait for. */
static void op_close(struct mw__store *s, struct mw__list *finishing)
{
    (void)finishing;
    mw__redis_close(R(s));
}

static void op_reap(struct mw__store *s)
{
    (void)s;                               /* never finishing */
}

static bool op_up(const struct mw__store *s)
{
    return mw__container_of(s, const struct mw__redis, base)->req.up;
}

static int op_put(struct mw__store *s, const char *key, const char *val, size_t len,
                  unsigned lease_ms, mw__store_fn fn, void *arg)
{
    return mw__redis_put(R(s), key, val, len, lease_ms, fn, arg);
}

static int op_renew(struct mw__store *s, const char *key, uint64_t instance,
                    unsigned lease_ms, mw__store_renew_fn fn, void *arg)
{
    return mw__redis_renew(R(s), key, instance, lease_ms, fn, arg);
}

static int op_del(struct mw__store *s, const char *key, uint64_t instance, mw__store_fn fn,
                  void *arg)
{
    return mw__redis_del(R(s), key, instance, fn, arg);
}

static int op_get(struct mw__store *s, const char *key, mw__store_get_fn fn, void *arg)
{
    return mw__redis_get(R(s), key, fn, arg);
}

static int op_scan(struct mw__store *s, const char *prefix, mw__store_scan_fn fn, void *arg)
{
    return mw__redis_scan(R(s), prefix, fn, arg);
}

static const struct mw__store_ops redis_ops = {
    .close = op_close, .reap = op_reap, .up = op_up, .put = op_put, .renew = op_renew, .del = op_del,
    .get = op_get, .scan = op_scan,
};

int mw__redis_open(mw_ctx_t *ctx, const char *url, const char *prefix,
                   const struct mw__store_cfg *cfg, const struct mw__store_hooks *hooks,
                   struct mw__store **out, const char **why)
{
    struct mw__redis *st = mw__calloc(1, sizeof *st);
    *why = "out of memory";
    if (!st)
        return -ENOMEM;
    *st = (struct mw__redis){.base.ops = &redis_ops, .ctx = ctx, .timeout_ms = cfg->timeout_ms,
                             .configure = cfg->configure, .hooks = *hooks};
    mw__list_init(&st->waiting);
    int rc = mw__redis_parse_url(url, &st->addr, why);
    if (!rc && (rc = store_init(st, prefix)))
        *why = "out of memory";
    if (rc) {
        st->closing = true;
        mw__redis_close(st);
        return rc;
    }
    mw__redis_link_connect(&st->req);
    mw__redis_link_connect(&st->ev);
    *out = &st->base;
    return 0;
}
