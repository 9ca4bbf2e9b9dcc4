/* Which keys memory has: devices and connections' domains joining the
 * memory layer (layer.c makes it), and the post path's address -> keys
 * lookup.  A lookup tries the arena's index (mw_alloc), then mw_reg's
 * (regcache.c): each holds disjoint regions, so binary search finds the one
 * containing a range, and any live region containing it has valid keys. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/worker.h"
#include "mem/region.h"

/* ------------------------------------------------------------------------
 * Devices and protection domains joining, and the lookup
 * ------------------------------------------------------------------------ */

static uint64_t live_bytes(const struct mw__mem *m)
{
    uint64_t bytes = 0;
    struct mw__region *r;
    mw__list_for_each(r, &m->rg.all, link)
        bytes += r->end - r->start;
    return bytes;
}

/* Registering @bytes in @n regions with @dev failed: say why, in dev->why
 * for the connections waiting on it, and at length in the log. */
static void add_dev_failed(mw_ctx_t *ctx, struct mw__dev *dev, int err, size_t n,
                           uint64_t bytes)
{
    char what[112];
    bool memlock = mw__memlock_why(err, bytes, what, sizeof what);
    snprintf(dev->why, sizeof dev->why, "RDMA device %s %s", dev->name, what);
    MW_LOG(ctx, MW_LOG_WARN, "%s (%zu regions)%s", dev->why, n,
           memlock ? ": each connection pins more (its own registration of the memory it "
                     "sends and receives through: about 16 MiB with the default slots); raise "
                     "ulimit -l, or LimitMEMLOCK= for a systemd service (unlimited is simplest)"
                   : "");
}

int mw__mem_add_dev(mw_ctx_t *ctx, struct mw__dev *dev)
{
    if (!ctx || !mw__mem_of(ctx) || !dev)
        return -EINVAL;
    struct mw__mem *m = mw__mem_of(ctx);
    int rc = mw__registrar_add_dev(&m->rg, dev);
    size_t n = m->arena_ix.n + m->nuregs;
    if (rc < 0)
        add_dev_failed(ctx, dev, rc, n, live_bytes(m));
    else
        MW_LOG(ctx, MW_LOG_DEBUG, "device %d: %zu region(s) registered", dev->index, n);
    return rc;
}

/* Registering the live regions with a new device on the helper thread. */
struct devreg {
    struct mw__job job;
    struct mw__mem *m;
    struct mw__dev *dev;
    struct mw__reg_backend be;
    struct mw__regjob_entry *e;
    size_t n, tried;
    void (*done)(struct mw__dev *dev, int err, void *arg);
    void *arg;
};

static void devreg_work(struct mw__job *j)
{
    struct devreg *d = (struct devreg *)j;
    for (size_t i = 0; i < d->n; i++) {
        struct mw__regjob_entry *e = &d->e[i];
        d->tried++;
        errno = 0;
        e->handle = d->be.reg(d->be.be, d->dev, NULL, e->addr, e->len, &e->lkey, &e->rkey);
        if (!e->handle) {
            e->err = errno > 0 ? -errno : -EIO;
            break;                /* the device is not usable: stop here */
        }
    }
}

static void devreg_done(struct mw__job *j)
{
    struct devreg *d = (struct devreg *)j;
    struct mw__mem *m = d->m;
    int err = 0;
    for (size_t i = 0; i < d->tried && !err; i++)
        err = d->e[i].err;
    m->ctx->stats.registrations += d->tried;
    for (size_t i = 0; i < d->tried; i++) {
        struct mw__regjob_entry *e = &d->e[i];
        if (e->handle && (err || !mw__registrar_set_keys(&m->rg, d->dev, e))) {
            d->be.dereg(d->be.be, e->handle);   /* its region went meanwhile */
            m->ctx->stats.deregistrations++;
        }
    }
    if (err) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < d->n; i++)
            bytes += d->e[i].len;
        add_dev_failed(m->ctx, d->dev, err, d->n, bytes);
        mw__registrar_remove_dev(&m->rg, d->dev);
    }
    d->done(d->dev, err, d->arg);
    mw__free(d->e);
    mw__free(d);
}

int mw__mem_add_dev_async(mw_ctx_t *ctx, struct mw__dev *dev,
                          void (*done)(struct mw__dev *dev, int err, void *arg), void *arg)
{
    if (!ctx || !mw__mem_of(ctx) || !dev || !done)
        return -EINVAL;
    struct mw__mem *m = mw__mem_of(ctx);
    uint64_t bytes = live_bytes(m);
    if (bytes <= MW__REG_INLINE_BYTES)
        return mw__mem_add_dev(ctx, dev);
    struct devreg *d = mw__calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    int rc = mw__registrar_begin_dev(&m->rg, dev, &d->e, &d->n);
    if (rc < 0) {
        mw__free(d);
        return rc;
    }
    *d = (struct devreg){.job = {.work = devreg_work, .done = devreg_done}, .m = m, .dev = dev,
                         .be = m->rg.be, .e = d->e, .n = d->n, .done = done, .arg = arg};
    if ((rc = mw__worker_submit(ctx, &d->job)) < 0) {
        mw__registrar_remove_dev(&m->rg, dev);
        mw__free(d->e);
        mw__free(d);
        return rc;
    }
    MW_LOG(ctx, MW_LOG_DEBUG, "device %d: registering %zu region(s), %llu MiB, off the loop",
           dev->index, d->n, (unsigned long long)(bytes >> 20));
    return 1;
}

