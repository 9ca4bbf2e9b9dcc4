/* Registered memory without an RDMA device: the region index, the mw_reg()
 * registration cache, and mw_alloc()'s jemalloc arena, over a fake
 * registration backend and fake devices (only .index is set).
 *
 * The context: mw_ctx_new() always wires the real ibv_reg_mr backend, so
 * setup() creates a context as usual and then swaps its memory layer for one
 * on the fake backend (mw__mem_free + mw__mem_new) before anything is
 * registered, so the swap is invisible.  teardown() frees the memory layer
 * explicitly (to check that everything registered was deregistered exactly
 * once), then the context as usual. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <cmocka.h>

#include <jemalloc/jemalloc.h>

#include "core/ctx.h"
#include "core/dev.h"
#include "mem/mem.h"
#include "core/worker.h"
#include "mem/region.h"

/* ------------------------------------------------------------------------
 * Fake backend
 * ------------------------------------------------------------------------ */

struct fake_mr {
    struct fake_mr *next;
    int dev;
    int pd;                   /* the connection domain's slot; -1: the device's */
    uintptr_t start, end;
    uint32_t lkey, rkey;
};

struct fake {
    unsigned calls;           /* reg calls, failed ones included */
    unsigned regs, deregs;    /* successful regs; deregs */
    unsigned live;
    int fail_in;              /* > 0: the fail_in-th next reg call fails */
    bool fail_sticky;         /* ... and every one after it */
    int fail_err;
    uint32_t serial;
    uintptr_t last_start, last_end; /* range of the last successful reg */
    struct fake_mr *mrs;
};

/* Like ibv_reg_mr, the fake may be called from the registration worker
 * and the loop thread at once. */
static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;

static void *fake_reg_locked(void *be, struct mw__dev *dev, const struct mw__pd *pd, void *addr, size_t len,
                             uint32_t *lkey, uint32_t *rkey)
{
    struct fake *f = be;
    f->calls++;
    if (f->fail_in > 0 && --f->fail_in == 0) {
        if (f->fail_sticky)
            f->fail_in = 1;
        errno = f->fail_err;
        return NULL;
    }
    struct fake_mr *mr = calloc(1, sizeof *mr);
    if (!mr) {
        errno = ENOMEM;
        return NULL;
    }
    /* Distinct keys per call; the low byte names the device. */
    f->serial++;
    *mr = (struct fake_mr){
        .next = f->mrs,
        .dev = dev->index,
        .pd = pd ? pd->slot : -1,
        .start = (uintptr_t)addr,
        .end = (uintptr_t)addr + len,
        .lkey = f->serial << 8 | (uint32_t)dev->index,
        .rkey = (f->serial << 8 | (uint32_t)dev->index) ^ 0x80000000u,
    };
    f->mrs = mr;
    f->regs++;
    f->live++;
    f->last_start = mr->start;
    f->last_end = mr->end;
    *lkey = mr->lkey;
    *rkey = mr->rkey;
    return mr;
}

static void *fake_reg(void *be, struct mw__dev *dev, const struct mw__pd *pd, void *addr, size_t len,
                      uint32_t *lkey, uint32_t *rkey)
{
    pthread_mutex_lock(&fake_lock);
    void *mr = fake_reg_locked(be, dev, pd, addr, len, lkey, rkey);
    pthread_mutex_unlock(&fake_lock);
    return mr;
}

static int fake_dereg(void *be, void *handle)
{
    pthread_mutex_lock(&fake_lock);
    struct fake *f = be;
    struct fake_mr **pp = &f->mrs;
    while (*pp && *pp != handle)
        pp = &(*pp)->next;
    assert_non_null(*pp);     /* a handle is deregistered once, and was ours */
    *pp = ((struct fake_mr *)handle)->next;
    free(handle);
    f->deregs++;
    f->live--;
    pthread_mutex_unlock(&fake_lock);
    return 0;
}

static struct fake_mr *fake_find(const struct fake *f, uint32_t lkey)
{
    for (struct fake_mr *mr = f->mrs; mr; mr = mr->next)
        if (mr->lkey == lkey)
            return mr;
    return NULL;
}

static void fake_fail(struct fake *f, int in, bool sticky, int err)
{
    f->fail_in = in;
    f->fail_sticky = sticky;
    f->fail_err = err;
}

/* ------------------------------------------------------------------------
 * Fixture
 * ------------------------------------------------------------------------ */

#define NDEV 4

struct env {
    mw_ctx_t *ctx;
    struct fake fake;
    struct mw__reg_backend be;
    struct mw__dev dev[NDEV];
    unsigned logs;
};

static void count_log(int level, const char *msg, void *arg)
{
    (void)level;
    (void)msg;
    ((struct env *)arg)->logs++;
}

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    assert_non_null(e);
    mw_ctx_opts_t o;
    mw_ctx_opts_init(&o);
    o.log_level = MW_LOG_DEBUG;   /* exercise every log call, silently */
    o.log_fn = count_log;
    o.log_arg = e;
    assert_int_equal(mw_ctx_new(&e->ctx, NULL, &o), 0);
    /* Swap the real backend for the fake (see the top of the file). */
    mw__mem_free(e->ctx);
    assert_null(mw__mem_of(e->ctx));
    e->be = (struct mw__reg_backend){.reg = fake_reg, .dereg = fake_dereg, .be = &e->fake};
    assert_int_equal(mw__mem_new(e->ctx, &e->be), 0);
    for (int i = 0; i < NDEV; i++)
        e->dev[i].index = i;
    *state = e;
    return 0;
}

/* As setup, with registrations dropped at their last mw_dereg, as without
 * userfaultfd: the index rules, alone. */
