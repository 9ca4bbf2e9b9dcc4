/* Communicators: creating one (its arguments, its job, its place in the
 * context's list of them), their lifetime and failure, and letting go.
 * The connections to the peers are peers.c's; leaving together and
 * shrinking, leave.c's. */
#include <errno.h>
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

mw_future_t *mw__comm_future(mw_comm_t *h, const char *fn, struct mw__comm **comm)
{
    int err;
    if (!(*comm = mw__comm_of(h, fn, &err))) {
        errno = -err;
        return NULL;
    }
    return mw_future_new((*comm)->ctx);
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
        st->connections += mw__peer_connected(p);
        st->scratch_bytes += p->scratch ? mw__comm_scratch_bytes(comm) : 0;
    }
    return 0;
}

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
        mw__comm_release(comm);
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

/* --- the layer: communicators not yet freed ------------------------------- */

struct colls {
    struct mw__list comms;
};

void mw__comm_close(struct mw__comm *comm, const char *why)
{
    mw__comm_ref(comm);           /* failing a creation releases it already */
    mw__comm_fail(comm, -ECANCELED, "%s", why);
    if (!mw__comm_freed(comm))
        mw__comm_release(comm);
    mw__comm_unref(comm);
}

static void colls_teardown(mw_ctx_t *ctx, void *state)
{
    struct colls *cl = state;
    while (!mw__list_empty(&cl->comms))       /* release() unlinks each */
        mw__comm_close(mw__container_of(cl->comms.next, struct mw__comm, link), "context closed");
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
uint64_t mw__fnv(uint64_t h, const char *s)
{
    for (; s && *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return (h ^ 0xff) * 1099511628211ull;      /* a separator */
}

uint64_t mw__comm_job_id(const mw_comm_opts_t *opts)
{
    static const char *const launcher[] = {"SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID",
                                           "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"};
    uint64_t h = MW__FNV_BASIS;
    const char *own = opts && opts->job ? opts->job : getenv("MW_JOB");
    if (own)
        return mw__fnv(h, own);
    for (size_t i = 0; i < sizeof launcher / sizeof *launcher; i++)
        h = mw__fnv(h, getenv(launcher[i]));
    return h;
}

/* A creation cancelled or timed out is torn down: connections closed,
 * the listener (and its port) freed, the communicator gone. */
static void create_cancel(mw_future_t *f, void *arg)
{
    (void)f;
    mw__comm_close(arg, "creation cancelled or timed out");
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
        mw_future_resolve(f, mw__comm_handle(comm));
        return f;
    }
    comm->create_f = mw_future_ref(f);
    mw__future_on_cancel(f, create_cancel, comm);
    int rc = mw__comm_start(comm, peers);
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
void mw__comm_release(struct mw__comm *comm)
{
    mw__handle_release(comm->h);  /* the owner's handle stops matching */
    comm->h = 0;                  /* and so mw__comm_freed() */
    mw__list_del(&comm->link);
    mw__comm_drop_retries(comm);
    for (int r = 0; r < comm->nranks; r++) {
        struct mw__peer *p = &comm->peers[r];
        mw__peer_unwatch(p);
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

int mw_comm_free(mw_comm_t *h)
{
    int err;
    if (!h)
        return 0;
    struct mw__comm *comm = mw__comm_of(h, __func__, &err);
    if (!comm)
        return err;
    mw__comm_close(comm, "communicator freed");
    return 0;
}
