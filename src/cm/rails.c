/* Rails: one peer's region over several connections.  A transfer is cut
 * into slices (entries split where a slice ends); each slice goes to the
 * rail with the fewest bytes out, as a one-shot batch on its connection.
 * A slice that fails there takes its rail out and waits for another: it
 * is posted again whole (writes and reads are idempotent), only once its
 * first post came back, so no two posts of it ever touch the caller's
 * memory at once.  Everything runs from future callbacks on the loop. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <event2/event.h>

#include "cm/cm.h"
#include "core/alloc.h"
#include "core/future.h"

#define SLICES_PER_RAIL 4         /* slices in flight per rail */
#define DEFAULT_SLICE (1u << 20)
#define DEFAULT_STALL_MS 10000   /* rxe, 3 VMs on 2 cores: rails idle 2.5-4 s seen */
#define STALL_CHECKS 4            /* looks per stall time, while slices are out */
/* Slices the other rails must complete while one completes none, beside
 * the stall time: a peer that was outside its loop serves the rail whose
 * bytes it already holds first, so "another moved" alone misjudged the
 * rail still waiting for its bytes (1.75 s, stall 300 ms, right after the
 * peer resumed). */
#define STALL_PASSES (2 * SLICES_PER_RAIL)

struct gxfer;

struct slice {
    struct gxfer *t;
    size_t first, n;              /* its pieces */
    uint64_t bytes;
    int rail;
    unsigned rail_gen;            /* the rail's connection it went out on */
    mw_future_t *f;               /* in flight, or NULL */
    struct mw__cb cb;
    struct slice *next;           /* in the transfer's list to post again */
};

/* A transfer over the group. */
struct gxfer {
    struct mw__list link;         /* in g->xfers */
    mw_rails_t *g;
    mw_future_t *f;
    mw_dir_t dir;
    mw_batch_entry_t *pieces;
    struct slice *slices;
    size_t nslices, next, left;   /* never posted from next; not done: left */
    struct slice *retry, **retry_tail;
    unsigned inflight;
    int err;                      /* stopping: why; else the last rail failure */
    char why[200];
    bool stopping;                /* cancelled or failed: post nothing more */
};

struct rail {
    mw_conn_t *conn;
    mw_remote_t remote;
    unsigned gen;                 /* bumped per connection given */
    unsigned out;                 /* slices in flight on the current connection */
    uint64_t out_bytes;
    uint64_t moved_ms;            /* its last slice done, or its first out since */
    unsigned passed;              /* slices the other rails completed since */
    mw_rail_stats_t st;
};

struct probe {
    mw_rails_t *g;
    int rail;
    unsigned gen;
};

struct mw_rails {
    mw_ctx_t *ctx;
    struct rail rails[MW_RAILS_MAX];
    int n;
    uint64_t region_addr, region_len, slice_bytes;
    uint8_t *probe_buf;           /* registered: probes read a byte into it */
    struct mw__list xfers;
    unsigned pending;             /* slices and probes in flight */
    unsigned stall_ms;            /* 0: never judged stalled */
    struct event *stall_ev;       /* looks for stalls while slices are out */
    bool freed;
};

static void schedule(mw_rails_t *g);

static void group_maybe_free(mw_rails_t *g)
{
    if (!g->freed || g->pending || !mw__list_empty(&g->xfers))
        return;
    if (g->stall_ev)
        event_free(g->stall_ev);
    mw_free(g->ctx, g->probe_buf);
    mw__free(g);
}

static void rail_down(mw_rails_t *g, int i, int err, const char *why)
{
    struct rail *r = &g->rails[i];
    if (r->st.state == MW_RAIL_DOWN)
        return;
    r->st.state = MW_RAIL_DOWN;
    r->st.failures++;
    snprintf(r->st.why, sizeof r->st.why, "%.120s (%s)", why, mw_strerror(err));
}

/* Take out the up rails whose connection broke (or was closed) while no
 * slice was on it: they are not offered work, and their stats say so. */
static void check_rails(mw_rails_t *g)
{
    for (int i = 0; i < g->n; i++) {
        struct rail *r = &g->rails[i];
        if (r->st.state != MW_RAIL_UP)
            continue;
        int err;
        struct mw__conn *c = mw__conn_of(r->conn, "mw_rails", &err);
        if (!c)
            rail_down(g, i, err, "its connection was closed");
        else if (c->err || !mw__conn_usable(c))
            rail_down(g, i, c->err ? c->err : -ESHUTDOWN, c->err ? c->why : "connection closing");
    }
}

