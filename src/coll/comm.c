/* Creating a communicator, and its connections: a rank connects only to
 * the peers its collectives need, when they first need them -- at
 * creation its two ring neighbours (so every rank's setup is checked
 * against its neighbours', and an abort reaches every rank by flooding),
 * later the peers of each schedule (recursive doubling: log2 n, a ring:
 * none more, alltoall: all).  Of a pair the higher rank connects (retrying
 * while the other starts, up to opts.timeout_ms), the lower accepts; over
 * each connection the two exchange a hello -- who they are, the scratch
 * geometry, and the registered scratch region the other will write into:
 * a 64-byte stub, shared by all peers, until a collective first needs to
 * receive data from that peer; then its scratch is allocated and announced
 * by a message of the hello's format (a barrier's peers never get one).
 * Then one receive stays pending on every connection: with the keepalive
 * it turns a peer's death into a failure of what still needs it.
 * Closing (mw_comm_close) says goodbye to every connected peer and waits
 * for theirs, so no rank leaves while another still writes to it. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "cm/cm.h"
#include "cm/nic.h"
#include "coll/comm.h"
#include "coll/sched.h"
#include "core/alloc.h"
#include "core/ctx.h"
#include "core/future.h"
#include "core/handle.h"

/* The hello names the collectives' wire format: "MWC3" since connections
 * are made on demand and ranks say goodbye; "MWC2" from when data
 * immediates carried slot acks (exec.c); "MWCN" before.  Ranks of two
 * formats would wait for connections never made or misread each other's
 * immediates, so one refuses the other. */
#define HELLO_MAGIC 0x4d574333u   /* "MWC3" */
#define SCRATCH_MAGIC 0x4d574353u /* "MWCS": a hello's later announcement of scratch */
/* Where zero-length writes point before that: smaller than any scratch,
 * so its length tells a stub from a scratch. */
#define STUB_BYTES 64u
static const uint32_t older_magics[] = {
    0x4d574332u,                  /* "MWC2": meshwire before 2026-11-28 */
    0x4d57434eu,                  /* "MWCN": before 2026-11-26 */
};
#define RETRY_MS 200

struct hello {                    /* the first message each way */
    uint32_t magic, rank, nranks, slots, slot_size, algo;
    uint64_t job;                 /* the job's identity: mw__comm_job_id() */
    mw_remote_t scratch;
};

void mw_comm_opts_init(mw_comm_opts_t *o)
{
    *o = (mw_comm_opts_t){.timeout_ms = 60000, .slot_size = 1u << 20, .slots = 4};
    mw_conn_opts_init(&o->conn);
    /* Only hellos travel as messages (the data goes by writes into the
     * scratch): 4 KiB receive slots, not the 64 KiB a connection's
     * messages get, save 1.9 MiB of registered memory per peer. */
    o->conn.slot_size = 4096;
}

struct mw__comm *mw__comm_of(const mw_comm_t *h, const char *fn, int *err)
{
    return mw__handle_get(MW__HANDLE(h), MW__H_COMM, fn, err);
}

static mw_comm_t *handle_of(const struct mw__comm *comm)
{
    return MW__HANDLE_PTR(mw_comm_t, comm->h);
}

int mw_comm_rank(const mw_comm_t *h)
{
    int err;
    struct mw__comm *comm = mw__comm_of(h, __func__, &err);
    return comm ? comm->rank : err;
}

int mw_comm_size(const mw_comm_t *h)
{
    int err;
    struct mw__comm *comm = mw__comm_of(h, __func__, &err);
    return comm ? comm->nranks : err;
}

static size_t scratch_bytes(const struct mw__comm *comm);

int mw_comm_stats(const mw_comm_t *h, mw_comm_stats_t *st)
{
    int err;
    struct mw__comm *comm = mw__comm_of(h, __func__, &err);
    if (!comm || !st)
        return comm ? -EINVAL : err;
    *st = (mw_comm_stats_t){.collectives = comm->colls_done,
                            .collective_failures = comm->colls_failed};
    for (int r = 0; r < comm->nranks; r++) {
        const struct mw__peer *p = &comm->peers[r];
        st->connections += p->ready && (!p->gone || p->said_bye);   /* not lost */
        st->scratch_bytes += p->scratch ? scratch_bytes(comm) : 0;
    }
    return 0;
}

static void release(struct mw__comm *comm);

void mw__comm_fail(struct mw__comm *comm, int err, const char *fmt, ...)
{
    if (!comm->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(comm->why, sizeof comm->why, fmt, ap);
        va_end(ap);
        comm->err = err;
        /* freed by its owner, or a peer that left: ordinary ends */
        bool ordinary = err == -ECANCELED || err == -ECONNRESET;
        MW_LOG(comm->ctx, ordinary ? MW_LOG_INFO : MW_LOG_WARN, "communicator rank %d/%d: %s",
               comm->rank, comm->nranks, comm->why);
    }
    mw__coll_fail_all(comm, err, comm->why);
    if (comm->create_f) {         /* nobody will ever own it: let go */
        mw_future_fail(comm->create_f, err, "rank %d: %s", comm->rank, comm->why);
        mw_future_unref(comm->create_f);
        comm->create_f = NULL;
        release(comm);
    } else if (comm->close_f) {   /* broken: nobody waits for its goodbyes */
        mw__comm_close_progress(comm);
    }
}