static int setup_unkept(void **state)
{
    setup(state);
    struct env *e = *state;
    mw__mem_of(e->ctx)->uffd_tried = -ENOSYS;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    mw__worker_flush(e->ctx);     /* deregistrations handed to the helper */
    mw__mem_free(e->ctx);
    mw_ctx_stats_t st;
    mw_ctx_stats(e->ctx, &st);
    /* Everything registered was deregistered exactly once (fake_dereg
     * rejects a second time), and the counters saw every backend call. */
    assert_int_equal(e->fake.live, 0);
    assert_null(e->fake.mrs);
    assert_int_equal(e->fake.regs, e->fake.deregs);
    assert_int_equal(st.registrations, e->fake.calls);
    assert_int_equal(st.deregistrations, e->fake.deregs);
    mw_ctx_free(e->ctx);
    free(e);
    return 0;
}

static void add_dev(struct env *e, int i)
{
    assert_int_equal(mw__mem_add_dev(e->ctx, &e->dev[i]), 0);
}

/* The fake MR behind @dev's keys for [addr, addr+len): it must cover the
 * range and belong to that device. */
static struct fake_mr *mr_for(struct env *e, int dev, const void *addr, size_t len)
{
    uint32_t lkey = 0, rkey = 0;
    assert_int_equal(mw__mem_dev_keys(e->ctx, &e->dev[dev], addr, len, &lkey, &rkey), 0);
    struct fake_mr *mr = fake_find(&e->fake, lkey);
    assert_non_null(mr);
    assert_int_equal(mr->rkey, rkey);
    assert_int_equal(mr->dev, dev);
    assert_true(mr->start <= (uintptr_t)addr);
    assert_true((uintptr_t)addr + len <= mr->end);
    return mr;
}

static int keys_rc(struct env *e, const struct mw__dev *dev, const void *addr, size_t len)
{
    uint32_t lkey, rkey;
    return mw__mem_dev_keys(e->ctx, dev, addr, len, &lkey, &rkey);
}

static uint64_t cache_hits(struct env *e)
{
    mw_ctx_stats_t st;
    mw_ctx_stats(e->ctx, &st);
    return st.reg_cache_hits;
}

/* Caller memory for mw_reg (the fake never touches it). */
static char buf[1 << 16];

/* ------------------------------------------------------------------------
 * The sorted index alone
 * ------------------------------------------------------------------------ */

static void rindex_binary_search(void **state)
{
    (void)state;
    enum { N = 257 };
    static struct mw__region r[N];
    struct mw__rindex ix = {0};
    /* Regions [100i, 100i + 50), inserted in a scrambled order. */
    for (unsigned k = 0; k < N; k++) {
        unsigned i = (k * 101) % N;
        r[i] = (struct mw__region){.start = 1000 + 100 * i, .end = 1050 + 100 * i};
        assert_int_equal(mw__rindex_insert(&ix, &r[i]), 0);
    }
    assert_int_equal(ix.n, N);
    for (unsigned i = 0; i < N; i++) {
        uintptr_t s = r[i].start;
        assert_ptr_equal(mw__rindex_find(&ix, s, s + 50), &r[i]);
        assert_ptr_equal(mw__rindex_find(&ix, s + 10, s + 11), &r[i]);
        assert_null(mw__rindex_find(&ix, s + 40, s + 60));   /* runs past the end */
        assert_null(mw__rindex_find(&ix, s + 60, s + 70));   /* in the gap */
        assert_null(mw__rindex_find(&ix, s + 40, s + 110));  /* straddles two */
    }
    assert_null(mw__rindex_find(&ix, 0, 10));
    size_t first, n = mw__rindex_overlap(&ix, 1040, 1300, &first);
    assert_int_equal(n, 3);
    assert_ptr_equal(ix.v[first], &r[0]);
    assert_int_equal(mw__rindex_overlap(&ix, 1050, 1100, &first), 0);
    for (unsigned i = 0; i < N; i += 2)
        assert_true(mw__rindex_remove(&ix, &r[i]));
    assert_false(mw__rindex_remove(&ix, &r[0]));
    for (unsigned i = 0; i < N; i++) {
        struct mw__region *want = i % 2 ? &r[i] : NULL;
        assert_ptr_equal(mw__rindex_find(&ix, r[i].start, r[i].end), want);
    }
    mw__rindex_fini(&ix);
}

/* ------------------------------------------------------------------------
 * mw_reg cache
 * ------------------------------------------------------------------------ */

static void reg_subrange_hits_cache(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    mw_mr_t *whole, *part;
    assert_int_equal(mw_reg(e->ctx, buf, 16384, &whole), 0);
    assert_int_equal(e->fake.calls, 1);
    assert_int_equal(mw_reg(e->ctx, buf + 100, 200, &part), 0);
    assert_int_equal(e->fake.calls, 1);                 /* no new registration */
    assert_int_equal(cache_hits(e), 1);
    assert_ptr_equal(mr_for(e, 0, buf + 100, 200), mr_for(e, 0, buf, 16384));
    assert_int_equal(mw_dereg(e->ctx, part), 0);
    assert_int_equal(e->fake.deregs, 0);                /* still referenced */
    assert_int_equal(mw_dereg(e->ctx, whole), 0);
    assert_int_equal(e->fake.deregs, 1);
    assert_int_equal(keys_rc(e, &e->dev[0], buf, 1), -EFAULT);
}

