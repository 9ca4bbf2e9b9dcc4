/* Operation records in stable chunks (pointers never move), with a free
 * list and a generation per slot so old wr_ids stop matching. */
#include <errno.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/future.h"
#include "core/op.h"

#define CHUNK 256u
#define GEN_MASK 0xffffffu        /* a wr_id's generation bits (op.h) */

struct slot {
    struct mw__op op;          /* first: an op pointer is its slot's pointer */
    uint32_t gen;              /* odd while live, even while free */
    uint32_t next_free;
};

struct mw__ops {
    struct slot **chunks;
    uint32_t nchunks;
    uint32_t free_head;        /* UINT32_MAX when empty */
    unsigned live;
};

int mw__ops_new(mw_ctx_t *ctx)
{
    ctx->ops = mw__calloc(1, sizeof *ctx->ops);
    if (!ctx->ops)
        return -ENOMEM;
    ctx->ops->free_head = UINT32_MAX;
    return 0;
}

void mw__ops_free(mw_ctx_t *ctx)
{
    struct mw__ops *ops = ctx->ops;
    if (!ops)
        return;
    for (uint32_t i = 0; i < ops->nchunks; i++)
        mw__free(ops->chunks[i]);
    mw__free(ops->chunks);
    mw__free(ops);
    ctx->ops = NULL;
}

static struct slot *slot_at(const struct mw__ops *ops, uint32_t idx)
{
    uint32_t c = idx / CHUNK;
    return c < ops->nchunks ? &ops->chunks[c][idx % CHUNK] : NULL;
}

static int grow(struct mw__ops *ops)
{
    if (ops->nchunks >= UINT32_MAX / CHUNK - 1)
        return -ENOSPC;
    struct slot **chunks = mw__realloc(ops->chunks, (ops->nchunks + 1) * sizeof *chunks);
    if (!chunks)
        return -ENOMEM;
    ops->chunks = chunks;
    struct slot *c = mw__calloc(CHUNK, sizeof *c);
    if (!c)
        return -ENOMEM;
    chunks[ops->nchunks] = c;
    uint32_t base = ops->nchunks++ * CHUNK;
    for (uint32_t i = CHUNK; i-- > 0;) {    /* lowest index handed out first */
        c[i].next_free = ops->free_head;
        ops->free_head = base + i;
    }
    return 0;
}

struct mw__op *mw__op_get(mw_ctx_t *ctx, mw__op_done_fn done, mw__op_abort_fn abort,
                          void *owner)
{
    struct mw__ops *ops = ctx->ops;
    if (ops->free_head == UINT32_MAX && grow(ops) < 0)
        return NULL;
    uint32_t idx = ops->free_head;
    struct slot *s = slot_at(ops, idx);
    ops->free_head = s->next_free;
    s->gen++;                                 /* even -> odd: live */
    s->op = (struct mw__op){
        .wr_id = (uint64_t)(s->gen & GEN_MASK) << 32 | idx,
        .done = done,
        .abort = abort,
        .owner = owner,
    };
    ops->live++;
    return &s->op;
}

void mw__op_put(mw_ctx_t *ctx, struct mw__op *op)
{
    struct mw__ops *ops = ctx->ops;
    struct slot *s = (struct slot *)op;
    uint32_t idx = (uint32_t)op->wr_id;
    if (!(s->gen & 1)) {
        MW_LOG(ctx, MW_LOG_ERROR, "operation record %u released twice", idx);
        return;
    }
    mw_future_unref(op->future);
    s->op.future = NULL;
    s->gen++;                                 /* odd -> even: free */
    s->next_free = ops->free_head;
    ops->free_head = idx;
    ops->live--;
}

struct mw__op *mw__op_lookup(const mw_ctx_t *ctx, uint64_t wr_id)
{
    struct slot *s = slot_at(ctx->ops, (uint32_t)wr_id);
    if (!s || (s->gen & GEN_MASK) != (uint32_t)(wr_id >> 32 & GEN_MASK) || !(s->gen & 1))
        return NULL;
    return &s->op;
}

void mw__ops_drop_owner(mw_ctx_t *ctx, const void *owner)
{
    struct mw__ops *ops = ctx->ops;
    for (uint32_t i = 0; ops && i < ops->nchunks * CHUNK; i++) {
        struct slot *s = slot_at(ops, i);
        if ((s->gen & 1) && s->op.owner == owner)
            mw__op_put(ctx, &s->op);
    }
}

void mw__ops_fail_all(mw_ctx_t *ctx)
{
    struct mw__ops *ops = ctx->ops;
    if (!ops)
        return;
    for (uint32_t i = 0; i < ops->nchunks * CHUNK; i++) {
        struct slot *s = slot_at(ops, i);
        if (!(s->gen & 1))
            continue;
        if (s->op.abort)
            s->op.abort(&s->op, -ECANCELED);
        else
            mw__op_put(ctx, &s->op);
    }
}

unsigned mw__ops_live(const mw_ctx_t *ctx)
{
    return ctx->ops->live;
}