/* --- lifetime ------------------------------------------------------------ */

/* Callbacks of connects, hellos and watches may come after the owner freed
 * the communicator (or after its creation failed): each holds a reference,
 * and finds mw__comm_freed(). */
void mw__comm_ref(struct mw__comm *comm)
{
    comm->refs++;
}

void mw__comm_unref(struct mw__comm *comm)
{
    if (--comm->refs > 0)
        return;
    for (int r = 0; r < comm->nranks; r++) {
        mw_free(comm->ctx, comm->peers[r].scratch);
        mw__free(comm->peers[r].imm);
    }
    if (comm->deadline)
        event_free(comm->deadline);
    mw_free(comm->ctx, comm->stub);
    for (int r = 0; comm->addrs && r < comm->nranks; r++)
        mw__free(comm->addrs[r]);
    mw__free(comm->addrs);
    mw__free(comm->peers);
    mw__free(comm);
}

/* --- liveness ------------------------------------------------------------ */

void mw__peer_gone(struct mw__peer *p, int err, const char *why)
{
    if (!p->gone) {
        p->gone = err ? err : -ECONNRESET;
        snprintf(p->gone_why, sizeof p->gone_why, "rank %d: %s", p->rank, why);
        MW_LOG(p->comm->ctx, MW_LOG_INFO, "communicator rank %d: %s", p->comm->rank, p->gone_why);
    }
    if (!mw__comm_freed(p->comm))
        mw__coll_advance(p->comm);
}

void mw__peer_said_bye(struct mw__peer *p)
{
    p->said_bye = true;
    mw__peer_gone(p, -ECONNRESET, "closed the communicator");
}

struct mw__watch {
    struct mw__peer *p;           /* NULL once the communicator let go */
    mw_future_t *f;
    struct mw__cb cb;
};

static void watch(struct mw__peer *p);
static bool take_scratch(struct mw__peer *p, const mw_msg_t *m);

/* The one message that travels after the hello is the peer's scratch
 * announcement: another means the peer broke the protocol; a failed
 * receive, that the connection is gone. */
static void on_watch(mw_future_t *f, void *arg)
{
    struct mw__watch *w = arg;
    struct mw__peer *p = w->p;
    if (p) {
        p->watch = NULL;
        if (mw_future_state(f) != MW_FUTURE_DONE)
            mw__peer_gone(p, mw_future_error(f), mw_future_message(f));
        else if (!take_scratch(p, mw_future_value(f)))
            mw__comm_abort(p->comm, MW__ABORT_MISMATCH, p->rank, -EPROTO,
                           "rank %d sent an unexpected message", p->rank);
    }
    if (mw_future_state(f) == MW_FUTURE_DONE)
        mw_msg_free(mw_future_value(f));
    mw_future_unref(f);
    mw__free(w);
}

static void watch(struct mw__peer *p)
{
    struct mw__watch *w = mw__malloc(sizeof *w);
    mw_future_t *f = w ? mw_recv(p->conn) : NULL;
    if (!f || mw_future_error(f) == -ENOMEM) {   /* its loss would go unseen */
        if (f)
            mw_future_unref(f);
        mw__free(w);
        mw__peer_gone(p, -ENOMEM, "no memory to watch the connection");
        return;
    }
    *w = (struct mw__watch){.p = p, .f = f};
    mw__future_then_in(f, &w->cb, on_watch, w);
    p->watch = w;
}

/* --- hello --------------------------------------------------------------- */

static size_t scratch_bytes(const struct mw__comm *comm)
{
    return (size_t)comm->opts.slots * comm->opts.slot_size;
}

/* A hello on its way: it lives until its send is done. */
struct hello_out {
    struct hello m;
    struct mw__cb sent;
};

static void on_hello_sent(mw_future_t *f, void *arg)
{
    (void)f;
    mw__free(arg);
}

/* Our hello (or, with SCRATCH_MAGIC, our scratch announcement) on @c,
 * with the region @c's peer writes into: @p's scratch, else the stub (no
 * peer: none, only to tell a peer that disagrees what we are). */
static int send_hello(struct mw__comm *comm, mw_conn_t *c, struct mw__peer *p, uint32_t magic)
{
    struct hello_out *o = mw__malloc(sizeof *o);
    if (!o)
        return -ENOMEM;
    o->m = (struct hello){.magic = magic, .rank = (uint32_t)comm->rank,
                          .nranks = (uint32_t)comm->nranks, .slots = comm->opts.slots,
                          .slot_size = comm->opts.slot_size,
                          .algo = (uint32_t)comm->allreduce_algo, .job = comm->job};
    int rc = !p            ? 0
             : p->scratch ? mw_mem_export(c, p->scratch, scratch_bytes(comm), &o->m.scratch)
                          : mw_mem_export(c, comm->stub, STUB_BYTES, &o->m.scratch);
    if (p && p->scratch && !rc)
        p->scratch_sent = true;
    mw_future_t *f = rc ? NULL : mw_send(c, &o->m, sizeof o->m);
    if (!f) {
        mw__free(o);
        return rc ? rc : -ENOMEM;
    }
    rc = mw_future_error(f) == -ENOMEM ? -ENOMEM : 0;
    if (rc)                       /* refused at once: no hello will go */
        mw__free(o);
    else                          /* a failure of the connection is seen by the receive */
        mw__future_then_in(f, &o->sent, on_hello_sent, o);
    mw_future_unref(f);
    return rc;
}

