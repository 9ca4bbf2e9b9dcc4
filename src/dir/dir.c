/* The directory: entries published under a renewed lease, lookups and
 * lists, and watches fed by the store's events, all on the context's
 * loop.  The store (store.h) is Redis; nothing here knows it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/handle.h"
#include "core/list.h"
#include "dir/dir.h"
#include "dir/entry.h"
#include "dir/store.h"

#define KEY_MAX (MW__DIR_NAME_MAX + 128)

struct dirs {
    struct mw__list all;
};

struct mw__dir {
    mw_ctx_t *ctx;
    uint64_t h;
    struct mw__list link;            /* in the layer's list */
    mw_dir_opts_t opts;
    char prefix[96];                 /* "PREFIX:" */
    char *url;
    struct mw__store *st;
    mw_future_t *open;               /* until both links answered once */
    struct event *open_timer;
    bool req_up, ev_up, ever_up;
    int notify_err;                  /* -ENOTSUP: the store sends no events */
    struct mw__list pubs, watches;
    int next_watch;
    bool freed;
};

/* A name published here.  Store requests and the renewal hold references:
 * unpublishing drops the list's. */
struct pub {
    struct mw__dir *d;
    struct mw__list link;
    int refs;
    bool gone;
    char key[KEY_MAX];
    char *val;
    size_t len;
    mw_listener_t *l;
    struct mw__dir_serve serve;
    struct event *renew_ev;
    bool renewing;
    mw_future_t *f;                  /* the publish future, until stored */
};

struct known {
    struct mw__list link;
    struct mw__dir_entry *e;
    uint64_t seen;                   /* the sync it was last seen in */
};

/* A change a watch reports, queued: the caller's function runs from the
 * loop, never inside the store client's callbacks (where freeing the
 * directory would pull the client from under itself). */
struct wevent {
    struct wevent *next;
    int kind;
    struct mw__dir_entry *e;         /* a reference, or NULL */
};

struct watch {
    struct mw__dir *d;
    uint64_t dh;                     /* d's handle, for the caller's function */
    struct mw__list link;
    int id, refs;
    bool gone;
    struct wevent *qhead, **qtail;
    struct mw__task drain;
    char key[KEY_MAX];               /* key prefix */
    mw_dir_watch_fn fn;
    void *arg;
    struct mw__list known;
    uint64_t gen;                    /* syncs begun */
    struct event *sweep_ev;          /* after a resync: who did not come back */
};

/* One lookup, list or open in flight: the future and what it is for. */
struct op {
    struct mw__dir *d;
    mw_future_t *f;
    char name[MW__DIR_NAME_MAX + 1];
};

/* ------------------------------------------------------------------------
 * Handles, the layer
 * ------------------------------------------------------------------------ */

static struct mw__dir *dir_of(mw_directory_t *h, const char *fn, int *err)
{
    return mw__handle_get(MW__HANDLE(h), MW__H_DIR, fn, err);
}

/* A new future on @h's context, or NULL: out of memory, or errno set for
 * a handle that is not a live directory (as connections do). */
static mw_future_t *dir_future(mw_directory_t *h, const char *fn, struct mw__dir **dp)
{
    int err;
    struct mw__dir *d = dir_of(h, fn, &err);
    if (!d) {
        errno = -err;
        return NULL;
    }
    *dp = d;
    return mw_future_new(d->ctx);
}

mw_ctx_t *mw__dir_ctx(mw_directory_t *h)
{
    int err;
    struct mw__dir *d = dir_of(h, __func__, &err);
    return d ? d->ctx : NULL;
}

unsigned mw__dir_lease_ms(mw_directory_t *h)
{
    int err;
    struct mw__dir *d = dir_of(h, __func__, &err);
    return d ? d->opts.lease_ms : 0;
}

static void dir_release(struct mw__dir *d);

static void dirs_teardown(mw_ctx_t *ctx, void *state)
{
    struct dirs *ds = state;
    while (!mw__list_empty(&ds->all))
        dir_release(mw__list_first(&ds->all, struct mw__dir, link));
    mw__free(ds);
    ctx->layers[MW__LAYER_DIR] = (struct mw__layer){0};
}

