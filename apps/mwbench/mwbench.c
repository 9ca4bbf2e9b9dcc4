/* mwbench: meshwire's own numbers, on the public API only.
 *
 *   mwbench write-bw ADDR [SIZE...]   one-sided write bandwidth over a loopback
 *                                      connection to ADDR (perftest's ib_write_bw
 *                                      in iteration mode is the anchor)
 *   mwbench connect ADDR N            time to set up N connections at once
 *   mwbench idle ADDR N SECONDS       CPU used by N idle connections
 *   mwbench allreduce [-n RANKS ADDR] [BYTES...]
 *                                      f32 sum allreduce time per size; with -n
 *                                      it starts RANKS processes on ADDR, else
 *                                      it is one rank of a launcher's job
 *                                      (mw_comm_create_env); MW_ALLREDUCE_ALGO
 *                                      picks the algorithm
 *
 * Every line also gives the CPU seconds the process used (getrusage), so
 * "nothing spins" is a number. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "meshwire.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void die(const char *what, int rc, mw_future_t *f)
{
    fprintf(stderr, "mwbench: %s: %s%s%s\n", what, mw_strerror(rc), f ? ": " : "",
            f ? mw_future_message(f) : "");
    exit(1);
}

/* --- a loopback pair ------------------------------------------------------ */

#define MAXC 1024
static mw_conn_t *accepted[MAXC];
static int naccepted;

static void on_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    (void)arg;
    if (naccepted < MAXC)
        accepted[naccepted++] = c;
    else
        mw_conn_abort(c);
}

static mw_listener_t *listen_on(mw_ctx_t *ctx, const char *addr, char *target, size_t cap)
{
    mw_listener_t *l;
    char a[128];
    snprintf(a, sizeof a, "%s:0", addr);
    int rc = mw_listen(ctx, a, NULL, on_accept, NULL, &l);
    if (rc)
        die("listen", rc, NULL);
    snprintf(target, cap, "%s:%d", addr, mw_listener_port(l));
    return l;
}

static mw_conn_t *connect_one(mw_ctx_t *ctx, const char *target)
{
    mw_future_t *f = mw_connect(ctx, target, NULL);
    int rc = mw_wait(f);
    if (rc)
        die("connect", rc, f);
    mw_conn_t *c = mw_future_value(f);
    mw_future_unref(f);
    return c;
}

static void run_for(mw_ctx_t *ctx, unsigned ms)
{
    mw_future_t *t = mw_future_new(ctx);
    mw_future_set_timeout(t, ms);
    mw_wait(t);
    mw_future_unref(t);
}

static void close_conn(mw_conn_t *c)
{
    mw_future_t *f = mw_conn_close(c);
    mw_wait(f);
    mw_future_unref(f);
}

/* --- write bandwidth ------------------------------------------------------- */

struct wstate {
    mw_conn_t *c;
    void *src;
    size_t size;
    mw_remote_t r;
    unsigned left, inflight, failed;
    mw_future_t *done;
};

static void post_write(struct wstate *w);

static void on_written(mw_future_t *f, void *arg)
{
    struct wstate *w = arg;
    w->inflight--;
    if (mw_future_error(f))
        w->failed++;
    if (w->left)
        post_write(w);
    else if (!w->inflight)
        mw_future_resolve(w->done, NULL);
}

static void post_write(struct wstate *w)
{
    w->left--;
    w->inflight++;
    mw_future_t *f = mw_write(w->c, w->src, w->size, &w->r, 0);
    mw_future_then(f, on_written, w);
    mw_future_unref(f);
}

