/* The directory's store on Redis (redis.h: its parts): opening it starts
 * both links; closing it fails what still waits. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "dir/redis/redis.h"

static int store_init(struct mw__store *st, const char *prefix)
{
    if (!(st->prefix = mw__malloc(strlen(prefix) + 1)))
        return -ENOMEM;
    strcpy(st->prefix, prefix);
    if (mw__redis_link_init(st, &st->req, false, mw__redis_requests_ready) ||
        mw__redis_link_init(st, &st->ev, true, mw__redis_events_ready))
        return -ENOMEM;
    return 0;
}

int mw__store_open(mw_ctx_t *ctx, const char *url, const char *prefix,
                   const struct mw__store_cfg *cfg,
                   const struct mw__store_hooks *hooks, struct mw__store **out,
                   const char **why)
{
    struct mw__store *st = mw__calloc(1, sizeof *st);
    *why = "out of memory";
    if (!st)
        return -ENOMEM;
    *st = (struct mw__store){.ctx = ctx, .timeout_ms = cfg->timeout_ms,
                             .configure = cfg->configure, .hooks = *hooks};
    mw__list_init(&st->waiting);
    int rc = mw__redis_parse_url(url, &st->addr, why);
    if (!rc && (rc = store_init(st, prefix)))
        *why = "out of memory";
    if (rc) {
        st->closing = true;
        mw__store_close(st);
        return rc;
    }
    mw__redis_link_connect(&st->req);
    mw__redis_link_connect(&st->ev);
    *out = st;
    return 0;
}

void mw__store_close(struct mw__store *st)
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

bool mw__store_up(const struct mw__store *st)
{
    return st->req.up;
}
