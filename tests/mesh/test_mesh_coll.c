/* Run on every node of the mesh at once: a communicator over the
 * direct-connect mesh (each pair on its own subnet) made the way a launcher
 * would (mw_comm_create_env with MW_RANK and MW_PEERS), then allreduce,
 * allgather and broadcast checked against local references: with one rank
 * per node, and with two (a mixed communicator: a rank reaches its sibling
 * on the same-host path, the other nodes' ranks over RDMA). */
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "meshwire.h"
#include "../rxe/coll_data.h"
#include "../rxe/rxe_util.h"

#define PORT "7481"
#define PORT2 "7491"                /* two ranks a node: 7491, 7492 */
#define MAXN 16

static int me, nodes;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void wait_ok(mw_future_t *f, const char *what)
{
    mw_future_set_timeout(f, 120000);
    int rc = mw_wait(f);
    if (rc)
        fail_msg("node%d %s: %s: %s", me, what, mw_strerror(rc), mw_future_message(f));
    mw_future_unref(f);
}

/* The collectives as rank @me of @nodes ranks (the globals, per process),
 * @per_node ranks on each node: each node's address in MW_PEERS that many
 * times (ranks on one address get consecutive ports).  Return the
 * connections the context made on the same-host path. */
static uint64_t run_collectives(int per_node)
{
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    char peers[2048] = "", *save = NULL, list[1024];
    snprintf(list, sizeof list, "%s", getenv("MW_PEER_ADDRS"));
    for (char *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save))
        for (int k = 0; k < per_node; k++)
            snprintf(peers + strlen(peers), sizeof peers - strlen(peers), "%s%s",
                     peers[0] ? " " : "", a);
    char v[16];
    setenv("MW_PEERS", peers, 1);
    snprintf(v, sizeof v, "%d", me);
    setenv("MW_RANK", v, 1);
    snprintf(v, sizeof v, "%d", nodes);
    setenv("MW_WORLD_SIZE", v, 1);
    setenv("MW_PORT", per_node == 1 ? PORT : PORT2, 1);
    mw_future_t *cf = mw_comm_create_env(ctx, NULL);
    mw_future_set_timeout(cf, 120000);
    if (mw_wait(cf))
        fail_msg("node%d: comm_create: %s", me, mw_future_message(cf));
    mw_comm_t *comm = mw_future_value(cf);
    mw_future_unref(cf);

    const size_t sizes[] = {0, 7, 4096, (1 << 20) + 3};
    for (size_t s = 0; s < 4; s++) {
        size_t n = sizes[s];
        float *x = malloc(n * sizeof *x + 1);
        fill(x, MW_F32, n, me, s);
        double t0 = now();
        wait_ok(mw_allreduce(comm, x, x, n, MW_F32, MW_SUM), "allreduce");
        float *ref = reference(MW_F32, MW_SUM, n, nodes, s);
        assert_memory_equal(x, ref, n * sizeof *x);
        printf("node%d: allreduce f32 %zu elements ok (%.3f s)\n", me, n, now() - t0);
        free(ref);
        free(x);
    }
    size_t n = 4096;
    int32_t *in = malloc(n * 4), *all = malloc(nodes * n * 4), *want = malloc(n * 4);
    fill(in, MW_INT32, n, me, 9);
    wait_ok(mw_allgather(comm, in, all, n, MW_INT32), "allgather");
    for (int q = 0; q < nodes; q++) {
        fill(want, MW_INT32, n, q, 9);
        assert_memory_equal(all + q * n, want, n * 4);
    }
    printf("node%d: allgather ok\n", me);
    size_t bn = (1 << 20) + 3;
    int32_t *b = malloc(bn * 4), *bwant = malloc(bn * 4);
    fill(bwant, MW_INT32, bn, 1, 10);
    if (me == 1)
        memcpy(b, bwant, bn * 4);
    wait_ok(mw_broadcast(comm, b, bn, MW_INT32, 1 % nodes), "broadcast");
    assert_memory_equal(b, bwant, bn * 4);
    printf("node%d: broadcast ok\n", me);
    wait_ok(mw_barrier(comm), "barrier");
    /* Leaving together: under loss (the lossy stage) a rank whose final
     * barrier is done would otherwise leave while another's last step
     * still waits for a third rank's resent message. */
    mw_ctx_stats_t st;
    mw_ctx_stats(ctx, &st);      /* before the close lets the connections go */
    wait_ok(mw_comm_close(comm), "close");
    free(in), free(all), free(want), free(b), free(bwant);
    mw_ctx_free(ctx);
    return st.local_connections;
}

