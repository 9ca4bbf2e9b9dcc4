/* allreduce: a communicator and one collective.
 *
 *   allreduce RANK ENTRY0 ENTRY1 ...   entry i says how to reach rank i:
 *                                      "ADDR[,ADDR...][:PORT]"
 *   allreduce                          rank and entries from a launcher's
 *                                      environment (mw_comm_create_env:
 *                                      MW_RANK, MW_PEERS or MW_HOSTFILE...)
 *   allreduce --dir URL JOB RANK SIZE  the ranks found through a directory
 *                                      (mw_dir_comm_create): no entries
 *
 * Every rank sums a vector of floats in place and checks the result; the
 * job ends with a barrier before the communicator is freed (the clean
 * teardown the header describes).  The communicator part is the README's
 * example, verbatim.  It says how long forming the communicator took (from
 * before the directory opened, when there is one). */
#include <errno.h>
#include <meshwire.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    mw_ctx_t *ctx;
    bool by_dir = argc == 6 && !strcmp(argv[1], "--dir");
    if (argc == 2 || (!by_dir && argc > 1 && argv[1][0] == '-') ||
        mw_ctx_new(&ctx, NULL, NULL) < 0) {
        fprintf(stderr, "usage: allreduce [RANK ENTRY0 ENTRY1 ... | --dir URL JOB RANK SIZE]\n");
        return 2;
    }
    float *x = mw_alloc(ctx, N * sizeof *x);       /* registered once, used often */
    int rank = argc > 2 ? atoi(argv[by_dir ? 4 : 1]) : 0;
    const char *const *peers = (const char *const *)argv + 2;
    double t0 = now_ms();
    mw_directory_t *dir = NULL;
    if (by_dir && wait_for(mw_dir_open(ctx, argv[2], NULL), "directory", (void **)&dir) < 0)
        return 1;
    /* README: begin */
    mw_comm_t *comm;
    mw_future_t *cf = dir ? mw_dir_comm_create(dir, argv[3], rank, atoi(argv[5]), NULL)
                    : argc > 2 ? mw_comm_create(ctx, rank, argc - 2, peers, NULL)
                               : mw_comm_create_env(ctx, NULL);   /* MW_RANK, MW_PEERS... */
    if (wait_for(cf, "communicator", (void **)&comm) < 0)
        return 1;
    /* README: end */
    double formed_ms = now_ms() - t0;               /* the directory opened, if any */
    int me = mw_comm_rank(comm), size = mw_comm_size(comm);
    for (int i = 0; i < N; i++)
        x[i] = (float)(me + i % 7);
    int rc = wait_for(mw_allreduce(comm, x, x, N, MW_F32, MW_SUM), "allreduce", NULL);
    int wrong = 0;
    for (int i = 0; i < N && rc == 0; i++)         /* sum over r of (r + i % 7) */
        wrong += x[i] != (float)(size * (size - 1) / 2 + size * (i % 7));
    printf("allreduce: rank %d of %d: %s (communicator formed%s in %.0f ms)\n", me, size,
           rc ? "failed" : wrong ? "WRONG RESULT" : "sum correct",
           dir ? " through the directory" : "", formed_ms);
    if (wait_for(mw_comm_close(comm), "close", NULL) < 0)   /* together with the others */
        rc = -1;
    mw_dir_free(dir);
    mw_free(ctx, x);
    mw_ctx_free(ctx);
    return rc || wrong;
}