static void reg_overlap_registers_union(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    mw_mr_t *a, *b, *c, *d, *hit;
    assert_int_equal(mw_reg(e->ctx, buf, 100, &a), 0);
    assert_int_equal(mw_reg(e->ctx, buf + 50, 100, &b), 0);
    assert_int_equal(e->fake.calls, 2);
    assert_ptr_equal(e->fake.last_start, (uintptr_t)buf);  /* union of a and b */
    assert_ptr_equal(e->fake.last_end, (uintptr_t)buf + 150);
    /* Lookups (and new mw_regs) are served by the outermost region. */
    struct fake_mr *ab = mr_for(e, 0, buf, 150);
    assert_ptr_equal(mr_for(e, 0, buf + 10, 20), ab);
    assert_int_equal(mw_reg(e->ctx, buf + 10, 20, &hit), 0);
    assert_int_equal(cache_hits(e), 1);
    assert_int_equal(mw_dereg(e->ctx, hit), 0);

    /* A range bridging two disjoint registrations absorbs both. */
    assert_int_equal(mw_reg(e->ctx, buf + 300, 100, &c), 0);
    assert_int_equal(mw_reg(e->ctx, buf + 120, 200, &d), 0);
    assert_int_equal(e->fake.calls, 4);
    assert_ptr_equal(e->fake.last_start, (uintptr_t)buf);
    assert_ptr_equal(e->fake.last_end, (uintptr_t)buf + 400);
    struct fake_mr *all = mr_for(e, 0, buf, 400);
    assert_ptr_equal(mr_for(e, 0, buf + 10, 20), all);
    assert_int_equal(e->fake.live, 4);                  /* absorbed ones stay valid */

    /* The outer region goes first: what it absorbed is found again. */
    assert_int_equal(mw_dereg(e->ctx, d), 0);
    assert_int_equal(e->fake.deregs, 1);
    assert_ptr_equal(mr_for(e, 0, buf + 10, 20), ab);
    assert_int_equal(keys_rc(e, &e->dev[0], buf + 200, 10), -EFAULT);
    mr_for(e, 0, buf + 300, 100);
    assert_int_equal(mw_dereg(e->ctx, b), 0);
    struct fake_mr *ra = mr_for(e, 0, buf + 10, 20);
    assert_ptr_equal(ra->start, (uintptr_t)buf);
    assert_ptr_equal(ra->end, (uintptr_t)buf + 100);
    assert_int_equal(keys_rc(e, &e->dev[0], buf + 120, 10), -EFAULT);
    assert_int_equal(mw_dereg(e->ctx, a), 0);
    assert_int_equal(mw_dereg(e->ctx, c), 0);
    assert_int_equal(e->fake.deregs, 4);
    assert_int_equal(keys_rc(e, &e->dev[0], buf, 1), -EFAULT);
    assert_int_equal(keys_rc(e, &e->dev[0], buf + 300, 1), -EFAULT);
}

static void dereg_once_per_registration(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    add_dev(e, 1);
    enum { N = 40 };
    mw_mr_t *mr[N];
    /* Overlapping, nested and disjoint ranges, taken and dropped in an
     * order unrelated to how they were merged. */
    for (int i = 0; i < N; i++) {
        size_t off = (size_t)(i * 7919) % 60000, len = 1 + (size_t)(i * 104729) % 3000;
        assert_int_equal(mw_reg(e->ctx, buf + off, len, &mr[i]), 0);
        mr_for(e, 0, buf + off, len);
        mr_for(e, 1, buf + off, len);
    }
    for (int i = 0; i < N; i++) {
        int k = (i * 17) % N;
        assert_int_equal(mw_dereg(e->ctx, mr[k]), 0);
    }
    assert_int_equal(e->fake.live, 0);
    assert_int_equal(e->fake.regs, e->fake.deregs);
    assert_int_equal(mw_dereg(e->ctx, NULL), -EINVAL);
}

/* A registration dropped twice, another context's, or something else's
 * handle: refused, and the registrations still held are untouched. */
static void dereg_refuses_what_it_does_not_hold(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    mw_mr_t *a, *b;
    assert_int_equal(mw_reg(e->ctx, buf, 4096, &a), 0);
    assert_int_equal(mw_reg(e->ctx, buf, 4096, &b), 0);
    assert_int_equal(mw_dereg(e->ctx, a), 0);
    assert_int_equal(mw_dereg(e->ctx, a), -ESTALE);          /* twice */
    assert_int_equal(e->fake.deregs, 0);                     /* b still holds it */
    mw_ctx_t *other;
    assert_int_equal(mw_ctx_new(&other, NULL, NULL), 0);
    assert_int_equal(mw_dereg(other, b), -EINVAL);           /* not its own */
    mw_future_t *f = mw_future_new(e->ctx);
    assert_int_equal(mw_dereg(e->ctx, (mw_mr_t *)f), -EINVAL);
    assert_int_equal(mw_future_state(f), MW_FUTURE_PENDING);
    mw_future_unref(f);
    mw_ctx_free(other);
    assert_int_equal(keys_rc(e, &e->dev[0], buf, 4096), 0);  /* still registered */
    assert_int_equal(mw_dereg(e->ctx, b), 0);
    assert_int_equal(e->fake.deregs, 1);
}

static void keys_lookup_rules(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    mw_mr_t *a, *b;
    assert_int_equal(mw_reg(e->ctx, buf, 100, &a), 0);
    assert_int_equal(mw_reg(e->ctx, buf + 100, 100, &b), 0);  /* adjacent: own MR */
    assert_int_equal(e->fake.calls, 2);
    struct mw__dev *d0 = &e->dev[0];
    mr_for(e, 0, buf, 100);
    mr_for(e, 0, buf + 99, 1);
    mr_for(e, 0, buf + 100, 100);
    assert_int_equal(keys_rc(e, d0, buf + 90, 20), -EFAULT);   /* straddles two */
    assert_int_equal(keys_rc(e, d0, buf + 150, 51), -EFAULT);  /* runs past */
    assert_int_equal(keys_rc(e, d0, buf + 4096, 8), -EFAULT);  /* never registered */
    assert_int_equal(keys_rc(e, &e->dev[1], buf, 8), -ENODEV); /* never added */
    struct mw__dev impostor = {.index = 0};
    assert_int_equal(keys_rc(e, &impostor, buf, 8), -ENODEV);
    struct mw__dev far = {.index = 1000};
    assert_int_equal(keys_rc(e, &far, buf, 8), -ENODEV);
    assert_int_equal(keys_rc(e, d0, buf, 0), -EINVAL);
    assert_int_equal(keys_rc(e, d0, (void *)(UINTPTR_MAX - 10), 100), -EINVAL);
    assert_int_equal(mw_dereg(e->ctx, a), 0);
    assert_int_equal(mw_dereg(e->ctx, b), 0);
}

