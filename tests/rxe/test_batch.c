/* Batches on real soft-RoCE, as a KV-cache mover uses them: thousands of
 * scattered pages in one operation, contents exact; a prepared list posted
 * again and again; strided (paged) layouts; every entry checked before
 * anything is posted; the immediate after the whole batch; what a failed
 * or cancelled batch says it completed is exactly what landed; memory
 * that went away is refused, not written through a stale key. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <cmocka.h>

#include "meshwire.h"
#include "rxe_util.h"

static const char *addrs[2];

#define PAGE 4096u

/* Page @i of a pattern for round @round: every byte says which. */
static void fill_page(uint8_t *p, size_t i, unsigned round)
{
    for (size_t k = 0; k < PAGE; k += 8) {
        uint64_t v = (uint64_t)round << 48 | (uint64_t)i << 16 | k;
        memcpy(p + k, &v, 8);
    }
}

/* A random permutation of 0..n-1 (fixed seed: reproducible). */
static size_t *shuffled(size_t n, unsigned seed)
{
    size_t *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = i;
    srand(seed);
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1), t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
    return v;
}

static int post_wait(mw_batch_t *b, size_t *done)
{
    mw_future_t *f = mw_batch_post(b, done);
    assert_non_null(f);
    int rc = mw_wait(f);
    if (rc)
        print_message("batch: %s\n", mw_future_message(f));
    mw_future_unref(f);
    return rc;
}

static uint64_t completions(mw_ctx_t *ctx)
{
    mw_ctx_stats_t st;
    mw_ctx_stats(ctx, &st);
    return st.completions;
}

/* 10,000 pages scattered into a remote pool in a random order, then
 * gathered back with a read batch: every byte where it belongs, with far
 * fewer completions than entries (chains signal only at their end). */
static void scatter_and_gather_10000_pages(void **state)
{
    (void)state;
    enum { N = 10000 };
    struct rxe_pair p;
    rxe_pair_open(&p, addrs[1], NULL);
    uint8_t *src = mw_alloc(p.ctx, (size_t)N * PAGE), *pool = mw_alloc(p.ctx, (size_t)N * PAGE);
    uint8_t *back = mw_alloc(p.ctx, (size_t)N * PAGE);
    assert_true(src && pool && back);
    memset(pool, 0, (size_t)N * PAGE);
    mw_remote_t r;
    assert_int_equal(mw_mem_export(p.b, pool, (size_t)N * PAGE, &r), 0);
    size_t *to = shuffled(N, 1);
    mw_batch_entry_t *e = calloc(N, sizeof *e);
    for (size_t i = 0; i < N; i++) {
        fill_page(src + i * PAGE, i, 1);
        e[i] = (mw_batch_entry_t){.local = src + i * PAGE, .len = PAGE, .offset = to[i] * PAGE};
    }
    mw_batch_t *w, *rd;
    assert_int_equal(mw_batch_new(p.a, MW_DIR_WRITE, &r, 1, e, N, &w, NULL), 0);
    uint64_t c0 = completions(p.ctx);
    double t0 = now_s();
    size_t done = 0;
    assert_int_equal(post_wait(w, &done), 0);
    double took = now_s() - t0;
    uint64_t wcs = completions(p.ctx) - c0;
    assert_int_equal(done, N);
    for (size_t i = 0; i < N; i++)
        assert_memory_equal(pool + to[i] * PAGE, src + i * PAGE, PAGE);
    print_message("10,000 x 4 KiB scattered in %.3f s, %llu completions\n", took,
                  (unsigned long long)wcs);
    assert_true(wcs <= N / 4);

    for (size_t i = 0; i < N; i++)
        e[i].local = back + i * PAGE;
    assert_int_equal(mw_batch_new(p.a, MW_DIR_READ, &r, 1, e, N, &rd, NULL), 0);
    assert_int_equal(post_wait(rd, &done), 0);
    assert_int_equal(done, N);
    assert_memory_equal(back, src, (size_t)N * PAGE);
    mw_conn_stats_t st;
    mw_conn_stats(p.a, &st);
    assert_true(st.writes >= N && st.reads >= N);
    mw_batch_free(w);
    mw_batch_free(rd);
    free(e);
    free(to);
    mw_free(p.ctx, src);
    mw_free(p.ctx, pool);
    mw_free(p.ctx, back);
    rxe_pair_close(&p);
}

