/* A communicator's connections: a rank connects only to the peers its
 * collectives need, when they first need them -- at creation its two ring
 * neighbours (so every rank's setup is checked against its neighbours',
 * and an abort reaches every rank by flooding), later the peers of each
 * schedule (recursive doubling: log2 n, a ring: none more, alltoall: all).
 * Of a pair the higher rank connects (retrying while the other starts, up
 * to opts.timeout_ms), the lower accepts; over each connection the two
 * exchange a hello -- who they are, the scratch geometry, and the
 * registered region the other will write into: a 64-byte stub, shared by
 * all peers, until a collective first needs to receive data from that
 * peer; then its scratch is allocated and announced by a message of the
 * hello's format (a barrier's peers never get one).  Then one receive
 * stays pending on every connection: with the keepalive it turns a peer's
 * death into a failure of what still needs it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "cm/cm.h"
#include "cm/nic.h"
#include "coll/comm.h"
#include "core/alloc.h"
#include "core/ctx.h"
#include "core/future.h"

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

void mw__peer_unwatch(struct mw__peer *p)
{
    if (p->watch) {
        p->watch->p = NULL;       /* its callback, still to come, finds nobody */
        p->watch = NULL;
    }
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
             : p->scratch ? mw_mem_export(c, p->scratch, mw__comm_scratch_bytes(comm), &o->m.scratch)
                          : mw_mem_export(c, comm->stub, STUB_BYTES, &o->m.scratch);
    mw_future_t *f = rc ? NULL : mw_send(c, &o->m, sizeof o->m);
    if (!f) {
        mw__free(o);
        return rc ? rc : -ENOMEM;
    }
    rc = mw_future_error(f) == -ENOMEM ? -ENOMEM : 0;
    if (rc) {                     /* refused at once: no hello will go */
        mw__free(o);
    } else {                      /* a failure of the connection is seen by the receive */
        mw__future_then_in(f, &o->sent, on_hello_sent, o);
        if (p && p->scratch)
            p->scratch_sent = true;
    }
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
    if (h->scratch.len == 0)      /* refuse_own_rank()'s hello: it told us no */
        return "it refused this rank (it holds a connection from this rank already, or ran "
               "out of memory: its log says which)";
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
    p->ready = true;
    watch(p);
    if (p->gone) {                /* what needs it fails; at creation, everything */
        if (comm->create_f)
            mw__comm_fail(comm, p->gone, "%s", p->gone_why);
        return;
    }
    if (is_ring_neighbour(comm, p->rank) && --comm->ring_left == 0 && comm->create_f) {
        event_del(comm->deadline);
        mw_future_t *f = comm->create_f;
        comm->create_f = NULL;
        MW_LOG(comm->ctx, MW_LOG_INFO, "communicator rank %d/%d ready", comm->rank, comm->nranks);
        mw_future_resolve(f, mw__comm_handle(comm));
        mw_future_unref(f);
    }
    mw__coll_advance(comm);       /* a collective may have waited for it */
}

/* The peer's scratch announcement: where its scratch for us is now. */
static bool take_scratch(struct mw__peer *p, const mw_msg_t *m)
{
    const struct hello *h = m->data;
    if (m->len != sizeof *h || h->magic != SCRATCH_MAGIC || (int)h->rank != p->rank ||
        h->job != p->comm->job || h->scratch.len < mw__comm_scratch_bytes(p->comm))
        return false;
    p->remote = h->scratch;
    watch(p);
    mw__coll_advance(p->comm);    /* a step may wait to write to it */
    return true;
}

int mw__comm_need_scratch(struct mw__comm *comm, int r)
{
    struct mw__peer *p = &comm->peers[r];
    if (!p->scratch && !(p->scratch = mw_alloc(comm->ctx, mw__comm_scratch_bytes(comm))))
        return -ENOMEM;
    /* Not yet connected: its hello will carry it. */
    if (p->ready && !p->gone && !p->scratch_sent)
        return send_hello(comm, p->conn, p, SCRATCH_MAGIC);
    return 0;
}

static int alloc_peer(struct mw__comm *comm, int r, mw_conn_t *c)
{
    struct mw__peer *p = &comm->peers[r];
    if (p->conn)
        return -EEXIST;
    if (!p->imm)
        p->imm = mw__calloc(comm->opts.slots, sizeof *p->imm);
    if (!p->imm)
        return -ENOMEM;           /* @c is not the peer's: the caller lets go of it */
    p->conn = c;
    p->scratch_sent = false;      /* an attempt that was dropped sent it to nobody */
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
    comm->peers[k->rank].connecting = NULL;
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
    mw_msg_t *m = mw_future_state(f) == MW_FUTURE_DONE ? mw_future_value(f) : NULL;
    bool ours;
    const char *bad = m ? check_hello(comm, m, p->rank, &ours) : mw_future_message(f);
    if (mw__comm_freed(comm)) {
        drop_connecting(k);
    } else if (!m) {
        mw_conn_abort(p->conn);
        p->conn = NULL;
        if (mw_future_error(f) == -ENOMEM) {
            /* Ours to fail: the peer has our hello and may be done
             * already, and would refuse a second connection from us. */
            drop_connecting(k);
            mw__comm_fail(comm, -ENOMEM, "rank %d: cannot take its hello: %s", p->rank, bad);
        } else {
            comm->dropped = true;
            retry_or_give_up(k, "dropped before its hello");
        }
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
            if (p->conn != c)     /* alloc_peer() did not take it */
                mw_conn_abort(c);
            mw__comm_fail(comm, -ENOMEM, "cannot greet rank %d", k->rank);
        } else {                  /* the attempt lives on until the hello is in */
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
void mw__comm_drop_retries(struct mw__comm *comm)
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
    comm->peers[r].connecting = k;
    if (try_connect(k) < 0) {
        drop_connecting(k);
        return -ENOMEM;
    }
    return 0;
}

int mw__comm_need(struct mw__comm *comm, int r)
{
    struct mw__peer *p = &comm->peers[r];
    if (r >= comm->rank || p->conn || p->connecting || p->gone || comm->err)
        return 0;
    return dial(comm, r);
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
int mw__comm_start(struct mw__comm *comm, const char *const *peers)
{
    if (!(comm->deadline = evtimer_new(comm->ctx->base, on_deadline, comm)))
        return -ENOMEM;
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
    for (int r = 0; r < comm->nranks; r++) {
        if (!is_ring_neighbour(comm, r))
            continue;
        comm->ring_left++;
        if (r < comm->rank && (rc = dial(comm, r)) < 0)
            return rc;            /* the creation fails now, not at its deadline */
    }
    struct timeval tv = {comm->opts.timeout_ms / 1000, (comm->opts.timeout_ms % 1000) * 1000};
    return mw__ev_add(comm->ctx, comm->deadline, &tv);
}