/* --- stalls ---------------------------------------------------------------- */

/* A rail with slices out that completed none for stall_ms while the
 * others completed STALL_PASSES is stalled (RC resending on a lossy link,
 * a peer's loop that serves one transport and not the other): its
 * connection is failed, which brings its slices back at once, to go on the
 * others.  When every rail is slow alike, the peer is: nothing is judged. */
static void stalls_look(mw_rails_t *g)
{
    uint64_t now = mw__now_ms();
    for (int i = 0; i < g->n; i++) {
        struct rail *r = &g->rails[i];
        if (r->st.state != MW_RAIL_UP || !r->out || now - r->moved_ms < g->stall_ms ||
            r->passed < STALL_PASSES)
            continue;
        char why[120];
        snprintf(why, sizeof why, "stalled: no slice done in %llu ms while other rails did %u",
                 (unsigned long long)(now - r->moved_ms), r->passed);
        rail_down(g, i, -ETIMEDOUT, why);
        int err;
        struct mw__conn *c = mw__conn_of(r->conn, "mw_rails", &err);
        if (c && !c->err)
            mw__conn_fail(c, -ETIMEDOUT, "rail %s", why);
    }
}

static void stalls_watch(mw_rails_t *g);

static void on_stall_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    mw_rails_t *g = arg;
    g->pending++;                 /* failing a connection may finish slices */
    stalls_look(g);
    g->pending--;
    schedule(g);
    stalls_watch(g);
    group_maybe_free(g);
}

/* Look for stalls while slices are out (an idle group arms nothing). */
static void stalls_watch(mw_rails_t *g)
{
    if (!g->stall_ms || g->freed || !g->pending || (g->stall_ev && evtimer_pending(g->stall_ev, NULL)))
        return;
    if (!g->stall_ev && !(g->stall_ev = evtimer_new(g->ctx->base, on_stall_timer, g)))
        return;                   /* no memory: no stall judged, no harm */
    mw__ev_add_ms(g->ctx, g->stall_ev, g->stall_ms / STALL_CHECKS ? g->stall_ms / STALL_CHECKS : 1);
}

/* --- probing -------------------------------------------------------------- */

static void on_probed(mw_future_t *f, void *arg)
{
    struct probe *p = arg;
    mw_rails_t *g = p->g;
    struct rail *r = &g->rails[p->rail];
    g->pending--;
    if (p->gen == r->gen && !g->freed) {
        if (mw_future_error(f) == 0)
            r->st.state = MW_RAIL_UP;
        else
            rail_down(g, p->rail, mw_future_error(f), mw_future_message(f));
    }
    mw__free(p);
    schedule(g);
    group_maybe_free(g);
}

/* Probe rail @i's current connection: a 1-byte read of the region. */
static void probe(mw_rails_t *g, int i)
{
    struct rail *r = &g->rails[i];
    r->st.state = MW_RAIL_PROBING;
    struct probe *p = mw__calloc(1, sizeof *p);
    mw_future_t *f = p ? mw_read(r->conn, g->probe_buf, 1, &r->remote, 0) : NULL;
    if (!f || mw_future_then(f, on_probed, p) < 0) {
        rail_down(g, i, -ENOMEM, "cannot probe the rail");
        mw__free(p);
        mw_future_unref(f);
        return;
    }
    *p = (struct probe){.g = g, .rail = i, .gen = r->gen};
    g->pending++;
    mw_future_unref(f);           /* the callback runs all the same */
}

/* --- rails ------------------------------------------------------------------ */

static int check_rail(mw_rails_t *g, mw_conn_t *c, const mw_remote_t *rem,
                      mw_conn_stats_t *st)
{
    if (!g || g->freed || !c || !rem || !rem->len)
        return -EINVAL;
    int rc = mw_conn_stats(c, st);
    if (rc < 0)
        return rc;
    if (g->n && (rem->addr != g->region_addr || rem->len != g->region_len))
        return -EINVAL;
    return 0;
}