/* One list prepared, posted 100 times with new contents each time; then
 * 100 posts issued at once and a message behind them: it arrives after
 * the last post's data (issue order). */
static void prepared_list_posted_100_times(void **state)
{
    (void)state;
    enum { N = 64 };
    struct rxe_pair p;
    rxe_pair_open(&p, addrs[1], NULL);
    uint8_t *src = mw_alloc(p.ctx, N * PAGE), *pool = mw_alloc(p.ctx, 2 * N * PAGE);
    mw_remote_t r;
    assert_int_equal(mw_mem_export(p.b, pool, 2 * N * PAGE, &r), 0);
    size_t *to = shuffled(2 * N, 2);
    mw_batch_entry_t e[N];
    for (size_t i = 0; i < N; i++)
        e[i] = (mw_batch_entry_t){.local = src + i * PAGE, .len = PAGE, .offset = to[i] * PAGE};
    mw_batch_t *b;
    assert_int_equal(mw_batch_new(p.a, MW_DIR_WRITE, &r, 1, e, N, &b, NULL), 0);
    for (unsigned round = 1; round <= 100; round++) {
        for (size_t i = 0; i < N; i++)
            fill_page(src + i * PAGE, i, round);
        assert_int_equal(post_wait(b, NULL), 0);
        for (size_t i = 0; i < N; i++)
            assert_memory_equal(pool + to[i] * PAGE, src + i * PAGE, PAGE);
    }
    for (size_t i = 0; i < N; i++)
        fill_page(src + i * PAGE, i, 1000);
    mw_future_t *fs[100];
    size_t done[100];
    for (int k = 0; k < 100; k++)
        assert_non_null(fs[k] = mw_batch_post(b, &done[k]));
    mw_future_t *sent = mw_send(p.a, "after", 6);
    mw_msg_t *m = rxe_recv(p.b, 10000);
    for (size_t i = 0; i < N; i++)               /* in place when the message is */
        assert_memory_equal(pool + to[i] * PAGE, src + i * PAGE, PAGE);
    mw_msg_free(m);
    for (int k = 0; k < 100; k++) {
        assert_int_equal(mw_wait(fs[k]), 0);
        assert_int_equal(done[k], N);
        mw_future_unref(fs[k]);
    }
    assert_int_equal(mw_wait(sent), 0);
    mw_future_unref(sent);
    mw_batch_free(b);
    free(to);
    mw_free(p.ctx, src);
    mw_free(p.ctx, pool);
    rxe_pair_close(&p);
}

/* A paged layout: 300 pages of 4 KiB every 8 KiB here to every 12 KiB
 * there from offset 100; the gaps keep their bytes.  Then a read batch of
 * the same shape brings them back. */
static void strided_batches(void **state)
{
    (void)state;
    enum { N = 300, LS = 2 * PAGE, RS = 3 * PAGE, OFF = 100 };
    struct rxe_pair p;
    rxe_pair_open(&p, addrs[1], NULL);
    size_t rlen = OFF + (size_t)N * RS;
    uint8_t *src = mw_alloc(p.ctx, (size_t)N * LS), *pool = mw_alloc(p.ctx, rlen);
    uint8_t *back = mw_alloc(p.ctx, (size_t)N * LS);
    memset(pool, 0xee, rlen);
    memset(back, 0, (size_t)N * LS);
    for (size_t i = 0; i < N; i++)
        fill_page(src + i * LS, i, 7);
    mw_remote_t r;
    assert_int_equal(mw_mem_export(p.b, pool, rlen, &r), 0);
    mw_batch_t *w, *rd;
    size_t done;
    assert_int_equal(mw_batch_new_strided(p.a, MW_DIR_WRITE, src, LS, &r, OFF, RS, N, PAGE, &w,
                                          NULL), 0);
    assert_int_equal(post_wait(w, &done), 0);
    assert_int_equal(done, N);
    for (size_t i = 0; i < N; i++) {
        assert_memory_equal(pool + OFF + i * RS, src + i * LS, PAGE);
        for (size_t k = PAGE; k < RS && OFF + i * RS + k < rlen; k++)
            assert_int_equal(pool[OFF + i * RS + k], 0xee);
    }
    for (size_t k = 0; k < OFF; k++)
        assert_int_equal(pool[k], 0xee);
    assert_int_equal(mw_batch_new_strided(p.a, MW_DIR_READ, back, LS, &r, OFF, RS, N, PAGE,
                                          &rd, NULL), 0);
    assert_int_equal(post_wait(rd, &done), 0);
    for (size_t i = 0; i < N; i++) {
        assert_memory_equal(back + i * LS, src + i * LS, PAGE);
        assert_int_equal(back[i * LS + PAGE], 0);       /* the gaps here untouched too */
    }
    mw_batch_free(w);
    mw_batch_free(rd);
    mw_free(p.ctx, src);
    mw_free(p.ctx, pool);
    mw_free(p.ctx, back);
    rxe_pair_close(&p);
}

