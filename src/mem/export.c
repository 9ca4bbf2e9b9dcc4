/* Exports: registrations of exactly [addr, addr+len) with remote access.
 * Their owners (connections) keep them; the memory layer lists them all,
 * so that memory leaving meshwire's hands withdraws every export over it
 * first: a key a peer holds never reaches memory given back for reuse. */
#include <errno.h>

#include <infiniband/verbs.h>

#include "core/dev.h"
#include "mem/region.h"

int mw__export_new(mw_ctx_t *ctx, const struct mw__pd *pd, void *addr, size_t len,
                   struct mw__export *e)
{
    int rc = mw__mem_dev_keys(ctx, pd->dev, addr, len, NULL, NULL);
    if (rc < 0)
        return rc;                /* not registered memory: -EFAULT */
    errno = 0;
    /* In the connection's own domain: its key works on no other queue pair. */
    e->mr = ibv_reg_mr(pd->pd, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                               IBV_ACCESS_REMOTE_READ);
    if (!e->mr)
        return errno ? -errno : -ENOMEM;
    ctx->stats.registrations++;
    e->start = (uintptr_t)addr;
    e->end = e->start + len;
    e->rkey = e->mr->rkey;
    mw__list_add_tail(&mw__mem_of(ctx)->exports, &e->link);
    return 0;
}

void mw__export_withdraw(mw_ctx_t *ctx, struct mw__export *e)
{
    if (!e->mr)
        return;
    mw__list_del(&e->link);
    ibv_dereg_mr(e->mr);
    e->mr = NULL;
    ctx->stats.deregistrations++;
}

void mw__exports_withdraw_range(mw_ctx_t *ctx, uintptr_t start, uintptr_t end)
{
    struct mw__list *h = &mw__mem_of(ctx)->exports;
    for (struct mw__list *n = h->next, *next; n != h; n = next) {
        next = n->next;
        struct mw__export *e = mw__container_of(n, struct mw__export, link);
        if (e->start < end && start < e->end) {
            MW_LOG(ctx, MW_LOG_DEBUG, "export [%#lx, %#lx) withdrawn: its memory was released",
                   (unsigned long)e->start, (unsigned long)e->end);
            mw__export_withdraw(ctx, e);
        }
    }
}
