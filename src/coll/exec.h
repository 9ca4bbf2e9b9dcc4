/* The executor's record of one collective, shared by coll.c (which builds
 * it) and exec.c (which runs it). */
#ifndef MW_COLL_EXEC_H
#define MW_COLL_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "coll/comm.h"
#include "coll/sched.h"

struct mw__run {
    struct mw__list link;
    struct mw__comm *comm;
    mw_future_t *f;
    struct mw__sched s;
    mw_dtype_t dt;
    mw_op_t op;
    size_t esz;
    uint8_t seq;
    uint32_t sig_base;
    const uint8_t *in;
    uint8_t *res;                 /* the user's output, or work below */
    uint8_t *out;                 /* where the answer goes */
    uint8_t *work, *in_copy, *stage;
    mw_mr_t *mr_in, *mr_out;
    /* chunks written and not yet complete: they read @in or @stage, so a
     * failed run waits for them before its future fails and its buffers
     * and registrations go (the fence) */
    unsigned writes_out;
    unsigned regs_pending;        /* buffers still being registered: it
                                     neither starts nor goes before they are */
    bool finished;                /* out of the queue, waiting for the above */
    bool peers_asked;             /* mw__comm_need() called for its peers */
    int err;
    char why[160];
    /* the step in progress */
    int step;
    bool started;
    const uint8_t *src;           /* of this step's send */
    size_t s_chunks, s_posted, r_chunks, r_done, chunk_elems;
    uint64_t s_base;              /* the send peer's 'sent' when the step began */
};

/* Queue @k (its future set) behind the collectives in flight; it holds a
 * reference on @comm until it finishes. */
void mw__coll_enqueue(struct mw__comm *comm, struct mw__run *k);
/* Release what @k holds, without touching its future (never queued). */
void mw__coll_discard(struct mw__run *k);
/* The same for a run that failed before it was queued, once no
 * registration of it is pending any more. */
void mw__coll_discard_later(struct mw__run *k, int err, const char *why);
/* A buffer of @k's is registered (or failed: @err). */
void mw__coll_registered(struct mw__run *k, int err);
/* Where step @st's send reads from; whether its receive lands on that
 * (then the send goes from a copy taken at the step's start, in k->stage). */
const uint8_t *mw__step_source(const struct mw__run *k, const struct mw__step *st);
bool mw__step_overlaps(const struct mw__run *k, const struct mw__step *st);
/* What both sides of every chunk must agree on. */
uint32_t mw__coll_signature(int kind, int algo, mw_dtype_t dt, mw_op_t op, size_t count,
                            int root);

#endif