/* What is wrong with a peer's hello, or NULL.  *@ours: it is a rank of this
 * communicator, set up differently (the job is misconfigured, not a
 * stranger at our port). */
static const char *check_hello(const struct mw__comm *comm, const mw_msg_t *m, int expect_rank,
                               bool *ours)
{
    const struct hello *h = m->data;
    *ours = false;
    for (size_t i = 0; m->len == sizeof *h && i < sizeof older_magics / sizeof *older_magics; i++)
        if (h->magic == older_magics[i])
            return "a rank of an older meshwire (its collectives' wire format differs: run one "
                   "version on every rank)";
    if (m->len != sizeof *h || h->magic != HELLO_MAGIC)
        return "not a communicator hello";
    if (h->job != comm->job)      /* a stale rank of an earlier run, another job */
        return "a rank of another job (MW_JOB or the launcher's job id differs)";
    if ((int)h->nranks != comm->nranks)
        return "nranks differs";
    if (expect_rank >= 0 ? (int)h->rank != expect_rank
                         : ((int)h->rank <= comm->rank || (int)h->rank >= comm->nranks))
        return "unexpected rank";
    *ours = true;
    if (h->slots != comm->opts.slots || h->slot_size != comm->opts.slot_size)
        return "scratch geometry differs";
    if ((int)h->algo != comm->allreduce_algo)
        return "MW_ALLREDUCE_ALGO differs";
    if (h->scratch.len < STUB_BYTES)
        return "scratch too small";
    return NULL;
}

static bool is_ring_neighbour(const struct mw__comm *comm, int r)
{
    int n = comm->nranks;
    return r != comm->rank && (r == (comm->rank + 1) % n || r == (comm->rank + n - 1) % n);
}

static void peer_ready(struct mw__peer *p, const struct hello *h)
{
    struct mw__comm *comm = p->comm;
    p->remote = h->scratch;
    p->remote_full = h->scratch.len >= scratch_bytes(comm);
    p->ready = true;
    watch(p);
    if (p->gone) {                /* what needs it fails; at creation, everything */
        if (comm->create_f)
            mw__comm_fail(comm, p->gone, "%s", p->gone_why);
        return;
    }
    comm->ready++;
    if (is_ring_neighbour(comm, p->rank) && --comm->ring_left == 0 && comm->create_f) {
        event_del(comm->deadline);
        mw_future_t *f = comm->create_f;
        comm->create_f = NULL;
        MW_LOG(comm->ctx, MW_LOG_INFO, "communicator rank %d/%d ready", comm->rank, comm->nranks);
        mw_future_resolve(f, handle_of(comm));
        mw_future_unref(f);
    }
    mw__coll_advance(comm);       /* a collective may have waited for it */
}

/* The peer's scratch announcement: where its scratch for us is now. */
static bool take_scratch(struct mw__peer *p, const mw_msg_t *m)
{
    const struct hello *h = m->data;
    if (m->len != sizeof *h || h->magic != SCRATCH_MAGIC || (int)h->rank != p->rank ||
        h->job != p->comm->job || h->scratch.len < scratch_bytes(p->comm))
        return false;
    p->remote = h->scratch;
    p->remote_full = true;
    watch(p);
    mw__coll_advance(p->comm);    /* a step may wait to write to it */
    return true;
}

void mw__comm_need_scratch(struct mw__comm *comm, int r)
{
    struct mw__peer *p = &comm->peers[r];
    if (!p->scratch && !(p->scratch = mw_alloc(comm->ctx, scratch_bytes(comm)))) {
        mw__comm_abort(comm, MW__ABORT_LOCAL, comm->rank, -ENOMEM,
                       "no memory for rank %d's scratch", r);
        return;
    }
    /* Not yet connected: its hello will carry it. */
    if (p->ready && !p->gone && !p->scratch_sent &&
        send_hello(comm, p->conn, p, SCRATCH_MAGIC) < 0)
        mw__comm_abort(comm, MW__ABORT_LOCAL, comm->rank, -ENOMEM,
                       "cannot announce rank %d's scratch", r);
}

static int alloc_peer(struct mw__comm *comm, int r, mw_conn_t *c)
{
    struct mw__peer *p = &comm->peers[r];
    if (p->conn)
        return -EEXIST;
    p->conn = c;
    p->scratch_sent = false;      /* an attempt that was dropped sent it to nobody */
    if (!p->imm)
        p->imm = mw__calloc(comm->opts.slots, sizeof *p->imm);
    if (!p->imm)
        return -ENOMEM;
    /* Now, not when its hello is read: the peer may finish creating the
     * communicator and write its first chunk right after its hello, and
     * that chunk must find the handler. */
    mw_conn_on_imm(c, mw__comm_on_imm, p);
    return 0;
}

/* --- the ranks above: they connect to us --------------------------------- */

struct accepting {
    struct mw__comm *comm;
    mw_conn_t *conn;
    struct mw__cb hello;
};

struct refusal {
    struct mw__comm *comm;
    int rank;
    const char *why;              /* a literal of check_hello */
    struct mw__cb closed;
};

static void on_refusal_closed(mw_future_t *f, void *arg)
{
    struct refusal *x = arg;
    mw__comm_fail(x->comm, -EPROTO, "rank %d: %s", x->rank, x->why);
    mw__comm_unref(x->comm);
    mw_future_unref(f);
    mw__free(x);
}