static struct dirs *dirs_get(mw_ctx_t *ctx)
{
    struct dirs *ds = ctx->layers[MW__LAYER_DIR].state;
    if (!ds && (ds = mw__calloc(1, sizeof *ds))) {
        mw__list_init(&ds->all);
        ctx->layers[MW__LAYER_DIR] = (struct mw__layer){ds, dirs_teardown, NULL, NULL};
    }
    return ds;
}

static int key_of(const struct mw__dir *d, const char *name, char *buf)
{
    return snprintf(buf, KEY_MAX, "%s%s", d->prefix, name) >= KEY_MAX ? -EINVAL : 0;
}

/* ------------------------------------------------------------------------
 * Publishing
 * ------------------------------------------------------------------------ */

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

static void on_put(void *arg, int err, const char *why)
{
    struct pub *p = arg;
    if (p->f && err)
        mw_future_fail(p->f, err, "publishing %s: %s", p->key, why);
    else if (p->f)
        mw_future_resolve(p->f, NULL);
    if (p->f) {
        mw_future_unref(p->f);
        p->f = NULL;
    }
    if (err && err != -ECANCELED && !p->gone)
        mw__log(p->d->ctx, MW_LOG_WARN, "directory: publishing %s: %s (retried)", p->key, why);
    pub_unref(p);
}

static void pub_put(struct pub *p)
{
    p->refs++;
    if (mw__store_put(p->d->st, p->key, p->val, p->len, p->d->opts.lease_ms, on_put, p) < 0)
        on_put(p, -ENOMEM, "out of memory");
}

static void on_renewed(void *arg, int err, const char *why, bool exists)
{
    struct pub *p = arg;
    (void)why;
    p->renewing = false;
    if (!err && !exists && !p->gone)
        pub_put(p);       /* expired (the store was away a lease) or the store restarted */
    pub_unref(p);
}

static void on_renew_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct pub *p = arg;
    unsigned ms = p->d->opts.lease_ms / 3;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    mw__ev_add(p->d->ctx, p->renew_ev, &tv);
    if (p->renewing || !p->d->req_up)      /* the store's return puts it again */
        return;
    p->renewing = true;
    p->refs++;
    if (mw__store_renew(p->d->st, p->key, p->d->opts.lease_ms, on_renewed, p) < 0)
        on_renewed(p, -ENOMEM, "out of memory", true);
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
    if (p->f && err)
        mw_future_fail(p->f, err, "removing %s: %s", p->key, why);
    else if (p->f)
        mw_future_resolve(p->f, NULL);
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
    if (p->f) {                           /* still publishing: that ends here */
        mw_future_fail(p->f, -ECANCELED, "%s was unpublished before it was stored", p->key);
        mw_future_unref(p->f);
        p->f = NULL;
    }
    if (del) {
        p->f = f ? mw_future_ref(f) : NULL;
        p->refs++;
        if (mw__store_del(p->d->st, p->key, on_deleted, p) < 0)
            on_deleted(p, -ENOMEM, "out of memory");
    }
    pub_unref(p);
}

