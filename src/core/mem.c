/* Registered memory: the memory layer's life cycle, the post path's
 * address -> keys lookup, and the mw_reg() registration cache.
 *
 * Lookup rule.  Regions of one index never overlap, so the region containing
 * a range is unique and binary search finds it.  The arena's index holds one
 * region per mapping (mmap never overlaps).  For mw_reg, a range that
 * overlaps registered regions without fitting in one is registered as the
 * union of itself and all of them; the regions it absorbs leave the index
 * but stay registered, hung under the new region, until their own handles
 * are gone (keys already handed out, possibly to peers, must stay valid).
 * So the index holds the outermost live regions only, and each absorbed
 * region lies inside its outer one.  When an outer region goes first, the
 * regions it absorbed come back into the index (they lie inside it, so they
 * are disjoint from everything else there).  A lookup tries the arena's
 * index, then mw_reg's; any live region containing a range has valid keys,
 * and this rule finds one whenever one exists. */
#include <errno.h>
#include <stdlib.h>

#include <infiniband/verbs.h>

#include "core/handle.h"
#include "core/region.h"

/* A mw_reg() region. */
struct ureg {
    struct mw__region r;
    unsigned refs;             /* handles pointing here */
    struct ureg *parent;       /* the region that absorbed this one; NULL
                                  while this one is in the index */
    struct mw__list children;  /* live regions this one absorbed */
    struct mw__list sibling;   /* in parent->children */
    struct mw__list link;      /* in mem->uregs */
};

/* A mw_reg() handle: one per call, so each mw_dereg() drops exactly the
 * reference its mw_reg() took, whichever region served it. */
struct mw__mr {
    uint64_t h;                /* what the caller holds (core/handle.h) */
    struct mw__mem *mem;
    struct ureg *reg;
    void *addr;                /* the caller's exact range */
    size_t len;
    struct mw__list link;      /* in mem->handles */
};

/* ------------------------------------------------------------------------
 * The real backend
 * ------------------------------------------------------------------------ */

