/* The launcher-facing peer list: parsing (ports for ranks sharing a host,
 * slots=, comments) and the environment variables of torchrun, Open MPI,
 * MPICH and Slurm, with clear errors for everything missing or malformed. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "coll/launch.h"

static char why[256];

static void expect_list(const char *text, unsigned base, const char *const *want, int n)
{
    char **peers;
    int got;
    int rc = mw__peer_list_parse(text, base, &peers, &got, why, sizeof why);
    if (rc)
        fail_msg("'%s': %s", text, why);
    assert_int_equal(got, n);
    for (int i = 0; i < n; i++)
        assert_string_equal(peers[i], want[i]);
    mw__peer_list_free(peers, got);
}

static void expect_bad(const char *text, const char *reason_part)
{
    char **peers = NULL;
    int n = 0;
    why[0] = 0;
    assert_int_not_equal(mw__peer_list_parse(text, 7000, &peers, &n, why, sizeof why), 0);
    if (!strstr(why, reason_part))
        fail_msg("'%s': reason '%s' lacks '%s'", text, why, reason_part);
}

static void ports_for_shared_hosts(void **s)
{
    (void)s;
    expect_list("a b", 7000, (const char *[]){"a:7000", "b:7000"}, 2);
    expect_list("a a b a", 7000, (const char *[]){"a:7000", "a:7001", "b:7000", "a:7002"}, 4);
    expect_list("a:9 a", 7000, (const char *[]){"a:9", "a:7001"}, 2);
    expect_list("10.0.0.1,10.1.0.1 10.0.0.2", 5, (const char *[]){"10.0.0.1,10.1.0.1:5",
                                                                  "10.0.0.2:5"}, 2);
    expect_list("[fe80::1]:80 fe80::2", 5, (const char *[]){"[fe80::1]:80", "fe80::2:5"}, 2);
}

static void separators_comments_slots(void **s)
{
    (void)s;
    expect_list("# hosts\nnode1 slots=2\n\n node2;node3 # last\r\n", 100,
                (const char *[]){"node1:100", "node1:101", "node2:100", "node3:100"}, 4);
    expect_list("x slots=1", 1, (const char *[]){"x:1"}, 1);
}

static void bad_lists(void **s)
{
    (void)s;
    expect_bad("", "no peers");
    expect_bad("  # nothing\n", "no peers");
    expect_bad("slots=2 a", "must follow");
    expect_bad("a slots=0", "slots=1..");
    expect_bad("a\nb slots=x", "line 2");
    expect_bad("a slots=1025", "slots=1..");
    char **p;
    int n;
    assert_int_equal(mw__peer_list_parse("h h", 65535, &p, &n, why, sizeof why), -ERANGE);
    assert_non_null(strstr(why, "too many ranks"));
}

static void clear_env(void)
{
    const char *vars[] = {"MW_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID",
                          "MW_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                          "SLURM_NTASKS", "MW_PEERS", "MW_HOSTFILE", "MW_PORT"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
}

static int from_env(struct mw__launch *l)
{
    why[0] = 0;
    return mw__launch_from_env(7470, l, why, sizeof why);
}

static void expect_env_error(const char *reason_part)
{
    struct mw__launch l;
    assert_int_equal(from_env(&l), -EINVAL);
    assert_null(l.peers);
    if (!strstr(why, reason_part))
        fail_msg("reason '%s' lacks '%s'", why, reason_part);
}

static void launcher_variables(void **s)
{
    (void)s;
    struct mw__launch l;
    clear_env();
    setenv("MW_PEERS", "h0 h1 h1", 1);
    expect_env_error("no rank");
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);         /* Open MPI's names */
    assert_int_equal(from_env(&l), 0);
    assert_int_equal(l.rank, 2);
    assert_int_equal(l.nranks, 3);
    assert_string_equal(l.peers[2], "h1:7471");
    mw__peer_list_free(l.peers, l.nranks);
    setenv("RANK", "1", 1);                          /* torchrun's wins over Open MPI's */
    setenv("MW_PORT", "9000", 1);
    assert_int_equal(from_env(&l), 0);
    assert_int_equal(l.rank, 1);
    assert_string_equal(l.peers[0], "h0:9000");
    mw__peer_list_free(l.peers, l.nranks);
    setenv("WORLD_SIZE", "4", 1);
    expect_env_error("WORLD_SIZE=4 but the peer list has 3");
    setenv("MW_WORLD_SIZE", "3", 1);                 /* meshwire's own wins */
    assert_int_equal(from_env(&l), 0);
    mw__peer_list_free(l.peers, l.nranks);
    setenv("MW_RANK", "3", 1);
    expect_env_error("MW_RANK=3 but there are only 3");
    setenv("MW_RANK", "one", 1);
    expect_env_error("MW_RANK='one'");
    setenv("MW_RANK", "0", 1);
    setenv("MW_PORT", "70000", 1);
    expect_env_error("MW_PORT");
    unsetenv("MW_PORT");
    unsetenv("MW_PEERS");
    expect_env_error("no peers");
    setenv("MW_PEERS", "a slots=-1", 1);
    expect_env_error("MW_PEERS: line 1");
    clear_env();
}

static void hostfile(void **s)
{
    (void)s;
    char path[] = "/tmp/mw-hostfile-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char text[] = "# two per node\n10.0.0.1 slots=2\n10.0.0.2 slots=2\n";
    assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)sizeof text - 1);
    close(fd);
    clear_env();
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "4", 1);
    setenv("MW_HOSTFILE", path, 1);
    setenv("MW_PEERS", "ignored when a hostfile is given", 1);
    struct mw__launch l;
    assert_int_equal(from_env(&l), 0);
    assert_int_equal(l.rank, 3);
    assert_int_equal(l.nranks, 4);
    assert_string_equal(l.peers[1], "10.0.0.1:7471");
    assert_string_equal(l.peers[3], "10.0.0.2:7471");
    mw__peer_list_free(l.peers, l.nranks);
    unlink(path);
    expect_env_error("cannot open MW_HOSTFILE");
    clear_env();
}

static void create_env_fails_clearly(void **s)
{
    (void)s;
    clear_env();
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_future_t *f = mw_comm_create_env(ctx, NULL);
    assert_int_equal(mw_wait(f), -EINVAL);
    assert_non_null(strstr(mw_future_message(f), "MW_RANK"));
    mw_future_unref(f);
    mw_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ports_for_shared_hosts),
        cmocka_unit_test(separators_comments_slots),
        cmocka_unit_test(bad_lists),
        cmocka_unit_test(launcher_variables),
        cmocka_unit_test(hostfile),
        cmocka_unit_test(create_env_fails_clearly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
