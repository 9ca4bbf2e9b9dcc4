/* Publishing: an entry put under a lease and renewed every third of it,
 * put again when the store comes back (it may have restarted empty), and
 * removed on unpublish or when the directory goes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/list.h"
#include "dir/dir.h"
#include "dir/entry.h"
#include "dir/store.h"

/* A name published here.  Store requests and the renewal hold references:
 * unpublishing drops the list's. */
struct pub {
    struct mw__dir *d;
    struct mw__list link;
    int refs;
    bool gone;
    char key[MW__DIR_KEY_MAX];
    char *val;
    size_t len;
    mw_listener_t *l;
    struct mw__dir_serve serve;
    struct event *renew_ev;
    bool renewing;
    bool displaced;                  /* another publisher holds the name */
    uint64_t instance;               /* ours, in the entry */
    mw_future_t *f;                  /* the publish future, until stored */
};

/* ------------------------------------------------------------------------
 * Publishing
 * ------------------------------------------------------------------------ */

/* Anyone who can reach the listener may connect, and each connection holds
 * its own export of every share: max_conns bounds what strangers can pin. */
#define PUB_MAX_CONNS 64

static int pub_listen(struct pub *p, const mw_dir_pub_t *pub)
{
    mw_conn_opts_t o;
    if (pub->conn)
        o = *pub->conn;
    else
        mw_conn_opts_init(&o);
    if (pub->max_conns)
        o.max_conns = pub->max_conns;
    else if (!o.max_conns)
        o.max_conns = PUB_MAX_CONNS;
    return mw_listen(p->d->ctx, pub->listen, &o, mw__dir_serve_accept, &p->serve, &p->l);
}

static void pub_unref(struct pub *p)
{
    if (--p->refs)
        return;
    mw__free(p->val);
    if (p->renew_ev)
        event_free(p->renew_ev);
    mw__dir_serve_fini(&p->serve);
    if (p->f)
        mw_future_unref(p->f);
    mw__free(p);
}

static void pub_put(struct pub *p);

/* Complete the caller's future of a publish or an unpublish, if any. */
static void pub_settle(struct pub *p, int err, const char *what, const char *why)
{
    if (!p->f)
        return;
    if (err)
        mw_future_fail(p->f, err, "%s %s: %s", what, p->key, why);
    else
        mw_future_resolve(p->f, NULL);
    mw_future_unref(p->f);
    p->f = NULL;
}

static void on_put(void *arg, int err, const char *why)
{
    struct pub *p = arg;
    pub_settle(p, err, "publishing", why);
    if (err && err != -ECANCELED && !p->gone)
        MW_LOG(p->d->ctx, MW_LOG_WARN, "directory: publishing %s: %s (retried)", p->key, why);
    pub_unref(p);
}

static void pub_put(struct pub *p)
{
    p->refs++;
    if (mw__store_put(p->d->st, p->key, p->val, p->len, p->d->opts.lease_ms, on_put, p) < 0)
        on_put(p, -ENOMEM, "out of memory");
}

static void on_renewed(void *arg, int err, const char *why, enum mw__store_held held)
{
    struct pub *p = arg;
    (void)why;
    p->renewing = false;
    if (!err && !p->gone && held == MW__HELD_THEIRS && !p->displaced)
        MW_LOG(p->d->ctx, MW_LOG_WARN, "directory: %s was published by another process since; "
               "it holds the name, and this entry returns once that one is gone", p->key);
    if (!err)
        p->displaced = held == MW__HELD_THEIRS;
    if (!err && held == MW__HELD_NONE && !p->gone)
        pub_put(p);       /* expired (the store was away a lease), the store restarted,
                             or the publisher that replaced us went */
    pub_unref(p);
}

static void on_renew_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct pub *p = arg;
    mw__ev_add_ms(p->d->ctx, p->renew_ev, p->d->opts.lease_ms / 3);
    if (p->renewing || !p->d->req_up)      /* the store's return puts it again */
        return;
    p->renewing = true;
    p->refs++;
    if (mw__store_renew(p->d->st, p->key, p->instance, p->d->opts.lease_ms, on_renewed, p) < 0)
        on_renewed(p, -ENOMEM, "out of memory", MW__HELD_OURS);
}

static struct pub *pub_find(struct mw__dir *d, const char *key)
{
    struct pub *p;
    mw__list_for_each(p, &d->pubs, link)
        if (!strcmp(p->key, key))
            return p;
    return NULL;
}

static void on_deleted(void *arg, int err, const char *why)
{
    struct pub *p = arg;
    pub_settle(p, err, "removing", why);
    pub_unref(p);
}

/* Unlink @p; with @del remove its entry too, then complete @f (if any). */
static void pub_remove(struct pub *p, bool del, mw_future_t *f)
{
    p->gone = true;
    mw__list_del(&p->link);
    event_del(p->renew_ev);
    if (p->l)
        mw_listener_free(p->l);
    p->l = NULL;
    mw__dir_serve_stop(&p->serve);  /* connections not handed over yet */
    /* still publishing: that ends here */
    pub_settle(p, -ECANCELED, "publishing", "unpublished before it was stored");
    if (del) {
        p->f = f ? mw_future_ref(f) : NULL;
        p->refs++;
        if (mw__store_del(p->d->st, p->key, p->instance, on_deleted, p) < 0)
            on_deleted(p, -ENOMEM, "out of memory");
    }
    pub_unref(p);
}

