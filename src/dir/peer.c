/* Connections by name: the serving side exports its shares on every
 * accepted connection and sends their table as the first message; the
 * connecting side looks the name up, connects, and takes the table. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "cm/addrs.h"
#include "cm/export.h"
#include "cm/nic.h"
#include "core/alloc.h"
#include "core/ctx.h"
#include "dir/dir.h"
#include "dir/entry.h"

/* ------------------------------------------------------------------------
 * Serving
 * ------------------------------------------------------------------------ */

int mw__dir_serve_init(struct mw__dir_serve *s, mw_ctx_t *ctx, const mw_dir_pub_t *pub)
{
    *s = (struct mw__dir_serve){.ctx = ctx, .on_accept = pub->on_accept, .arg = pub->arg};
    mw__list_init(&s->exporting);
    size_t n = pub->nshares;
    if (n && (!(s->names = mw__calloc(n, sizeof *s->names)) ||
              !(s->addrs = mw__calloc(n, sizeof *s->addrs)) ||
              !(s->lens = mw__calloc(n, sizeof *s->lens))))
        return -ENOMEM;
    for (; s->n < n; s->n++) {
        const mw_dir_share_t *sh = &pub->shares[s->n];
        if (!(s->names[s->n] = mw__malloc(strlen(sh->name) + 1)))
            return -ENOMEM;
        strcpy(s->names[s->n], sh->name);
        s->addrs[s->n] = sh->addr;
        s->lens[s->n] = sh->len;
    }
    return 0;
}

/* A connection accepted, its shares being exported: it reaches on_accept
 * once they all are and their table is on its way. */
struct exporting {
    struct mw__dir_serve *s;      /* NULL: the publication ended meanwhile */
    mw_listener_t *l;
    mw_conn_t *c;
    mw_remote_t r[MW__DIR_REGIONS_MAX];
    size_t pending;               /* exports still being made */
    int err;
    struct mw__list link;         /* in s->exporting while s lives */
};

void mw__dir_serve_stop(struct mw__dir_serve *s)
{
    if (!s->exporting.next)       /* never served (no listener), or finished */
        return;
    struct exporting *x;
    mw__list_for_each(x, &s->exporting, link) {
        mw__list_del(&x->link);
        x->s = NULL;              /* its last export frees it */
        mw_conn_abort(x->c);      /* which lets go of its exports */
    }
}

void mw__dir_serve_fini(struct mw__dir_serve *s)
{
    mw__dir_serve_stop(s);
    for (size_t i = 0; i < s->n; i++)
        mw__free(s->names[i]);
    mw__free(s->names);
    mw__free(s->addrs);
    mw__free(s->lens);
    *s = (struct mw__dir_serve){0};
}

static void on_table_sent(mw_future_t *f, void *arg)
{
    (void)f;
    mw__free(arg);
}

/* Every share exported (or one failed, or the connection went meanwhile:
 * -ECANCELED): send the table, hand the connection over. */
static void serve(struct exporting *x)
{
    struct mw__dir_serve *s = x->s;
    uint8_t *buf = x->err ? NULL : mw__malloc(MW__DIR_TABLE_MAX);
    int len = x->err ? x->err : !buf ? -ENOMEM
            : mw__dir_table_encode((const char *const *)s->names, x->r, s->n, buf,
                                   MW__DIR_TABLE_MAX);
    mw_future_t *f = len < 0 ? NULL : mw_send(x->c, buf, (size_t)len);
    if (!f) {
        MW_LOG(s->ctx, len == -ECANCELED ? MW_LOG_DEBUG : MW_LOG_ERROR, "directory: a "
               "connection refused: its shares could not be exported or sent: %s",
               mw_strerror(len < 0 ? len : -ENOMEM));
        mw__free(buf);
        mw_conn_abort(x->c);
        return;
    }
    mw_future_then(f, on_table_sent, buf);    /* the buffer lives until sent */
    mw_future_unref(f);
    s->on_accept(x->l, x->c, s->arg);
}

