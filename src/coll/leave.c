/* Leaving a communicator together (mw_comm_close: goodbyes after the last
 * collective, then each connected peer's awaited, so nobody leaves while
 * another still writes to it) and making the survivors' communicator
 * after ranks were lost (mw_comm_shrink). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "coll/comm.h"
#include "core/alloc.h"
#include "core/ctx.h"
#include "core/future.h"

/* --- closing together ------------------------------------------------------ */

static void close_done(struct mw__comm *comm)
{
    mw_future_t *f = comm->close_f;
    comm->close_f = NULL;
    MW_LOG(comm->ctx, MW_LOG_INFO, "communicator rank %d/%d closed%s%s", comm->rank,
           comm->nranks, comm->err ? " broken: " : "", comm->err ? comm->why : "");
    mw__comm_release(comm);
    mw_future_resolve(f, NULL);
    mw_future_unref(f);
}

static void send_byes(struct mw__comm *comm)
{
    comm->byes_sent = true;
    for (int r = 0; r < comm->nranks; r++) {
        struct mw__peer *p = &comm->peers[r];
        if (p->conn && mw__peer_connected(p) && !mw__comm_send_bye(p)) {
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
    mw__comm_close(comm, "close cancelled or timed out");
}

mw_future_t *mw_comm_close(mw_comm_t *h)
{
    struct mw__comm *comm;
    mw_future_t *f = mw__comm_future(h, __func__, &comm);
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
    struct mw__comm *comm;
    mw_future_t *f = mw__comm_future(h, __func__, &comm);
    if (!f)
        return NULL;
    const char *why = comm->nranks == 1 ? "a communicator of one rank"
                                        : bad_exclusion(comm, exclude, nexclude);
    if (why) {
        mw_future_fail(f, -EINVAL, "%s", why);
        return f;
    }
    /* The survivors in their old order; the job is the old one's and the
     * list's (in rank order), so a rank excluding others is refused like
     * another job. */
    int nranks = comm->nranks, me = 0;
    const char **peers = mw__calloc(nranks - nexclude, sizeof *peers);
    if (!peers) {
        mw_future_fail(f, -ENOMEM, "no memory");
        return f;
    }
    uint64_t list = MW__FNV_BASIS;
    for (int r = 0, i = 0; r < nranks; r++) {
        char num[16];
        snprintf(num, sizeof num, "%d", r);
        if (excluded(exclude, nexclude, r)) {
            list = mw__fnv(list, num);
            continue;
        }
        me += r < comm->rank;
        peers[i++] = comm->addrs[r];
    }
    char job[48];
    snprintf(job, sizeof job, "%016" PRIx64 "/shrink/%016" PRIx64, comm->job, list);
    mw_comm_opts_t o = opts ? *opts : comm->opts;
    o.job = job;
    mw_ctx_t *ctx = comm->ctx;
    char **addrs = comm->addrs;   /* kept past the release for the call */
    comm->addrs = NULL;
    mw__comm_close(comm, "shrunk");   /* its port is free for the new one */
    mw_future_t *nf = mw_comm_create(ctx, me, nranks - nexclude, peers, &o);
    for (int r = 0; r < nranks; r++)
        mw__free(addrs[r]);
    mw__free(addrs);
    mw__free(peers);
    if (!nf) {
        mw_future_fail(f, -ENOMEM, "no memory");
        return f;
    }
    mw_future_unref(f);
    return nf;
}