/* Our hello tells rank @r why; we fail only once the close delivered it
 * (or gave up), so an owner that tears its context down at our failure
 * cannot take the answer off the wire before the peer has it. */
static void refuse_own_rank(struct mw__comm *comm, mw_conn_t *c, int r, const char *why)
{
    mw__comm_tell_abort(comm, MW__ABORT_MISMATCH, r);   /* ranks connected to us fail too */
    struct refusal *x = mw__malloc(sizeof *x);
    mw_future_t *closed = x && send_hello(comm, c, NULL, HELLO_MAGIC) == 0 ? mw_conn_close(c)
                                                                          : NULL;
    if (!closed) {
        mw__free(x);
        mw_conn_abort(c);
        mw__comm_fail(comm, -EPROTO, "rank %d: %s", r, why);
        return;
    }
    *x = (struct refusal){.comm = comm, .rank = r, .why = why};
    mw__comm_ref(comm);
    mw__future_then_in(closed, &x->closed, on_refusal_closed, x);
}

static void on_accepted_hello(mw_future_t *f, void *arg)
{
    struct accepting *a = arg;
    struct mw__comm *comm = a->comm;
    mw_msg_t *m = mw_future_state(f) == MW_FUTURE_DONE ? mw_future_value(f) : NULL;
    bool ours = false;
    const char *bad = mw__comm_freed(comm) ? "communicator gone"
                      : comm->byes_sent    ? "communicator closed"
                      : m                  ? check_hello(comm, m, -1, &ours)
                                           : "no hello";
    int r = m ? (int)((struct hello *)m->data)->rank : -1;
    if (!bad && alloc_peer(comm, r, a->conn) < 0)
        bad = "duplicate rank or no memory";
    if (bad && ours) {
        /* A rank of ours, set up otherwise: tell it what we are (it fails
         * with the reason too), and nobody can go on. */
        refuse_own_rank(comm, a->conn, r, bad);
    } else if (bad) {
        MW_LOG(comm->ctx, MW_LOG_WARN, "communicator rank %d: refused a peer: %s", comm->rank, bad);
        mw_conn_abort(a->conn);
    } else if (send_hello(comm, a->conn, &comm->peers[r], HELLO_MAGIC) < 0) {
        mw__comm_fail(comm, -ENOMEM, "cannot answer rank %d", r);
    } else {
        peer_ready(&comm->peers[r], m->data);
    }
    mw_msg_free(m);
    mw_future_unref(f);
    mw__free(a);
    mw__comm_unref(comm);
}

static void on_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    struct mw__comm *comm = arg;
    struct accepting *a = mw__malloc(sizeof *a);
    mw_future_t *f = a ? mw_recv(c) : NULL;
    if (!f) {
        mw__free(a);
        mw_conn_abort(c);
        return;
    }
    *a = (struct accepting){.comm = comm, .conn = c};
    mw__comm_ref(comm);
    mw__future_then_in(f, &a->hello, on_accepted_hello, a);
}

/* --- the ranks below: we connect to them when needed ---------------------- */

struct mw__connecting {
    struct mw__comm *comm;
    int rank;
    uint64_t give_up_ms;          /* mw__now_ms() past which it is not retried */
    struct event *retry;
    struct mw__list link;         /* in comm->retrying while its timer is armed */
    struct mw__cb connected;
};

static int try_connect(struct mw__connecting *k);

/* The attempt is over: let go of its record and its reference. */
static void drop_connecting(struct mw__connecting *k)
{
    struct mw__comm *comm = k->comm;
    comm->peers[k->rank].dialing = false;
    event_free(k->retry);
    mw__free(k);
    mw__comm_unref(comm);
}

/* Refused, or dropped before its hello: whoever listens there is not (yet)
 * this rank -- it is starting, or a process of another job refuses us.
 * Again shortly, until the attempt's deadline; then the rank is gone (at
 * creation the communicator's deadline, as long, reports it). */
static void retry_or_give_up(struct mw__connecting *k, const char *why)
{
    struct mw__comm *comm = k->comm;
    if (mw__now_ms() < k->give_up_ms && !comm->err) {
        MW_LOG(comm->ctx, MW_LOG_DEBUG, "rank %d: %s; retrying", k->rank, why);
        mw__list_add_tail(&comm->retrying, &k->link);
        struct timeval tv = {0, RETRY_MS * 1000};
        mw__ev_add(comm->ctx, k->retry, &tv);
        return;
    }
    struct mw__peer *p = &comm->peers[k->rank];
    char msg[200];
    snprintf(msg, sizeof msg, "no connection within %u ms: %s", comm->opts.timeout_ms, why);
    drop_connecting(k);
    mw__peer_gone(p, -ETIMEDOUT, msg);
}

