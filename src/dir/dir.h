/* The directory (include/meshwire.h, "Directory"), internal side: one per
 * mw_dir_open, kept in the context's directory layer.  dir.c holds the
 * store client's owner, entries published and watches; peer.c connects
 * by name and serves region tables; comm.c forms communicators from it.
 * The layer sits above coll and cm: they know nothing of it. */
#ifndef MW_DIR_DIR_H
#define MW_DIR_DIR_H

#include "meshwire.h"

#define MW__LAYER_DIR 2

struct mw__dir;

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
};
int mw__dir_serve_init(struct mw__dir_serve *s, mw_ctx_t *ctx, const mw_dir_pub_t *pub);
void mw__dir_serve_fini(struct mw__dir_serve *s);
void mw__dir_serve_accept(mw_listener_t *l, mw_conn_t *c, void *arg);
/* The addresses a listener on @listen reached at @port is published
 * with: the one named, else this host's RDMA-backed IPv4 addresses.
 * Return: a mw__malloc'd string, or NULL with *@err. */
char *mw__dir_listen_addrs(mw_ctx_t *ctx, const char *listen, int port, int *err);

#endif
