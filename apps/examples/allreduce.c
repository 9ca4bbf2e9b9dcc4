/* allreduce: a communicator and one collective.
 *
 *   allreduce RANK ENTRY0 ENTRY1 ...   entry i says how to reach rank i:
 *                                      "ADDR[,ADDR...][:PORT]"
 *   allreduce                          rank and entries from a launcher's
 *                                      environment (mw_comm_create_env:
 *                                      MW_RANK, MW_PEERS or MW_HOSTFILE...)
 *
 * Every rank sums a vector of floats in place and checks the result; the
 * job ends with a barrier before the communicator is freed (the clean
 * teardown the header describes).  The communicator part is the README's
 * example, verbatim. */
#include <errno.h>
#include <meshwire.h>
#include <stdio.h>
#include <stdlib.h>

#define N 100000

/* Wait for @f and drop it: 0 (its value in *@value), or its error, said. */
static int wait_for(mw_future_t *f, const char *what, void **value)
{
    int rc = f ? mw_wait(f) : -ENOMEM;
    if (rc < 0)
        fprintf(stderr, "allreduce: %s: %s\n", what, f ? mw_future_message(f) : mw_strerror(rc));
    else if (value)
        *value = mw_future_value(f);
    mw_future_unref(f);
    return rc;
}

int main(int argc, char **argv)
{
    mw_ctx_t *ctx;
    if (argc == 2 || mw_ctx_new(&ctx, NULL, NULL) < 0) {
        fprintf(stderr, "usage: allreduce [RANK ENTRY0 ENTRY1 ...]\n");
        return 2;
    }
    float *x = mw_alloc(ctx, N * sizeof *x);       /* registered once, used often */
    int rank = argc > 2 ? atoi(argv[1]) : 0;
    const char *const *peers = (const char *const *)argv + 2;
    /* README: begin */
    mw_comm_t *comm;
    mw_future_t *cf = argc > 2 ? mw_comm_create(ctx, rank, argc - 2, peers, NULL)
                               : mw_comm_create_env(ctx, NULL);   /* MW_RANK, MW_PEERS... */
    if (wait_for(cf, "communicator", (void **)&comm) < 0)
        return 1;
    int me = mw_comm_rank(comm), size = mw_comm_size(comm);
    for (int i = 0; i < N; i++)
        x[i] = (float)(me + i % 7);
    int rc = wait_for(mw_allreduce(comm, x, x, N, MW_F32, MW_SUM), "allreduce", NULL);
    /* README: end */
    int wrong = 0;
    for (int i = 0; i < N && rc == 0; i++)         /* sum over r of (r + i % 7) */
        wrong += x[i] != (float)(size * (size - 1) / 2 + size * (i % 7));
    if (wait_for(mw_barrier(comm), "final barrier", NULL) < 0)
        rc = -1;
    printf("allreduce: rank %d of %d: %s\n", me, size,
           rc ? "failed" : wrong ? "WRONG RESULT" : "sum correct");
    mw_comm_free(comm);
    mw_free(ctx, x);
    mw_ctx_free(ctx);
    return rc || wrong;
}
