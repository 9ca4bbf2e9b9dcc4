/* Regions: registration with every known device, and the sorted index. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "mem/region.h"

/* ------------------------------------------------------------------------
 * Registration
 * ------------------------------------------------------------------------ */

void mw__registrar_init(struct mw__registrar *rg, const struct mw__reg_backend *be,
                        uint64_t *nreg, uint64_t *ndereg)
{
    *rg = (struct mw__registrar){.be = *be, .nreg = nreg, .ndereg = ndereg};
    mw__list_init(&rg->all);
}

void mw__registrar_fini(struct mw__registrar *rg)
{
    mw__free(rg->devs);
    mw__free(rg->pds);
    rg->devs = NULL;
    rg->pds = NULL;
    rg->nslots = rg->npds = 0;
}

/* One backend registration of [start, end) into @k; errors normalised to a
 * negative errno. */
static int reg_keys(struct mw__registrar *rg, uintptr_t start, uintptr_t end,
                    struct mw__dev *dev, const struct mw__pd *pd, struct mw__keys *k)
{
    (*rg->nreg)++;
    errno = 0;
    k->handle = rg->be.reg(rg->be.be, dev, pd, (void *)start, end - start, &k->lkey, &k->rkey);
    if (k->handle)
        return 0;
    int err = errno > 0 ? -errno : -EIO;
    *k = (struct mw__keys){0};
    return err;
}

static int dereg_keys(struct mw__registrar *rg, struct mw__keys *k)
{
    if (!k->handle)
        return 0;
    (*rg->ndereg)++;
    int rc = rg->be.dereg(rg->be.be, k->handle);
    /* The handle is gone either way: a failed dereg cannot be retried
     * meaningfully, and keeping it would only dangle. */
    *k = (struct mw__keys){0};
    return rc > 0 ? -rc : rc;
}

static int reg_one(struct mw__registrar *rg, struct mw__region *r, int i)
{
    return reg_keys(rg, r->start, r->end, rg->devs[i], NULL, &r->keys[i]);
}

static int dereg_one(struct mw__registrar *rg, struct mw__region *r, int i)
{
    return dereg_keys(rg, &r->keys[i]);
}

/* Deregister every window of @w; the first error. */
static int drop_wins(struct mw__registrar *rg, struct mw__pdwins *w)
{
    int err = 0;
    for (int i = 0; i < w->n; i++) {
        int rc = dereg_keys(rg, &w->v[i].k);
        if (rc < 0 && !err)
            err = rc;
    }
    mw__free(w->v);
    *w = (struct mw__pdwins){0};
    return err;
}

int mw__region_drop_pd_keys(struct mw__registrar *rg, struct mw__region *r)
{
    int err = 0;
    for (int i = 0; i < r->npwins; i++) {
        int rc = drop_wins(rg, &r->pwins[i]);
        if (rc < 0 && !err)
            err = rc;
    }
    mw__free(r->pwins);
    r->pwins = NULL;
    r->npwins = 0;
    return err;
}

int mw__region_init(struct mw__registrar *rg, struct mw__region *r,
                    uintptr_t start, size_t len)
{
    int n = rg->nslots > 0 ? rg->nslots : 1;
    *r = (struct mw__region){.id = ++rg->next_id, .start = start, .end = start + len, .nkeys = n};
    mw__list_init(&r->link);
    r->keys = mw__calloc((size_t)n, sizeof *r->keys);
    if (!r->keys)
        return -ENOMEM;
    for (int i = 0; i < rg->nslots; i++) {
        if (!rg->devs[i])
            continue;
        int rc = reg_one(rg, r, i);
        if (rc < 0) {
            while (i-- > 0)
                dereg_one(rg, r, i);
            mw__free(r->keys);
            r->keys = NULL;
            return rc;
        }
    }
    mw__list_add_tail(&rg->all, &r->link);
    return 0;
}