static void reg_rejects_bad_args(void **state)
{
    struct env *e = *state;
    mw_mr_t *mr = NULL;
    assert_int_equal(mw_reg(NULL, buf, 1, &mr), -EINVAL);
    assert_int_equal(mw_reg(e->ctx, NULL, 1, &mr), -EINVAL);
    assert_int_equal(mw_reg(e->ctx, buf, 1, NULL), -EINVAL);
    assert_int_equal(mw_reg(e->ctx, buf, 0, &mr), -EINVAL);
    assert_int_equal(mw_reg(e->ctx, (void *)(UINTPTR_MAX - 10), 100, &mr), -EINVAL);
    assert_null(mr);
    assert_int_equal(mw_dereg(e->ctx, NULL), -EINVAL);
    assert_int_equal(mw_dereg(NULL, NULL), -EINVAL);
    assert_int_equal(mw__mem_add_dev(e->ctx, NULL), -EINVAL);
    assert_int_equal(e->fake.calls, 0);
}

/* ------------------------------------------------------------------------
 * Registrations kept after their last mw_dereg (userfaultfd)
 * ------------------------------------------------------------------------ */

/* Anonymous memory, at @at exactly when given (as a new allocation after a
 * free lands where the old one was). */
static char *anon(size_t len, void *at)
{
    char *p = mmap(at, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    assert_true(p != MAP_FAILED);
    if (at)
        assert_ptr_equal(p, at);
    memset(p, 1, len);
    return p;
}

/* Whether this process may use userfaultfd (not under valgrind, say):
 * registered memory is then kept; else those tests have nothing to test. */
static bool kept(struct env *e, char *p, size_t len)
{
    mw_mr_t *mr;
    assert_int_equal(mw_reg(e->ctx, p, len, &mr), 0);
    assert_int_equal(mw_dereg(e->ctx, mr), 0);
    if (mw__mem_of(e->ctx)->uffd)
        return true;
    assert_int_equal(e->fake.deregs, e->fake.regs);   /* dropped at once instead */
    return false;
}

static uint32_t lkey_of(struct env *e, const void *p, size_t len)
{
    uint32_t lkey, rkey;
    assert_int_equal(mw__mem_dev_keys(e->ctx, &e->dev[0], p, len, &lkey, &rkey), 0);
    return lkey;
}

/* The case the cache exists for: dropped, reused for free -- and never
 * handed out for other pages that later sit at the same address. */
static void kept_until_its_memory_goes(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    size_t len = 1 << 20;
    char *p = anon(len, NULL);
    if (!kept(e, p, len)) {
        munmap(p, len);
        skip();
    }
    assert_int_equal(e->fake.deregs, 0);              /* kept */
    uint32_t old = lkey_of(e, p, len);
    mw_mr_t *mr;
    assert_int_equal(mw_reg(e->ctx, p + 4096, 8192, &mr), 0);
    assert_int_equal(e->fake.regs, 1);                /* free the second time */
    assert_int_equal(lkey_of(e, p + 4096, 8192), old);
    assert_int_equal(mw_dereg(e->ctx, mr), 0);

    /* freed, and a new mapping at the very same address */
    assert_int_equal(munmap(p, len), 0);
    char *q = anon(len, p);
    assert_int_equal(keys_rc(e, &e->dev[0], q, len), -EFAULT);   /* not the old one */
    assert_int_equal(e->fake.deregs, 1);              /* the old one went */
    assert_int_equal(mw_reg(e->ctx, q, len, &mr), 0);
    assert_int_equal(e->fake.regs, 2);                /* registered anew */
    assert_int_not_equal(lkey_of(e, q, len), old);
    assert_int_equal(mw_dereg(e->ctx, mr), 0);

    /* pages zapped under it (madvise, as free() trims the heap): gone too */
    assert_int_equal(madvise(q + 8192, 4096, MADV_DONTNEED), 0);
    assert_int_equal(keys_rc(e, &e->dev[0], q, 4096), -EFAULT);
    assert_int_equal(e->fake.deregs, 2);
    munmap(q, len);
}

/* Memory that goes while a registration of it is held: out of the index at
 * once (new memory there gets its own), deregistered with its last handle. */
static void held_registration_of_gone_memory(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    size_t len = 1 << 20;
    char *p = anon(len, NULL);
    if (!kept(e, p, len)) {
        munmap(p, len);
        skip();
    }
    mw_mr_t *held, *fresh;
    assert_int_equal(mw_reg(e->ctx, p, len, &held), 0);
    assert_int_equal(munmap(p, len), 0);
    char *q = anon(len, p);
    assert_int_equal(mw_reg(e->ctx, q, len, &fresh), 0);
    assert_int_equal(e->fake.regs, 2);
    assert_int_equal(e->fake.deregs, 0);              /* the old one is still held */
    assert_int_equal(mw_dereg(e->ctx, held), 0);
    assert_int_equal(e->fake.deregs, 1);
    assert_int_equal(mw_dereg(e->ctx, fresh), 0);
    munmap(q, len);
}

/* Kept registrations nobody holds stay under a cap, oldest out first. */
static void idle_registrations_are_capped(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    size_t len = 1 << 20;
    char *p[3] = {anon(len, NULL), anon(len, NULL), anon(len, NULL)};
    if (!kept(e, p[0], len)) {
        for (int i = 0; i < 3; i++)
            munmap(p[i], len);
        skip();
    }
    mw__mem_of(e->ctx)->idle_max = 2 * len;
    for (int i = 1; i < 3; i++) {
        mw_mr_t *mr;
        assert_int_equal(mw_reg(e->ctx, p[i], len, &mr), 0);
        assert_int_equal(mw_dereg(e->ctx, mr), 0);
    }
    assert_int_equal(e->fake.regs, 3);
    assert_int_equal(e->fake.deregs, 1);              /* p[0], the oldest */
    assert_int_equal(keys_rc(e, &e->dev[0], p[0], len), -EFAULT);
    assert_int_equal(keys_rc(e, &e->dev[0], p[2], len), 0);
    for (int i = 0; i < 3; i++)
        munmap(p[i], len);
}

/* ------------------------------------------------------------------------
 * Registering off the loop (the helper thread)
 * ------------------------------------------------------------------------ */

struct async_got {
    mw_future_t *f;
    mw_mr_t *mr;
    int err;
};

static void got_reg(void *arg, mw_mr_t *mr, int err)
{
    struct async_got *g = arg;
    g->mr = mr;
    g->err = err;
    mw_future_resolve(g->f, NULL);
}

static void large_registration_off_the_loop(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    add_dev(e, 1);
    size_t len = 2 * MW__REG_ASYNC_BYTES;
    char *p = anon(len, NULL);
    struct async_got g = {.f = mw_future_new(e->ctx)};
    mw_mr_t *mr = NULL;
    assert_int_equal(mw__reg_async(e->ctx, p, len, &mr, got_reg, &g), 1);   /* pending */
    assert_int_equal(mw_wait(g.f), 0);
    assert_int_equal(g.err, 0);
    assert_non_null(g.mr);
    mr_for(e, 0, p, len);
    mr_for(e, 1, p, len);
    /* the same again is there at once; a small one is made at once */
    mw_mr_t *again, *small;
    assert_int_equal(mw__reg_async(e->ctx, p, len, &again, got_reg, &g), 0);
    char *q = anon(4096, NULL);
    assert_int_equal(mw__reg_async(e->ctx, q, 4096, &small, got_reg, &g), 0);
    assert_int_equal(mw_dereg(e->ctx, again), 0);
    assert_int_equal(mw_dereg(e->ctx, small), 0);
    assert_int_equal(mw_dereg(e->ctx, g.mr), 0);
    mw_future_unref(g.f);
    munmap(p, len);
    munmap(q, 4096);
}

struct dev_got {
    mw_future_t *f;
    int calls, err;
};

static void got_dev(struct mw__dev *dev, int err, void *arg)
{
    (void)dev;
    struct dev_got *g = arg;
    g->calls++;
    g->err = err;
    mw_future_resolve(g->f, NULL);
}

/* A device opened while much memory is registered: the helper registers it
 * all; memory registered meanwhile joins at once; a failure leaves the
 * device unknown and nothing registered with it. */
static void device_with_much_memory_joins_off_the_loop(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    size_t len = MW__REG_INLINE_BYTES;
    char *big[2] = {anon(len, NULL), anon(len, NULL)};
    mw_mr_t *mr[3];
    for (int i = 0; i < 2; i++)
        assert_int_equal(mw_reg(e->ctx, big[i], len, &mr[i]), 0);
    struct dev_got g = {.f = mw_future_new(e->ctx)};
    assert_int_equal(mw__mem_add_dev_async(e->ctx, &e->dev[1], got_dev, &g), 1);
    char *late = anon(4096, NULL);
    assert_int_equal(mw_reg(e->ctx, late, 4096, &mr[2]), 0);   /* while it works */
    assert_int_equal(mw_wait(g.f), 0);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.err, 0);
    for (int i = 0; i < 2; i++)
        mr_for(e, 1, big[i], len);
    mr_for(e, 1, late, 4096);
    mw_future_unref(g.f);

    g = (struct dev_got){.f = mw_future_new(e->ctx)};
    fake_fail(&e->fake, 2, false, ENOMEM);   /* the second of the helper's */
    assert_int_equal(mw__mem_add_dev_async(e->ctx, &e->dev[2], got_dev, &g), 1);
    assert_int_equal(mw_wait(g.f), 0);
    assert_int_equal(g.err, -ENOMEM);
    assert_int_equal(keys_rc(e, &e->dev[2], big[0], 8), -ENODEV);
    mw_future_unref(g.f);
    for (int i = 0; i < 3; i++)
        assert_int_equal(mw_dereg(e->ctx, mr[i]), 0);
    munmap(big[0], len);
    munmap(big[1], len);
    munmap(late, 4096);
}

