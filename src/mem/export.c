/* Exports: registrations of exactly [addr, addr+len) with remote access,
 * large ones made on the helper thread.
 * Their owners (connections) keep them; the memory layer lists them all,
 * so that memory leaving meshwire's hands withdraws every export over it
 * first: a key a peer holds never reaches memory given back for reuse. */
#include <errno.h>
#include <sys/random.h>

#include <infiniband/verbs.h>

#include "core/alloc.h"
#include "core/dev.h"
#include "core/worker.h"
#include "mem/region.h"

#define EXPORT_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* @e stands under @rkey: its key works, and memory released withdraws it. */
static void stand(mw_ctx_t *ctx, struct mw__export *e, struct ibv_mr *mr, uint32_t rkey,
                  void *addr, size_t len)
{
    e->mr = mr;
    e->standing = true;
    e->start = (uintptr_t)addr;
    e->end = e->start + len;
    e->rkey = rkey;
    mw__list_add_tail(&mw__mem_of(ctx)->exports, &e->link);
}

/* Without a device: a random key, which guessing finds once in 2^32 tries
 * (a device's is no harder), and a peer that tries is cut at its first
 * miss (lqp.c). */
static int export_keyless(mw_ctx_t *ctx, void *addr, size_t len, struct mw__export *e)
{
    int rc = mw__mem_held(ctx, addr, len);
    if (rc < 0)
        return rc == -EINVAL ? -EFAULT : rc;
    uint32_t rkey = 0;
    while (!rkey)
        if (getrandom(&rkey, sizeof rkey, 0) != sizeof rkey && errno != EINTR)
            return -errno;
    stand(ctx, e, NULL, rkey, addr, len);
    return 0;
}

int mw__export_new(mw_ctx_t *ctx, const struct mw__pd *pd, void *addr, size_t len,
                   struct mw__export *e)
{
    if (!pd)
        return export_keyless(ctx, addr, len, e);
    int rc = mw__mem_dev_keys(ctx, pd->dev, addr, len, NULL, NULL);
    if (rc < 0)
        return rc;                /* not registered memory: -EFAULT */
    errno = 0;
    /* In the connection's own domain: its key works on no other queue pair. */
    struct ibv_mr *mr = ibv_reg_mr(pd->pd, addr, len, EXPORT_ACCESS);
    if (!mr)
        return errno ? -errno : -ENOMEM;
    ctx->stats.registrations++;
    stand(ctx, e, mr, mr->rkey, addr, len);
    return 0;
}

/* A large export on the helper thread.  The domain is held until done. */
struct export_job {
    struct mw__job job;
    mw_ctx_t *ctx;
    struct mw__pd *pd;
    struct mw__export *e;         /* NULL: withdrawn meanwhile */
    void *addr;
    size_t len;
    uint64_t region;              /* the memory's, when asked: still it at the end? */
    struct ibv_mr *mr;
    int err;
    void (*done)(void *arg, int err);
    void *arg;
};

static void export_work(struct mw__job *jb)
{
    struct export_job *j = (struct export_job *)jb;
    errno = 0;
    if (!(j->mr = ibv_reg_mr(j->pd->pd, j->addr, j->len, EXPORT_ACCESS)))
        j->err = errno ? -errno : -ENOMEM;
}

static void export_done(struct mw__job *jb)
{
    struct export_job *j = (struct export_job *)jb;
    mw_ctx_t *ctx = j->ctx;
    int err = j->err;
    if (j->mr)
        ctx->stats.registrations++;
    if (!err && !j->e)
        err = -ECANCELED;
    else if (!err && mw__mem_region_id(ctx, j->pd->dev, j->addr, j->len) != j->region)
        err = -EFAULT;            /* released (and perhaps handed out again) meanwhile */
    if (err && j->mr) {
        ibv_dereg_mr(j->mr);
        ctx->stats.deregistrations++;
    }
    if (j->e) {
        j->e->pending = NULL;
        if (!err)
            stand(ctx, j->e, j->mr, j->mr->rkey, j->addr, j->len);
    }
    mw__pd_unhold(ctx, j->pd);
    j->done(j->arg, err);
    mw__free(j);
}

int mw__export_new_async(mw_ctx_t *ctx, struct mw__pd *pd, void *addr, size_t len,
                         struct mw__export *e, void (*done)(void *arg, int err), void *arg)
{
    if (len <= MW__REG_ASYNC_BYTES || !pd)
        return mw__export_new(ctx, pd, addr, len, e);
    uint64_t region = mw__mem_region_id(ctx, pd->dev, addr, len);
    if (!region)
        return -EFAULT;           /* not registered memory */
    struct export_job *j = mw__calloc(1, sizeof *j);
    if (!j)
        return -ENOMEM;
    *j = (struct export_job){.job = {.work = export_work, .done = export_done}, .ctx = ctx,
                             .pd = pd, .e = e, .addr = addr, .len = len, .region = region,
                             .done = done, .arg = arg};
    *e = (struct mw__export){.pending = j};
    pd->jobs++;
    if (mw__worker_submit(ctx, &j->job) < 0) {
        pd->jobs--;
        mw__free(j);
        *e = (struct mw__export){0};
        return mw__export_new(ctx, pd, addr, len, e);
    }
    return 1;
}

void mw__export_withdraw(mw_ctx_t *ctx, struct mw__export *e)
{
    if (e->pending) {             /* its job drops the registration */
        ((struct export_job *)e->pending)->e = NULL;
        e->pending = NULL;
        return;
    }
    if (!e->standing)
        return;
    e->standing = false;
    mw__list_del(&e->link);
    if (!e->mr)
        return;
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
