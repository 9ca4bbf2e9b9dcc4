/* The directory: its handle and place in the context, opening and
 * freeing, the store's hooks, lookups and lists.  Publishing is
 * publish.c's, watches watch.c's; the store (store.h) is Redis, and
 * nothing here knows it. */
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

struct dirs {
    struct mw__list all;
    struct mw__list finishing;    /* stores closed, their last deletes going out */
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

struct mw__dir *mw__dir_of(mw_directory_t *h, const char *fn, int *err)
{
    return mw__handle_get(MW__HANDLE(h), MW__H_DIR, fn, err);
}

mw_future_t *mw__dir_future(mw_directory_t *h, const char *fn, struct mw__dir **dp)
{
    int err;
    struct mw__dir *d = mw__dir_of(h, fn, &err);
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
    struct mw__dir *d = mw__dir_of(h, __func__, &err);
    return d ? d->ctx : NULL;
}

unsigned mw__dir_lease_ms(mw_directory_t *h)
{
    int err;
    struct mw__dir *d = mw__dir_of(h, __func__, &err);
    return d ? d->opts.lease_ms : 0;
}

static void dir_release(struct mw__dir *d);

static void dirs_teardown(mw_ctx_t *ctx, void *state)
{
    struct dirs *ds = state;
    while (!mw__list_empty(&ds->all))
        dir_release(mw__list_first(&ds->all, struct mw__dir, link));
    while (!mw__list_empty(&ds->finishing))
        mw__store_reap(mw__list_first(&ds->finishing, struct mw__store, finishing));
    mw__free(ds);
    ctx->layers[MW__LAYER_DIR] = (struct mw__layer){0};
}

static struct dirs *dirs_get(mw_ctx_t *ctx)
{
    struct dirs *ds = ctx->layers[MW__LAYER_DIR].state;
    if (!ds && (ds = mw__calloc(1, sizeof *ds))) {
        mw__list_init(&ds->all);
        mw__list_init(&ds->finishing);
        ctx->layers[MW__LAYER_DIR] = (struct mw__layer){.state = ds, .teardown = dirs_teardown};
    }
    return ds;
}

int mw__dir_key(const struct mw__dir *d, const char *name, char *buf)
{
    int n = snprintf(buf, MW__DIR_KEY_MAX, "%s%s", d->prefix, name);
    return n >= MW__DIR_KEY_MAX ? -EINVAL : 0;
}

uint64_t mw__dir_random64(void)
{
    uint64_t v = 0;
    while (!v && getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        ;
    return v;
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
    mw_future_t *f = *out = mw__dir_future(h, fn, &d);
    if (!f)
        return NULL;
    char key[MW__DIR_KEY_MAX];
    if (!mw__dir_name_ok(name, prefix) || mw__dir_key(d, name, key)) {
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
    char key[MW__DIR_KEY_MAX];
    if (o && (mw__dir_key(o->d, name, key) || mw__store_get(o->d->st, key, on_lookup, o) < 0))
        on_lookup(o, -ENOMEM, "out of memory", NULL, 0);
    return f;
}

size_t mw__dir_decode_all(struct mw__dir *d, size_t n, const char *const *keys,
                         const char *const *vals, const size_t *lens, struct mw__dir_entry **es)
{
    size_t m = 0, pl = strlen(d->prefix);
    for (size_t i = 0; i < n; i++) {
        const char *why;
        const char *name = keys[i] + pl;
        if (strncmp(keys[i], d->prefix, pl) || !mw__dir_name_ok(name, false)) {
            MW_LOG(d->ctx, MW_LOG_WARN, "directory: skipping key %s: not a name", keys[i]);
            continue;
        }
        int rc = mw__dir_entry_decode(name, vals[i], lens[i], &es[m], &why);
        if (rc == -EPROTO)
            MW_LOG(d->ctx, MW_LOG_WARN, "directory: skipping %s: %s", name, why);
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
        size_t m = mw__dir_decode_all(o->d, n, keys, vals, lens, es);
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
    char key[MW__DIR_KEY_MAX];
    if (o && (mw__dir_key(o->d, prefix, key) || mw__store_scan(o->d->st, key, on_list, o) < 0))
        on_list(o, -ENOMEM, "out of memory", 0, NULL, NULL, NULL);
    return f;
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
        if (d->ever_up)                     /* back: the store may have restarted empty */
            mw__dir_pubs_put_all(d);
        d->ever_up = true;
    } else {
        d->ev_up = !err;
        d->notify_err = err;
        mw__dir_watches_up(d, err);
    }
    open_done(d);
}

static void on_store_down(void *arg, bool requests, const char *why)
{
    struct mw__dir *d = arg;
    MW_LOG(d->ctx, requests ? MW_LOG_WARN : MW_LOG_DEBUG,
            "directory: lost the store at %s (%s); retrying", d->url, why ? why : "?");
    if (requests) {
        d->req_up = false;
        return;
    }
    d->ev_up = false;
    mw__dir_watches_lost(d);
}

static void on_store_event(void *arg, const char *key, enum mw__store_event ev,
                           const char *val, size_t len)
{
    struct mw__dir *d = arg;
    const char *name = key + strlen(d->prefix);
    if (!strncmp(key, d->prefix, strlen(d->prefix)) && mw__dir_name_ok(name, false))
        mw__dir_watches_event(d, key, name, ev, val, len);
}

_Static_assert(MW__DIR_KEY_MAX <= MW__STORE_KEY_MAX, "the store carries every key");
_Static_assert(MW__DIR_VALUE_MAX == MW__STORE_VALUE_MAX, "the store reads every entry");

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
    mw__list_del(&d->link);
    mw__handle_release(d->h);
    mw__dir_watches_remove_all(d);
    mw__dir_pubs_remove_all(d);
    struct dirs *ds = d->ctx->layers[MW__LAYER_DIR].state;
    mw__store_close(d->st, &ds->finishing);   /* what is still pending fails now */
    if (d->open) {
        mw_future_fail(d->open, -ECANCELED, "the directory closed");
        mw_future_unref(d->open);
    }
    if (d->open_timer)
        event_free(d->open_timer);
    mw__free(d->url);
    mw__free(d);
}

/* @url without its password ("redis://user:***@host"), for messages:
 * @out has room for @url and 3 bytes more. */
static void redact(const char *url, char *out)
{
    const char *start = strncmp(url, "unix:", 5) ? strstr(url, "//") : url + 3;
    const char *at = NULL;
    if (start)
        for (const char *p = start + 2; *p && *p != '/'; p++)
            if (*p == '@')
                at = p;
    const char *colon = at ? memchr(start + 2, ':', (size_t)(at - start - 2)) : NULL;
    if (!colon) {
        strcpy(out, url);
        return;
    }
    size_t head = (size_t)(colon + 1 - url);
    memcpy(out, url, head);
    strcpy(out + head, "***");
    strcpy(out + head + 3, at);
}

/* The store refused our credentials (or wants some): an open still under
 * way fails now rather than at its deadline. */
static void on_store_refused(void *arg, int err, const char *why)
{
    struct mw__dir *d = arg;
    MW_LOG(d->ctx, MW_LOG_WARN, "directory: the store at %s refused us: %s", d->url, why);
    if (!d->open || d->refused)
        return;
    d->refused = err;
    snprintf(d->refusal, sizeof d->refusal, "%s%s", why,
             strstr(why, "NOAUTH") ? " (give the password in the URL: "
                                     "redis://[USER]:PASSWORD@HOST)" : "");
    /* failed from the loop, not inside the store's reply callback */
    event_active(d->open_timer, EV_TIMEOUT, 1);
}

static void on_open_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__dir *d = arg;
    mw_future_t *f = d->open;
    d->open = NULL;
    if (d->refused)
        mw_future_fail(f, d->refused, "directory: the store at %s refused us: %s", d->url,
                       d->refusal);
    else
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
    if (o->configure_store > 1)
        return *why = "configure_store: 0 or 1", -EINVAL;
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
    if (!d || !(d->url = mw__malloc(strlen(url) + 4)) ||
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
    redact(url, d->url);
    snprintf(d->prefix, sizeof d->prefix, "%s:", o.prefix);
    mw__list_init(&d->pubs);
    mw__list_init(&d->watches);
    mw__list_add_tail(&ds->all, &d->link);
    struct mw__store_hooks hooks = {.up = on_store_up, .down = on_store_down,
                                    .refused = on_store_refused, .event = on_store_event,
                                    .arg = d};
    struct mw__store_cfg cfg = {.timeout_ms = o.timeout_ms, .configure = o.configure_store};
    int rc = mw__store_open(ctx, url, d->prefix, &cfg, &hooks, &d->st, &why);
    if (rc < 0) {
        d->st = NULL;
        mw_future_fail(f, rc, "mw_dir_open %s: %s", d->url, why);   /* (d->url: redacted) */
        dir_release(d);
        return f;
    }
    d->open = mw_future_ref(f);
    mw__ev_add_ms(ctx, d->open_timer, o.timeout_ms);
    return f;
}

int mw_dir_free(mw_directory_t *h)
{
    if (!h)
        return 0;
    int err;
    struct mw__dir *d = mw__dir_of(h, __func__, &err);
    if (!d)
        return err;
    dir_release(d);
    return 0;
}
