/* mw_ctx_metrics(): Prometheus's text format as the format's own rules
 * check it (families whole, HELP and TYPE first, counters _total, label
 * values escaped), snprintf's contract for the buffer, and the counters
 * moving with what the context does.  Connections' families are checked
 * on rxe (python/tests) and by promtool. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "meshwire.h"
#include "core/metrics.h"

static char *metrics_of(mw_ctx_t *ctx)
{
    long n = mw_ctx_metrics(ctx, NULL, 0);
    assert_true(n > 0);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(mw_ctx_metrics(ctx, buf, (size_t)n + 1), n);
    assert_int_equal(strlen(buf), (size_t)n);
    return buf;
}

/* The value of sample @name (no labels) in @text, or -1. */
static long long value_of(const char *text, const char *name)
{
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(text, key);
    return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/* Every family: "# HELP name ...", "# TYPE name counter|gauge", then its
 * samples, none of another family between; a counter's name ends _total. */
static void check_format(const char *text)
{
    const char *p = text;
    char family[128] = "";
    int families = 0;
    while (*p) {
        const char *eol = strchr(p, '\n');
        assert_non_null(eol);                       /* every line ends */
        char line[1024];
        size_t len = (size_t)(eol - p);
        assert_true(len < sizeof line);
        memcpy(line, p, len);
        line[len] = '\0';
        char name[128], type[16];
        if (sscanf(line, "# HELP %127s", name) == 1) {
            strcpy(family, name);
            families++;
            p = eol + 1;
            eol = strchr(p, '\n');
            assert_non_null(eol);
            assert_int_equal(sscanf(p, "# TYPE %127s %15s", name, type), 2);
            assert_string_equal(name, family);
            assert_true(!strcmp(type, "counter") || !strcmp(type, "gauge"));
            if (!strcmp(type, "counter"))
                assert_non_null(strstr(family, "_total"));
        } else {
            assert_true(family[0]);
            assert_int_equal(strncmp(line, family, strlen(family)), 0);
            char c = line[strlen(family)];
            assert_true(c == ' ' || c == '{');
        }
        p = eol + 1;
    }
    assert_true(families >= 14);
}

static void the_format_holds(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    char *text = metrics_of(ctx);
    check_format(text);
    free(text);
    mw_ctx_free(ctx);
}

static void the_buffer_is_filled_as_snprintf_does(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    long n = mw_ctx_metrics(ctx, NULL, 0);
    char small[40];
    memset(small, 'x', sizeof small);
    assert_int_equal(mw_ctx_metrics(ctx, small, sizeof small), n);
    assert_int_equal(strlen(small), sizeof small - 1);   /* cut, terminated */
    char *whole = metrics_of(ctx);
    assert_memory_equal(small, whole, sizeof small - 1);
    free(whole);
    assert_int_equal(mw_ctx_metrics(NULL, small, sizeof small), -EINVAL);
    assert_int_equal(mw_ctx_metrics(ctx, NULL, 10), -EINVAL);
    mw_ctx_free(ctx);
}

static void counters_follow_the_context(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    char *before = metrics_of(ctx);
    mw_future_t *f[5];
    for (int i = 0; i < 5; i++)
        f[i] = mw_future_new(ctx);
    char *after = metrics_of(ctx);
    assert_int_equal(value_of(after, "meshwire_futures_created_total"),
                     value_of(before, "meshwire_futures_created_total") + 5);
    assert_int_equal(value_of(after, "meshwire_futures_live"),
                     value_of(before, "meshwire_futures_live") + 5);
    for (int i = 0; i < 5; i++)
        mw_future_unref(f[i]);
    free(before);
    free(after);
    mw_ctx_free(ctx);
}

static void label_values_are_escaped(void **state)
{
    (void)state;
    struct mw__labels l = {.len = 0};
    mw__labels_add(&l, "remote", "a\"b\\c\nd");
    mw__labels_add(&l, "path", "rdma");
    assert_string_equal(l.s, "remote=\"a\\\"b\\\\c\\nd\",path=\"rdma\"");
    char big[600];
    memset(big, 'v', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    mw__labels_add(&l, "huge", big);                 /* no room: left out whole */
    assert_string_equal(l.s, "remote=\"a\\\"b\\\\c\\nd\",path=\"rdma\"");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_format_holds),
        cmocka_unit_test(the_buffer_is_filled_as_snprintf_does),
        cmocka_unit_test(counters_follow_the_context),
        cmocka_unit_test(label_values_are_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
