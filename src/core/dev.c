/* Devices, opened lazily: a protection domain and a CQ each. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cq.h"
#include "core/dev.h"
#include "core/mem.h"

#define DEFAULT_CQ_DEPTH 4096

struct mw__devs {
    struct mw__dev **v;
    int n;
};

int mw__dev_count(const mw_ctx_t *ctx)
{
    return ctx->devs ? ctx->devs->n : 0;
}

struct mw__dev *mw__dev_at(const mw_ctx_t *ctx, int index)
{
    return index >= 0 && index < mw__dev_count(ctx) ? ctx->devs->v[index] : NULL;
}

static void dev_release(struct mw__dev *dev)
{
    mw__cq_close(dev->cq);
    dev->cq = NULL;
    if (dev->pd)
        ibv_dealloc_pd(dev->pd);
    dev->pd = NULL;
}

static void dev_close(struct mw__dev *dev)
{
    dev_release(dev);
    free(dev);
}

struct mw__dev *mw__dev_find(const mw_ctx_t *ctx, const struct ibv_context *verbs)
{
    for (int i = 0; verbs && i < mw__dev_count(ctx); i++)
        if (ctx->devs->v[i]->verbs == verbs)
            return ctx->devs->v[i];
    return NULL;
}

void mw__dev_remove(mw_ctx_t *ctx, struct mw__dev *dev)
{
    if (!dev || dev->removed)
        return;
    MW_LOG(ctx, MW_LOG_WARN, "RDMA device %s removed: releasing what meshwire held on it",
           dev->name);
    mw__mem_remove_dev(ctx, dev);     /* MRs before the PD */
    dev_release(dev);
    dev->verbs = NULL;                /* a re-added device gets a new slot */
    dev->removed = true;
}

static int dev_open(mw_ctx_t *ctx, struct ibv_context *verbs, int index, struct mw__dev **devp)
{
    struct mw__dev *dev = calloc(1, sizeof *dev);
    if (!dev)
        return -ENOMEM;
    dev->index = index;
    dev->verbs = verbs;
    snprintf(dev->name, sizeof dev->name, "%s", ibv_get_device_name(verbs->device));
    int rc = -ibv_query_device(verbs, &dev->attr);
    if (rc < 0)
        goto fail;
    dev->pd = ibv_alloc_pd(verbs);
    if (!dev->pd) {
        rc = errno ? -errno : -ENOMEM;
        goto fail;
    }
    int depth = ctx->opts.cq_depth ? (int)ctx->opts.cq_depth : DEFAULT_CQ_DEPTH;
    if (depth > dev->attr.max_cqe)
        depth = dev->attr.max_cqe;
    if ((rc = mw__cq_open(ctx, verbs, depth, &dev->cq)) < 0)
        goto fail;
    dev->cqe_size = ((struct ibv_cq *)dev->cq->cq)->cqe;
    *devp = dev;
    return 0;
fail:
    MW_LOG(ctx, MW_LOG_ERROR, "cannot open RDMA device %s: %s", dev->name, mw_strerror(rc));
    dev_close(dev);
    return rc;
}

int mw__dev_get(mw_ctx_t *ctx, struct ibv_context *verbs, struct mw__dev **devp)
{
    if (!ctx || !verbs || !devp)
        return -EINVAL;
    struct mw__dev *known = mw__dev_find(ctx, verbs);
    if (known) {
        *devp = known;
        return 0;
    }
    if (!ctx->devs && !(ctx->devs = calloc(1, sizeof *ctx->devs)))
        return -ENOMEM;
    struct mw__devs *d = ctx->devs;
    struct mw__dev **v = realloc(d->v, (d->n + 1) * sizeof *v);
    if (!v)
        return -ENOMEM;
    d->v = v;
    struct mw__dev *dev = NULL;
    int rc = dev_open(ctx, verbs, d->n, &dev);
    if (rc < 0)
        return rc;
    /* Memory registered so far (arena extents, mw_reg ranges) becomes
     * usable on the new device before anyone can post on it. */
    if ((rc = mw__mem_add_dev(ctx, dev)) < 0) {
        dev_close(dev);
        return rc;
    }
    d->v[d->n++] = dev;
    ctx->stats.devices++;
    MW_LOG(ctx, MW_LOG_INFO, "opened RDMA device %s (max_qp %d, max_cqe %d, max_mr_size %llu)",
           dev->name, dev->attr.max_qp, dev->attr.max_cqe,
           (unsigned long long)dev->attr.max_mr_size);
    *devp = dev;
    return 0;
}

void mw__devs_free(mw_ctx_t *ctx)
{
    struct mw__devs *d = ctx->devs;
    if (!d)
        return;
    for (int i = d->n; i-- > 0;)
        dev_close(d->v[i]);
    free(d->v);
    free(d);
    ctx->devs = NULL;
}

int mw__dev_reserve_cqe(struct mw__dev *dev, int n)
{
    int need = dev->cqe_used + n;
    if (need > dev->cqe_size) {
        if (need > dev->attr.max_cqe)
            return -ENOSPC;
        int want = dev->cqe_size * 2 > need ? dev->cqe_size * 2 : need;
        if (want > dev->attr.max_cqe)
            want = dev->attr.max_cqe;
        struct ibv_cq *cq = dev->cq->cq;
        int rc = ibv_resize_cq(cq, want);
        if (rc)
            return -rc;
        dev->cqe_size = cq->cqe;
    }
    dev->cqe_used = need;
    return 0;
}

void mw__dev_release_cqe(struct mw__dev *dev, int n)
{
    dev->cqe_used -= n;
}