static void exported(void *arg, int err, const mw_remote_t *r)
{
    struct exporting *x = arg;
    if (err && !x->err)
        x->err = err;
    for (size_t i = 0; r && x->s && i < x->s->n; i++)   /* which share: by its address */
        if (x->r[i].len == 0 && (uintptr_t)x->s->addrs[i] == r->addr && x->s->lens[i] == r->len)
            x->r[i] = *r;
    if (--x->pending)
        return;
    if (x->s) {
        mw__list_del(&x->link);
        serve(x);
    }
    mw__free(x);
}

void mw__dir_serve_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    struct mw__dir_serve *s = arg;
    struct exporting *x = mw__calloc(1, sizeof *x);
    if (!x) {
        MW_LOG(s->ctx, MW_LOG_ERROR, "directory: a connection refused: out of memory");
        mw_conn_abort(c);
        return;
    }
    *x = (struct exporting){.s = s, .l = l, .c = c, .pending = 1};  /* 1: this call's */
    mw__list_add_tail(&s->exporting, &x->link);
    for (size_t i = 0; i < s->n && !x->err; i++) {
        int rc = mw__mem_export_async(c, s->addrs[i], s->lens[i], &x->r[i], exported, x);
        if (rc == 1)
            x->pending++;
        else if (rc < 0)
            x->err = rc;
    }
    exported(x, 0, NULL);
}

char *mw__dir_listen_addrs(mw_ctx_t *ctx, const char *listen, int port, int *err)
{
    char host[256] = "";
    const char *colon = listen ? strrchr(listen, ':') : NULL;
    size_t hl = listen ? (colon ? (size_t)(colon - listen) : strlen(listen)) : 0;
    if (hl >= sizeof host || port <= 0) {
        *err = -EINVAL;
        return NULL;
    }
    memcpy(host, listen, hl);
    size_t cap = 64;
    char *out = NULL;
    if (*host && strcmp(host, "*")) {               /* the address named */
        cap += hl;
        if ((out = mw__malloc(cap)))
            snprintf(out, cap, "%s:%d", host, port);
        *err = out ? 0 : -ENOMEM;
        return out;
    }
    const struct mw__nic *nics;
    size_t n;
    if ((*err = mw__cm_local_addrs(ctx, &nics, &n)))
        return NULL;
    if (!(out = mw__malloc(cap = 16 + n * INET_ADDRSTRLEN))) {
        *err = -ENOMEM;
        return NULL;
    }
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&nics[i].addr;
        if (in->sin_family != AF_INET)                 /* "*" listens on IPv4 */
            continue;
        if (len)
            out[len++] = ',';
        inet_ntop(AF_INET, &in->sin_addr, out + len, (socklen_t)(cap - len));
        len += strlen(out + len);
    }
    if (!len) {
        mw__free(out);
        *err = -EADDRNOTAVAIL;
        return NULL;
    }
    snprintf(out + len, cap - len, ":%d", port);
    return out;
}

/* ------------------------------------------------------------------------
 * Connecting by name
 * ------------------------------------------------------------------------ */

struct dconn {
    mw_directory_t *d;
    mw_ctx_t *ctx;
    mw_future_t *f;                  /* the caller's */
    mw_conn_opts_t opts;
    char name[MW__DIR_NAME_MAX + 1];
    bool serves;
    mw_conn_t *conn;
};

static void dconn_end(struct dconn *dc, mw_dir_peer_t *p, int err, const char *fmt,
                      const char *what)
{
    if (err) {
        mw_future_fail(dc->f, err, fmt, dc->name, what);
        if (dc->conn)
            mw_conn_abort(dc->conn);
    } else if (mw_future_resolve(dc->f, p) < 0) {   /* cancelled meanwhile */
        mw_conn_abort(p->conn);
        mw_dir_peer_free(p);
    }
    mw_future_unref(dc->f);
    mw__free(dc);
}