static void set_conn(mw_rails_t *g, int i, mw_conn_t *c, const mw_remote_t *rem,
                     const mw_conn_stats_t *st)
{
    struct rail *r = &g->rails[i];
    r->conn = c;
    r->remote = *rem;
    r->gen++;
    r->out = 0;
    r->out_bytes = 0;
    snprintf(r->st.device, sizeof r->st.device, "%s", st->device);
    probe(g, i);
}

int mw_rails_new(mw_ctx_t *ctx, size_t slice_bytes, mw_rails_t **out)
{
    if (!ctx || !out || slice_bytes > (1ull << 32))
        return -EINVAL;
    mw_rails_t *g = mw__calloc(1, sizeof *g);
    if (!g || !(g->probe_buf = mw_alloc(ctx, 64))) {
        mw__free(g);
        return -ENOMEM;
    }
    g->ctx = ctx;
    g->slice_bytes = slice_bytes ? slice_bytes : DEFAULT_SLICE;
    g->stall_ms = DEFAULT_STALL_MS;
    mw__list_init(&g->xfers);
    *out = g;
    return 0;
}

int mw_rails_add(mw_rails_t *g, mw_conn_t *c, const mw_remote_t *r)
{
    mw_conn_stats_t st;
    int rc = check_rail(g, c, r, &st);
    if (rc < 0)
        return rc;
    for (int i = 0; i < g->n; i++)
        if (g->rails[i].conn == c)
            return -EINVAL;
    if (g->n == MW_RAILS_MAX)
        return -ENOSPC;
    if (!g->n) {
        g->region_addr = r->addr;
        g->region_len = r->len;
    }
    int i = g->n++;
    set_conn(g, i, c, r, &st);
    return i;
}

int mw_rails_replace(mw_rails_t *g, int rail, mw_conn_t *c, const mw_remote_t *r)
{
    mw_conn_stats_t st;
    int rc = check_rail(g, c, r, &st);
    if (rc < 0)
        return rc;
    if (rail < 0 || rail >= g->n)
        return -ENOENT;
    set_conn(g, rail, c, r, &st);
    return 0;
}

int mw_rails_set_stall(mw_rails_t *g, unsigned ms)
{
    if (!g || g->freed)
        return -EINVAL;
    g->stall_ms = ms;
    stalls_watch(g);
    return 0;
}

int mw_rails_count(const mw_rails_t *g)
{
    return g ? g->n : -EINVAL;
}

int mw_rails_stats(mw_rails_t *g, int rail, mw_rail_stats_t *out)
{
    if (!g || !out)
        return -EINVAL;
    if (rail < 0 || rail >= g->n)
        return -ENOENT;
    check_rails(g);
    *out = g->rails[rail].st;
    return 0;
}

/* --- transfers ---------------------------------------------------------------- */

static void xfer_free(struct gxfer *t)
{
    mw__list_del(&t->link);
    mw_future_unref(t->f);
    mw__free(t->pieces);
    mw__free(t->slices);
    mw__free(t);
}

/* Stop @t: nothing more is posted; slices out are cancelled. */
static void stop(struct gxfer *t, int err, const char *why)
{
    if (t->stopping)
        return;
    t->stopping = true;
    t->err = err;
    snprintf(t->why, sizeof t->why, "%s", why);
    for (size_t i = 0; i < t->nslices; i++)
        if (t->slices[i].f)
            mw_future_cancel(t->slices[i].f);
}

static bool any_rail_left(const mw_rails_t *g)
{
    for (int i = 0; i < g->n; i++)
        if (g->rails[i].st.state != MW_RAIL_DOWN)
            return true;
    return false;
}

/* Complete @t if nothing of it is out and it is done, stopped, or has no
 * rail left.  Return true when it went. */
static bool maybe_finish(struct gxfer *t)
{
    if (t->inflight)
        return false;
    if (!t->left)
        mw_future_resolve(t->f, NULL);
    else if (t->stopping)
        mw_future_fail(t->f, t->err, "%s", t->why);
    else if (!any_rail_left(t->g))
        mw_future_fail(t->f, t->err ? t->err : -ENETDOWN, "no rail left%s%s",
                       t->why[0] ? ": " : "", t->why);
    else
        return false;
    xfer_free(t);
    return true;
}