static void on_peer_hello(mw_future_t *f, void *arg)
{
    struct mw__peer *p = arg;
    struct mw__comm *comm = p->comm;
    struct mw__connecting *k = p->connecting;
    p->connecting = NULL;
    mw_msg_t *m = mw_future_state(f) == MW_FUTURE_DONE ? mw_future_value(f) : NULL;
    bool ours;
    const char *bad = m ? check_hello(comm, m, p->rank, &ours) : mw_future_message(f);
    if (mw__comm_freed(comm)) {
        drop_connecting(k);
    } else if (!m) {
        mw_conn_abort(p->conn);
        p->conn = NULL;
        comm->dropped = true;
        retry_or_give_up(k, "dropped before its hello");
    } else {
        drop_connecting(k);
        if (bad)
            mw__comm_abort(comm, MW__ABORT_MISMATCH, p->rank, -EPROTO, "rank %d: %s", p->rank,
                           bad);
        else
            peer_ready(p, m->data);
    }
    mw_msg_free(m);
    mw_future_unref(f);
    mw__comm_unref(comm);
}

static void on_connected(mw_future_t *f, void *arg)
{
    struct mw__connecting *k = arg;
    struct mw__comm *comm = k->comm;
    bool ok = mw_future_state(f) == MW_FUTURE_DONE;
    if (ok && mw__comm_freed(comm)) {
        mw_conn_abort(mw_future_value(f));
    } else if (ok) {
        mw_conn_t *c = mw_future_value(f);
        struct mw__peer *p = &comm->peers[k->rank];
        mw_future_t *h = NULL;
        if (alloc_peer(comm, k->rank, c) < 0 || send_hello(comm, c, p, HELLO_MAGIC) < 0 ||
            !(h = mw_recv(c))) {
            mw__comm_fail(comm, -ENOMEM, "cannot greet rank %d", k->rank);
        } else {                  /* the attempt lives on until the hello is in */
            p->connecting = k;
            mw__comm_ref(comm);
            mw__future_then_in(h, &p->hello, on_peer_hello, p);
            mw_future_unref(f);
            return;
        }
    } else if (!mw__comm_freed(comm)) {   /* not up yet, perhaps */
        retry_or_give_up(k, mw_future_message(f));
        mw_future_unref(f);
        return;
    }
    mw_future_unref(f);
    drop_connecting(k);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct mw__connecting *k = arg;
    mw__list_del(&k->link);
    if (try_connect(k) < 0) {
        mw__comm_fail(k->comm, -ENOMEM, "cannot connect to rank %d: no memory", k->rank);
        drop_connecting(k);
    }
}

/* A freed communicator retries nothing; a timer armed at the context's
 * teardown would never fire to let go of its record. */
static void drop_retries(struct mw__comm *comm)
{
    while (!mw__list_empty(&comm->retrying)) {
        struct mw__connecting *k = mw__container_of(comm->retrying.next, struct mw__connecting, link);
        mw__list_del(&k->link);
        drop_connecting(k);       /* the owner's reference is still held */
    }
}

static int try_connect(struct mw__connecting *k)
{
    mw_future_t *f = mw_connect(k->comm->ctx, k->comm->addrs[k->rank], &k->comm->opts.conn);
    if (!f)
        return -ENOMEM;
    mw__future_then_in(f, &k->connected, on_connected, k);
    return 0;
}

static int dial(struct mw__comm *comm, int r)
{
    struct mw__connecting *k = mw__calloc(1, sizeof *k);
    if (!k)
        return -ENOMEM;
    *k = (struct mw__connecting){.comm = comm, .rank = r,
                                 .give_up_ms = mw__now_ms() + comm->opts.timeout_ms};
    if (!(k->retry = evtimer_new(comm->ctx->base, on_retry, k))) {
        mw__free(k);
        return -ENOMEM;
    }
    mw__comm_ref(comm);
    comm->peers[r].dialing = true;
    if (try_connect(k) < 0) {
        drop_connecting(k);
        return -ENOMEM;
    }
    return 0;
}

void mw__comm_need(struct mw__comm *comm, int r)
{
    struct mw__peer *p = &comm->peers[r];
    if (r >= comm->rank || p->conn || p->dialing || p->gone || comm->err)
        return;
    if (dial(comm, r) < 0)
        mw__peer_gone(p, -ENOMEM, "no memory to connect to it");
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct mw__comm *comm = arg;
    char missing[96] = "";
    for (int r = 0; r < comm->nranks; r++)
        if (is_ring_neighbour(comm, r) && !comm->peers[r].ready)
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %d", r);
    mw__comm_fail(comm, -ETIMEDOUT, "after %u ms still missing ranks:%s%s", comm->opts.timeout_ms,
                  missing, comm->dropped ? " (dropped before their hello: whoever listens "
                                           "there is of another job, or not up)" : "");
}

/* Where this rank listens: every local address, on its entry's port. */
static int own_listen_addr(const char *entry, unsigned dflt, char *buf, size_t cap)
{
    uint16_t port = 0;
    bool v6 = false;
    int rc = mw__addr_list_port(entry, (uint16_t)dflt, &port, &v6); /* only -ENOMEM now */
    snprintf(buf, cap, v6 ? "[::]:%u" : "*:%u", (unsigned)port);
    return rc;
}

/* Keep every rank's entry (a collective may need any of them later), listen,
 * and dial the ring neighbours below us; those above dial us. */
