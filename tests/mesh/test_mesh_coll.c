/* Run on every node of the mesh at once: one rank per node, a communicator
 * over the direct-connect mesh (each pair on its own subnet) made the way a
 * launcher would (mw_comm_create_env with MW_RANK and MW_PEERS), then
 * allreduce, allgather and broadcast checked against local references. */
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

static void collectives_across_the_mesh(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    /* the runner's peer addresses, as a launcher would export them (on a
     * host with real devices they are all the same: ranks then get
     * consecutive ports) */
    char peers[1024];
    snprintf(peers, sizeof peers, "%s", getenv("MW_PEER_ADDRS"));
    for (char *c = peers; *c; c++)
        *c = *c == ',' ? ' ' : *c;
    setenv("MW_PEERS", peers, 1);
    setenv("MW_RANK", getenv("MW_NODE"), 1);
    setenv("MW_WORLD_SIZE", getenv("MW_NODES"), 1);
    setenv("MW_PORT", PORT, 1);
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
    free(in), free(all), free(want), free(b), free(bwant);
    mw_comm_free(comm);
    mw_ctx_free(ctx);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
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
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(collectives_across_the_mesh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