void mw__mem_remove_dev(mw_ctx_t *ctx, struct mw__dev *dev)
{
    if (ctx && mw__mem_of(ctx) && dev)
        mw__registrar_remove_dev(&mw__mem_of(ctx)->rg, dev);
}

int mw__mem_add_pd(mw_ctx_t *ctx, struct mw__pd *pd)
{
    return mw__registrar_add_pd(&mw__mem_of(ctx)->rg, pd);
}

void mw__mem_remove_pd(mw_ctx_t *ctx, struct mw__pd *pd)
{
    if (ctx && mw__mem_of(ctx) && pd)
        mw__registrar_remove_pd(&mw__mem_of(ctx)->rg, pd);
}

/* The live region containing [addr, addr+len) with keys of @dev: 0 with
 * *@rp set, -EINVAL (an empty or wrapping range), -EFAULT (none). */
static int find(struct mw__mem *m, const struct mw__dev *dev, const void *addr, size_t len,
                struct mw__region **rp)
{
    uintptr_t start = (uintptr_t)addr, end;
    if (!len || __builtin_add_overflow(start, len, &end))
        return -EINVAL;
    struct mw__region *r = mw__rindex_find(&m->arena_ix, start, end);
    if (!r) {
        mw__regcache_sync(m);     /* memory that went is never found */
        r = mw__rindex_find(&m->user_ix, start, end);
    }
    *rp = r;
    return r && (!dev || r->keys[dev->index].handle) ? 0 : -EFAULT;   /* or not yet on @dev */
}

uint64_t mw__mem_epoch(mw_ctx_t *ctx)
{
    struct mw__mem *m = mw__mem_of(ctx);
    if (!m)
        return 0;
    mw__regcache_sync(m);         /* memory unmapped since is counted */
    return m->arena_ix.removed + m->user_ix.removed;
}

void mw__mem_sync(mw_ctx_t *ctx)
{
    if (mw__mem_of(ctx))
        mw__regcache_sync(mw__mem_of(ctx));
}

/* The live region holding [addr, addr+len) with keys of @dev (NULL: any
 * region, device or not): 0 with *@rp set, -ENODEV (@dev not added), or
 * find()'s errors. */
static int dev_region(mw_ctx_t *ctx, const struct mw__dev *dev, const void *addr, size_t len,
                      struct mw__region **rp)
{
    struct mw__mem *m = mw__mem_of(ctx);
    if (!m)
        return dev ? -ENODEV : -EFAULT;   /* nothing was ever registered */
    if (dev && !mw__registrar_has(&m->rg, dev))
        return -ENODEV;
    return find(m, dev, addr, len, rp);
}

int mw__mem_dev_keys(mw_ctx_t *ctx, const struct mw__dev *dev, const void *addr, size_t len,
                     uint32_t *lkey, uint32_t *rkey)
{
    struct mw__region *r;
    int rc = dev_region(ctx, dev, addr, len, &r);
    if (rc < 0)
        return rc;
    if (lkey)
        *lkey = r->keys[dev->index].lkey;
    if (rkey)
        *rkey = r->keys[dev->index].rkey;
    return 0;
}

uint64_t mw__mem_region_id(mw_ctx_t *ctx, const struct mw__dev *dev, const void *addr,
                           size_t len)
{
    struct mw__region *r;
    return dev_region(ctx, dev, addr, len, &r) < 0 ? 0 : r->id;
}

int mw__mem_held(mw_ctx_t *ctx, const void *addr, size_t len)
{
    struct mw__region *r;
    return dev_region(ctx, NULL, addr, len, &r);
}

int mw__mem_keys(mw_ctx_t *ctx, const struct mw__pd *pd, const void *addr, size_t len,
                 uint32_t *lkey)
{
    struct mw__mem *m = mw__mem_of(ctx);
    if (!m || !pd || !mw__registrar_has(&m->rg, pd->dev) || pd->slot < 0)
        return -ENODEV;
    struct mw__region *r;
    int rc = find(m, pd->dev, addr, len, &r);
    if (rc < 0)
        return rc;
    const struct mw__keys *k;
    rc = mw__region_pd_keys(&m->rg, r, pd, (uintptr_t)addr, len, &k);
    if (rc < 0) {
        char why[112];
        mw__memlock_why(rc, len, why, sizeof why);
        MW_LOG(ctx, MW_LOG_WARN, "registering a window around [%#lx, %#lx) for a "
               "connection: %s", (unsigned long)addr, (unsigned long)addr + len, why);
        return rc == -EFAULT || rc == -EINVAL ? -EIO : rc;   /* those mean the range here */
    }
    *lkey = k->lkey;
    return 0;
}