static int start(struct mw__comm *comm, const char *const *peers)
{
    if (!(comm->addrs = mw__calloc(comm->nranks, sizeof *comm->addrs)) ||
        !(comm->stub = mw_alloc(comm->ctx, STUB_BYTES)))
        return -ENOMEM;
    for (int r = 0; r < comm->nranks; r++)
        if (!(comm->addrs[r] = mw__strdup(peers[r])))
            return -ENOMEM;
    char la[64];
    int rc = own_listen_addr(peers[comm->rank], comm->opts.conn.default_port, la, sizeof la);
    if (rc == 0)
        rc = mw_listen(comm->ctx, la, &comm->opts.conn, on_accept, comm, &comm->listener);
    if (rc < 0)
        return rc;
    for (int r = 0; r < comm->nranks; r++)
        if (is_ring_neighbour(comm, r)) {
            comm->ring_left++;
            mw__comm_need(comm, r);
        }
    struct timeval tv = {comm->opts.timeout_ms / 1000, (comm->opts.timeout_ms % 1000) * 1000};
    return mw__ev_add(comm->ctx, comm->deadline, &tv);
}

/* --- the layer: communicators not yet freed ------------------------------- */

struct colls {
    struct mw__list comms;
};

static void comm_close(struct mw__comm *comm, const char *why)
{
    mw__comm_ref(comm);           /* failing a creation releases it already */
    mw__comm_fail(comm, -ECANCELED, "%s", why);
    if (!mw__comm_freed(comm))
        release(comm);
    mw__comm_unref(comm);
}

static void colls_teardown(mw_ctx_t *ctx, void *state)
{
    struct colls *cl = state;
    while (!mw__list_empty(&cl->comms))       /* release() unlinks each */
        comm_close(mw__container_of(cl->comms.next, struct mw__comm, link), "context closed");
    mw__free(cl);
    ctx->layers[MW__LAYER_COLL] = (struct mw__layer){0};
}

static void colls_metrics(mw_ctx_t *ctx, void *state, struct mw__metrics *m)
{
    (void)ctx;
    mw__coll_metrics(&((struct colls *)state)->comms, m);
}

static struct colls *colls_get(mw_ctx_t *ctx)
{
    struct colls *cl = ctx->layers[MW__LAYER_COLL].state;
    if (!cl && (cl = mw__calloc(1, sizeof *cl))) {
        mw__list_init(&cl->comms);
        ctx->layers[MW__LAYER_COLL] = (struct mw__layer){.state = cl, .teardown = colls_teardown,
                                                         .metrics = colls_metrics};
    }
    return cl;
}

/* A communicator with its owner's reference and handle, in the layer's list. */
static struct mw__comm *comm_new(mw_ctx_t *ctx, int rank, int nranks, const mw_comm_opts_t *opts)
{
    struct colls *cl = colls_get(ctx);
    struct mw__comm *comm = cl ? mw__calloc(1, sizeof *comm) : NULL;
    if (!comm || !(comm->peers = mw__calloc(nranks, sizeof *comm->peers)) ||
        !(comm->h = mw__handle_new(MW__H_COMM, comm, mw__loop_thread(ctx)))) {
        if (comm)
            mw__free(comm->peers);
        mw__free(comm);
        return NULL;
    }
    comm->ctx = ctx;
    comm->refs = 1;               /* the owner's, once the future hands it over */
    comm->rank = rank;
    comm->nranks = nranks;
    if (opts)
        comm->opts = *opts;
    else
        mw_comm_opts_init(&comm->opts);
    mw__list_init(&comm->colls);
    mw__list_init(&comm->retrying);
    mw__list_add_tail(&cl->comms, &comm->link);
    for (int r = 0; r < nranks; r++)
        comm->peers[r] = (struct mw__peer){.comm = comm, .rank = r};
    return comm;
}

/* MW_ALLREDUCE_ALGO=ring|rd|direct forces allreduce's algorithm (for
 * measuring the switch point); read once, here, and part of the hello. */
static int allreduce_algo_from_env(int *algo)
{
    const char *a = getenv("MW_ALLREDUCE_ALGO");
    *algo = !a || !*a              ? MW__ALGO_AUTO
            : !strcmp(a, "ring")   ? MW__ALGO_RING
            : !strcmp(a, "rd")     ? MW__ALGO_RECURSIVE_DOUBLING
            : !strcmp(a, "direct") ? MW__ALGO_DIRECT
                                   : -1;
    return *algo < 0 ? -EINVAL : 0;
}

/* The job a communicator belongs to: opts->job, else MW_JOB, else the
 * launcher's job id (Slurm's job and step, torchrun's run id, PMIx's
 * namespace, Open MPI's job id), hashed (FNV-1a).  Ranks of one job agree;
 * a process left over from an earlier run under another id is refused,
 * not taken for a rank.  Without any of them every job is job "". */
