/* A hop: reader, queue, credits and chunk posting on one connection. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hop.h"
#include "session.h"

struct mc_qmsg {
    struct mc_qmsg *next;
    struct mc_msg m;
};

void mc_kick(struct mc_waker *k)
{
    if (k->react)
        k->react(k->arg);
    if (k->w)
        mw_future_resolve(k->w, NULL);
}

void mc_sleep(struct mc_waker *k)
{
    k->w = mw_future_new(k->ctx);
    mw_wait(k->w);
    mw_future_unref(k->w);
    k->w = NULL;
}

void mc_hop_fail(struct mc_hop *h, int err, const char *fmt, ...)
{
    if (!h->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(h->why, sizeof h->why, fmt, ap);
        va_end(ap);
        h->err = err < 0 ? err : -EIO;
    }
    mc_kick(h->waker);
}

void mc_hop_give_up(struct mc_hop *h, int err, const char *why)
{
    if (h->err)
        return;
    if (h->c) {
        mc_send_simple(h->c, MC_ERROR, 0, 0, why);
        h->told = true;
    }
    mc_hop_fail(h, err, "%s", why);
}

static void read_next(struct mc_hop *h);

static void queue(struct mc_hop *h, const struct mc_msg *m)
{
    struct mc_qmsg *q = malloc(sizeof *q);
    if (!q) {
        mc_hop_fail(h, -ENOMEM, "out of memory");
        return;
    }
    q->next = NULL;
    q->m = *m;
    if (h->tail)
        h->tail->next = q;
    else
        h->head = q;
    h->tail = q;
}

static void on_msg(mw_future_t *f, void *arg)
{
    struct mc_hop *h = arg;
    if (mw_future_error(f)) {
        if (!h->closed)
            mc_hop_fail(h, mw_future_error(f), "%s: connection lost (%s)", h->name,
                        mw_future_message(f));
        return;
    }
    mw_msg_t *raw = mw_future_value(f);
    const char *why;
    const struct mc_msg *m = mc_msg_check(raw, &why);
    if (!m) {
        mc_hop_fail(h, -EPROTO, "%s: %s", h->name, why);
    } else if (m->type == MC_CREDIT) {
        h->credits += m->a;
    } else if (m->type == MC_ERROR) {
        h->peer_error = true;
        mc_hop_fail(h, -ECONNABORTED, "%s: %s", h->name, m->text);
    } else {
        queue(h, m);
        if (m->type == MC_BYE)
            h->closed = true;
    }
    mw_msg_free(raw);
    if (!h->err && !h->closed)
        read_next(h);
    mc_kick(h->waker);
}

static void read_next(struct mc_hop *h)
{
    mw_future_t *f = mw_recv(h->c);
    if (!f || mw_future_then(f, on_msg, h) < 0)
        mc_hop_fail(h, -ENOMEM, "out of memory");
    mw_future_unref(f);
}

void mc_hop_start(struct mc_hop *h, struct mc_waker *k, mw_conn_t *c, const char *name)
{
    h->ctx = k->ctx;
    h->c = c;
    h->waker = k;
    snprintf(h->name, sizeof h->name, "%s", name);
    read_next(h);
}

static void pause_ms(mw_ctx_t *ctx, unsigned ms)
{
    mw_future_t *f = mw_future_new(ctx);
    mw_future_set_timeout(f, ms);
    mw_wait(f);
    mw_future_unref(f);
}

/* The connection of a connect future that succeeded (by name: the peer's
 * regions are not used here). */
static mw_conn_t *conn_of(mw_future_t *f, bool by_name)
{
    if (!by_name)
        return mw_future_value(f);
    mw_dir_peer_t *p = mw_future_value(f);
    mw_conn_t *c = p->conn;
    mw_dir_peer_free(p);
    return c;
}

/* A refused connection (or, by name, one not yet published) is retried
 * until the deadline: the receiver may be starting at the same moment (as
 * in scripts). */
int mc_hop_connect(struct mc_hop *h, struct mc_waker *k, mw_directory_t *dir,
                   const char *name, const mw_conn_opts_t *o)
{
    mw_ctx_t *ctx = k->ctx;
    unsigned timeout_ms = o->timeout_ms;
    double deadline = mc_now() + timeout_ms / 1000.0;
    for (;;) {
        mw_future_t *f = dir ? mw_dir_connect(dir, name, o) : mw_connect(ctx, name, o);
        if (!f)
            return -ENOMEM;
        mw_future_set_timeout(f, timeout_ms + 1000);
        int rc = mw_wait(f);
        if (!rc) {
            mc_hop_start(h, k, conn_of(f, dir != NULL), name);
            mw_future_unref(f);
            return 0;
        }
        bool retry = (rc == -ECONNREFUSED || (dir && rc == -ENOENT)) &&
                     mc_now() + 0.2 < deadline;
        if (!retry) {
            snprintf(h->why, sizeof h->why, "%s: %s", name,
                     rc == -ECONNREFUSED ? "connection refused (is meshcat -l running there?)"
                     : rc == -ENOENT     ? "not in the directory (is meshcat -l --name running?)"
                     : rc == -ETIMEDOUT  ? "no answer (unreachable, or not an RDMA peer?)"
                                         : mw_future_message(f));
            h->err = rc;
        }
        mw_future_unref(f);
        if (!retry)
            return rc;
        pause_ms(ctx, 200);
    }
}

int mc_hop_next(struct mc_hop *h, struct mc_msg *out)
{
    while (!h->head && !h->err)
        mc_sleep(h->waker);
    if (h->err && !h->head)
        return h->err;
    struct mc_qmsg *q = h->head;
    h->head = q->next;
    if (!h->head)
        h->tail = NULL;
    *out = q->m;
    free(q);
    return 0;
}

bool mc_hop_can_post(const struct mc_hop *h)
{
    return !h->err && h->posted - h->credits < h->window && h->posted - h->written < h->window;
}

static void on_written(mw_future_t *f, void *arg)
{
    struct mc_hop *h = arg;
    if (mw_future_error(f))
        mc_hop_fail(h, mw_future_error(f), "%s: write failed: %s", h->name, mw_future_message(f));
    else
        h->written++;
    mc_kick(h->waker);
}

int mc_hop_post(struct mc_hop *h, const void *buf, size_t len)
{
    uint64_t slot = h->posted % h->window;
    mw_future_t *f = mw_write_imm(h->c, buf, len, &h->ring, slot * h->chunk, (uint32_t)len);
    if (!f)
        return -ENOMEM;
    h->posted++;
    mw_future_then(f, on_written, h);
    mw_future_unref(f);
    return 0;
}

void mc_hop_close(struct mc_hop *h)
{
    while (h->head) {
        struct mc_qmsg *q = h->head;
        h->head = q->next;
        free(q);
    }
    h->tail = NULL;
    if (!h->c)
        return;
    h->closed = true;
    if (h->err && !h->told) {
        mw_conn_abort(h->c);
    } else {
        mw_future_t *f = mw_conn_close(h->c);
        mw_future_set_timeout(f, 5000);
        mw_wait(f);
        mw_future_unref(f);
    }
    h->c = NULL;
}