/* Every entry is checked before anything is posted, and the one refused is
 * named; the remote keeps its bytes. */
static void every_entry_checked_before_posting(void **state)
{
    (void)state;
    enum { N = 10 };
    struct rxe_pair p;
    rxe_pair_open(&p, addrs[1], NULL);
    uint8_t *src = mw_alloc(p.ctx, N * PAGE), *pool = mw_alloc(p.ctx, N * PAGE);
    static uint8_t unregistered[PAGE];
    memset(pool, 0x5a, N * PAGE);
    memset(src, 1, N * PAGE);
    mw_remote_t r[2];
    assert_int_equal(mw_mem_export(p.b, pool, N * PAGE, &r[0]), 0);
    assert_int_equal(mw_mem_export(p.b, pool, PAGE, &r[1]), 0);
    mw_batch_entry_t e[N];
    for (size_t i = 0; i < N; i++)
        e[i] = (mw_batch_entry_t){.local = src + i * PAGE, .len = PAGE, .offset = i * PAGE};
    mw_batch_t *b = (mw_batch_t *)&b;
    size_t bad = 99;
    e[7].offset = N * PAGE - 1;                  /* one byte inside, the rest beyond */
    assert_int_equal(mw_batch_new(p.a, MW_DIR_WRITE, r, 2, e, N, &b, &bad), -ERANGE);
    assert_int_equal(bad, 7);
    assert_null(b);
    e[7].offset = 7 * PAGE;
    e[3].remote = 1;                             /* the 1-page export: page 3 is beyond */
    assert_int_equal(mw_batch_new(p.a, MW_DIR_WRITE, r, 2, e, N, &b, &bad), -ERANGE);
    assert_int_equal(bad, 3);
    e[3].remote = 2;                             /* no such remote */
    assert_int_equal(mw_batch_new(p.a, MW_DIR_WRITE, r, 2, e, N, &b, &bad), -EINVAL);
    assert_int_equal(bad, 3);
    e[3].remote = 0;
    e[5].local = unregistered;
    assert_int_equal(mw_batch_new(p.a, MW_DIR_WRITE, r, 2, e, N, &b, &bad), -EFAULT);
    assert_int_equal(bad, 5);
    e[5].local = src + 5 * PAGE;
    e[9].len = 0;
    assert_int_equal(mw_batch_new(p.a, MW_DIR_READ, r, 2, e, N, &b, &bad), -EINVAL);
    assert_int_equal(bad, 9);
    e[9].len = PAGE;
    assert_int_equal(mw_batch_new(p.a, MW_DIR_WRITE, r, 2, e, 0, &b, NULL), -EINVAL);
    assert_int_equal(mw_batch_new(p.a, 7, r, 2, e, N, &b, NULL), -EINVAL);
    assert_int_equal(mw_batch_new(p.a, MW_DIR_WRITE, NULL, 0, e, N, &b, NULL), -EINVAL);
    assert_int_equal(mw_batch_new(NULL, MW_DIR_WRITE, r, 2, e, N, &b, NULL), -EINVAL);
    /* strides: overflow and bounds, entry named */
    assert_int_equal(mw_batch_new_strided(p.a, MW_DIR_WRITE, src, PAGE, &r[0], 1, UINT64_MAX,
                                          N, PAGE, &b, &bad), -ERANGE);
    assert_int_equal(bad, 1);
    assert_int_equal(mw_batch_new_strided(p.a, MW_DIR_WRITE, src, PAGE, &r[0], PAGE, PAGE, N,
                                          PAGE, &b, &bad), -ERANGE);
    assert_int_equal(bad, N - 1);
    for (size_t i = 0; i < N * PAGE; i++)
        assert_int_equal(pool[i], 0x5a);         /* nothing was posted */
    /* an immediate on a read batch: refused in its future */
    assert_int_equal(mw_batch_new(p.a, MW_DIR_READ, r, 2, e, N, &b, NULL), 0);
    mw_future_t *f = mw_batch_post_imm(b, 1, NULL);
    assert_int_equal(mw_wait(f), -EINVAL);
    mw_future_unref(f);
    mw_batch_free(b);
    mw_batch_free(NULL);
    rxe_round_trip(p.a, p.b);                    /* the connection is unharmed */
    mw_free(p.ctx, src);
    mw_free(p.ctx, pool);
    rxe_pair_close(&p);
}