static void late_device_registers_live_regions(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    mw_mr_t *a, *b, *c;
    assert_int_equal(mw_reg(e->ctx, buf, 100, &a), 0);
    assert_int_equal(mw_reg(e->ctx, buf + 50, 100, &b), 0);   /* absorbs a */
    assert_int_equal(mw_reg(e->ctx, buf + 1000, 100, &c), 0);
    assert_int_equal(e->fake.calls, 3);
    add_dev(e, 1);
    assert_int_equal(e->fake.calls, 6);                 /* every live region */
    add_dev(e, 3);                                      /* index 2 never opened */
    assert_int_equal(e->fake.calls, 9);
    for (int d = 1; d <= 3; d += 2) {
        struct fake_mr *m0 = mr_for(e, 0, buf + 1000, 100);
        struct fake_mr *md = mr_for(e, d, buf + 1000, 100);
        assert_int_not_equal(m0->lkey, md->lkey);
        assert_int_not_equal(m0->rkey, md->rkey);
        assert_ptr_equal(m0->start, md->start);
        assert_ptr_equal(mr_for(e, d, buf, 150)->end, (uintptr_t)buf + 150);
    }
    assert_int_equal(mw__mem_add_dev(e->ctx, &e->dev[1]), 0);   /* again: no-op */
    assert_int_equal(e->fake.calls, 9);
    struct mw__dev other = {.index = 1};
    assert_int_equal(mw__mem_add_dev(e->ctx, &other), -EEXIST);
    /* The absorbed region got keys for the new devices too: once the outer
     * one goes, it is what lookups find. */
    assert_int_equal(mw_dereg(e->ctx, b), 0);
    assert_ptr_equal(mr_for(e, 3, buf + 10, 10)->end, (uintptr_t)buf + 100);
    assert_int_equal(mw_dereg(e->ctx, a), 0);
    assert_int_equal(mw_dereg(e->ctx, c), 0);
    assert_int_equal(e->fake.live, 0);
}