static void *ibv_backend_reg(void *be, struct mw__dev *dev, void *addr, size_t len,
                             uint32_t *lkey, uint32_t *rkey)
{
    (void)be;
    /* Local access only: a peer reaches memory through the registration
     * mw_mem_export makes over exactly the range exported, nothing else. */
    struct ibv_mr *mr = ibv_reg_mr(dev->pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
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
 * Life cycle and lookup
 * ------------------------------------------------------------------------ */

int mw__mem_new(mw_ctx_t *ctx, const struct mw__reg_backend *backend)
{
    if (!ctx || (backend && (!backend->reg || !backend->dereg)))
        return -EINVAL;
    if (ctx->mem)
        return -EEXIST;
    struct mw__mem *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->ctx = ctx;
    mw__registrar_init(&m->rg, backend ? backend : &ibv_backend,
                       &ctx->stats.registrations, &ctx->stats.deregistrations);
    mw__list_init(&m->uregs);
    mw__list_init(&m->handles);
    ctx->mem = m;
    return 0;
}

/* Release every mw_reg region and handle, held or not: the devices go
 * next, and MRs must not outlive their protection domains. */
static void release_uregs(struct mw__mem *m)
{
    size_t held = 0;
    while (!mw__list_empty(&m->handles)) {
        struct mw__mr *h = mw__container_of(m->handles.next, struct mw__mr, link);
        mw__list_del(&h->link);
        mw__handle_release(h->h);
        free(h);
        held++;
    }
    if (held)
        MW_LOG(m->ctx, MW_LOG_WARN, "%zu mw_reg registration(s) still held at "
               "teardown: deregistered", held);
    while (!mw__list_empty(&m->uregs)) {
        struct ureg *u = mw__container_of(m->uregs.next, struct ureg, link);
        mw__list_del(&u->link);
        mw__region_fini(&m->rg, &u->r);
        free(u);
    }
    m->nuregs = 0;
    mw__rindex_fini(&m->user_ix);
}

void mw__mem_free(mw_ctx_t *ctx)
{
    struct mw__mem *m = ctx ? ctx->mem : NULL;
    if (!m)
        return;
    mw__arena_destroy(m);
    release_uregs(m);
    mw__rindex_fini(&m->arena_ix);
    if (!mw__list_empty(&m->rg.all))
        MW_LOG(ctx, MW_LOG_WARN, "memory teardown: regions left registered");
    MW_LOG(ctx, MW_LOG_DEBUG, "memory teardown: %llu registrations, %llu "
           "deregistrations", (unsigned long long)ctx->stats.registrations,
           (unsigned long long)ctx->stats.deregistrations);
    mw__registrar_fini(&m->rg);
    free(m);
    ctx->mem = NULL;
}

int mw__mem_add_dev(mw_ctx_t *ctx, struct mw__dev *dev)
{
    if (!ctx || !ctx->mem || !dev)
        return -EINVAL;
    struct mw__mem *m = ctx->mem;
    int rc = mw__registrar_add_dev(&m->rg, dev);
    size_t n = m->arena_ix.n + m->nuregs;
    if (rc < 0)
        MW_LOG(ctx, MW_LOG_WARN, "device %d: registering %zu region(s) failed: %s",
               dev->index, n, mw_strerror(rc));
    else
        MW_LOG(ctx, MW_LOG_DEBUG, "device %d: %zu region(s) registered", dev->index, n);
    return rc;
}

void mw__mem_remove_dev(mw_ctx_t *ctx, struct mw__dev *dev)
{
    if (ctx && ctx->mem && dev)
        mw__registrar_remove_dev(&ctx->mem->rg, dev);
}

int mw__mem_keys(const mw_ctx_t *ctx, const struct mw__dev *dev, const void *addr,
                 size_t len, uint32_t *lkey, uint32_t *rkey)
{
    uintptr_t start = (uintptr_t)addr, end;
    if (!len || __builtin_add_overflow(start, len, &end))
        return -EINVAL;
    const struct mw__mem *m = ctx->mem;
    if (!m || !mw__registrar_has(&m->rg, dev))
        return -ENODEV;
    const struct mw__region *r = mw__rindex_find(&m->arena_ix, start, end);
    if (!r)
        r = mw__rindex_find(&m->user_ix, start, end);
    if (!r)
        return -EFAULT;
    *lkey = r->keys[dev->index].lkey;
    *rkey = r->keys[dev->index].rkey;
    return 0;
}

/* ------------------------------------------------------------------------
 * mw_reg() cache
 * ------------------------------------------------------------------------ */

static struct ureg *ureg_of(struct mw__region *r)
{
    return r ? mw__container_of(r, struct ureg, r) : NULL;
}

/* Register [start, end) grown to the union with every indexed region it
 * overlaps, and put it in the index in their place. */
static int ureg_new(struct mw__mem *m, uintptr_t start, uintptr_t end, struct ureg **up)
{
    struct mw__rindex *ix = &m->user_ix;
    size_t first, n = mw__rindex_overlap(ix, start, end, &first);
    if (n) {
        if (ix->v[first]->start < start)
            start = ix->v[first]->start;
        if (ix->v[first + n - 1]->end > end)
            end = ix->v[first + n - 1]->end;
    }
    /* Room for every live region, so that putting absorbed regions back
     * into the index (in mw_dereg) can never fail. */
    int rc = mw__rindex_reserve(ix, m->nuregs + 1);
    struct ureg *u = rc ? NULL : calloc(1, sizeof *u);
    if (!u)
        return -ENOMEM;
    rc = mw__region_init(&m->rg, &u->r, start, end - start);
    if (rc < 0) {
        MW_LOG(m->ctx, MW_LOG_WARN, "mw_reg: registering [%#jx, +%ju) failed: %s",
               (uintmax_t)start, (uintmax_t)(end - start), mw_strerror(rc));
        free(u);
        return rc;
    }
    mw__list_init(&u->children);
    mw__list_init(&u->sibling);
    for (size_t i = 0; i < n; i++) {
        struct ureg *c = ureg_of(ix->v[first + i]);
        c->parent = u;
        mw__list_add_tail(&u->children, &c->sibling);
    }
    for (struct mw__list *l = u->children.next; l != &u->children; l = l->next)
        mw__rindex_remove(ix, &mw__container_of(l, struct ureg, sibling)->r);
    mw__rindex_insert(ix, &u->r); /* cannot fail: reserved above */
    mw__list_add_tail(&m->uregs, &u->link);
    m->nuregs++;
    MW_LOG(m->ctx, MW_LOG_DEBUG, "mw_reg: registered [%#jx, +%ju) with %d device(s)%s",
           (uintmax_t)start, (uintmax_t)(end - start), m->rg.ndevs,
           n ? ", merging overlapping registrations" : "");
    *up = u;
    return 0;
}

/* Drop one reference; the last one deregisters the region and hands what
 * it absorbed to its parent, or back to the index. */
static int ureg_put(struct mw__mem *m, struct ureg *u)
{
    if (--u->refs)
        return 0;
    if (!u->parent)
        mw__rindex_remove(&m->user_ix, &u->r);
    while (!mw__list_empty(&u->children)) {
        struct ureg *c = mw__container_of(u->children.next, struct ureg, sibling);
        mw__list_del(&c->sibling);
        c->parent = u->parent;
        if (u->parent)
            mw__list_add_tail(&u->parent->children, &c->sibling);
        else
            mw__rindex_insert(&m->user_ix, &c->r); /* cannot fail: reserved */
    }
    mw__list_del(&u->sibling);
    mw__list_del(&u->link);
    m->nuregs--;
    int rc = mw__region_fini(&m->rg, &u->r);
    if (rc < 0)
        MW_LOG(m->ctx, MW_LOG_WARN, "mw_dereg: deregistering [%#jx, +%ju) failed: %s",
               (uintmax_t)u->r.start, (uintmax_t)(u->r.end - u->r.start),
               mw_strerror(rc));
    free(u);
    return rc;
}

int mw_reg(mw_ctx_t *ctx, void *addr, size_t len, mw_mr_t **mrp)
{
    uintptr_t start = (uintptr_t)addr, end;
    if (!ctx || !ctx->mem || !addr || !mrp || !len ||
        __builtin_add_overflow(start, len, &end))
        return -EINVAL;
    struct mw__mem *m = ctx->mem;
    struct mw__mr *h = calloc(1, sizeof *h);
    uint64_t hv = h ? mw__handle_new(MW__H_MR, h, mw__loop_thread(ctx)) : 0;
    if (!hv) {
        free(h);
        return -ENOMEM;
    }
    /* Memory from mw_alloc is registered for as long as it lives: a handle
     * with nothing behind it.  (Collectives mw_reg their buffers on every
     * call; registering arena memory again cost two ioctls and page pinning
     * per collective.) */
    struct ureg *u = NULL;
    if (mw__rindex_find(&m->arena_ix, start, end) ||
        (u = ureg_of(mw__rindex_find(&m->user_ix, start, end)))) {
        ctx->stats.reg_cache_hits++;
    } else {
        int rc = ureg_new(m, start, end, &u);
        if (rc < 0) {
            mw__handle_release(hv);
            free(h);
            return rc;
        }
    }
    if (u)
        u->refs++;
    *h = (struct mw__mr){.h = hv, .mem = m, .reg = u, .addr = addr, .len = len};
    mw__list_add_tail(&m->handles, &h->link);
    *mrp = MW__HANDLE_PTR(mw_mr_t, hv);
    return 0;
}

int mw_dereg(mw_ctx_t *ctx, mw_mr_t *handle)
{
    int err;
    if (!ctx || !handle || !ctx->mem)
        return -EINVAL;
    struct mw__mr *mr = mw__handle_get(MW__HANDLE(handle), MW__H_MR, __func__, &err);
    if (!mr)
        return err;
    if (mr->mem != ctx->mem)
        return -EINVAL;               /* another context's */
    struct ureg *u = mr->reg;
    mw__list_del(&mr->link);
    mw__handle_release(mr->h);
    free(mr);
    return u ? ureg_put(ctx->mem, u) : 0;
}