static uint64_t fnv(uint64_t h, const char *s)
{
    for (; s && *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return (h ^ 0xff) * 1099511628211ull;      /* a separator */
}

uint64_t mw__comm_job_id(const mw_comm_opts_t *opts)
{
    static const char *const launcher[] = {"SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID",
                                           "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"};
    uint64_t h = 14695981039346656037ull;
    const char *own = opts && opts->job ? opts->job : getenv("MW_JOB");
    if (own)
        return fnv(h, own);
    for (size_t i = 0; i < sizeof launcher / sizeof *launcher; i++)
        h = fnv(h, getenv(launcher[i]));
    return h;
}

/* A creation cancelled or timed out is torn down: connections closed,
 * the listener (and its port) freed, the communicator gone. */
static void create_cancel(mw_future_t *f, void *arg)
{
    (void)f;
    comm_close(arg, "creation cancelled or timed out");
}

/* What a communicator can work with: slots that hold whole, aligned
 * elements of every type (a multiple of 4 KiB), a slot count the 24-bit
 * acks and the receive bookkeeping can carry, a deadline, connection
 * options in range.  NULL, or why not. */
static const char *bad_opts(const mw_comm_opts_t *o)
{
    if (!o)
        return NULL;
    if (o->slot_size < MW__COMM_SLOT_MIN || o->slot_size > MW__COMM_SLOT_MAX ||
        o->slot_size % MW__COMM_SLOT_MIN)
        return "opts->slot_size must be a multiple of 4 KiB, 4 KiB to 256 MiB";
    if (o->slots < 1 || o->slots > MW__COMM_SLOTS_MAX)
        return "opts->slots must be 1 to 1024";
    if (o->timeout_ms < 1)
        return "opts->timeout_ms must be at least 1";
    if (mw__conn_opts_check(&o->conn) < 0)
        return "opts->conn has a field out of its range (see mw_conn_opts_t)";
    return NULL;
}

mw_future_t *mw_comm_create(mw_ctx_t *ctx, int rank, int nranks, const char *const *peers,
                            const mw_comm_opts_t *opts)
{
    mw_future_t *f = ctx ? mw_future_new(ctx) : NULL;
    if (!f)
        return NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks || !peers) {
        mw_future_fail(f, -EINVAL, "bad rank %d of %d or no peer list", rank, nranks);
        return f;
    }
    const char *why = bad_opts(opts);
    if (why) {
        mw_future_fail(f, -EINVAL, "%s", why);
        return f;
    }
    unsigned dflt = opts ? opts->conn.default_port : MW_DEFAULT_PORT;
    for (int r = 0; r < nranks; r++) {
        uint16_t port;
        bool v6;
        if (!peers[r] || !*peers[r]) {
            mw_future_fail(f, -EINVAL, "no address for rank %d", r);
            return f;
        }
        int bad = dflt > 65535 ? -EINVAL : mw__addr_list_port(peers[r], (uint16_t)dflt, &port, &v6);
        if (bad == -ENOMEM) {
            mw_future_fail(f, -ENOMEM, "no memory");
            return f;
        }
        if (bad < 0) {
            mw_future_fail(f, -EINVAL, "rank %d's entry \"%s\" is malformed or names two "
                           "ports (one port per rank: \"ADDR[,ADDR...][:PORT]\")", r, peers[r]);
            return f;
        }
    }
    int algo;
    if (allreduce_algo_from_env(&algo) < 0) {
        mw_future_fail(f, -EINVAL, "MW_ALLREDUCE_ALGO=%s: ring, rd or direct",
                       getenv("MW_ALLREDUCE_ALGO"));
        return f;
    }
    struct mw__comm *comm = comm_new(ctx, rank, nranks, opts);
    if (!comm) {
        mw_future_fail(f, -ENOMEM, "no memory");
        return f;
    }
    comm->allreduce_algo = algo;
    comm->job = mw__comm_job_id(opts);
    comm->opts.job = NULL;        /* the caller's string: read, not kept */
    if (nranks == 1) {
        mw_future_resolve(f, handle_of(comm));
        return f;
    }
    comm->create_f = mw_future_ref(f);
    mw__future_on_cancel(f, create_cancel, comm);
    comm->deadline = evtimer_new(ctx->base, on_deadline, comm);
    int rc = comm->deadline ? start(comm, peers) : -ENOMEM;
    if (rc < 0)
        mw__comm_fail(comm, rc, "cannot start: %s", mw_strerror(rc));
    return f;
}

/* A peer's connection is gone: nothing can write into its scratch now. */
static void on_peer_closed(mw_future_t *f, void *arg)
{
    (void)f;
    mw__comm_unref(arg);
}

/* Let go of the mesh: connections aborted (their callbacks unhooked first),
 * the owner's reference dropped; callbacks still in flight hold their own. */
static void release(struct mw__comm *comm)
{
    mw__handle_release(comm->h);  /* the owner's handle stops matching */
    comm->h = 0;                  /* and so mw__comm_freed() */
    mw__list_del(&comm->link);
    drop_retries(comm);
    for (int r = 0; r < comm->nranks; r++) {
        struct mw__peer *p = &comm->peers[r];
        if (p->watch) {
            p->watch->p = NULL;
            p->watch = NULL;
        }
        if (p->conn) {            /* graceful: our last acks still go out */
            mw_conn_on_imm(p->conn, NULL, NULL);
            mw_future_t *closed = mw_conn_close(p->conn);
            if (closed) {         /* the scratch it writes into stays until it is gone */
                mw__comm_ref(comm);
                mw__future_then_in(closed, &p->closed, on_peer_closed, comm);
                mw_future_unref(closed);
            }
        }
        p->conn = NULL;
    }
    if (comm->deadline)
        event_del(comm->deadline);
    if (comm->listener)           /* now: the context may go before the last ref */
        mw_listener_free(comm->listener);
    comm->listener = NULL;
    mw__comm_unref(comm);
}

/* --- closing together ------------------------------------------------------ */

static void close_done(struct mw__comm *comm)
{
    mw_future_t *f = comm->close_f;
    comm->close_f = NULL;
    MW_LOG(comm->ctx, MW_LOG_INFO, "communicator rank %d/%d closed%s%s", comm->rank,
           comm->nranks, comm->err ? " broken: " : "", comm->err ? comm->why : "");
    release(comm);
    mw_future_resolve(f, NULL);
    mw_future_unref(f);
}

