/* The communicators' families for mw_ctx_metrics() (core/metrics.h): how
 * many there are, and each live one's size, readiness and collectives,
 * labelled by its job (as hashed: mw__comm_job_id) and rank.  (The label
 * is comm_job: Prometheus gives "job" to the scrape target.) */
#include <inttypes.h>
#include <stdio.h>

#include "coll/comm.h"
#include "core/metrics.h"

enum what { RANKS, READY, BROKEN, QUEUED, DONE, FAILED };
static const struct {
    const char *name, *type, *help;
} families[] = {
    [RANKS] = {"meshwire_comm_ranks", "gauge", "Ranks in the communicator."},
    [READY] = {"meshwire_comm_peers_ready", "gauge", "Peers connected (as mw_comm_stats counts them)."},
    [BROKEN] = {"meshwire_comm_broken", "gauge", "1 once the communicator broke (its collectives fail)."},
    [QUEUED] = {"meshwire_comm_collectives_queued", "gauge", "Collectives issued and not yet finished."},
    [DONE] = {"meshwire_comm_collectives_total", "counter", "Collectives completed."},
    [FAILED] = {"meshwire_comm_collective_failures_total", "counter", "Collectives that failed."},
};

static uint64_t value(const struct mw__comm *comm, enum what w)
{
    uint64_t n = 0;
    const struct mw__list *it;
    switch (w) {
    case RANKS: return (uint64_t)comm->nranks;
    case READY:
        for (int r = 0; r < comm->nranks; r++)
            n += mw__peer_connected(&comm->peers[r]);
        return n;
    case BROKEN: return comm->err != 0;
    case QUEUED:
        for (it = comm->colls.next; it != &comm->colls; it = it->next)
            n++;
        return n;
    case DONE: return comm->colls_done;
    case FAILED: return comm->colls_failed;
    }
    return 0;
}

void mw__coll_metrics(struct mw__list *comms, struct mw__metrics *m)
{
    uint64_t live = 0;
    struct mw__comm *comm;
    mw__list_for_each(comm, comms, link)
        live += !mw__comm_freed(comm);
    mw__metrics_family(m, "meshwire_communicators", "gauge", "Communicators not freed.");
    mw__metrics_sample(m, "meshwire_communicators", "", live);
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        mw__metrics_family(m, families[f].name, families[f].type, families[f].help);
        mw__list_for_each(comm, comms, link) {
            if (mw__comm_freed(comm))
                continue;
            char job[24], rank[16];
            snprintf(job, sizeof job, "%016" PRIx64, comm->job);
            snprintf(rank, sizeof rank, "%d", comm->rank);
            struct mw__labels l = {.len = 0};
            l.s[0] = '\0';
            mw__labels_add(&l, "comm_job", job);
            mw__labels_add(&l, "rank", rank);
            mw__metrics_sample(m, families[f].name, l.s, value(comm, (enum what)f));
        }
    }
}
