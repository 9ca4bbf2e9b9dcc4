/* Operation records: what a posted work request belongs to.  A wr_id is
 * (position << 56 | generation << 32 | slot), so a completion is dispatched
 * only to the live record that posted it; a stale or forged wr_id is
 * counted and dropped, never dereferenced.  The position (8 bits) is the
 * owner's: a record that posts chains of work requests, most of them
 * unsignalled, numbers them, so that a completion says how many of its
 * requests it accounts for (an error completes one that was unsignalled). */
#ifndef MW_CORE_OP_H
#define MW_CORE_OP_H

#include <stdint.h>

#include <infiniband/verbs.h>

#include "core/ctx.h"

struct mw__op;

/* Called for each completion of the op's work requests; @wc->status may be
 * an error.  Release the record with mw__op_put() once its last work
 * request has completed. */
typedef void (*mw__op_done_fn)(struct mw__op *op, const struct ibv_wc *wc);

/* Called when the context tears down with the op still live: fail its
 * future, release what it holds, mw__op_put() it. */
typedef void (*mw__op_abort_fn)(struct mw__op *op, int err);

struct mw__op {
    uint64_t wr_id;           /* what to post as ibv_send_wr.wr_id */
    mw__op_done_fn done;
    mw__op_abort_fn abort;
    void *owner;              /* whoever posted it (a connection, a test) */
    mw_future_t *future;      /* optional; the op holds a reference */
    uint64_t u64[2];          /* owner's scratch (bytes, counters) */
};

int mw__ops_new(mw_ctx_t *ctx);
void mw__ops_free(mw_ctx_t *ctx);

/* mw__op_get() - a fresh record, or NULL when out of memory. */
struct mw__op *mw__op_get(mw_ctx_t *ctx, mw__op_done_fn done, mw__op_abort_fn abort,
                          void *owner);

/* mw__op_put() - release a record; its wr_id stops matching at once. */
void mw__op_put(mw_ctx_t *ctx, struct mw__op *op);

/* mw__op_wr_id_at() - @op's wr_id carrying position @pos. */
static inline uint64_t mw__op_wr_id_at(const struct mw__op *op, uint8_t pos)
{
    return op->wr_id | (uint64_t)pos << 56;
}

/* mw__wc_pos() - the position a completion's work request was posted with. */
static inline uint8_t mw__wc_pos(const struct ibv_wc *wc)
{
    return (uint8_t)(wc->wr_id >> 56);
}

/* mw__op_lookup() - the live record for @wr_id (any position), or NULL. */
struct mw__op *mw__op_lookup(const mw_ctx_t *ctx, uint64_t wr_id);

/* mw__ops_drop_owner() - release every live record of @owner: its queue
 * pair is gone, so what it posted will never complete with meaning (a
 * completion still queued for it turns stray instead of reaching it). */
void mw__ops_drop_owner(mw_ctx_t *ctx, const void *owner);

/* mw__ops_fail_all() - abort every live op with -ECANCELED (teardown). */
void mw__ops_fail_all(mw_ctx_t *ctx);

/* mw__ops_live() - records in use. */
unsigned mw__ops_live(const mw_ctx_t *ctx);

#endif