static mw_dir_peer_t *peer_new(mw_conn_t *c, const uint8_t *tbl, size_t len, const char **why,
                               int *err)
{
    size_t n = 0;
    mw_dir_peer_t *p = mw__calloc(1, sizeof *p + MW__DIR_REGIONS_MAX * (sizeof(char *) +
                                                  sizeof(mw_remote_t)) + len + 1);
    *err = -ENOMEM;
    *why = "out of memory";
    if (!p)
        return NULL;
    const char **names = (const char **)(p + 1);
    mw_remote_t *r = (mw_remote_t *)(names + MW__DIR_REGIONS_MAX);
    char *text = (char *)(r + MW__DIR_REGIONS_MAX);
    if (tbl && (*err = mw__dir_table_decode(tbl, len, text, names, r, &n, why)) < 0) {
        mw__free(p);
        return NULL;
    }
    *p = (mw_dir_peer_t){.conn = c, .nregions = n, .names = names, .regions = r};
    *err = 0;
    return p;
}

static void on_table(mw_future_t *f, void *arg)
{
    struct dconn *dc = arg;
    int err = mw_future_error(f);
    if (err) {
        dconn_end(dc, NULL, err, "connecting to %s: no region table: %s",
                  mw_future_message(f));
        return;
    }
    mw_msg_t *m = mw_future_value(f);
    const char *why;
    mw_dir_peer_t *p = peer_new(dc->conn, m->data, m->len, &why, &err);
    mw_msg_free(m);
    dconn_end(dc, p, err, "connecting to %s: %s", why);
}

static void on_connected(mw_future_t *f, void *arg)
{
    struct dconn *dc = arg;
    int err = mw_future_error(f);
    if (err) {
        dconn_end(dc, NULL, err, "connecting to %s: %s", mw_future_message(f));
        return;
    }
    dc->conn = mw_future_value(f);
    if (!dc->serves) {
        const char *why;
        mw_dir_peer_t *p = peer_new(dc->conn, NULL, 0, &why, &err);
        dconn_end(dc, p, err, "connecting to %s: %s", why);
        return;
    }
    mw_future_t *r = mw_recv(dc->conn);
    if (!r) {
        dconn_end(dc, NULL, -ENOMEM, "connecting to %s: %s", "out of memory");
        return;
    }
    mw_future_set_timeout(r, dc->opts.timeout_ms);
    mw_future_then(r, on_table, dc);
    mw_future_unref(r);
}

static void on_found(mw_future_t *f, void *arg)
{
    struct dconn *dc = arg;
    int err = mw_future_error(f);
    if (err) {
        dconn_end(dc, NULL, err, "connecting to %s: %s", mw_future_message(f));
        return;
    }
    mw_dir_list_t *l = mw_future_value(f);
    dc->serves = l->e[0].serves;
    mw_future_t *c = mw_connect(dc->ctx, l->e[0].addrs, &dc->opts);
    mw_dir_list_free(l);
    if (!c) {
        dconn_end(dc, NULL, -ENOMEM, "connecting to %s: %s", "out of memory");
        return;
    }
    mw_future_then(c, on_connected, dc);
    mw_future_unref(c);
}

mw_future_t *mw_dir_connect(mw_directory_t *d, const char *name, const mw_conn_opts_t *opts)
{
    mw_future_t *look = mw_dir_lookup(d, name);
    if (!look)
        return NULL;
    mw_ctx_t *ctx = mw__dir_ctx(d);
    mw_future_t *f = mw_future_new(ctx);
    struct dconn *dc = f ? mw__calloc(1, sizeof *dc) : NULL;
    if (!dc) {
        mw_future_unref(look);
        if (f)
            mw_future_fail(f, -ENOMEM, "mw_dir_connect: out of memory");
        return f;
    }
    *dc = (struct dconn){.d = d, .ctx = ctx, .f = mw_future_ref(f)};
    if (opts)
        dc->opts = *opts;
    else
        mw_conn_opts_init(&dc->opts);
    snprintf(dc->name, sizeof dc->name, "%s", name);
    mw_future_then(look, on_found, dc);
    mw_future_unref(look);
    return f;
}

const mw_remote_t *mw_dir_peer_region(const mw_dir_peer_t *p, const char *name)
{
    for (size_t i = 0; p && name && i < p->nregions; i++)
        if (!strcmp(p->names[i], name))
            return &p->regions[i];
    return NULL;
}

void mw_dir_peer_free(mw_dir_peer_t *p)
{
    mw__free(p);
}
