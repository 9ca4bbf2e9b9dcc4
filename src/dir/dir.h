/* The directory (include/meshwire.h, "Directory"), internal side: one per
 * mw_dir_open, kept in the context's directory layer.  dir.c owns the
 * store client, lookups and lists; publish.c the entries published;
 * watch.c the watches; peer.c connects by name and serves region tables;
 * comm.c forms communicators from it.
 * The layer sits above coll and cm: they know nothing of it. */
#ifndef MW_DIR_DIR_H
#define MW_DIR_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/list.h"
#include "dir/entry.h"
#include "dir/store.h"
#include "meshwire.h"

#define MW__DIR_KEY_MAX (MW__DIR_NAME_MAX + 128)

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
    int refused;                     /* the store refused the open: why, below */
    char refusal[320];
    bool req_up, ev_up, ever_up;
    int notify_err;                  /* -ENOTSUP: the store sends no events */
    struct mw__list pubs, watches;
    int next_watch;
};

/* dir.c: the directory behind a live handle (else NULL with *@err, logged
 * for @fn); a new future on its context (NULL: out of memory, or errno set
 * for a handle not live, as connections do); "PREFIX:NAME" into @buf
 * (MW__DIR_KEY_MAX); a random non-zero number. */
struct mw__dir *mw__dir_of(mw_directory_t *h, const char *fn, int *err);
mw_future_t *mw__dir_future(mw_directory_t *h, const char *fn, struct mw__dir **dp);
int mw__dir_key(const struct mw__dir *d, const char *name, char *buf);
uint64_t mw__dir_random64(void);
/* mw__dir_decode_all() - what a prefix read found, into @es (room for @n),
 * malformed entries skipped and logged.  Return: how many. */
size_t mw__dir_decode_all(struct mw__dir *d, size_t n, const char *const *keys,
                          const char *const *vals, const size_t *lens,
                          struct mw__dir_entry **es);

/* publish.c: put every entry again (the store is back); remove them all
 * (the directory goes). */
void mw__dir_pubs_put_all(struct mw__dir *d);
void mw__dir_pubs_remove_all(struct mw__dir *d);

/* watch.c: the store's events flow again (@err 0: read everything again)
 * or will not (-ENOTSUP: LOST); the events link went down (LOST); a key
 * set or gone; every watch removed (the directory goes). */
void mw__dir_watches_up(struct mw__dir *d, int err);
void mw__dir_watches_lost(struct mw__dir *d);
void mw__dir_watches_event(struct mw__dir *d, const char *key, const char *name,
                           enum mw__store_event ev, const char *val, size_t len);
void mw__dir_watches_remove_all(struct mw__dir *d);

/* mw__dir_ctx() - the context of @d (a live handle), or NULL. */
mw_ctx_t *mw__dir_ctx(mw_directory_t *d);
/* mw__dir_lease_ms() - the lease of @d's entries. */
unsigned mw__dir_lease_ms(mw_directory_t *d);

/* peer.c: serving.  The accept callback a publication with a listener
 * gives mw_listen: exports the shares, sends the table, hands over. */
struct mw__dir_serve {
    mw_ctx_t *ctx;
    mw_accept_fn on_accept;
    void *arg;
    size_t n;
    char **names;
    void **addrs;
    size_t *lens;
    struct mw__list exporting;    /* accepted, large shares still being exported */
};
int mw__dir_serve_init(struct mw__dir_serve *s, mw_ctx_t *ctx, const mw_dir_pub_t *pub);
/* mw__dir_serve_stop() - the publication ends: the connections whose shares
 * are still being exported are aborted, never handed to on_accept. */
void mw__dir_serve_stop(struct mw__dir_serve *s);
void mw__dir_serve_fini(struct mw__dir_serve *s);
void mw__dir_serve_accept(mw_listener_t *l, mw_conn_t *c, void *arg);
/* The addresses a listener on @listen reached at @port is published
 * with: the one named, else this host's RDMA-backed IPv4 addresses.
 * Return: a mw__malloc'd string, or NULL with *@err. */
char *mw__dir_listen_addrs(mw_ctx_t *ctx, const char *listen, int port, int *err);

#endif
