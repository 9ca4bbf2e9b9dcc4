/* mpibench: MPI's collectives timed the way mwbench times meshwire's, as an
 * anchor for scripts/bench.  Not part of meshwire: it links MPI only.
 *
 *   mpirun -np RANKS [MCA options] mpibench LABEL OP [BYTES...]
 *
 * OP: allreduce, allgather or broadcast, f32 (sum).  BYTES is the result
 * buffer per rank (allgather: all ranks' parts together).  LABEL names the
 * transport in the algo column (e.g. mpi-ucx, mpi-tcp).  Rank 0 prints:
 *   op bytes ranks algo iters time_us algbw_MiB/s cpu_s
 * cpu_s is rank 0's process during the timed iterations. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static int run_op(const char *op, float *in, float *out, int count, int ranks)
{
    if (!strcmp(op, "allreduce"))
        return MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (!strcmp(op, "allgather"))
        return MPI_Allgather(in, count / ranks, MPI_FLOAT, out, count / ranks, MPI_FLOAT,
                             MPI_COMM_WORLD);
    if (!strcmp(op, "broadcast"))
        return MPI_Bcast(out, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
    return -1;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (argc < 3) {
        if (rank == 0)
            fprintf(stderr, "usage: mpibench LABEL allreduce|allgather|broadcast [BYTES...]\n");
        MPI_Finalize();
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    static char *dflt[] = {"4096", "1048576", "16777216"};
    int nsizes = argc > 3 ? argc - 3 : 3;
    char **sizes = argc > 3 ? argv + 3 : dflt;
    int rc = 0;
    for (int i = 0; i < nsizes && !rc; i++) {
        int count = (int)(strtoull(sizes[i], NULL, 0) / sizeof(float));
        count -= count % ranks;
        if (!count)
            count = ranks;
        float *in = malloc(count * sizeof *in), *out = malloc(count * sizeof *out);
        for (int k = 0; k < count; k++)
            in[k] = out[k] = 1.0f;
        unsigned iters = (unsigned)((32u << 20) / (count * sizeof(float)));
        iters = iters < 5 ? 5 : iters > 500 ? 500 : iters;
        rc = run_op(argv[2], in, out, count, ranks);              /* warm-up */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime(), c0 = cpu();
        for (unsigned k = 0; k < iters && !rc; k++)
            rc = run_op(argv[2], in, out, count, ranks);
        double t = (MPI_Wtime() - t0) / iters, cs = cpu() - c0;
        MPI_Barrier(MPI_COMM_WORLD);
        if (rc && rank == 0)
            fprintf(stderr, "mpibench: %s failed (%d)\n", argv[2], rc);
        else if (rank == 0)
            printf("%-16s %-10zu %6d %6s %8u %12.1f %12.1f %8.3f\n", argv[2],
                   count * sizeof(float), ranks, argv[1], iters, t * 1e6,
                   count * sizeof(float) / t / (1 << 20), cs);
        free(in);
        free(out);
    }
    MPI_Finalize();
    return rc ? 1 : 0;
}