int mw__region_adopt(struct mw__registrar *rg, struct mw__region *r, uintptr_t start,
                     size_t len, struct mw__keys *keys, int nkeys)
{
    int n = rg->nslots > nkeys ? rg->nslots : nkeys;
    *r = (struct mw__region){.id = ++rg->next_id, .start = start, .end = start + len, .nkeys = n};
    mw__list_init(&r->link);
    if (!(r->keys = mw__calloc((size_t)(n ? n : 1), sizeof *r->keys)))
        return -ENOMEM;
    for (int i = 0; i < rg->nslots; i++) {
        if (!rg->devs[i])
            continue;
        if (i < nkeys && keys[i].handle) {
            r->keys[i] = keys[i];
            continue;
        }
        int rc = reg_one(rg, r, i);
        if (rc < 0) {
            for (int j = 0; j < i; j++)
                if (j >= nkeys || !keys[j].handle)
                    dereg_one(rg, r, j);
            mw__free(r->keys);
            r->keys = NULL;
            return rc;
        }
    }
    for (int i = 0; i < nkeys; i++)
        keys[i] = (struct mw__keys){0};   /* taken over */
    mw__list_add_tail(&rg->all, &r->link);
    return 0;
}

int mw__region_fini(struct mw__registrar *rg, struct mw__region *r)
{
    int err = mw__region_drop_pd_keys(rg, r);
    for (int i = 0; i < r->nkeys; i++) {
        int rc = dereg_one(rg, r, i);
        if (rc < 0 && !err)
            err = rc;
    }
    mw__list_del(&r->link);
    mw__free(r->keys);
    r->keys = NULL;
    r->nkeys = 0;
    return err;
}

/* ------------------------------------------------------------------------
 * Connections' protection domains: a slot each, registrations made lazily
 * ------------------------------------------------------------------------ */

int mw__registrar_add_pd(struct mw__registrar *rg, struct mw__pd *pd)
{
    int i = 0;
    while (i < rg->npds && rg->pds[i])
        i++;
    if (i == rg->npds) {
        int n = rg->npds ? 2 * rg->npds : 8;
        struct mw__pd **v = mw__realloc(rg->pds, (size_t)n * sizeof *v);
        if (!v)
            return -ENOMEM;
        memset(v + rg->npds, 0, (size_t)(n - rg->npds) * sizeof *v);
        rg->pds = v;
        rg->npds = n;
    }
    rg->pds[i] = pd;
    pd->slot = i;
    return 0;
}

void mw__registrar_remove_pd(struct mw__registrar *rg, struct mw__pd *pd)
{
    if (pd->slot < 0 || pd->slot >= rg->npds || rg->pds[pd->slot] != pd)
        return;
    struct mw__region *r;
    mw__list_for_each(r, &rg->all, link)
        if (pd->slot < r->npwins)
            drop_wins(rg, &r->pwins[pd->slot]);
    rg->pds[pd->slot] = NULL;
    pd->slot = -1;
}

/* The window of @r holding [addr, addr+len): its id and bounds. */
static uint64_t window_of(const struct mw__region *r, uintptr_t addr, size_t len,
                          uintptr_t *start, uintptr_t *end)
{
    if (r->end - r->start <= MW__PDWIN_WHOLE) {
        *start = r->start;
        *end = r->end;
        return UINT64_MAX;        /* the whole region */
    }
    uintptr_t size = MW__PDWIN_MIN;
    uint64_t c = 0;
    while (len > size / 2 && size < 2 * (r->end - r->start)) {
        size <<= 2;
        c++;
    }
    uintptr_t k = addr / (size / 2);
    uintptr_t s = k * (size / 2), e = s + size;
    *start = s > r->start ? s : r->start;
    *end = e < r->end && e > s ? e : r->end;
    return c << 56 | k;
}

