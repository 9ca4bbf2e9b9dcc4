/* Watches: what is under a prefix now (JOINED each, then SYNCED), then
 * every change the store's events report; a resync after the store came
 * back reports as LEFT only what did not return within a lease (and the
 * 2 s its publisher may take to notice the store back).  The
 * caller's function runs from the loop (on_drain).
 *
 * Events come on the store's event link while a sync reads on its request
 * link: a page read before a change may arrive after the change's event.
 * So the events that come during a sync are held, and applied after what
 * it read. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/handle.h"
#include "core/list.h"
#include "dir/dir.h"
#include "dir/entry.h"
#include "dir/store.h"

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

/* An event held during a sync: an entry set (@e, a reference), or gone. */
struct held {
    struct held *next;
    struct mw__dir_entry *e;
    char name[];                     /* when gone */
};

#define HELD_MAX 4096                /* beyond, the sync is done again instead */

struct watch {
    struct mw__dir *d;
    uint64_t dh;                     /* d's handle, for the caller's function */
    struct mw__list link;
    int id, refs;
    bool gone;
    struct wevent *qhead, **qtail;
    struct mw__task drain;
    char key[MW__DIR_KEY_MAX];               /* key prefix */
    mw_dir_watch_fn fn;
    void *arg;
    struct mw__list known;
    uint64_t gen;                    /* syncs begun */
    int syncing;                     /* syncs not answered yet */
    struct held *hhead, **htail;     /* events come meanwhile, in order */
    unsigned nheld;
    bool again;                      /* too many held: sync again */
    struct event *sweep_ev;          /* after a resync: who did not come back */
};

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

static void held_drop_all(struct watch *w)
{
    while (w->hhead) {
        struct held *h = w->hhead;
        w->hhead = h->next;
        entry_unref(h->e);
        mw__free(h);
    }
    w->htail = &w->hhead;
    w->nheld = 0;
}

static void watch_unref(struct watch *w)
{
    if (--w->refs)
        return;
    held_drop_all(w);
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

/* A change an event reports: @e (taken) set, or @name gone (@e NULL). */
static void apply(struct watch *w, const char *name, struct mw__dir_entry *e)
{
    if (e) {
        known_set(w, e);
        return;
    }
    struct known *k = known_find(w, name);
    if (k)
        known_drop(w, k);
}

static void hold(struct watch *w, const char *name, struct mw__dir_entry *e)
{
    size_t n = e ? 0 : strlen(name) + 1;
    struct held *h = w->nheld < HELD_MAX ? mw__malloc(sizeof *h + n) : NULL;
    if (!h) {                        /* what the next sync reads says it all */
        entry_unref(e);
        held_drop_all(w);
        w->again = true;
        return;
    }
    h->next = NULL;
    h->e = e;
    memcpy(h->name, name, n);
    *w->htail = h;
    w->htail = &h->next;
    w->nheld++;
}

static void watch_sync(struct watch *w);

/* A sync was answered: once none is left, what was held meanwhile. */
static void sync_done(struct watch *w)
{
    if (--w->syncing || w->gone)
        return;
    if (w->again) {
        w->again = false;
        watch_sync(w);
        return;
    }
    struct held *h = w->hhead;
    w->hhead = NULL;
    w->htail = &w->hhead;
    w->nheld = 0;
    while (h) {
        struct held *next = h->next;
        apply(w, h->name, h->e);
        mw__free(h);
        h = next;
    }
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
            MW_LOG(w->d->ctx, MW_LOG_WARN, "directory: watch of %s: %s", w->key,
                    es || !n ? why : "out of memory");
        mw__free(es);
        sync_done(w);
        watch_unref(w);
        return;
    }
    size_t m = mw__dir_decode_all(w->d, n, keys, vals, lens, es);
    for (size_t i = 0; i < m; i++)
        known_set(w, es[i]);
    mw__free(es);
    tell(w, MW_DIR_SYNCED, NULL);
    /* entries known from before the store went away and not found now are
     * gone once they had a lease to come back in, counted from when their
     * publisher noticed the store back (its retry, at most 2 s later) */
    mw__ev_add_ms(w->d->ctx, w->sweep_ev, w->d->opts.lease_ms + MW__STORE_RETRY_MAX_MS);
    sync_done(w);
    watch_unref(w);
}

static void watch_sync(struct watch *w)
{
    w->gen++;
    w->refs++;
    w->syncing++;
    if (mw__store_scan(w->d->st, w->key, on_watch_scan, w) < 0)
        on_watch_scan(w, -ENOMEM, "out of memory", 0, NULL, NULL, NULL);
}

int mw_dir_watch(mw_directory_t *h, const char *prefix, mw_dir_watch_fn fn, void *arg)
{
    int err;
    struct mw__dir *d = mw__dir_of(h, __func__, &err);
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
    if (mw__dir_key(d, prefix, w->key)) {
        watch_unref(w);
        return -EINVAL;
    }
    w->d = d;
    w->dh = d->h;
    w->qtail = &w->qhead;
    w->htail = &w->hhead;
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
    struct mw__dir *d = mw__dir_of(h, __func__, &err);
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

void mw__dir_watches_event(struct mw__dir *d, const char *key, const char *name,
                           enum mw__store_event ev, const char *val, size_t len)
{
    struct watch *w;
    mw__list_for_each(w, &d->watches, link) {
        if (strncmp(key, w->key, strlen(w->key)))
            continue;
        struct mw__dir_entry *e = NULL;
        const char *why;
        int rc = ev == MW__STORE_GONE ? 0 : mw__dir_entry_decode(name, val, len, &e, &why);
        if (rc == -EPROTO)
            MW_LOG(d->ctx, MW_LOG_WARN, "directory: skipping %s: %s", name, why);
        if (rc)
            continue;
        if (w->syncing)
            hold(w, name, e);
        else
            apply(w, name, e);
    }
}

void mw__dir_watches_up(struct mw__dir *d, int err)
{
    struct watch *w;
    mw__list_for_each(w, &d->watches, link) {
        if (err)
            tell(w, MW_DIR_LOST, NULL);
        else
            watch_sync(w);
    }
}

void mw__dir_watches_lost(struct mw__dir *d)
{
    struct watch *w;
    mw__list_for_each(w, &d->watches, link)
        tell(w, MW_DIR_LOST, NULL);
}

void mw__dir_watches_remove_all(struct mw__dir *d)
{
    while (!mw__list_empty(&d->watches))
        watch_remove(mw__list_first(&d->watches, struct watch, link));
}