static int write_bw(const char *addr, int nsizes, char **sizes)
{
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    char target[160];
    mw_listener_t *l = listen_on(ctx, addr, target, sizeof target);
    mw_conn_t *c = connect_one(ctx, target);
    while (!naccepted)
        run_for(ctx, 5);
    size_t max = 8u << 20;
    void *src = mw_alloc(ctx, max), *dst = mw_alloc(ctx, max);
    memset(src, 7, max);
    struct wstate w = {.c = c, .src = src};
    if (mw_mem_export(accepted[0], dst, max, &w.r))
        die("export", -EFAULT, NULL);
    printf("%-10s %8s %10s %10s %12s %10s\n", "bytes", "iters", "MiB/s", "cpu_s", "cpu_s/GiB",
           "wc/event");
    for (int i = 0; i < nsizes; i++) {
        w.size = strtoul(sizes[i], NULL, 0);
        if (!w.size || w.size > max)
            die("size must be 1..8 MiB", -EINVAL, NULL);
        unsigned iters = (unsigned)((512u << 20) / w.size);   /* 512 MiB a size */
        iters = iters < 100 ? 100 : iters > 20000 ? 20000 : iters;
        unsigned window = w.size >= (1u << 20) ? 2 : 16;       /* chunks pipeline inside */
        mw_ctx_stats_t s0, s1;
        mw_ctx_stats(ctx, &s0);
        w.left = iters;
        w.done = mw_future_new(ctx);
        double t0 = now(), c0 = cpu();
        for (unsigned k = 0; k < window && w.left; k++)
            post_write(&w);
        mw_wait(w.done);
        double t = now() - t0, cs = cpu() - c0;
        mw_ctx_stats(ctx, &s1);
        mw_future_unref(w.done);
        double bytes = (double)w.size * iters;
        printf("%-10zu %8u %10.1f %10.3f %12.3f %10.1f%s\n", w.size, iters,
               bytes / t / (1 << 20), cs, cs / (bytes / (1 << 30)),
               (double)(s1.completions - s0.completions) / (double)(s1.events - s0.events + !(s1.events - s0.events)),
               w.failed ? "  FAILED" : "");
    }
    mw_free(ctx, src);
    mw_free(ctx, dst);
    close_conn(c);
    close_conn(accepted[0]);
    mw_listener_free(l);
    mw_ctx_free(ctx);
    return w.failed ? 1 : 0;
}

/* --- connection setup and idle -------------------------------------------- */

static mw_future_t **connect_many(mw_ctx_t *ctx, const char *target, int n, double *secs)
{
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.credits = 4;
    o.slot_size = 4096;
    mw_future_t **fs = calloc(n, sizeof *fs);
    double t0 = now();
    for (int i = 0; i < n; i++)
        fs[i] = mw_connect(ctx, target, &o);
    mw_future_t *all = mw_future_all(ctx, fs, n);
    int rc = mw_wait(all);
    if (rc)
        die("connect", rc, all);
    *secs = now() - t0;
    mw_future_unref(all);
    while (naccepted < n)
        run_for(ctx, 5);
    return fs;
}

static void close_many(mw_future_t **fs, int n)
{
    for (int i = 0; i < n; i++) {
        close_conn(mw_future_value(fs[i]));
        mw_future_unref(fs[i]);
    }
    free(fs);
    for (int i = 0; i < naccepted; i++)
        close_conn(accepted[i]);
    naccepted = 0;
}

static int connect_bench(const char *addr, int n, int idle_s)
{
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    char target[160];
    mw_listener_t *l = listen_on(ctx, addr, target, sizeof target);
    double secs, c0 = cpu();
    mw_future_t **fs = connect_many(ctx, target, n, &secs);
    if (idle_s <= 0) {
        printf("connections %d  setup_s %.3f  per_conn_ms %.2f  cpu_s %.3f\n", n, secs,
               secs / n * 1000, cpu() - c0);
    } else {
        mw_ctx_stats_t s0, s1;
        mw_ctx_stats(ctx, &s0);
        c0 = cpu();
        run_for(ctx, (unsigned)idle_s * 1000);
        double cs = cpu() - c0;
        mw_ctx_stats(ctx, &s1);
        printf("idle connections %d  seconds %d  cpu_s %.4f  core_pct %.3f  wakeups %llu\n", n,
               idle_s, cs, cs / idle_s * 100, (unsigned long long)(s1.events - s0.events));
    }
    close_many(fs, n);
    mw_listener_free(l);
    mw_ctx_free(ctx);
    return 0;
}

/* --- allreduce ------------------------------------------------------------ */

static void wait_or_die(mw_future_t *f, const char *what)
{
    int rc = mw_wait(f);
    if (rc)
        die(what, rc, f);
    mw_future_unref(f);
}

/* One rank: for each size a warm-up, then enough iterations to move about
 * 64 MiB (10..2000), between barriers; rank 0 prints the mean. */
