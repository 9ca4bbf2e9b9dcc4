/* The directory's store on etcd (etcd.h: its parts): "etcd://HOST[:PORT]"
 * (HOST may be "[IPv6]"; port 2379 by default); opening it starts both
 * links. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "dir/etcd/etcd.h"

#define ETCD_PORT 2379

static int parse_url(struct mw__etcd *st, const char *url, const char **why)
{
    const char *h = url + strlen("etcd://"), *end = h + strcspn(h, "/?#");
    *why = "a bad etcd URL: etcd://HOST[:PORT]";
    if (*end || strchr(h, '@')) {
        if (strchr(h, '@'))
            *why = "etcd://: a user and password are not supported (etcd's auth); "
                   "give etcd://HOST[:PORT]";
        return -EINVAL;
    }
    const char *colon = NULL, *hs = h, *he;
    if (*h == '[') {
        he = strchr(h, ']');
        if (!he || (he[1] && he[1] != ':'))
            return -EINVAL;
        hs = h + 1;
        colon = he[1] == ':' ? he + 1 : NULL;
    } else {
        colon = strchr(h, ':');
        he = colon ? colon : end;
    }
    size_t n = (size_t)(he - hs);
    if (!n || n >= sizeof st->host)
        return -EINVAL;
    memcpy(st->host, hs, n);
    st->host[n] = 0;
    st->port = ETCD_PORT;
    if (colon) {
        char *pe;
        long p = strtol(colon + 1, &pe, 10);
        if (pe == colon + 1 || *pe || p < 1 || p > 65535)
            return -EINVAL;
        st->port = (int)p;
    }
    snprintf(st->hostport, sizeof st->hostport, strchr(st->host, ':') ? "[%s]:%d" : "%s:%d",
             st->host, st->port);
    return 0;
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    mw__etcd_reap_now(arg);
}

/* The request link's first request: the store's status (it is up once
 * answered, http.c). */
static void probe(struct mw__etcd_link *l)
{
    mw__etcd_send(l, "/v3/maintenance/status", "{}");
}

int mw__etcd_open(mw_ctx_t *ctx, const char *url, const char *prefix,
                  const struct mw__store_cfg *cfg, const struct mw__store_hooks *hooks,
                  struct mw__store **out, const char **why)
{
    struct mw__etcd *st = mw__calloc(1, sizeof *st);
    *why = "out of memory";
    if (!st)
        return -ENOMEM;
    *st = (struct mw__etcd){.base.ops = &mw__etcd_ops, .ctx = ctx,
                            .timeout_ms = cfg->timeout_ms, .hooks = *hooks};
    mw__list_init(&st->waiting);
    mw__list_init(&st->leases);
    mw__list_init(&st->base.finishing);
    st->reap_ev = evtimer_new(ctx->base, on_reap, st);
    int rc = parse_url(st, url, why);
    if (!rc && (!st->reap_ev || !(st->prefix = mw__malloc(strlen(prefix) + 1)) ||
                mw__etcd_link_init(st, &st->req, false, probe) ||
                mw__etcd_link_init(st, &st->ev, true, mw__etcd_events_ready))) {
        rc = -ENOMEM;
        *why = "out of memory";
    }
    if (rc) {
        mw__etcd_reap_now(st);
        return rc;
    }
    strcpy(st->prefix, prefix);
    mw__etcd_link_connect(&st->req);
    mw__etcd_link_connect(&st->ev);
    *out = &st->base;
    return 0;
}
