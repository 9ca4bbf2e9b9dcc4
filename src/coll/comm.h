/* Communicators, internal side: the connections to the peers a collective
 * needed so far (the ring neighbours from the start), each connected peer's
 * scratch slots, and the queue of collectives executed in issue order. */
#ifndef MW_COLL_COMM_H
#define MW_COLL_COMM_H

#include <stdbool.h>
#include <stdint.h>

#include "meshwire.h"
#include "core/ctx.h"
#include "core/future.h"
#include "core/handle.h"
#include "core/list.h"

struct mw__run;
struct mw__connecting;

/* One peer, as this rank sees it, connected once a collective needs it.
 * Chunks go into its scratch slots round robin; RC delivers a connection's writes in order, so the
 * n-th chunk written is in slot n % slots at both ends, and an ack (a
 * zero-length write with immediate carrying a count) frees the oldest
 * slots. */
struct mw__peer {
    struct mw__comm *comm;
    int rank;
    mw_conn_t *conn;
    mw_remote_t remote;           /* its scratch (or stub), which I write into */
    uint8_t *scratch;             /* mine, which it writes into (once a
                                     collective receives data from it) */
    bool scratch_sent;            /* it knows where mine is */
    uint64_t sent, acked;         /* chunks written to it / acks it returned */
    uint64_t written;             /* of those, writes completed (in order: RC) */
    uint64_t arrived, consumed;   /* chunks it wrote to me / I have taken */
    uint32_t unacked;             /* of those taken, not yet acked to it */
    uint32_t *imm;                /* immediates of arrived chunks, by slot */
    struct mw__watch *watch;      /* a receive always pending: liveness */
    struct mw__cb hello;          /* waits for its hello */
    struct mw__connecting *connecting; /* our attempt to connect to it (it is
                                          below us), until its hello is in */
    struct mw__cb closed;         /* waits for its connection to go, at the end */
    bool ready;
    bool said_bye;                /* it closed the communicator: sends nothing more */
    int gone;                     /* why the peer is unreachable (0: it is not) */
    char gone_why[160];
};

struct mw__comm {
    uint64_t h;                   /* the owner's handle; 0 once it let go */
    mw_ctx_t *ctx;
    struct mw__list link;         /* in the layer's list until freed */
    struct mw__list retrying;     /* connects waiting for their retry timer */
    int refs;                     /* the owner, and each callback in flight */
    int rank, nranks;
    mw_comm_opts_t opts;
    struct mw__peer *peers;       /* indexed by rank; peers[rank] unused */
    char **addrs;                 /* each rank's entry, to connect when needed */
    uint8_t *stub;                /* what peers without scratch point at */
    mw_listener_t *listener;
    mw_future_t *create_f;
    struct event *deadline;
    int ring_left;                /* ring neighbours not yet ready: formation */
    mw_future_t *close_f;         /* mw_comm_close() in progress */
    bool byes_sent;
    int err;                      /* the mesh broke: every collective fails */
    char why[160];
    bool dropped;                 /* a rank we connected to dropped us before its hello */
    uint8_t seq;                  /* of the next collective, on the wire */
    int allreduce_algo;           /* enum mw__algo: MW_ALLREDUCE_ALGO, read at
                                     creation and agreed by every rank's hello */
    uint64_t job;                 /* the job's identity, agreed likewise */
    struct mw__list colls;        /* in issue order; the head executes */
    uint64_t colls_done, colls_failed;   /* for mw_ctx_metrics() */
    struct mw__task resume;       /* advance again next turn (holds a ref) */
};

/* comm.c */
#define MW__COMM_SLOT_MIN 4096u
#define MW__COMM_SLOT_MAX (256u << 20)
#define MW__COMM_SLOTS_MAX 1024u
/* mw__comm_freed() - the owner let go (its handle is released): callbacks
 * still in flight do nothing. */
static inline bool mw__comm_freed(const struct mw__comm *comm)
{
    return !comm->h;
}
/* The owner's handle of @comm. */
static inline mw_comm_t *mw__comm_handle(const struct mw__comm *comm)
{
    return MW__HANDLE_PTR(mw_comm_t, comm->h);
}
/* The scratch a connected peer writes into, in bytes. */
static inline size_t mw__comm_scratch_bytes(const struct mw__comm *comm)
{
    return (size_t)comm->opts.slots * comm->opts.slot_size;
}
/* Whether @p announced its scratch (before, p->remote is its stub, which
 * is shorter than any scratch). */
static inline bool mw__peer_has_scratch(const struct mw__peer *p)
{
    return p->remote.len >= mw__comm_scratch_bytes(p->comm);
}
/* Whether @p is connected: its hello is in, and its connection not lost
 * (one that said goodbye still is). */
static inline bool mw__peer_connected(const struct mw__peer *p)
{
    return p->ready && (!p->gone || p->said_bye);
}
/* mw__comm_release() - let go of the connections and the owner's handle
 * (callbacks in flight keep the rest until they end). */