static int allreduce_rank(int nsizes, char **sizes)
{
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    mw_future_t *cf = mw_comm_create_env(ctx, NULL);
    if (mw_wait(cf))
        die("communicator", mw_future_error(cf), cf);
    mw_comm_t *comm = mw_future_value(cf);
    mw_future_unref(cf);
    int rank = mw_comm_rank(comm), n = mw_comm_size(comm);
    const char *algo = getenv("MW_ALLREDUCE_ALGO");
    if (rank == 0)
        printf("%-10s %6s %6s %8s %12s %12s %8s\n", "bytes", "ranks", "algo", "iters",
               "time_us", "algbw_MiB/s", "cpu_s");
    int bad = 0;
    for (int i = 0; i < nsizes; i++) {
        size_t bytes = strtoul(sizes[i], NULL, 0), count = bytes / sizeof(float);
        float *in = mw_alloc(ctx, count * sizeof *in + 4), *out = mw_alloc(ctx, count * sizeof *out + 4);
        for (size_t k = 0; k < count; k++)
            in[k] = 1.0f;
        unsigned iters = bytes ? (unsigned)((64u << 20) / bytes) : 2000;
        iters = iters < 10 ? 10 : iters > 2000 ? 2000 : iters;
        wait_or_die(mw_allreduce(comm, in, out, count, MW_F32, MW_SUM), "allreduce");
        wait_or_die(mw_barrier(comm), "barrier");
        double t0 = now(), c0 = cpu();
        for (unsigned k = 0; k < iters; k++)
            wait_or_die(mw_allreduce(comm, in, out, count, MW_F32, MW_SUM), "allreduce");
        double t = (now() - t0) / iters, cs = cpu() - c0;
        bad += count && (out[0] != (float)n || out[count - 1] != (float)n);
        wait_or_die(mw_barrier(comm), "barrier");
        if (rank == 0)
            printf("%-10zu %6d %6s %8u %12.1f %12.1f %8.3f%s\n", bytes, n, algo ? algo : "auto",
                   iters, t * 1e6, t > 0 ? bytes / t / (1 << 20) : 0, cs,
                   bad ? "  WRONG RESULT" : "");
        mw_free(ctx, in);
        mw_free(ctx, out);
    }
    mw_comm_free(comm);
    mw_ctx_free(ctx);
    return bad ? 1 : 0;
}

/* -n RANKS: this host runs the whole job, one process a rank (forked before
 * any RDMA resource exists), each finding its rank in the environment as
 * under a launcher. */
static int allreduce_local(const char *addr, int nranks, int nsizes, char **sizes)
{
    char peers[160], port[16];
    snprintf(peers, sizeof peers, "%s slots=%d", addr, nranks);
    snprintf(port, sizeof port, "%d", 20000 + getpid() % 20000);
    setenv("MW_PEERS", peers, 1);
    setenv("MW_PORT", port, 1);
    pid_t pids[64];
    for (int r = 0; r < nranks; r++) {
        char rs[16];
        snprintf(rs, sizeof rs, "%d", r);
        if ((pids[r] = fork()) == 0) {
            setenv("MW_RANK", rs, 1);
            _exit(allreduce_rank(nsizes, sizes));
        }
    }
    int bad = 0;
    for (int r = 0; r < nranks; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    return bad ? 1 : 0;
}

static int allreduce_bench(int argc, char **argv)
{
    static char *dflt[] = {"4", "64", "1024", "4096", "16384", "65536", "262144", "1048576",
                           "4194304", "16777216"};
    int nranks = 0;
    if (argc >= 2 && !strcmp(argv[0], "-n")) {
        nranks = atoi(argv[1]);
        argc -= 2, argv += 2;
        if (nranks < 1 || nranks > 64)
            die("-n takes 1..64 ranks", -EINVAL, NULL);
    }
    const char *addr = NULL;
    if (nranks) {
        if (argc < 1)
            die("-n needs the address to run the ranks on", -EINVAL, NULL);
        addr = *argv++;
        argc--;
    }
    int nsizes = argc ? argc : 10;
    char **sizes = argc ? argv : dflt;
    return addr ? allreduce_local(addr, nranks, nsizes, sizes) : allreduce_rank(nsizes, sizes);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 3 && !strcmp(argv[1], "write-bw")) {
        char *dflt[] = {"65536", "1048576", "8388608"};
        return argc > 3 ? write_bw(argv[2], argc - 3, argv + 3) : write_bw(argv[2], 3, dflt);
    }
    if (argc == 4 && !strcmp(argv[1], "connect"))
        return connect_bench(argv[2], atoi(argv[3]), 0);
    if (argc == 5 && !strcmp(argv[1], "idle"))
        return connect_bench(argv[2], atoi(argv[3]), atoi(argv[4]));
    if (argc >= 2 && !strcmp(argv[1], "allreduce"))
        return allreduce_bench(argc - 2, argv + 2);
    fprintf(stderr, "usage: mwbench write-bw ADDR [SIZE...] | connect ADDR N | idle ADDR N SECONDS\n"
                    "       mwbench allreduce [-n RANKS ADDR] [BYTES...]\n");
    return 2;
}
