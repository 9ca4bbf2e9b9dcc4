/* Connections' protection domains (mem/mem.h, struct mw__pd): one per
 * queue pair, so that a key works only on the connection it was made for. */
#include <errno.h>

#include <infiniband/verbs.h>

#include "core/alloc.h"
#include "core/dev.h"
#include "mem/region.h"

int mw__pd_new(mw_ctx_t *ctx, struct mw__dev *dev, struct mw__pd **out)
{
    struct mw__pd *pd = mw__calloc(1, sizeof *pd);
    if (!pd)
        return -ENOMEM;
    *pd = (struct mw__pd){.dev = dev, .slot = -1};
    errno = 0;
    if (!(pd->pd = ibv_alloc_pd(dev->verbs))) {
        int rc = errno ? -errno : -ENOMEM;
        mw__free(pd);
        return rc;
    }
    int rc = mw__mem_add_pd(ctx, pd);
    if (rc < 0) {
        ibv_dealloc_pd(pd->pd);
        mw__free(pd);
        return rc;
    }
    *out = pd;
    return 0;
}

static void pd_dealloc(mw_ctx_t *ctx, struct mw__pd *pd)
{
    int rc = ibv_dealloc_pd(pd->pd);   /* the errno value itself */
    if (rc)
        MW_LOG(ctx, MW_LOG_WARN, "a connection's protection domain on %s: cannot free it: %s",
               pd->dev->name, mw_strerror(-rc));
    mw__free(pd);
}

void mw__pd_free(mw_ctx_t *ctx, struct mw__pd *pd)
{
    if (!pd)
        return;
    mw__mem_remove_pd(ctx, pd);
    if (pd->jobs)
        pd->freed = true;         /* the last export job deallocates it */
    else
        pd_dealloc(ctx, pd);
}

void mw__pd_unhold(mw_ctx_t *ctx, struct mw__pd *pd)
{
    if (--pd->jobs == 0 && pd->freed)
        pd_dealloc(ctx, pd);
}
