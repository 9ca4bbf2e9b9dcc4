/* The memory layer on a context: made with it (mw_ctx_new), in the slot
 * MW__LAYER_MEM, where core finds its hooks -- a device opened takes every
 * region in, a device going lets go of them, and the context's end
 * releases everything before the devices close -- and freed with it. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include <infiniband/verbs.h>

#include "core/alloc.h"
#include "core/dev.h"
#include "mem/region.h"

static void *ibv_backend_reg(void *be, struct mw__dev *dev, const struct mw__pd *pd, void *addr,
                             size_t len, uint32_t *lkey, uint32_t *rkey)
{
    (void)be;
    /* Local access only: a peer reaches memory through the registration
     * mw_mem_export makes over exactly the range exported, nothing else. */
    struct ibv_mr *mr = ibv_reg_mr(pd ? pd->pd : dev->pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr)
        return NULL;           /* errno set by ibv_reg_mr */
    *lkey = mr->lkey;
    *rkey = mr->rkey;
    return mr;
}

static int ibv_backend_dereg(void *be, void *handle)
{
    (void)be;
    int rc = ibv_dereg_mr(handle); /* returns the errno value itself */
    return rc > 0 ? -rc : rc;
}

static const struct mw__reg_backend ibv_backend = {
    .reg = ibv_backend_reg,
    .dereg = ibv_backend_dereg,
};

/* ------------------------------------------------------------------------
 * The layer's hooks: core calls them from its slot
 * ------------------------------------------------------------------------ */

/* The helper registered the memory that existed when the device opened. */
static void registered(struct mw__dev *dev, int err, void *arg)
{
    (void)arg;
    mw__mem_unreserve(dev->ctx);      /* for the connections that waited */
    mw__dev_ready(dev, err);
}

/* Memory registered so far (arena extents, mw_reg ranges) becomes usable
 * on the new device before anyone can post on it: now, or, when there is
 * much, once the helper thread has registered it. */
static int device_open(mw_ctx_t *ctx, void *state, struct mw__dev *dev)
{
    (void)state;
    int rc = mw__mem_add_dev_async(ctx, dev, registered, NULL);
    if (rc == 0)
        mw__mem_unreserve(ctx);
    return rc;
}

static void device_close(mw_ctx_t *ctx, void *state, struct mw__dev *dev)
{
    (void)state;
    mw__mem_remove_dev(ctx, dev);
}

static void release(mw_ctx_t *ctx, void *state)
{
    (void)state;
    mw__mem_free(ctx);
}

/* ------------------------------------------------------------------------
 * Life cycle
 * ------------------------------------------------------------------------ */

int mw__mem_new(mw_ctx_t *ctx, const struct mw__reg_backend *backend)
{
    if (!ctx || (backend && (!backend->reg || !backend->dereg)))
        return -EINVAL;
    if (mw__mem_of(ctx))
        return -EEXIST;
    struct mw__mem *m = mw__calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->ctx = ctx;
    mw__registrar_init(&m->rg, backend ? backend : &ibv_backend,
                       &ctx->stats.registrations, &ctx->stats.deregistrations);
    mw__list_init(&m->uregs);
    mw__list_init(&m->handles);
    mw__list_init(&m->exports);
    mw__list_init(&m->idle);
    m->uffd_wake = -1;
    const char *cap = getenv("MW_REG_CACHE_MB");
    m->idle_max = (cap && *cap ? strtoull(cap, NULL, 10) : 1024) << 20;
    ctx->layers[MW__LAYER_MEM] = (struct mw__layer){
        .state = m,
        .device_open = device_open,
        .device_close = device_close,
        .release = release,
    };
    return 0;
}

void mw__mem_free(mw_ctx_t *ctx)
{
    struct mw__mem *m = ctx ? mw__mem_of(ctx) : NULL;
    if (!m)
        return;
    mw__exports_withdraw_range(ctx, 0, UINTPTR_MAX);   /* their owners went first */
    mw__arena_destroy(m);
    mw__regcache_free(m);
    mw__rindex_fini(&m->arena_ix);
    if (!mw__list_empty(&m->rg.all))
        MW_LOG(ctx, MW_LOG_WARN, "memory teardown: regions left registered");
    MW_LOG(ctx, MW_LOG_DEBUG, "memory teardown: %llu registrations, %llu "
           "deregistrations", (unsigned long long)ctx->stats.registrations,
           (unsigned long long)ctx->stats.deregistrations);
    mw__registrar_fini(&m->rg);
    mw__free(m);
    ctx->layers[MW__LAYER_MEM] = (struct mw__layer){0};
}

/* fork() and registered memory.  Kernels that copy pinned pages into a
 * child at fork (rdma-core reports IBV_FORK_UNNEEDED; Debian 12's 6.1 does)
 * leave the parent's registrations on the parent's pages: nothing to do.
 * On older kernels the parent's next write to such a page after a fork
 * would land in a copy the device never sees; libibverbs' fork support
 * (MADV_DONTFORK on every registration) prevents that -- those pages are
 * then absent in the child -- and must be on before the first
 * registration in the process. */
static void fork_protect(mw_ctx_t *ctx)
{
    if (ibv_is_fork_initialized() != IBV_FORK_DISABLED)
        return;
    int rc = ibv_fork_init();
    if (rc)
        MW_LOG(ctx, MW_LOG_WARN, "fork() is not safe with registered memory in this process: "
               "ibv_fork_init: %s (memory was registered before the first context?)",
               mw_strerror(-rc));
    else
        MW_LOG(ctx, MW_LOG_INFO, "libibverbs fork support on: registered memory is "
               "absent in forked children");
}

/* The context as callers get it: core's, with the memory layer on it. */
int mw_ctx_new(mw_ctx_t **ctxp, struct event_base *base, const mw_ctx_opts_t *opts)
{
    if (!ctxp)
        return -EINVAL;
    mw_ctx_t *ctx;
    int rc = mw__ctx_new(&ctx, base, opts);
    if (rc < 0)
        return rc;
    if ((rc = mw__mem_new(ctx, NULL)) < 0) {
        mw_ctx_free(ctx);
        return rc;
    }
    fork_protect(ctx);            /* before anything is registered */
    mw__mem_reserve(ctx, MW__MEM_RESERVE_BYTES);
    *ctxp = ctx;
    return 0;
}