/* N pages of a pattern written, as one strided batch, to a pool of the
 * peer's: the setup of the tests below. */
struct paged {
    struct rxe_pair p;
    size_t n;
    uint8_t *src, *pool;
    mw_remote_t r;
    mw_batch_t *b;
    size_t done;                  /* what the post under way says */
};

static void paged_open(struct paged *k, size_t n, unsigned round)
{
    rxe_pair_open(&k->p, addrs[1], NULL);
    k->n = n;
    k->src = mw_alloc(k->p.ctx, n * PAGE);
    k->pool = mw_alloc(k->p.ctx, n * PAGE);
    assert_true(k->src && k->pool);
    memset(k->pool, 0, n * PAGE);
    for (size_t i = 0; i < n; i++)
        fill_page(k->src + i * PAGE, i, round);
    assert_int_equal(mw_mem_export(k->p.b, k->pool, n * PAGE, &k->r), 0);
    assert_int_equal(mw_batch_new_strided(k->p.a, MW_DIR_WRITE, k->src, PAGE, &k->r, 0, PAGE, n,
                                          PAGE, &k->b, NULL), 0);
}

/* Post the batch and run the loop until @least entries are done. */
static mw_future_t *paged_post_until(struct paged *k, size_t least)
{
    k->done = SIZE_MAX;
    mw_future_t *f = mw_batch_post(k->b, &k->done);
    while (k->done < least || k->done == SIZE_MAX)
        loop_for(k->p.ctx, 1);
    return f;
}

static void paged_free_memory(struct paged *k)
{
    mw_batch_free(k->b);
    mw_free(k->p.ctx, k->src);
    mw_free(k->p.ctx, k->pool);
}

struct imm_check {
    const uint8_t *pool, *src;
    size_t len;
    int got;
    uint32_t imm;
    bool in_place;
};

static void on_imm(mw_conn_t *c, uint32_t imm, void *arg)
{
    (void)c;
    struct imm_check *k = arg;
    k->got++;
    k->imm = imm;
    k->in_place = memcmp(k->pool, k->src, k->len) == 0;
}

/* The immediate of a batch comes once, after all of its data. */
static void immediate_after_the_whole_batch(void **state)
{
    (void)state;
    struct paged k;
    paged_open(&k, 500, 3);
    struct imm_check ic = {.pool = k.pool, .src = k.src, .len = k.n * PAGE};
    assert_int_equal(mw_conn_on_imm(k.p.b, on_imm, &ic), 0);
    mw_future_t *f = mw_batch_post_imm(k.b, 0xabcd, NULL);
    assert_int_equal(mw_wait(f), 0);
    mw_future_unref(f);
    for (int i = 0; i < 200 && !ic.got; i++)
        loop_for(k.p.ctx, 10);
    assert_int_equal(ic.got, 1);
    assert_int_equal(ic.imm, 0xabcd);
    assert_true(ic.in_place);
    paged_free_memory(&k);
    rxe_pair_close(&k.p);
}

/* The peer withdraws its export while a large batch is under way: the
 * batch fails -EACCES, and the entries it says completed are exactly in
 * place.  The connection breaks (an access error does that), everything
 * posted comes back, nothing is left behind. */