/* The up rail with room and the fewest bytes out, or -1. */
static int pick_rail(const mw_rails_t *g)
{
    int best = -1;
    for (int i = 0; i < g->n; i++) {
        const struct rail *r = &g->rails[i];
        if (r->st.state == MW_RAIL_UP && r->out < SLICES_PER_RAIL &&
            (best < 0 || r->out_bytes < g->rails[best].out_bytes))
            best = i;
    }
    return best;
}

static void on_slice_done(mw_future_t *f, void *arg);

static int post_slice(struct gxfer *t, struct slice *s, int ri)
{
    mw_rails_t *g = t->g;
    struct rail *r = &g->rails[ri];
    mw_batch_t *b;
    int rc = mw_batch_new(r->conn, t->dir, &r->remote, 1, t->pieces + s->first, s->n, &b, NULL);
    if (rc < 0)
        return rc;
    mw_future_t *f = mw_batch_post(b, NULL);
    mw_batch_free(b);             /* the post holds it */
    if (!f)
        return -errno;
    s->f = f;
    s->rail = ri;
    s->rail_gen = r->gen;
    if (!r->out) {
        r->moved_ms = mw__now_ms();   /* busy from now */
        r->passed = 0;
    }
    r->out++;
    r->out_bytes += s->bytes;
    t->inflight++;
    g->pending++;
    mw__future_then_in(f, &s->cb, on_slice_done, s);
    stalls_watch(g);
    return 0;
}

/* The next slice of @t to post (again first), not yet taken off. */
static struct slice *peek_slice(const struct gxfer *t)
{
    return t->retry ? t->retry : t->next < t->nslices ? &t->slices[t->next] : NULL;
}

static void take_slice(struct gxfer *t, struct slice *s)
{
    if (s == t->retry) {
        t->retry = s->next;
        if (!t->retry)
            t->retry_tail = &t->retry;
    } else {
        t->next++;
    }
}

/* Post what @t can on the rails with room. */
static void feed(struct gxfer *t)
{
    mw_rails_t *g = t->g;
    struct slice *s;
    int ri;
    while (!t->stopping && (s = peek_slice(t)) && (ri = pick_rail(g)) >= 0) {
        int rc = post_slice(t, s, ri);
        if (rc == 0) {
            take_slice(t, s);
        } else if (rc == -EFAULT || rc == -EINVAL || rc == -ERANGE) {
            stop(t, rc, "an entry of the transfer was refused (local memory not registered?)");
        } else {
            char why[120];
            snprintf(why, sizeof why, "posting a slice failed: %s", mw_strerror(rc));
            rail_down(g, ri, rc, why);
        }
    }
}

static void schedule(mw_rails_t *g)
{
    check_rails(g);
    struct gxfer *t;
    mw__list_for_each(t, &g->xfers, link) {
        feed(t);
        maybe_finish(t);
    }
}

static void on_slice_done(mw_future_t *f, void *arg)
{
    struct slice *s = arg;
    struct gxfer *t = s->t;
    mw_rails_t *g = t->g;
    struct rail *r = &g->rails[s->rail];
    int err = mw_future_error(f);
    t->inflight--;
    g->pending--;
    if (s->rail_gen == r->gen) {
        r->out--;
        r->out_bytes -= s->bytes;
    }
    if (!err) {
        r->st.bytes += s->bytes;
        r->st.slices++;
        r->moved_ms = mw__now_ms();
        r->passed = 0;
        for (int j = 0; j < g->n; j++)    /* the others waited while this one moved */
            g->rails[j].passed += j != s->rail && g->rails[j].out;
        t->left--;
    } else if (!t->stopping && (err == -EFAULT || err == -EBUSY)) {
        /* (-EBUSY: the slice may still land late; never post it again) */
        stop(t, err, mw_future_message(f));
    } else if (!t->stopping) {
        if (s->rail_gen == r->gen)
            rail_down(g, s->rail, err, mw_future_message(f));
        r->st.reposted++;
        t->err = err;
        snprintf(t->why, sizeof t->why, "%s", mw_future_message(f));
        s->next = NULL;           /* posted again, on another rail */
        *t->retry_tail = s;
        t->retry_tail = &s->next;
    }
    s->f = NULL;
    mw_future_unref(f);
    schedule(g);
    group_maybe_free(g);
}