static void failing_backend_leaves_no_state(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    add_dev(e, 1);
    mw_mr_t *a, *mr = NULL;
    /* Fails on the second device: the first one's MR is released. */
    fake_fail(&e->fake, 2, false, EACCES);
    assert_int_equal(mw_reg(e->ctx, buf, 100, &mr), -EACCES);
    assert_null(mr);
    assert_int_equal(e->fake.live, 0);
    assert_int_equal(keys_rc(e, &e->dev[0], buf, 1), -EFAULT);

    /* A failed merge leaves the region it would have absorbed in place. */
    assert_int_equal(mw_reg(e->ctx, buf, 100, &a), 0);
    struct fake_mr *ra = mr_for(e, 1, buf, 100);
    fake_fail(&e->fake, 1, false, ENOMEM);
    assert_int_equal(mw_reg(e->ctx, buf + 50, 100, &mr), -ENOMEM);
    assert_int_equal(e->fake.live, 2);
    assert_ptr_equal(mr_for(e, 1, buf, 100), ra);
    assert_int_equal(keys_rc(e, &e->dev[1], buf + 50, 100), -EFAULT);

    /* A device whose registrations fail half way stays unknown, with
     * nothing registered; adding it again later works. */
    mw_mr_t *c;
    assert_int_equal(mw_reg(e->ctx, buf + 1000, 100, &c), 0);
    unsigned live = e->fake.live;
    fake_fail(&e->fake, 2, false, EFAULT);
    assert_int_equal(mw__mem_add_dev(e->ctx, &e->dev[2]), -EFAULT);
    assert_int_equal(e->fake.live, live);
    assert_int_equal(keys_rc(e, &e->dev[2], buf, 1), -ENODEV);
    add_dev(e, 2);
    mr_for(e, 2, buf, 100);
    mr_for(e, 2, buf + 1000, 100);
    assert_int_equal(mw_dereg(e->ctx, a), 0);
    assert_int_equal(mw_dereg(e->ctx, c), 0);
    assert_int_equal(e->fake.live, 0);
}

/* ------------------------------------------------------------------------
 * mw_alloc arena
 * ------------------------------------------------------------------------ */

static void alloc_registers_with_every_device(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    char *small = mw_alloc(e->ctx, 100);
    assert_non_null(small);
    memset(small, 0xa5, 100);
    char *big = mw_alloc(e->ctx, 10000);
    assert_non_null(big);
    assert_int_equal((uintptr_t)big % 4096, 0);
    memset(big, 0x5a, 10000);
    mr_for(e, 0, small, 100);
    mr_for(e, 0, big, 10000);
    unsigned before = e->fake.calls;
    add_dev(e, 1);                                      /* after the allocations */
    assert_true(e->fake.calls > before);
    assert_int_not_equal(mr_for(e, 1, small, 100)->lkey, mr_for(e, 0, small, 100)->lkey);
    assert_int_not_equal(mr_for(e, 1, big, 10000)->rkey, mr_for(e, 0, big, 10000)->rkey);
    char *later = mw_alloc(e->ctx, 1 << 20);
    assert_non_null(later);
    memset(later, 1, 1 << 20);
    mr_for(e, 0, later, 1 << 20);
    mr_for(e, 1, later, 1 << 20);
    for (int i = 0; i < 100; i++)
        assert_int_equal((unsigned char)small[i], 0xa5);
    mw_free(e->ctx, small);
    mw_free(e->ctx, big);
    mw_free(e->ctx, later);
    mw_free(e->ctx, NULL);
    errno = 0;
    assert_null(mw_alloc(e->ctx, 0));
    assert_int_equal(errno, EINVAL);
    assert_true(e->logs > 0);
}

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static void fill_check(unsigned char *p, size_t n, unsigned char v, bool check)
{
    /* First, last and a few bytes between: enough to catch overlap. */
    size_t at[] = {0, n / 3, n / 2, n - 1};
    for (size_t i = 0; i < 4; i++) {
        if (check)
            assert_int_equal(p[at[i]], v);
        else
            p[at[i]] = v;
    }
}

#define STR_(x) #x
#define STR(x) STR_(x)

/* Mixed sizes, freed in a scrambled order, with a device added and a forced
 * purge (which reaches the dalloc, split and merge hooks) on the way: live
 * blocks keep their contents and keys throughout. */