static void send_byes(struct mw__comm *comm)
{
    comm->byes_sent = true;
    for (int r = 0; r < comm->nranks; r++) {
        struct mw__peer *p = &comm->peers[r];
        if (p->conn && p->ready && (!p->gone || p->said_bye) && !mw__comm_send_bye(p)) {
            mw__comm_fail(comm, -ENOMEM, "cannot say goodbye to rank %d: no memory", r);
            return;
        }
    }
}

static bool byes_all_in(const struct mw__comm *comm)
{
    for (int r = 0; r < comm->nranks; r++)
        if (comm->peers[r].ready && !comm->peers[r].gone)
            return false;
    return true;
}

void mw__comm_close_progress(struct mw__comm *comm)
{
    if (!comm->close_f || mw__comm_freed(comm))
        return;
    if (!comm->err && !mw__list_empty(&comm->colls))
        return;                   /* the collectives issued before it first */
    if (!comm->err && !comm->byes_sent)
        send_byes(comm);
    if (comm->err || byes_all_in(comm))
        close_done(comm);
}

/* An impatient caller: leave now, as mw_comm_free does. */
static void close_cancel(mw_future_t *f, void *arg)
{
    (void)f;
    struct mw__comm *comm = arg;
    mw_future_unref(comm->close_f);
    comm->close_f = NULL;
    comm_close(comm, "close cancelled or timed out");
}

mw_future_t *mw_comm_close(mw_comm_t *h)
{
    int err;
    struct mw__comm *comm = mw__comm_of(h, __func__, &err);
    if (!comm) {
        errno = -err;
        return NULL;
    }
    mw_future_t *f = mw_future_new(comm->ctx);
    if (!f)
        return NULL;
    if (comm->close_f) {
        mw_future_fail(f, -EALREADY, "the communicator is already closing");
        return f;
    }
    comm->close_f = mw_future_ref(f);
    mw__future_on_cancel(f, close_cancel, comm);
    mw__comm_close_progress(comm);
    return f;
}

/* --- shrinking ------------------------------------------------------------ */

/* What is wrong with an exclusion list for @comm, or NULL. */
static const char *bad_exclusion(const struct mw__comm *comm, const int *exclude, int nexclude)
{
    if (nexclude < 0 || nexclude >= comm->nranks || (nexclude && !exclude))
        return "nexclude must be 0 to nranks - 1, with a list";
    for (int i = 0; i < nexclude; i++) {
        if (exclude[i] < 0 || exclude[i] >= comm->nranks)
            return "an excluded rank is out of range";
        if (exclude[i] == comm->rank)
            return "this rank is in its own exclusion list";
        for (int j = 0; j < i; j++)
            if (exclude[j] == exclude[i])
                return "a rank is excluded twice";
    }
    return NULL;
}

static bool excluded(const int *exclude, int nexclude, int r)
{
    for (int i = 0; i < nexclude; i++)
        if (exclude[i] == r)
            return true;
    return false;
}

mw_future_t *mw_comm_shrink(mw_comm_t *h, const int *exclude, int nexclude,
                            const mw_comm_opts_t *opts)
{
    int err;
    struct mw__comm *comm = mw__comm_of(h, __func__, &err);
    if (!comm) {
        errno = -err;
        return NULL;
    }
    const char *why = bad_exclusion(comm, exclude, nexclude);
    if (why || comm->nranks == 1) {
        mw_future_t *f = mw_future_new(comm->ctx);
        if (f)
            mw_future_fail(f, -EINVAL, "%s", why ? why : "a communicator of one rank");
        return f;
    }
    /* The survivors in their old order; the job is the old one's and the
     * list's, so a rank excluding others is refused like another job. */
    int n = comm->nranks - nexclude, me = 0;
    const char **peers = mw__calloc(n, sizeof *peers);
    char job[64 + 12 * 64];
    if (!peers)
        return NULL;
    int len = snprintf(job, sizeof job, "%016" PRIx64 "/shrink", comm->job);
    for (int r = 0, i = 0; r < comm->nranks; r++) {
        if (excluded(exclude, nexclude, r)) {
            if (len < (int)sizeof job - 12)
                len += snprintf(job + len, sizeof job - len, ",%d", r);
            continue;
        }
        me += r < comm->rank;
        peers[i++] = comm->addrs ? comm->addrs[r] : "";
    }
    mw_comm_opts_t o = opts ? *opts : comm->opts;
    o.job = job;
    mw_ctx_t *ctx = comm->ctx;
    char **addrs = comm->addrs;   /* kept past the release for the call */
    comm->addrs = NULL;
    comm_close(comm, "shrunk");   /* its port is free for the new one */
    mw_future_t *f = mw_comm_create(ctx, me, n, peers, &o);
    for (int r = 0; addrs && r < n + nexclude; r++)
        mw__free(addrs[r]);
    mw__free(addrs);
    mw__free(peers);
    return f;
}

int mw_comm_free(mw_comm_t *h)
{
    int err;
    if (!h)
        return 0;
    struct mw__comm *comm = mw__comm_of(h, __func__, &err);
    if (!comm)
        return err;
    comm_close(comm, "communicator freed");
    return 0;
}
