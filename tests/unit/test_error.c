/* Error strings and version. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "meshwire.h"

static void names_errno_both_signs(void **state)
{
    (void)state;
    assert_string_equal(mw_strerror(-ECONNREFUSED), mw_strerror(ECONNREFUSED));
    assert_string_equal(mw_strerror(-ETIMEDOUT), strerror(ETIMEDOUT));
    assert_string_equal(mw_strerror(0), "success");
    assert_string_equal(mw_strerror(-100000), "unknown error");
}

static void version_matches_build(void **state)
{
    (void)state;
    assert_string_equal(mw_version(), MW_VERSION);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(names_errno_both_signs),
        cmocka_unit_test(version_matches_build),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