static void alloc_many_small_and_large(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    enum { N = 3000 };
    static unsigned char *p[N];
    static size_t sz[N];
    uint32_t seed = 42;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            if (p[i])
                continue;
            uint32_t r = lcg(&seed);
            sz[i] = r % 50 == 0   ? (size_t)(1 + r % 24) << 20   /* 1..24 MiB */
                    : r % 5 == 0 ? 4096 + r % 200000
                                 : 1 + r % 3000;
            p[i] = mw_alloc(e->ctx, sz[i]);
            assert_non_null(p[i]);
            if (sz[i] >= 4096)
                assert_int_equal((uintptr_t)p[i] % 4096, 0);
            fill_check(p[i], sz[i], (unsigned char)i, false);
        }
        if (round == 1)
            add_dev(e, 2);                              /* in the middle of it all */
        if (round == 2)                                 /* every arena: ours too */
            assert_int_equal(mallctl("arena." STR(MALLCTL_ARENAS_ALL) ".purge",
                                     NULL, NULL, NULL, 0), 0);
        for (int i = 0; i < N; i++) {
            fill_check(p[i], sz[i], (unsigned char)i, true);
            mr_for(e, 0, p[i], sz[i]);
            if (round >= 1)
                mr_for(e, 2, p[i], sz[i]);
        }
        for (int i = 0; i < N; i++)                     /* free about half */
            if (lcg(&seed) % 2) {
                mw_free(e->ctx, p[i]);
                p[i] = NULL;
            }
    }
    for (int i = 0; i < N; i++) {
        if (p[i])
            fill_check(p[i], sz[i], (unsigned char)i, true);
        mw_free(e->ctx, p[i]);
        p[i] = NULL;
    }
}

static void alloc_failure_is_clean(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    /* Failing while the arena is being created (jemalloc's own metadata
     * comes from the hooks too). */
    fake_fail(&e->fake, 1, true, EPERM);
    errno = 0;
    assert_null(mw_alloc(e->ctx, 64));
    assert_int_equal(errno, EPERM);
    assert_int_equal(e->fake.live, 0);
    fake_fail(&e->fake, 0, false, 0);
    void *p = mw_alloc(e->ctx, 64);
    assert_non_null(p);
    /* Failing for a block that needs a new mapping. */
    unsigned live = e->fake.live;
    fake_fail(&e->fake, 1, true, EPERM);
    errno = 0;
    assert_null(mw_alloc(e->ctx, 64 << 20));
    assert_int_equal(errno, EPERM);
    assert_int_equal(e->fake.live, live);
    fake_fail(&e->fake, 0, false, 0);
    void *q = mw_alloc(e->ctx, 64 << 20);
    assert_non_null(q);
    mr_for(e, 0, q, 64 << 20);
    mw_free(e->ctx, q);
    mw_free(e->ctx, p);
}

/* A connection's protection domain: its own registration of each region it
 * posts from, made at its first use, never shared with another domain nor
 * the device's own, and dropped with the domain or with the memory. */
static uint32_t pd_lkey(struct env *e, struct mw__pd *pd, const void *addr, size_t len)
{
    uint32_t lkey = 0;
    assert_int_equal(mw__mem_keys(e->ctx, pd, addr, len, &lkey), 0);
    struct fake_mr *mr = fake_find(&e->fake, lkey);
    assert_non_null(mr);
    assert_int_equal(mr->pd, pd->slot);
    assert_int_equal(mr->dev, pd->dev->index);
    assert_true(mr->start <= (uintptr_t)addr && (uintptr_t)addr + len <= mr->end);
    return lkey;
}

static void connection_domains_register_apart(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    mw_mr_t *mr;
    assert_int_equal(mw_reg(e->ctx, buf, 4096, &mr), 0);
    struct mw__pd a = {.dev = &e->dev[0], .slot = -1}, b = a, c = a, stranger = a;
    assert_int_equal(mw__mem_add_pd(e->ctx, &a), 0);
    assert_int_equal(mw__mem_add_pd(e->ctx, &b), 0);
    assert_int_not_equal(a.slot, b.slot);
    unsigned before = e->fake.regs;
    uint32_t la = pd_lkey(e, &a, buf, 100);
    assert_int_equal(e->fake.regs, before + 1);          /* on first use */
    assert_int_equal(pd_lkey(e, &a, buf + 200, 8), la);  /* then kept */
    assert_int_equal(e->fake.regs, before + 1);
    uint32_t lb = pd_lkey(e, &b, buf, 100);
    uint32_t ld = 0;
    assert_int_equal(mw__mem_dev_keys(e->ctx, &e->dev[0], buf, 100, &ld, NULL), 0);
    assert_int_not_equal(la, lb);
    assert_int_not_equal(la, ld);
    assert_int_not_equal(lb, ld);
    uint32_t k;                                          /* what is refused */
    assert_int_equal(mw__mem_keys(e->ctx, &a, buf + 4096, 8, &k), -EFAULT);
    assert_int_equal(mw__mem_keys(e->ctx, &stranger, buf, 8, &k), -ENODEV);
    assert_int_equal(mw__mem_keys(e->ctx, NULL, buf, 8, &k), -ENODEV);
    struct mw__pd elsewhere = {.dev = &e->dev[1], .slot = -1};   /* device not added */
    assert_int_equal(mw__mem_add_pd(e->ctx, &elsewhere), 0);
    assert_int_equal(mw__mem_keys(e->ctx, &elsewhere, buf, 8, &k), -ENODEV);
    mw__mem_remove_pd(e->ctx, &elsewhere);

    /* A domain leaving drops its registrations, and only its own. */
    mw__mem_remove_pd(e->ctx, &a);
    assert_int_equal(a.slot, -1);
    assert_null(fake_find(&e->fake, la));
    assert_non_null(fake_find(&e->fake, lb));
    assert_int_equal(mw__mem_keys(e->ctx, &a, buf, 8, &k), -ENODEV);
    mw__mem_remove_pd(e->ctx, &a);                       /* again: a no-op */
    /* Its slot is taken again, with nothing of the old domain in it. */
    assert_int_equal(mw__mem_add_pd(e->ctx, &c), 0);
    assert_int_equal(c.slot, 0);
    uint32_t lc = pd_lkey(e, &c, buf, 100);
    assert_int_not_equal(lc, la);

    /* A registration refused in a domain is an error of its own (not "not
     * registered"), and the next use tries again. */
    void *p = mw_alloc(e->ctx, 64);
    assert_non_null(p);
    fake_fail(&e->fake, 1, false, ENOMEM);
    assert_int_equal(mw__mem_keys(e->ctx, &b, p, 64, &k), -ENOMEM);
    pd_lkey(e, &b, p, 64);

    /* Memory leaving drops its registrations in every domain. */
    uint32_t lbuf_b = lb;
    assert_int_equal(mw_dereg(e->ctx, mr), 0);
    assert_null(fake_find(&e->fake, lbuf_b));
    assert_null(fake_find(&e->fake, lc));
    mw__mem_remove_pd(e->ctx, &b);
    mw__mem_remove_pd(e->ctx, &c);
    mw_free(e->ctx, p);
}