static void on_cancel(mw_future_t *f, void *arg)
{
    (void)f;
    struct gxfer *t = arg;
    stop(t, -ECANCELED, "cancelled");
    maybe_finish(t);
}

/* Cut @e into pieces and slices of at most g->slice_bytes. */
static int cut(struct gxfer *t, const mw_batch_entry_t *e, size_t n, uint64_t total)
{
    uint64_t sb = t->g->slice_bytes;
    /* every slice but the last holds sb bytes; a piece ends at an entry's
     * end or a slice's */
    t->pieces = mw__calloc(n + total / sb + 1, sizeof *t->pieces);
    t->slices = mw__calloc(total / sb + 1, sizeof *t->slices);
    if (!t->pieces || !t->slices)
        return -ENOMEM;
    size_t np = 0, ns = 0;
    uint64_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        for (uint64_t off = 0; off < e[i].len;) {
            uint64_t take = e[i].len - off < sb - cur ? e[i].len - off : sb - cur;
            if (cur == 0)
                t->slices[ns++] = (struct slice){.t = t, .first = np};
            t->pieces[np++] = (mw_batch_entry_t){.local = (uint8_t *)e[i].local + off,
                                                 .len = take, .offset = e[i].offset + off};
            t->slices[ns - 1].n++;
            t->slices[ns - 1].bytes += take;
            off += take;
            cur = cur + take == sb ? 0 : cur + take;
        }
    }
    t->nslices = t->left = ns;
    return 0;
}

static int check_entries(const mw_rails_t *g, const mw_batch_entry_t *e, size_t n,
                         uint64_t *total)
{
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!e[i].local || !e[i].len || e[i].remote)
            return -EINVAL;
        if (e[i].offset > g->region_len || e[i].len > g->region_len - e[i].offset)
            return -ERANGE;
        *total += e[i].len;
    }
    return 0;
}

static mw_future_t *start(mw_rails_t *g, mw_dir_t dir, const mw_batch_entry_t *e, size_t n)
{
    if (!g || g->freed) {
        errno = EINVAL;
        return NULL;
    }
    mw_future_t *f = mw_future_new(g->ctx);
    if (!f)
        return NULL;
    uint64_t total;
    int rc = !e || !n || n > MW_BATCH_MAX || (dir != MW_DIR_WRITE && dir != MW_DIR_READ)
                 ? -EINVAL : !g->n ? -ENOTCONN : check_entries(g, e, n, &total);
    struct gxfer *t = rc ? NULL : mw__calloc(1, sizeof *t);
    if (!rc && !t)
        rc = -ENOMEM;
    if (t) {
        *t = (struct gxfer){.g = g, .f = mw_future_ref(f), .dir = dir};
        t->retry_tail = &t->retry;
        mw__list_add_tail(&g->xfers, &t->link);
        if ((rc = cut(t, e, n, total)) < 0)
            xfer_free(t);
    }
    if (rc) {
        mw_future_fail(f, rc, "rails: %s", rc == -ENOTCONN ? "no rail yet"
                       : rc == -ERANGE ? "outside the region" : mw_strerror(rc));
        return f;
    }
    mw__future_on_cancel(f, on_cancel, t);
    check_rails(g);
    feed(t);
    maybe_finish(t);
    return f;
}

mw_future_t *mw_rails_post(mw_rails_t *g, mw_dir_t dir, const mw_batch_entry_t *e, size_t n)
{
    return start(g, dir, e, n);
}

mw_future_t *mw_rails_write(mw_rails_t *g, const void *local, size_t len, uint64_t offset)
{
    mw_batch_entry_t e = {.local = (void *)local, .len = len, .offset = offset};
    return start(g, MW_DIR_WRITE, &e, 1);
}

mw_future_t *mw_rails_read(mw_rails_t *g, void *local, size_t len, uint64_t offset)
{
    mw_batch_entry_t e = {.local = local, .len = len, .offset = offset};
    return start(g, MW_DIR_READ, &e, 1);
}

void mw_rails_free(mw_rails_t *g)
{
    if (!g || g->freed)
        return;
    g->freed = true;
    struct gxfer *t;
    mw__list_for_each(t, &g->xfers, link) {
        stop(t, -ECANCELED, "rail group freed");
        maybe_finish(t);
    }
    group_maybe_free(g);
}