/* A communicator formed through the directory (MW_DIRECTORY, a Redis that
 * tests/mesh/dir.sh runs on node0): no host file, no MW_PEERS. */
static void communicator_through_the_directory(void **state)
{
    (void)state;
    if (!getenv("MW_DIRECTORY"))
        skip();                      /* dir.sh runs it, with the store */
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_directory_t *d = NULL;
    for (int i = 0; i < 20 && !d; i++) {      /* node0's store may be starting */
        mw_future_t *f = mw_dir_open(ctx, NULL, NULL);
        if (mw_wait(f) == 0)
            d = mw_future_value(f);
        else
            fprintf(stderr, "node%d: %s (retrying)\n", me, mw_future_message(f));
        mw_future_unref(f);
    }
    assert_non_null(d);
    mw_comm_opts_t o;
    mw_comm_opts_init(&o);
    o.timeout_ms = 60000;
    double t0 = now();
    mw_future_t *cf = mw_dir_comm_create(d, "mesh", me, nodes, &o);
    if (mw_wait(cf))
        fail_msg("node%d: dir_comm_create: %s", me, mw_future_message(cf));
    mw_comm_t *comm = mw_future_value(cf);
    mw_future_unref(cf);
    printf("node%d: communicator of %d formed through the directory in %.3f s\n", me, nodes,
           now() - t0);
    size_t n = 4096;
    float *x = malloc(n * sizeof *x);
    fill(x, MW_F32, n, me, 3);
    wait_ok(mw_allreduce(comm, x, x, n, MW_F32, MW_SUM), "allreduce");
    float *ref = reference(MW_F32, MW_SUM, n, nodes, 3);
    assert_memory_equal(x, ref, n * sizeof *x);
    free(ref);
    free(x);
    wait_ok(mw_barrier(comm), "barrier");
    wait_ok(mw_comm_close(comm), "close");
    mw_dir_free(d);
    mw_ctx_free(ctx);
}

static void collectives_across_the_mesh(void **state)
{
    (void)state;
    assert_int_equal(run_collectives(1), 0);     /* every peer on another node */
}

/* Connections a rank of two per node should make on the same-host path:
 * one, to its sibling; none with MW_TRANSPORT=rdma. */
static uint64_t siblings_expected(void)
{
    const char *t = getenv("MW_TRANSPORT");
    return t && !strcmp(t, "rdma") ? 0 : 1;
}

/* Rank @me of @nodes (set by main), the second on its node. */
static uint64_t run_sibling(void)
{
    uint64_t local = run_collectives(2);
    printf("rank %d of %d: %llu connection(s) on the same-host path\n", me, nodes,
           (unsigned long long)local);
    return local;
}

/* Two ranks per node: 2 x nodes ranks, node n's being 2n and 2n+1 (the
 * second a process of its own, started fresh: a fork would inherit memory
 * registered here).  Each rank reaches its sibling on the same-host path
 * and every other rank over RDMA, and the results are exact. */
static void mixed_communicator_two_ranks_per_node(void **state)
{
    (void)state;
    int node = me, world = 2 * nodes;
    char rank[16], size[16];
    snprintf(rank, sizeof rank, "%d", 2 * node + 1);
    snprintf(size, sizeof size, "%d", world);
    char *argv[] = {"mesh-coll", "sibling", rank, size, NULL};
    pid_t child;
    assert_int_equal(posix_spawn(&child, "/proc/self/exe", NULL, NULL, argv, environ), 0);
    me = 2 * node;
    nodes = world;
    uint64_t local = run_sibling();
    int st;
    assert_int_equal(waitpid(child, &st, 0), child);
    me = node;
    nodes = world / 2;
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(local, siblings_expected());
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && !strcmp(argv[1], "sibling")) {
        me = atoi(argv[2]);
        nodes = atoi(argv[3]);
        return run_sibling() == siblings_expected() ? 0 : 3;
    }
    const char *addrs[1];
    rxe_require(1, addrs);
    if (!getenv("MW_NODE") || !getenv("MW_NODES") || !getenv("MW_PEER_ADDRS")) {
        printf("SKIP: not in a mesh (run through tools/rxe-vm mesh)\n");
        return SKIP_EXIT;
    }
    me = atoi(getenv("MW_NODE"));
    nodes = atoi(getenv("MW_NODES"));
    if (nodes < 2 || nodes > MAXN)
        return SKIP_EXIT;
    if (getenv("MW_TEST_FILTER"))
        cmocka_set_test_filter(getenv("MW_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(collectives_across_the_mesh),
        cmocka_unit_test(mixed_communicator_two_ranks_per_node),
        cmocka_unit_test(communicator_through_the_directory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