/* The entry's text, with the listener's addresses when it listens. */
static int pub_encode(struct pub *p, const mw_dir_pub_t *pub, const char **why)
{
    mw_dir_region_info_t info[MW__DIR_REGIONS_MAX];
    for (size_t i = 0; i < pub->nshares; i++)
        info[i] = (mw_dir_region_info_t){pub->shares[i].name, pub->shares[i].len};
    int err = 0;
    char *addrs = p->l ? mw__dir_listen_addrs(p->d->ctx, pub->listen, mw_listener_port(p->l), &err)
                       : NULL;
    if (p->l && !addrs)
        return *why = "no address to publish the listener by", err;
    mw_dir_entry_t e = {.addrs = addrs ? addrs : pub->addrs, .tag = pub->tag,
                        .instance = p->instance = mw__dir_random64(), .serves = p->l != NULL,
                        .nregions = pub->nshares, .regions = info};
    char buf[MW__DIR_VALUE_MAX + 1];
    int len = mw__dir_entry_encode(&e, buf, sizeof buf);
    mw__free(addrs);
    if (len < 0)
        return *why = "addrs or tag malformed or too long", -EINVAL;
    if (!(p->val = mw__malloc(len)))
        return *why = "out of memory", -ENOMEM;
    memcpy(p->val, buf, len);
    p->len = (size_t)len;
    return 0;
}

static int pub_check(const mw_dir_pub_t *pub, const char **why)
{
    *why = "pub is NULL";
    if (!pub)
        return -EINVAL;
    *why = "set either listen or addrs";
    if (!pub->listen == !pub->addrs)
        return -EINVAL;
    *why = "shares and on_accept need a listener";
    if (!pub->listen && (pub->nshares || pub->on_accept))
        return -EINVAL;
    *why = "a listener needs on_accept";
    if (pub->listen && !pub->on_accept)
        return -EINVAL;
    *why = "more than 64 shares, or shares NULL";
    if (pub->nshares > MW__DIR_REGIONS_MAX || (pub->nshares && !pub->shares))
        return -EINVAL;
    for (size_t i = 0; i < pub->nshares; i++) {
        *why = "a share's name is not 1-63 of [A-Za-z0-9._-], or its memory is NULL or empty";
        if (!mw__dir_region_name_ok(pub->shares[i].name) || !pub->shares[i].addr ||
            !pub->shares[i].len)
            return -EINVAL;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(pub->shares[i].name, pub->shares[j].name))
                return *why = "two shares of one name", -EINVAL;
    }
    return 0;
}

mw_future_t *mw_dir_publish(mw_directory_t *h, const char *name, const mw_dir_pub_t *pub)
{
    struct mw__dir *d;
    mw_future_t *f = mw__dir_future(h, __func__, &d);
    if (!f)
        return NULL;
    char key[MW__DIR_KEY_MAX];
    if (!mw__dir_name_ok(name, false) || mw__dir_key(d, name, key)) {
        mw_future_fail(f, -EINVAL, "mw_dir_publish: bad name \"%s\" (1-200 of [A-Za-z0-9._-] "
                                   "in segments separated by '/')", name ? name : "(null)");
        return f;
    }
    const char *why;
    int err = pub_check(pub, &why);
    struct pub *p = err ? NULL : mw__calloc(1, sizeof *p);
    if (!p) {
        mw_future_fail(f, err ? err : -ENOMEM, "mw_dir_publish %s: %s", name,
                       err ? why : "out of memory");
        return f;
    }
    strcpy(p->key, key);
    p->d = d;
    p->refs = 1;
    mw__list_init(&p->link);
    if (!(p->renew_ev = evtimer_new(d->ctx->base, on_renew_timer, p)))
        err = -ENOMEM, why = "out of memory";
    else if (pub->listen && (err = mw__dir_serve_init(&p->serve, d->ctx, pub)) < 0)
        why = "out of memory";
    else if (pub->listen && (err = pub_listen(p, pub)) < 0)
        why = "cannot listen";
    else
        err = pub_encode(p, pub, &why);
    if (err < 0) {
        if (p->l)
            mw_listener_free(p->l);
        p->l = NULL;
        pub_unref(p);
        mw_future_fail(f, err, "mw_dir_publish %s: %s", name, why);
        return f;
    }
    struct pub *old = pub_find(d, p->key);
    if (old)
        pub_remove(old, false, NULL);                /* replaced by the put below */
    mw__list_add_tail(&d->pubs, &p->link);
    p->f = mw_future_ref(f);
    pub_put(p);
    on_renew_timer(-1, 0, p);                  /* arms the renewal (nothing to renew yet) */
    return f;
}

mw_future_t *mw_dir_unpublish(mw_directory_t *h, const char *name)
{
    struct mw__dir *d;
    mw_future_t *f = mw__dir_future(h, __func__, &d);
    if (!f)
        return NULL;
    char key[MW__DIR_KEY_MAX];
    struct pub *p = NULL;
    if (!mw__dir_name_ok(name, false) || mw__dir_key(d, name, key))
        mw_future_fail(f, -EINVAL, "mw_dir_unpublish: bad name");
    else if (!(p = pub_find(d, key)))
        mw_future_fail(f, -ENOENT, "mw_dir_unpublish: %s is not published here", name);
    else
        pub_remove(p, true, f);
    return f;
}

void mw__dir_pubs_put_all(struct mw__dir *d)
{
    struct pub *p;
    mw__list_for_each(p, &d->pubs, link)
        pub_put(p);
}

void mw__dir_pubs_remove_all(struct mw__dir *d)
{
    while (!mw__list_empty(&d->pubs))
        pub_remove(mw__list_first(&d->pubs, struct pub, link), true, NULL);
}
