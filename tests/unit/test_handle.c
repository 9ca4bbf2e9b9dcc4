/* The handle table: lookups by kind, released and foreign values refused,
 * the owner thread only, generations retired before they could wrap, and
 * threads handing out and releasing handles at once.  Built with MW__HANDLE_GEN_MAX 7, so a slot
 * retires after 4 uses instead of 2^31. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/handle.h"

static int a, b;

static void lookup_by_kind(void **state)
{
    (void)state;
    int err = 0;
    uint64_t h = mw__handle_new(MW__H_CONN, &a, 0);
    assert_int_not_equal(h, 0);
    assert_ptr_equal(mw__handle_get(h, MW__H_CONN, "test", &err), &a);
    assert_null(mw__handle_get(h, MW__H_FUTURE, "test", &err));
    assert_int_equal(err, -EINVAL);
    assert_null(mw__handle_get(0, MW__H_CONN, "test", &err));
    assert_int_equal(err, -EINVAL);
    mw__handle_release(h);
    assert_null(mw__handle_get(h, MW__H_CONN, "test", &err));
    assert_int_equal(err, -ESTALE);
    mw__handle_release(h);                    /* twice: nothing happens */
    assert_int_equal(mw__handles_live(), 0);
}

/* Values that never were handles: an even generation, an index past the
 * table, an address. */
static void foreign_values_are_stale(void **state)
{
    (void)state;
    int err = 0;
    uint64_t h = mw__handle_new(MW__H_FUTURE, &a, 0);
    uint64_t bad[] = {h + (1ull << 32), h | 0xffffffffull, (uint64_t)(uintptr_t)&a,
                      UINT64_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = 0;
        assert_null(mw__handle_get(bad[i], MW__H_FUTURE, "test", &err));
        assert_int_equal(err, -ESTALE);
    }
    mw__handle_release(h);
}

struct lookup {
    uint64_t h;
    void *obj;
    int err;
};

static void *lookup_elsewhere(void *arg)
{
    struct lookup *l = arg;
    l->obj = mw__handle_get(l->h, MW__H_LISTENER, "test", &l->err);
    return NULL;
}

/* A handle owned by this thread is refused (-EPERM) from another one; one
 * made for any thread is not. */
static void owner_thread_only(void **state)
{
    (void)state;
    int err;
    struct lookup mine = {.h = mw__handle_new(MW__H_LISTENER, &a, mw__thread_self())};
    struct lookup any = {.h = mw__handle_new(MW__H_LISTENER, &b, 0)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, lookup_elsewhere, &mine), 0);
    pthread_join(t, NULL);
    assert_null(mine.obj);
    assert_int_equal(mine.err, -EPERM);
    assert_ptr_equal(mw__handle_get(mine.h, MW__H_LISTENER, "test", &err), &a);
    assert_int_equal(pthread_create(&t, NULL, lookup_elsewhere, &any), 0);
    pthread_join(t, NULL);
    assert_ptr_equal(any.obj, &b);
    mw__handle_release(mine.h);
    mw__handle_release(any.h);
    assert_int_equal(mw__handles_live(), 0);
}

/* With GEN_MAX 7 a slot carries generations up to 7 and then retires:
 * no handle value is ever issued twice. */
static void generations_retire_instead_of_wrapping(void **state)
{
    (void)state;
    int err;
    uint64_t retired = mw__handles_retired();
    uint64_t h = mw__handle_new(MW__H_FUTURE, &a, 0);
    uint32_t idx = (uint32_t)h;
    uint64_t seen[4];
    int n = 0;
    while ((uint32_t)h == idx) {  /* a freed slot is handed out first (LIFO) */
        assert_true(n < 4);
        seen[n++] = h;
        mw__handle_release(h);
        for (int j = 0; j < n; j++)
            assert_null(mw__handle_get(seen[j], MW__H_FUTURE, "test", &err));
        h = mw__handle_new(MW__H_FUTURE, &b, 0);
        for (int j = 0; j < n; j++)
            assert_true(h != seen[j]);
    }
    for (int j = 1; j < n; j++)
        assert_int_equal(seen[j] >> 32, (seen[j - 1] >> 32) + 2);
    assert_int_equal(seen[n - 1] >> 32, 7);  /* the last generation, then retired */
    assert_int_equal(mw__handles_retired(), retired + 1);
    assert_ptr_equal(mw__handle_get(h, MW__H_FUTURE, "test", &err), &b);
    mw__handle_release(h);
    assert_int_equal(mw__handles_live(), 0);
}

#define THREADS 4
#define ROUNDS 20000

static void *churn(void *arg)
{
    uintptr_t bad = 0;
    int err;
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t h = mw__handle_new(MW__H_COMM, arg, mw__thread_self());
        if (!h || mw__handle_get(h, MW__H_COMM, "test", &err) != arg)
            bad++;
        mw__handle_release(h);
    }
    return (void *)bad;
}

/* Slots handed out and released by several threads at once: each thread
 * always finds its own object behind its own handle (run under TSan too). */
static void threads_share_the_table(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    int objs[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn, &objs[i]), 0);
    for (int i = 0; i < THREADS; i++) {
        void *bad;
        pthread_join(t[i], &bad);
        assert_null(bad);
    }
    assert_int_equal(mw__handles_live(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lookup_by_kind),
        cmocka_unit_test(foreign_values_are_stale),
        cmocka_unit_test(owner_thread_only),
        cmocka_unit_test(generations_retire_instead_of_wrapping),
        cmocka_unit_test(threads_share_the_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
