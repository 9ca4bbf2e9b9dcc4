/* The directory's store (store.h): the backend the URL's scheme names, and
 * its operations. */
#include <errno.h>
#include <string.h>

#include "dir/etcd/etcd.h"
#include "dir/redis/redis.h"
#include "dir/store.h"

int mw__store_open(mw_ctx_t *ctx, const char *url, const char *prefix,
                   const struct mw__store_cfg *cfg, const struct mw__store_hooks *hooks,
                   struct mw__store **out, const char **why)
{
    if (!strncmp(url, "etcd://", 7))
        return mw__etcd_open(ctx, url, prefix, cfg, hooks, out, why);
    return mw__redis_open(ctx, url, prefix, cfg, hooks, out, why);
}

void mw__store_close(struct mw__store *st, struct mw__list *finishing)
{
    if (st)
        st->ops->close(st, finishing);
}

void mw__store_reap(struct mw__store *st)
{
    st->ops->reap(st);
}

bool mw__store_up(const struct mw__store *st)
{
    return st->ops->up(st);
}

int mw__store_put(struct mw__store *st, const char *key, const char *val, size_t len,
                  unsigned lease_ms, mw__store_fn fn, void *arg)
{
    return st->ops->put(st, key, val, len, lease_ms, fn, arg);
}

int mw__store_renew(struct mw__store *st, const char *key, uint64_t instance,
                    unsigned lease_ms, mw__store_renew_fn fn, void *arg)
{
    return st->ops->renew(st, key, instance, lease_ms, fn, arg);
}

int mw__store_del(struct mw__store *st, const char *key, uint64_t instance, mw__store_fn fn,
                  void *arg)
{
    return st->ops->del(st, key, instance, fn, arg);
}

int mw__store_get(struct mw__store *st, const char *key, mw__store_get_fn fn, void *arg)
{
    return st->ops->get(st, key, fn, arg);
}

int mw__store_scan(struct mw__store *st, const char *prefix, mw__store_scan_fn fn, void *arg)
{
    return st->ops->scan(st, prefix, fn, arg);
}