/* What a domain has registered: the sum of its live registrations. */
static uint64_t pd_bytes(struct env *e, const struct mw__pd *pd)
{
    uint64_t sum = 0;
    for (struct fake_mr *mr = e->fake.mrs; mr; mr = mr->next)
        if (mr->pd == pd->slot)
            sum += mr->end - mr->start;
    return sum;
}

/* A domain registers windows of a region, never the whole of a large one:
 * a small post a 2 MiB window (one crossing a window's edge too), a long
 * one at most 8 times its length; posting from the whole region pins at
 * most about twice the region. */
static void connection_domains_register_windows(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    enum { BIG = 64 << 20 };
    uint8_t *p = mw_alloc(e->ctx, BIG);
    assert_non_null(p);
    struct mw__pd a = {.dev = &e->dev[0], .slot = -1};
    assert_int_equal(mw__mem_add_pd(e->ctx, &a), 0);
    uint32_t k = pd_lkey(e, &a, p + (10 << 20), 4096);
    assert_true(e->fake.last_end - e->fake.last_start <= MW__PDWIN_MIN);
    unsigned regs = e->fake.regs;
    assert_int_equal(pd_lkey(e, &a, p + (10 << 20) + 8192, 100), k);   /* the same window */
    assert_int_equal(e->fake.regs, regs);
    pd_lkey(e, &a, p + (12 << 20) - 100, 200);                  /* across an edge */
    assert_true(e->fake.last_end - e->fake.last_start <= MW__PDWIN_MIN);
    pd_lkey(e, &a, p + 100, 16 << 20);                          /* a long one */
    assert_true(e->fake.last_end - e->fake.last_start <= 8 * (16u << 20));
    for (size_t off = 0; off < BIG; off += 1 << 20)             /* everything */
        pd_lkey(e, &a, p + off, 1 << 20);
    uint64_t sum = pd_bytes(e, &a);
    printf("64 MiB posted from in 1 MiB pieces: %llu MiB registered in the domain\n",
           (unsigned long long)(sum >> 20));
    assert_true(sum <= 2 * (uint64_t)BIG + 2 * MW__PDWIN_MIN + (128u << 20));
    struct mw__pd gone = a;
    mw__mem_remove_pd(e->ctx, &a);
    assert_int_equal(pd_bytes(e, &gone), 0);             /* all dropped with it */
    mw_free(e->ctx, p);
}

static void teardown_deregisters_everything(void **state)
{
    struct env *e = *state;
    add_dev(e, 0);
    add_dev(e, 1);
    void *keep[8];
    for (int i = 0; i < 8; i++) {
        void *tmp = mw_alloc(e->ctx, (size_t)(i + 1) << 18);
        keep[i] = mw_alloc(e->ctx, 1000 * (size_t)(i + 1));
        assert_non_null(tmp);
        assert_non_null(keep[i]);
        mw_free(e->ctx, tmp);
    }
    mw_mr_t *mr;
    assert_int_equal(mw_reg(e->ctx, buf, 4096, &mr), 0);
    assert_true(e->fake.live > 2);
    /* Not freed, not deregistered: the teardown (in teardown()) still
     * releases every MR exactly once. */
    (void)keep;
    (void)mr;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rindex_binary_search),
        cmocka_unit_test_setup_teardown(reg_subrange_hits_cache, setup_unkept, teardown),
        cmocka_unit_test_setup_teardown(reg_overlap_registers_union, setup_unkept, teardown),
        cmocka_unit_test_setup_teardown(dereg_once_per_registration, setup_unkept, teardown),
        cmocka_unit_test_setup_teardown(dereg_refuses_what_it_does_not_hold, setup_unkept, teardown),
        cmocka_unit_test_setup_teardown(keys_lookup_rules, setup_unkept, teardown),
        cmocka_unit_test_setup_teardown(connection_domains_register_apart, setup_unkept, teardown),
        cmocka_unit_test_setup_teardown(connection_domains_register_windows, setup, teardown),
        cmocka_unit_test_setup_teardown(reg_rejects_bad_args, setup, teardown),
        cmocka_unit_test_setup_teardown(late_device_registers_live_regions, setup_unkept, teardown),
        cmocka_unit_test_setup_teardown(failing_backend_leaves_no_state, setup_unkept, teardown),
        cmocka_unit_test_setup_teardown(alloc_registers_with_every_device, setup, teardown),
        cmocka_unit_test_setup_teardown(alloc_many_small_and_large, setup, teardown),
        cmocka_unit_test_setup_teardown(alloc_failure_is_clean, setup, teardown),
        cmocka_unit_test_setup_teardown(teardown_deregisters_everything, setup_unkept, teardown),
        cmocka_unit_test_setup_teardown(kept_until_its_memory_goes, setup, teardown),
        cmocka_unit_test_setup_teardown(held_registration_of_gone_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(idle_registrations_are_capped, setup, teardown),
        cmocka_unit_test_setup_teardown(large_registration_off_the_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(device_with_much_memory_joins_off_the_loop, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