/* Where @id is in @w, or would be inserted. */
static int win_pos(const struct mw__pdwins *w, uint64_t id)
{
    int lo = 0, hi = w->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (w->v[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int mw__region_pd_keys(struct mw__registrar *rg, struct mw__region *r,
                       const struct mw__pd *pd, uintptr_t addr, size_t len,
                       const struct mw__keys **k)
{
    int i = pd->slot;
    if (i >= r->npwins) {
        int n = rg->npds;         /* > i: grown once per table growth */
        struct mw__pdwins *v = mw__realloc(r->pwins, (size_t)n * sizeof *v);
        if (!v)
            return -ENOMEM;
        memset(v + r->npwins, 0, (size_t)(n - r->npwins) * sizeof *v);
        r->pwins = v;
        r->npwins = n;
    }
    struct mw__pdwins *w = &r->pwins[i];
    uintptr_t start, end;
    uint64_t id = window_of(r, addr, len, &start, &end);
    int at = win_pos(w, id);
    if (at < w->n && w->v[at].id == id) {
        *k = &w->v[at].k;
        return 0;
    }
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 4;
        struct mw__pdwin *v = mw__realloc(w->v, (size_t)cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        w->v = v;
        w->cap = cap;
    }
    struct mw__keys nk;
    int rc = reg_keys(rg, start, end, pd->dev, pd, &nk);
    if (rc < 0)
        return rc;
    memmove(&w->v[at + 1], &w->v[at], (size_t)(w->n - at) * sizeof *w->v);
    w->v[at] = (struct mw__pdwin){.id = id, .k = nk};
    w->n++;
    *k = &w->v[at].k;
    return 0;
}

/* ------------------------------------------------------------------------
 * Devices
 * ------------------------------------------------------------------------ */

/* Make every region's key table and the device table @n long.  A failure
 * half way leaves some tables longer than needed, which is harmless. */
static int grow_slots(struct mw__registrar *rg, int n)
{
    struct mw__region *r;
    mw__list_for_each(r, &rg->all, link) {
        if (r->nkeys >= n)
            continue;
        struct mw__keys *k = mw__realloc(r->keys, (size_t)n * sizeof *k);
        if (!k)
            return -ENOMEM;
        memset(k + r->nkeys, 0, (size_t)(n - r->nkeys) * sizeof *k);
        r->keys = k;
        r->nkeys = n;
    }
    struct mw__dev **d = mw__realloc(rg->devs, (size_t)n * sizeof *d);
    if (!d)
        return -ENOMEM;
    memset(d + rg->nslots, 0, (size_t)(n - rg->nslots) * sizeof *d);
    rg->devs = d;
    rg->nslots = n;
    return 0;
}

/* Give @dev its slot (emptied again if what follows fails). */
static int take_slot(struct mw__registrar *rg, struct mw__dev *dev)
{
    if (!dev || dev->index < 0)
        return -EINVAL;
    int i = dev->index;
    if (i < rg->nslots && rg->devs[i])
        return rg->devs[i] == dev ? 1 : -EEXIST;
    if (i >= rg->nslots) {
        int rc = grow_slots(rg, i + 1);
        if (rc < 0)
            return rc;
    }
    rg->devs[i] = dev;
    return 0;
}

int mw__registrar_begin_dev(struct mw__registrar *rg, struct mw__dev *dev,
                            struct mw__regjob_entry **todo, size_t *n)
{
    *todo = NULL;
    *n = 0;
    int rc = take_slot(rg, dev);
    if (rc)
        return rc < 0 ? rc : -EEXIST;
    size_t count = 0;
    struct mw__region *r;
    mw__list_for_each(r, &rg->all, link)
        count++;
    if (count && !(*todo = mw__calloc(count, sizeof **todo))) {
        rg->devs[dev->index] = NULL;
        return -ENOMEM;
    }
    mw__list_for_each(r, &rg->all, link)
        (*todo)[(*n)++] = (struct mw__regjob_entry){
            .id = r->id, .addr = (void *)r->start, .len = r->end - r->start};
    rg->ndevs++;
    return 0;
}

bool mw__registrar_set_keys(struct mw__registrar *rg, const struct mw__dev *dev,
                            const struct mw__regjob_entry *e)
{
    struct mw__region *r;
    mw__list_for_each(r, &rg->all, link) {
        if (r->id != e->id)
            continue;
        if (!mw__registrar_has(rg, dev) || r->keys[dev->index].handle)
            return false;
        r->keys[dev->index] = (struct mw__keys){e->handle, e->lkey, e->rkey};
        return true;
    }
    return false;
}

int mw__registrar_add_dev(struct mw__registrar *rg, struct mw__dev *dev)
{
    int rc = take_slot(rg, dev);
    if (rc)
        return rc < 0 ? rc : 0;   /* 1: added already */
    int i = dev->index;
    /* Registered with the slot filled in, so reg_one sees the device; the
     * slot is emptied again if any region fails. */
    struct mw__region *r;
    mw__list_for_each(r, &rg->all, link)
        if ((rc = reg_one(rg, r, i)) < 0)
            break;
    if (rc < 0) {                 /* those registered before the failure go again */
        mw__list_for_each(r, &rg->all, link)
            dereg_one(rg, r, i);  /* a no-op where none was made */
        rg->devs[i] = NULL;
        return rc;
    }
    rg->ndevs++;
    return 0;
}

void mw__registrar_remove_dev(struct mw__registrar *rg, struct mw__dev *dev)
{
    if (!mw__registrar_has(rg, dev))
        return;
    int i = dev->index;
    struct mw__region *r;
    mw__list_for_each(r, &rg->all, link)
        dereg_one(rg, r, i);
    rg->devs[i] = NULL;
    rg->ndevs--;
}

/* ------------------------------------------------------------------------
 * Sorted index
 * ------------------------------------------------------------------------ */

void mw__rindex_fini(struct mw__rindex *ix)
{
    mw__free(ix->v);
    *ix = (struct mw__rindex){0};
}

int mw__rindex_reserve(struct mw__rindex *ix, size_t n)
{
    if (n <= ix->cap)
        return 0;
    size_t cap = ix->cap ? ix->cap : 16;
    while (cap < n)
        cap *= 2;
    struct mw__region **v = mw__realloc(ix->v, cap * sizeof *v);
    if (!v)
        return -ENOMEM;
    ix->v = v;
    ix->cap = cap;
    return 0;
}

/* The number of regions starting at or before @addr (so v[that - 1] is the
 * only candidate to contain it). */
static size_t upper_bound(const struct mw__rindex *ix, uintptr_t addr)
{
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->v[mid]->start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int mw__rindex_insert(struct mw__rindex *ix, struct mw__region *r)
{
    int rc = mw__rindex_reserve(ix, ix->n + 1);
    if (rc < 0)
        return rc;
    size_t at = upper_bound(ix, r->start);
    memmove(&ix->v[at + 1], &ix->v[at], (ix->n - at) * sizeof *ix->v);
    ix->v[at] = r;
    ix->n++;
    return 0;
}

bool mw__rindex_remove(struct mw__rindex *ix, const struct mw__region *r)
{
    size_t at = upper_bound(ix, r->start);
    if (at == 0 || ix->v[at - 1] != r)
        return false;
    at--;
    memmove(&ix->v[at], &ix->v[at + 1], (ix->n - at - 1) * sizeof *ix->v);
    ix->n--;
    ix->removed++;
    return true;
}

struct mw__region *mw__rindex_find(const struct mw__rindex *ix, uintptr_t start,
                                   uintptr_t end)
{
    size_t at = upper_bound(ix, start);
    if (at == 0)
        return NULL;
    struct mw__region *r = ix->v[at - 1];
    return end <= r->end ? r : NULL;
}

size_t mw__rindex_overlap(const struct mw__rindex *ix, uintptr_t start,
                          uintptr_t end, size_t *first)
{
    /* Disjoint and sorted by start means sorted by end too: skip those
     * ending at or before @start, take those starting before @end. */
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->v[mid]->end <= start)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t n = 0;
    while (lo + n < ix->n && ix->v[lo + n]->start < end)
        n++;
    *first = lo;
    return n;
}