static uint64_t random64(void)
{
    uint64_t v = 0;
    while (!v && getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        ;
    return v;
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
                        .instance = random64(), .serves = p->l != NULL,
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
    mw_future_t *f = dir_future(h, __func__, &d);
    if (!f)
        return NULL;
    char key[KEY_MAX];
    if (!mw__dir_name_ok(name, false) || key_of(d, name, key)) {
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
    else if (pub->listen &&
             (err = mw_listen(d->ctx, pub->listen, pub->conn, mw__dir_serve_accept, &p->serve,
                              &p->l)) < 0)
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
    mw_future_t *f = dir_future(h, __func__, &d);
    if (!f)
        return NULL;
    char key[KEY_MAX];
    struct pub *p = NULL;
    if (!mw__dir_name_ok(name, false) || key_of(d, name, key))
        mw_future_fail(f, -EINVAL, "mw_dir_unpublish: bad name");
    else if (!(p = pub_find(d, key)))
        mw_future_fail(f, -ENOENT, "mw_dir_unpublish: %s is not published here", name);
    else
        pub_remove(p, true, f);
    return f;
}

/* ------------------------------------------------------------------------
 * Lookups and lists
 * ------------------------------------------------------------------------ */

void mw_dir_list_free(mw_dir_list_t *l)
{
    if (!l)
        return;
    /* the entries are copies; their decoded blocks follow them (list_of) */
    struct mw__dir_entry **blocks = (struct mw__dir_entry **)(l->e + l->n);
    for (size_t i = 0; i < l->n; i++)
        mw__free(blocks[i]);
    mw__free(l);
}

/* A list owning @n decoded entries (taken), sorted by name. */
static int by_name(const void *a, const void *b)
{
    return strcmp((*(struct mw__dir_entry *const *)a)->pub.name,
                  (*(struct mw__dir_entry *const *)b)->pub.name);
}

static mw_dir_list_t *list_of(struct mw__dir_entry **es, size_t n)
{
    if (n)
        qsort(es, n, sizeof *es, by_name);
    mw_dir_list_t *l = mw__calloc(1, sizeof *l + n * (sizeof *l->e + sizeof *es));
    if (!l)
        return NULL;
    l->n = n;
    l->e = (mw_dir_entry_t *)(l + 1);
    struct mw__dir_entry **blocks = (struct mw__dir_entry **)(l->e + n);
    for (size_t i = 0; i < n; i++) {
        l->e[i] = es[i]->pub;
        blocks[i] = es[i];
    }
    return l;
}

static void op_end(struct op *o, mw_dir_list_t *l, int err, const char *fmt, const char *why)
{
    if (err)
        mw_future_fail(o->f, err, fmt, o->name, why);
    else if (mw_future_resolve(o->f, l) < 0)
        mw_dir_list_free(l);                    /* cancelled meanwhile */
    mw_future_unref(o->f);
    mw__free(o);
}

static void on_lookup(void *arg, int err, const char *why, const char *val, size_t len)
{
    struct op *o = arg;
    struct mw__dir_entry *e = NULL;
    mw_dir_list_t *l = NULL;
    if (!err)
        err = mw__dir_entry_decode(o->name, val, len, &e, &why);
    if (!err && !(l = list_of(&e, 1))) {
        mw__free(e);
        err = -ENOMEM, why = "out of memory";
    }
    op_end(o, l, err, "directory lookup of %s: %s", why);
}

static struct op *op_new(mw_directory_t *h, const char *fn, const char *name, bool prefix,
                         mw_future_t **out)
{
    struct mw__dir *d;
    mw_future_t *f = *out = dir_future(h, fn, &d);
    if (!f)
        return NULL;
    char key[KEY_MAX];
    if (!mw__dir_name_ok(name, prefix) || key_of(d, name, key)) {
        mw_future_fail(f, -EINVAL, "%s: bad name \"%s\"", fn, name ? name : "(null)");
        return NULL;
    }
    struct op *o = mw__calloc(1, sizeof *o);
    if (!o) {
        mw_future_fail(f, -ENOMEM, "%s: out of memory", fn);
        return NULL;
    }
    o->d = d;
    o->f = mw_future_ref(f);
    snprintf(o->name, sizeof o->name, "%s", name);
    return o;
}

mw_future_t *mw_dir_lookup(mw_directory_t *h, const char *name)
{
    mw_future_t *f;
    struct op *o = op_new(h, __func__, name, false, &f);
    char key[KEY_MAX];
    if (o && (key_of(o->d, name, key) || mw__store_get(o->d->st, key, on_lookup, o) < 0))
        on_lookup(o, -ENOMEM, "out of memory", NULL, 0);
    return f;
}

/* Decode what a scan found, skipping (and logging) malformed entries. */
static size_t decode_all(struct mw__dir *d, size_t n, const char *const *keys,
                         const char *const *vals, const size_t *lens, struct mw__dir_entry **es)
{
    size_t m = 0, pl = strlen(d->prefix);
    for (size_t i = 0; i < n; i++) {
        const char *why;
        const char *name = keys[i] + pl;
        if (strncmp(keys[i], d->prefix, pl) || !mw__dir_name_ok(name, false)) {
            mw__log(d->ctx, MW_LOG_WARN, "directory: skipping key %s: not a name", keys[i]);
            continue;
        }
        int rc = mw__dir_entry_decode(name, vals[i], lens[i], &es[m], &why);
        if (rc == -EPROTO)
            mw__log(d->ctx, MW_LOG_WARN, "directory: skipping %s: %s", name, why);
        m += rc == 0;
    }
    return m;
}

static void on_list(void *arg, int err, const char *why, size_t n, const char *const *keys,
                    const char *const *vals, const size_t *lens)
{
    struct op *o = arg;
    mw_dir_list_t *l = NULL;
    struct mw__dir_entry **es = NULL;
    if (!err && n && !(es = mw__calloc(n, sizeof *es)))
        err = -ENOMEM, why = "out of memory";
    if (!err) {
        size_t m = decode_all(o->d, n, keys, vals, lens, es);
        if (!(l = list_of(es, m))) {
            for (size_t i = 0; i < m; i++)
                mw__free(es[i]);
            err = -ENOMEM, why = "out of memory";
        }
    }
    mw__free(es);
    op_end(o, l, err, "directory list of \"%s\": %s", why);
}

mw_future_t *mw_dir_list(mw_directory_t *h, const char *prefix)
{
    mw_future_t *f;
    struct op *o = op_new(h, __func__, prefix, true, &f);
    char key[KEY_MAX];
    if (o && (key_of(o->d, prefix, key) || mw__store_scan(o->d->st, key, on_list, o) < 0))
        on_list(o, -ENOMEM, "out of memory", 0, NULL, NULL, NULL);
    return f;
}

/* ------------------------------------------------------------------------
 * Watches
 * ------------------------------------------------------------------------ */

static void entry_unref(struct mw__dir_entry *e)
{
    if (e && !--e->refs)
        mw__free(e);
}

static struct wevent *wevent_pop(struct watch *w)
{
    struct wevent *ev = w->qhead;
    if (ev && !(w->qhead = ev->next))
        w->qtail = &w->qhead;
    return ev;
}

static void watch_unref(struct watch *w)
{
    if (--w->refs)
        return;
    for (struct wevent *ev; (ev = wevent_pop(w));) {
        entry_unref(ev->e);
        mw__free(ev);
    }
    while (!mw__list_empty(&w->known)) {
        struct known *k = mw__list_first(&w->known, struct known, link);
        mw__list_del(&k->link);
        entry_unref(k->e);
        mw__free(k);
    }
    if (w->sweep_ev)
        event_free(w->sweep_ev);
    mw__free(w);
}

static struct known *known_find(struct watch *w, const char *name)
{
    struct known *k;
    mw__list_for_each(k, &w->known, link)
        if (!strcmp(k->e->pub.name, name))
            return k;
    return NULL;
}

/* Run the caller's function for what is queued; it may unwatch or free
 * the directory (then the rest is dropped). */
static void on_drain(struct mw__task *t)
{
    struct watch *w = mw__container_of(t, struct watch, drain);
    w->refs++;
    for (struct wevent *ev; !w->gone && (ev = wevent_pop(w));) {
        w->fn(MW__HANDLE_PTR(mw_directory_t, w->dh), ev->kind, ev->e ? &ev->e->pub : NULL,
              w->arg);
        entry_unref(ev->e);
        mw__free(ev);
    }
    watch_unref(w);
}

static void tell(struct watch *w, int event, struct mw__dir_entry *e)
{
    struct wevent *ev = w->gone ? NULL : mw__calloc(1, sizeof *ev);
    if (!ev)
        return;
    *ev = (struct wevent){.kind = event, .e = e};
    if (e)
        e->refs++;
    *w->qtail = ev;
    w->qtail = &ev->next;
    mw__defer(w->d->ctx, &w->drain);
}

static void known_drop(struct watch *w, struct known *k)
{
    mw__list_del(&k->link);
    tell(w, MW_DIR_LEFT, k->e);
    entry_unref(k->e);
    mw__free(k);
}

/* @e (taken) is present now: report it when new or changed. */
static void known_set(struct watch *w, struct mw__dir_entry *e)
{
    struct known *k = known_find(w, e->pub.name);
    bool same = k && k->e->pub.instance == e->pub.instance;
    if (!k && !(k = mw__calloc(1, sizeof *k))) {
        entry_unref(e);
        return;
    }
    if (!k->e)
        mw__list_add_tail(&w->known, &k->link);
    k->seen = w->gen;
    if (same) {
        entry_unref(e);
        return;
    }
    entry_unref(k->e);
    k->e = e;
    tell(w, MW_DIR_JOINED, e);
}

struct watch_get {
    struct watch *w;
    char name[MW__DIR_NAME_MAX + 1];
};

static void on_watch_get(void *arg, int err, const char *why, const char *val, size_t len)
{
    struct watch_get *g = arg;
    struct watch *w = g->w;
    struct mw__dir_entry *e;
    if (!err && !w->gone) {
        int rc = mw__dir_entry_decode(g->name, val, len, &e, &why);
        if (!rc)
            known_set(w, e);
        else if (rc == -EPROTO)
            mw__log(w->d->ctx, MW_LOG_WARN, "directory: skipping %s: %s", g->name, why);
    } else if (err == -ENOENT && !w->gone) {
        struct known *k = known_find(w, g->name);
        if (k)
            known_drop(w, k);
    }
    watch_unref(w);
    mw__free(g);
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct watch *w = arg;
    struct known *k;
    mw__list_for_each(k, &w->known, link) {
        if (k->seen < w->gen)
            known_drop(w, k);
    }
}

static void on_watch_scan(void *arg, int err, const char *why, size_t n, const char *const *keys,
                          const char *const *vals, const size_t *lens)
{
    struct watch *w = arg;
    struct mw__dir_entry **es = n ? mw__calloc(n, sizeof *es) : NULL;
    if (err || w->gone || (n && !es)) {
        if (err && err != -ECANCELED && !w->gone)
            mw__log(w->d->ctx, MW_LOG_WARN, "directory: watch of %s: %s", w->key,
                    es || !n ? why : "out of memory");
        mw__free(es);
        watch_unref(w);
        return;
    }
    size_t m = decode_all(w->d, n, keys, vals, lens, es);
    for (size_t i = 0; i < m; i++)
        known_set(w, es[i]);
    mw__free(es);
    tell(w, MW_DIR_SYNCED, NULL);
    /* entries known from before the store went away and not found now are
     * gone once they had a lease to come back in */
    unsigned ms = w->d->opts.lease_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    mw__ev_add(w->d->ctx, w->sweep_ev, &tv);
    watch_unref(w);
}

static void watch_sync(struct watch *w)
{
    w->gen++;
    w->refs++;
    if (mw__store_scan(w->d->st, w->key, on_watch_scan, w) < 0)
        on_watch_scan(w, -ENOMEM, "out of memory", 0, NULL, NULL, NULL);
}

int mw_dir_watch(mw_directory_t *h, const char *prefix, mw_dir_watch_fn fn, void *arg)
{
    int err;
    struct mw__dir *d = dir_of(h, __func__, &err);
    if (!d)
        return err;
    if (!fn || !mw__dir_name_ok(prefix, true))
        return -EINVAL;
    if (d->notify_err)
        return d->notify_err;
    struct watch *w = mw__calloc(1, sizeof *w);
    if (!w || !(w->sweep_ev = evtimer_new(d->ctx->base, on_sweep, w))) {
        mw__free(w);
        return -ENOMEM;
    }
    if (key_of(d, prefix, w->key)) {
        watch_unref(w);
        return -EINVAL;
    }
    w->d = d;
    w->dh = d->h;
    w->qtail = &w->qhead;
    w->drain.fn = on_drain;
    w->refs = 1;
    w->fn = fn;
    w->arg = arg;
    w->id = ++d->next_watch;
    mw__list_init(&w->known);
    mw__list_add_tail(&d->watches, &w->link);
    if (d->ev_up)
        watch_sync(w);                     /* else once the events flow */
    return w->id;
}

static void watch_remove(struct watch *w)
{
    w->gone = true;
    mw__list_del(&w->link);
    event_del(w->sweep_ev);
    mw__defer_cancel(w->d->ctx, &w->drain);
    watch_unref(w);
}

int mw_dir_unwatch(mw_directory_t *h, int id)
{
    int err;
    struct mw__dir *d = dir_of(h, __func__, &err);
    if (!d)
        return err;
    struct watch *w;
    mw__list_for_each(w, &d->watches, link)
        if (w->id == id) {
            watch_remove(w);
            return 0;
        }
    return -ENOENT;
}

/* ------------------------------------------------------------------------
 * The store's hooks
 * ------------------------------------------------------------------------ */

static void open_done(struct mw__dir *d)
{
    if (!d->open || !d->req_up || !(d->ev_up || d->notify_err))
        return;
    event_del(d->open_timer);
    mw_future_t *f = d->open;
    d->open = NULL;
    if (mw_future_resolve(f, MW__HANDLE_PTR(mw_directory_t, d->h)) < 0)
        dir_release(d);                     /* cancelled: nobody holds it */
    mw_future_unref(f);
}

static void on_store_up(void *arg, bool requests, int err)
{
    struct mw__dir *d = arg;
    if (requests) {
        d->req_up = true;
        if (d->ever_up) {                   /* back: the store may have restarted empty */
            struct pub *p;
            mw__list_for_each(p, &d->pubs, link)
                pub_put(p);
        }
        d->ever_up = true;
    } else {
        d->ev_up = !err;
        d->notify_err = err;
        struct watch *w;
        mw__list_for_each(w, &d->watches, link) {
            if (err)
                tell(w, MW_DIR_LOST, NULL);
            else
                watch_sync(w);
        }
    }
    open_done(d);
}

static void on_store_down(void *arg, bool requests, const char *why)
{
    struct mw__dir *d = arg;
    mw__log(d->ctx, requests ? MW_LOG_WARN : MW_LOG_DEBUG,
            "directory: lost the store at %s (%s); retrying", d->url, why ? why : "?");
    if (requests) {
        d->req_up = false;
        return;
    }
    d->ev_up = false;
    struct watch *w;
    mw__list_for_each(w, &d->watches, link)
        tell(w, MW_DIR_LOST, NULL);
}

static void on_store_event(void *arg, const char *key, enum mw__store_event ev)
{
    struct mw__dir *d = arg;
    const char *name = key + strlen(d->prefix);
    if (strncmp(key, d->prefix, strlen(d->prefix)) || !mw__dir_name_ok(name, false))
        return;
    struct watch *w;
    mw__list_for_each(w, &d->watches, link) {
        if (strncmp(key, w->key, strlen(w->key)))
            continue;
        if (ev == MW__STORE_GONE) {
            struct known *k = known_find(w, name);
            if (k)
                known_drop(w, k);
            continue;
        }
        struct watch_get *g = mw__calloc(1, sizeof *g);
        if (!g)
            continue;
        g->w = w;
        snprintf(g->name, sizeof g->name, "%s", name);
        w->refs++;
        if (mw__store_get(d->st, key, on_watch_get, g) < 0)
            on_watch_get(g, -ENOMEM, "out of memory", NULL, 0);
    }
}

/* ------------------------------------------------------------------------
 * Open and free
 * ------------------------------------------------------------------------ */

void mw_dir_opts_init(mw_dir_opts_t *o)
{
    if (o)
        *o = (mw_dir_opts_t){.prefix = "mw", .lease_ms = 10000, .timeout_ms = 5000};
}

static void dir_release(struct mw__dir *d)
{
    d->freed = true;
    mw__list_del(&d->link);
    mw__handle_release(d->h);
    while (!mw__list_empty(&d->watches))
        watch_remove(mw__list_first(&d->watches, struct watch, link));
    while (!mw__list_empty(&d->pubs))
        pub_remove(mw__list_first(&d->pubs, struct pub, link), true, NULL);
    mw__store_close(d->st);            /* what is still pending fails now */
    if (d->open) {
        mw_future_fail(d->open, -ECANCELED, "the directory closed");
        mw_future_unref(d->open);
    }
    if (d->open_timer)
        event_free(d->open_timer);
    mw__free(d->url);
    mw__free(d);
}

static void on_open_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__dir *d = arg;
    mw_future_t *f = d->open;
    d->open = NULL;
    mw_future_fail(f, -ETIMEDOUT, "directory: the store at %s was not reached within %u ms",
                   d->url, d->opts.timeout_ms);
    mw_future_unref(f);
    dir_release(d);
}

static int opts_check(const mw_dir_opts_t *o, const char **why)
{
    if (!o->prefix || !*o->prefix || strlen(o->prefix) > 80 || strpbrk(o->prefix, "*?[]\\ "))
        return *why = "prefix: 1-80 characters, no glob characters or spaces", -EINVAL;
    if (o->lease_ms < 300 || o->lease_ms > 86400000)
        return *why = "lease_ms: 300..86400000", -EINVAL;
    if (!o->timeout_ms)
        return *why = "timeout_ms: at least 1", -EINVAL;
    return 0;
}

mw_future_t *mw_dir_open(mw_ctx_t *ctx, const char *url, const mw_dir_opts_t *opts)
{
    mw_future_t *f = ctx ? mw_future_new(ctx) : NULL;
    if (!f)
        return NULL;
    mw_dir_opts_t o;
    if (opts)
        o = *opts;
    else
        mw_dir_opts_init(&o);
    const char *why;
    if (!url && !(url = getenv("MW_DIRECTORY"))) {
        mw_future_fail(f, -EINVAL, "mw_dir_open: no URL given and MW_DIRECTORY not set");
        return f;
    }
    if (opts_check(&o, &why) < 0) {
        mw_future_fail(f, -EINVAL, "mw_dir_open: %s", why);
        return f;
    }
    struct dirs *ds = dirs_get(ctx);
    struct mw__dir *d = ds ? mw__calloc(1, sizeof *d) : NULL;
    if (!d || !(d->url = mw__malloc(strlen(url) + 1)) ||
        !(d->open_timer = evtimer_new(ctx->base, on_open_timeout, d)) ||
        !(d->h = mw__handle_new(MW__H_DIR, d, mw__loop_thread(ctx)))) {
        if (d && d->open_timer)
            event_free(d->open_timer);
        if (d)
            mw__free(d->url);
        mw__free(d);
        mw_future_fail(f, -ENOMEM, "mw_dir_open: out of memory");
        return f;
    }
    d->ctx = ctx;
    d->opts = o;
    strcpy(d->url, url);
    snprintf(d->prefix, sizeof d->prefix, "%s:", o.prefix);
    mw__list_init(&d->pubs);
    mw__list_init(&d->watches);
    mw__list_add_tail(&ds->all, &d->link);
    struct mw__store_hooks hooks = {on_store_up, on_store_down, on_store_event, d};
    int rc = mw__store_open(ctx, url, d->prefix, o.timeout_ms, &hooks, &d->st, &why);
    if (rc < 0) {
        d->st = NULL;
        dir_release(d);
        mw_future_fail(f, rc, "mw_dir_open %s: %s", url, why);
        return f;
    }
    d->open = mw_future_ref(f);
    struct timeval tv = {o.timeout_ms / 1000, (o.timeout_ms % 1000) * 1000};
    mw__ev_add(ctx, d->open_timer, &tv);
    return f;
}

int mw_dir_free(mw_directory_t *h)
{
    if (!h)
        return 0;
    int err;
    struct mw__dir *d = dir_of(h, __func__, &err);
    if (!d)
        return err;
    dir_release(d);
    return 0;
}