static void failed_batch_says_what_completed(void **state)
{
    (void)state;
    struct paged k;
    paged_open(&k, 4000, 5);
    mw_future_t *f = paged_post_until(&k, 200);
    assert_int_equal(mw_mem_unexport(k.p.b, &k.r), 0);
    int rc = mw_wait(f);
    print_message("withdrawn under way: %s after %zu of %zu entries (%s)\n", mw_strerror(rc),
                  k.done, k.n, mw_future_message(f));
    mw_future_unref(f);
    assert_true(rc == -EACCES || rc == -ECONNRESET || rc == -EREMOTEIO);
    assert_true(k.done >= 200 && k.done < k.n);
    assert_memory_equal(k.pool, k.src, k.done * PAGE);
    mw_conn_abort(k.p.a);
    mw_conn_abort(k.p.b);                        /* its end saw the access refused */
    k.p.s.n = 0;
    paged_free_memory(&k);
    assert_null(mw_batch_post(NULL, NULL));
    rxe_server_close(&k.p.s);
    rxe_wait_conns_gone(k.p.ctx);
    mw_ctx_free(k.p.ctx);
}

/* Cancelled under way: fails -ECANCELED once what was posted is back; the
 * entries it says completed are in place; the connection goes on. */
static void cancelled_batch_says_what_completed(void **state)
{
    (void)state;
    struct paged k;
    paged_open(&k, 4000, 6);
    mw_future_t *f = paged_post_until(&k, 100);
    assert_int_equal(mw_future_cancel(f), 0);
    assert_int_equal(mw_wait(f), -ECANCELED);
    mw_future_unref(f);
    print_message("cancelled after %zu of %zu entries\n", k.done, k.n);
    assert_true(k.done >= 100 && k.done < k.n);
    assert_memory_equal(k.pool, k.src, k.done * PAGE);
    /* the connection goes on: the same batch again, all of it */
    assert_int_equal(post_wait(k.b, &k.done), 0);
    assert_int_equal(k.done, k.n);
    assert_memory_equal(k.pool, k.src, k.n * PAGE);
    paged_free_memory(&k);
    rxe_pair_close(&k.p);
}

/* Registered memory that went away after preparing: the post fails
 * -EFAULT naming the entry, nothing is written through the old key, the
 * connection is unharmed; a batch whose connection closed is refused. */
static void memory_gone_is_refused(void **state)
{
    (void)state;
    struct rxe_pair p;
    rxe_pair_open(&p, addrs[1], NULL);
    size_t len = 16 * PAGE;
    uint8_t *mine = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *pool = mw_alloc(p.ctx, len);
    assert_true(mine != MAP_FAILED && pool);
    memset(mine, 9, len);
    memset(pool, 0, len);
    mw_mr_t *mr;
    assert_int_equal(mw_reg(p.ctx, mine, len, &mr), 0);
    mw_remote_t r;
    assert_int_equal(mw_mem_export(p.b, pool, len, &r), 0);
    mw_batch_t *b;
    assert_int_equal(mw_batch_new_strided(p.a, MW_DIR_WRITE, mine, PAGE, &r, 0, PAGE, 16, PAGE,
                                          &b, NULL), 0);
    assert_int_equal(post_wait(b, NULL), 0);
    assert_memory_equal(pool, mine, len);
    memset(pool, 0, len);
    assert_int_equal(mw_dereg(p.ctx, mr), 0);
    assert_int_equal(munmap(mine, len), 0);       /* gone for good (the cache lets go) */
    mw_future_t *f = mw_batch_post(b, NULL);
    assert_int_equal(mw_wait(f), -EFAULT);
    assert_non_null(strstr(mw_future_message(f), "entry 0"));
    mw_future_unref(f);
    for (size_t i = 0; i < len; i++)
        assert_int_equal(pool[i], 0);
    rxe_round_trip(p.a, p.b);
    rxe_close_conn(p.a);
    errno = 0;
    assert_null(mw_batch_post(b, NULL));         /* its connection is gone */
    assert_int_equal(errno, ESTALE);
    mw_batch_free(b);
    mw_free(p.ctx, pool);
    rxe_server_close(&p.s);
    mw_ctx_free(p.ctx);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rxe_require(2, addrs);
    if (getenv("MW_TEST_FILTER"))
        cmocka_set_test_filter(getenv("MW_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scatter_and_gather_10000_pages),
        cmocka_unit_test(prepared_list_posted_100_times),
        cmocka_unit_test(strided_batches),
        cmocka_unit_test(every_entry_checked_before_posting),
        cmocka_unit_test(immediate_after_the_whole_batch),
        cmocka_unit_test(failed_batch_says_what_completed),
        cmocka_unit_test(cancelled_batch_says_what_completed),
        cmocka_unit_test(memory_gone_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