void mw__comm_release(struct mw__comm *comm);
/* mw__comm_close() - leave now: fail everything with -ECANCELED and @why,
 * then release (mw_comm_free, a cancelled close or creation, a shrink). */
void mw__comm_close(struct mw__comm *comm, const char *why);

/* peers.c */
/* mw__comm_start() - listen at this rank's entry's port, dial the ring
 * neighbours below, and arm the creation's deadline; @peers are kept. */
int mw__comm_start(struct mw__comm *comm, const char *const *peers);
/* mw__comm_drop_retries() - connection attempts waiting to retry stop. */
void mw__comm_drop_retries(struct mw__comm *comm);
/* mw__peer_unwatch() - the receive pending on @p's connection no longer
 * reports to it (the communicator lets go). */
void mw__peer_unwatch(struct mw__peer *p);

/* mw__comm_job_id() - the job a communicator created with @opts belongs to
 * (opts->job, else MW_JOB, else the launcher's job id; hashed). */
uint64_t mw__comm_job_id(const mw_comm_opts_t *opts);
/* mw__comm_of() - the communicator behind a caller's handle, for public
 * call @fn, or NULL with *@err: -EINVAL (NULL, another kind), -ESTALE
 * (freed, or its creation failed), -EPERM (off the loop thread). */
struct mw__comm *mw__comm_of(const mw_comm_t *h, const char *fn, int *err);
/* mw__comm_future() - the start of a public call @fn that returns a
 * future: *@comm is @h's communicator and the result a new future, or NULL
 * with errno set (EINVAL, ESTALE, EPERM as mw__comm_of; ENOMEM). */
mw_future_t *mw__comm_future(mw_comm_t *h, const char *fn, struct mw__comm **comm);
/* mw__fnv() - FNV-1a of @s (NULL: nothing) onto @h, then a separator. */
#define MW__FNV_BASIS 14695981039346656037ull
uint64_t mw__fnv(uint64_t h, const char *s);
/* mw__peer_gone() - @p left or broke: collectives that still need it fail
 * (when they get to it); those that are past it finish. */
void mw__peer_gone(struct mw__peer *p, int err, const char *why);
/* mw__comm_need() - a collective needs rank @r: connect to it if it is
 * below us and not connected (it connects to us otherwise: every schedule
 * pairs its sends and receives, so @r needs us in the same collective).
 * When it is ready, or gone, the queue advances.  0, or -ENOMEM (nothing
 * was done; the caller breaks the communicator). */
int mw__comm_need(struct mw__comm *comm, int r);
/* mw__comm_need_scratch() - a collective will receive data from rank @r:
 * allocate its scratch, and tell it where (now, or in the hello).  0, or
 * -ENOMEM (the caller breaks the communicator). */
int mw__comm_need_scratch(struct mw__comm *comm, int r);
/* mw__peer_said_bye() - @p closed the communicator: nothing more comes
 * from it; collectives that still need it fail. */
void mw__peer_said_bye(struct mw__peer *p);
/* mw__comm_close_progress() - a close in progress goes on: once the
 * collectives issued before it are over, goodbyes go out; once every
 * connected peer said goodbye (or is gone), the communicator is released. */
void mw__comm_close_progress(struct mw__comm *comm);
void mw__comm_ref(struct mw__comm *comm);
void mw__comm_unref(struct mw__comm *comm);
void mw__comm_fail(struct mw__comm *comm, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* metrics.c: the communicators' families for mw_ctx_metrics(); @comms
 * the layer's list of them. */
struct mw__metrics;
void mw__coll_metrics(struct mw__list *comms, struct mw__metrics *m);

/* exec.c */
void mw__coll_advance(struct mw__comm *comm);
void mw__coll_fail_all(struct mw__comm *comm, int err, const char *why);
void mw__comm_on_imm(mw_conn_t *c, uint32_t imm, void *arg);
/* mw__comm_send_bye() - tell @p this rank closed the communicator (ordered
 * after everything written to it); false without memory. */
bool mw__comm_send_bye(struct mw__peer *p);
enum mw__abort_why {
    MW__ABORT_OTHER = 0,
    MW__ABORT_LOST,               /* a rank died or left */
    MW__ABORT_MISMATCH,           /* ranks ran different collectives */
    MW__ABORT_CANCELLED,          /* a collective was cancelled or timed out */
    MW__ABORT_LOCAL,              /* a collective failed on one rank before it started */
};
/* mw__comm_abort() - break @comm (mw__comm_fail) and tell every live peer,
 * naming @culprit, so ranks waiting on ranks that gave up fail too. */
void mw__comm_abort(struct mw__comm *comm, enum mw__abort_why why, int culprit, int err,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* mw__comm_tell_abort() - only the telling: every connected peer learns
 * that this rank breaks because of @culprit. */
void mw__comm_tell_abort(struct mw__comm *comm, enum mw__abort_why why, int culprit);

#endif
