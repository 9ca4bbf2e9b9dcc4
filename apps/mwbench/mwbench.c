/* mwbench: meshwire's own numbers, on the public API only.
 *
 *   mwbench write-bw ADDR [SIZE...]   one-sided write bandwidth over a loopback
 *                                      connection to ADDR, several writes in
 *                                      flight (perftest's ib_write_bw in
 *                                      iteration mode is the anchor)
 *   mwbench lat ADDR [SIZE...]        send and write-with-immediate ping-pong
 *                                      with an echo process: half the round
 *                                      trip, median and p99, as perftest's
 *                                      ib_send_lat / ib_write_lat report
 *   mwbench batch ADDR [BLOCKS BYTES ROUNDS]
 *                                      BLOCKS blocks of BYTES (default 1000 of
 *                                      16 KiB) written to scattered places of a
 *                                      remote pool over a loopback connection,
 *                                      as one prepared batch per round and as
 *                                      BLOCKS mw_write futures issued at once
 *                                      (perftest's ib_write_bw at BYTES is
 *                                      the anchor)
 *   mwbench rails-serve PORT BYTES    serve a pool of BYTES to rail groups: every
 *                                      connection gets it exported and its
 *                                      descriptor (runs until killed)
 *   mwbench rails ADDRS PORT BYTES ROUNDS
 *                                      BYTES written over one rail (the first of
 *                                      the comma-separated ADDRS of a
 *                                      rails-serve peer) and over all of them
 *                                      (mw_rails_write): MiB/s per round count
 *   mwbench connect ADDR N            time to set up N connections at once
 *   mwbench idle ADDR N SECONDS       CPU used by N idle connections
 *   mwbench coll [-n RANKS ADDR] OP [BYTES...]
 *                                      time and algorithm bandwidth of a
 *                                      collective (allreduce allgather
 *                                      broadcast reduce reduce_scatter gather
 *                                      scatter alltoall barrier) per size, f32,
 *                                      after the communicator's creation time;
 *                                      with -n it starts RANKS processes on
 *                                      ADDR, else it is one rank of a
 *                                      launcher's job (mw_comm_create_env);
 *                                      MW_ALLREDUCE_ALGO picks allreduce's
 *                                      algorithm, MW_BENCH_SLOT_KIB and
 *                                      MW_BENCH_SLOTS the scratch slots
 *   mwbench scale -n RANKS ADDR [full]
 *                                      what a communicator of RANKS processes
 *                                      on ADDR costs each rank: creation time
 *                                      (from when every rank has its context:
 *                                      processes starting on few CPUs are not
 *                                      formation), connections, scratch, peak
 *                                      RSS, then allreduce of 4 KiB and 1 MiB;
 *                                      one line per rank.  "full": an alltoall
 *                                      right after creation first connects
 *                                      every pair (a full mesh, as meshwire
 *                                      made before 2026-11-28), and creation
 *                                      time includes it.  ADDR "mesh": RANKS
 *                                      on each node of a tools/rxe-vm mesh
 *                                      (MW_NODE, MW_PEER_ADDRS), port 23400
 *   mwbench futures [N]               the future API alone, no RDMA: N futures
 *                                      made, given a callback, resolved and
 *                                      released (default 2,000,000), and the
 *                                      cost of one handle lookup
 *   mwbench stalls ADDR               the longest single mw_ctx_progress()
 *                                      call of an epoll loop driving the
 *                                      context (and the CPU time its thread
 *                                      spent in it), in three situations: a
 *                                      first connection, a first connection
 *                                      with 1 GiB already from mw_alloc, and
 *                                      allreduce on malloc'd buffers (2 ranks)
 *
 * Every line also gives the CPU seconds the process used (getrusage), so
 * "nothing spins" is a number. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
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

/* User time only: on soft-RoCE the kernel's send engine runs in the
 * posting thread and its work is system time. */
static double cpu_user(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
}

/* CPU seconds the whole machine was busy, every CPU and every process
 * (/proc/stat: all but idle and iowait): rxe's work runs in softirqs and
 * kernel threads too, charged to whoever the CPU interrupted. */
static double machine_busy(void)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f || fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                     &v[3], &v[4], &v[5], &v[6], &v[7]) != 8) {
        if (f)
            fclose(f);
        return 0;
    }
    fclose(f);
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)sysconf(_SC_CLK_TCK);
}

static void die(const char *what, int rc, mw_future_t *f)
{
    fprintf(stderr, "mwbench: %s: %s%s%s\n", what, mw_strerror(rc), f ? ": " : "",
            f ? mw_future_message(f) : "");
    exit(1);
}

static void wait_or_die(mw_future_t *f, const char *what)
{
    int rc = mw_wait(f);
    if (rc)
        die(what, rc, f);
    mw_future_unref(f);
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

/* A new context, a listener on @addr and a connection to it, accepted
 * (accepted[0] is the other end). */
static mw_conn_t *loopback(const char *addr, mw_ctx_t **ctx, mw_listener_t **l)
{
    mw_ctx_new(ctx, NULL, NULL);
    char target[160];
    *l = listen_on(*ctx, addr, target, sizeof target);
    mw_conn_t *c = connect_one(*ctx, target);
    while (!naccepted)
        run_for(*ctx, 5);
    return c;
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

/* How long the loop can be kept from its timers: a 1 ms timer re-armed
 * while the writes run, and its worst lateness (rxe runs its send engine
 * inside ibv_post_send, so what one loop turn posts is time the loop is
 * not looking at anything else). */
struct stall_probe {
    mw_ctx_t *ctx;
    double due, worst;
    bool on, armed;
};

static void probe_arm(struct stall_probe *p);

static void probe_fired(mw_future_t *f, void *arg)
{
    struct stall_probe *p = arg;
    double late = now() - p->due;
    if (late > p->worst)
        p->worst = late;
    mw_future_unref(f);           /* the reference probe_arm kept */
    p->armed = false;
    if (p->on)
        probe_arm(p);
}

/* A future that can only time out; its reference is kept until it fires
 * (the last unref of a pending future drops it, callbacks and all). */
static void probe_arm(struct stall_probe *p)
{
    mw_future_t *t = mw_future_new(p->ctx);
    p->due = now() + 0.001;
    p->armed = true;
    mw_future_set_timeout(t, 1);
    mw_future_then(t, probe_fired, p);
}

static int write_bw(const char *addr, int nsizes, char **sizes)
{
    mw_ctx_t *ctx;
    mw_listener_t *l;
    mw_conn_t *c = loopback(addr, &ctx, &l);
    size_t max = 8u << 20;
    void *src = mw_alloc(ctx, max), *dst = mw_alloc(ctx, max);
    memset(src, 7, max);
    struct wstate w = {.c = c, .src = src};
    if (mw_mem_export(accepted[0], dst, max, &w.r))
        die("export", -EFAULT, NULL);
    printf("%-10s %8s %10s %10s %12s %10s %12s %13s %14s\n", "bytes", "iters", "MiB/s", "cpu_s",
           "cpu_s/GiB", "wc/event", "user_s/GiB", "max_stall_ms", "all_cpu_s/GiB");
    struct stall_probe probe = {.ctx = ctx};
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
        double t0 = now(), c0 = cpu(), u0 = cpu_user(), m0 = machine_busy();
        probe.on = true;
        probe.worst = 0;
        probe_arm(&probe);
        for (unsigned k = 0; k < window && w.left; k++)
            post_write(&w);
        mw_wait(w.done);
        double t = now() - t0, cs = cpu() - c0, us = cpu_user() - u0, ms = machine_busy() - m0;
        probe.on = false;
        while (probe.armed)
            run_for(ctx, 1);
        mw_ctx_stats(ctx, &s1);
        mw_future_unref(w.done);
        double bytes = (double)w.size * iters;
        printf("%-10zu %8u %10.1f %10.3f %12.3f %10.1f %12.3f %13.1f %14.3f%s\n", w.size, iters,
               bytes / t / (1 << 20), cs, cs / (bytes / (1 << 30)),
               (double)(s1.completions - s0.completions) / (double)(s1.events - s0.events + !(s1.events - s0.events)),
               us / (bytes / (1 << 30)), probe.worst * 1e3, ms / (bytes / (1 << 30)),
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

/* The descriptor of the peer's exported memory, its next message (within
 * 10 s, and exactly a descriptor's size). */
static void recv_remote(mw_conn_t *c, mw_remote_t *out)
{
    mw_future_t *f = mw_recv(c);
    mw_future_set_timeout(f, 10000);
    int rc = mw_wait(f);
    if (rc)
        die("descriptor", rc, f);
    mw_msg_t *m = mw_future_value(f);
    if (m->len != sizeof *out)
        die("descriptor", -EPROTO, NULL);
    memcpy(out, m->data, sizeof *out);
    mw_msg_free(m);
    mw_future_unref(f);
}

/* --- latency: send and write-with-immediate ping-pong ---------------------- */

#define LAT_MAX (64u << 10)

struct echo {
    mw_conn_t *c;
    void *buf;
    mw_remote_t peer;
    mw_future_t *got;           /* client: the current ping's answer */
};

static void echo_imm(mw_conn_t *c, uint32_t imm, void *arg)
{
    struct echo *e = arg;
    if (e->got) {                                    /* client: the pong */
        mw_future_resolve(e->got, NULL);
        return;
    }
    mw_future_unref(mw_write_imm(c, e->buf, imm, &e->peer, 0, imm));   /* server: pong */
}

/* Both ends: export a buffer, send its descriptor, take the peer's. */
static void swap_remotes(mw_ctx_t *ctx, struct echo *e)
{
    e->buf = mw_alloc(ctx, LAT_MAX);
    memset(e->buf, 1, LAT_MAX);
    mw_remote_t mine;
    if (mw_mem_export(e->c, e->buf, LAT_MAX, &mine))
        die("export", -EFAULT, NULL);
    wait_or_die(mw_send(e->c, &mine, sizeof mine), "send");
    recv_remote(e->c, &e->peer);
    mw_conn_on_imm(e->c, echo_imm, e);
}

/* The echo side: answer every message with one as long, every write with
 * immediate with one as long, until the client hangs up. */
static int lat_server(const char *target)
{
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    mw_listener_t *l;
    int rc = mw_listen(ctx, target, NULL, on_accept, NULL, &l);
    if (rc)
        die("listen", rc, NULL);
    while (!naccepted)
        run_for(ctx, 5);
    struct echo e = {.c = accepted[0]};
    swap_remotes(ctx, &e);
    for (;;) {
        mw_future_t *r = mw_recv(e.c);
        if (mw_wait(r)) {
            mw_future_unref(r);
            break;
        }
        mw_msg_t *m = mw_future_value(r);
        mw_future_unref(mw_send(e.c, e.buf, m->len));
        mw_msg_free(m);
        mw_future_unref(r);
    }
    mw_conn_abort(e.c);
    mw_free(ctx, e.buf);
    mw_listener_free(l);
    mw_ctx_free(ctx);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Half the round trip, as perftest's _lat tools report, median and p99. */
static void lat_report(const char *kind, size_t size, double *half, int iters, double cs)
{
    qsort(half, (size_t)iters, sizeof *half, cmp_double);
    printf("%-10s %-8zu %6d %10.2f %10.2f %8.3f\n", kind, size, iters, half[iters / 2] * 1e6,
           half[iters * 99 / 100] * 1e6, cs);
}

static int lat_client(const char *target, int nsizes, char **sizes)
{
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    mw_future_t *f = NULL;
    for (int i = 0; i < 200; i++) {            /* until the server listens */
        mw_future_unref(f);
        f = mw_connect(ctx, target, NULL);
        if (mw_wait(f) != -ECONNREFUSED)
            break;
        run_for(ctx, 20);
    }
    if (mw_future_error(f))
        die("connect", mw_future_error(f), f);
    struct echo e = {.c = mw_future_value(f)};
    mw_future_unref(f);
    swap_remotes(ctx, &e);
    enum { ITERS = 1000, WARMUP = 50 };
    static double half[ITERS];
    printf("%-10s %-8s %6s %10s %10s %8s\n", "kind", "bytes", "iters", "median_us", "p99_us",
           "cpu_s");
    for (int i = 0; i < nsizes; i++) {
        size_t size = strtoul(sizes[i], NULL, 0);
        if (!size || size > LAT_MAX)
            die("sizes are 1..64 KiB", -EINVAL, NULL);
        double c0 = cpu();
        for (int k = -WARMUP; k < ITERS; k++) {
            double t0 = now();
            mw_future_t *r = mw_recv(e.c);
            mw_future_unref(mw_send(e.c, e.buf, size));
            if (mw_wait(r))
                die("recv", mw_future_error(r), r);
            mw_msg_free(mw_future_value(r));
            mw_future_unref(r);
            if (k >= 0)
                half[k] = (now() - t0) / 2;
        }
        lat_report("send", size, half, ITERS, cpu() - c0);
        c0 = cpu();
        for (int k = -WARMUP; k < ITERS; k++) {
            double t0 = now();
            e.got = mw_future_new(ctx);
            mw_future_unref(mw_write_imm(e.c, e.buf, size, &e.peer, 0, (uint32_t)size));
            wait_or_die(e.got, "pong");
            e.got = NULL;
            if (k >= 0)
                half[k] = (now() - t0) / 2;
        }
        lat_report("write-imm", size, half, ITERS, cpu() - c0);
    }
    mw_free(ctx, e.buf);
    close_conn(e.c);
    mw_ctx_free(ctx);
    return 0;
}

/* The echo side is a child process, forked before any RDMA resource. */
static int lat_bench(const char *addr, int nsizes, char **sizes)
{
    static char *dflt[] = {"8", "64", "512", "4096", "65536"};
    char target[160];
    snprintf(target, sizeof target, "%s:%d", addr, 20000 + getpid() % 20000);
    pid_t pid = fork();
    if (pid == 0)
        _exit(lat_server(target));
    int rc = nsizes ? lat_client(target, nsizes, sizes) : lat_client(target, 5, dflt);
    int st;
    waitpid(pid, &st, 0);
    return rc || !WIFEXITED(st) || WEXITSTATUS(st);
}

/* --- collectives ---------------------------------------------------------- */

static const char *const coll_ops[] = {"allreduce", "allgather", "broadcast", "reduce",
                                       "reduce_scatter", "gather", "scatter", "alltoall",
                                       "barrier"};
#define NOPS (sizeof coll_ops / sizeof *coll_ops)

/* Start collective @op on @count f32 elements of result (@in and @out hold
 * that many; per-rank parts are count / nranks). */
static mw_future_t *coll_start(mw_comm_t *comm, int op, float *in, float *out, size_t count)
{
    size_t part = count / (size_t)mw_comm_size(comm);
    switch (op) {
    case 0: return mw_allreduce(comm, in, out, count, MW_F32, MW_SUM);
    case 1: return mw_allgather(comm, in, out, part, MW_F32);
    case 2: return mw_broadcast(comm, out, count, MW_F32, 0);
    case 3: return mw_reduce(comm, in, out, count, MW_F32, MW_SUM, 0);
    case 4: return mw_reduce_scatter(comm, in, out, count, MW_F32, MW_SUM);
    case 5: return mw_gather(comm, in, out, part, MW_F32, 0);
    case 6: return mw_scatter(comm, in, out, part, MW_F32, 0);
    case 7: return mw_alltoall(comm, in, out, part, MW_F32);
    default: return mw_barrier(comm);
    }
}

/* Whether @out is not what @op leaves there, every input 1.0 and every
 * output 0 before (a sum is nranks, anything moved is 1.0). */
static int coll_wrong(int op, const float *out, size_t count, int rank, int n)
{
    size_t part = count / (size_t)n;
    switch (op) {
    case 0: return out[0] != (float)n || out[count - 1] != (float)n;
    case 3: return rank == 0 && (out[0] != (float)n || out[count - 1] != (float)n);
    case 4: return out[0] != (float)n || out[part - 1] != (float)n;
    case 5: return rank == 0 && (out[0] != 1.0f || out[count - 1] != 1.0f);
    case 8: return 0;
    default: return out[0] != 1.0f || out[(op == 6 ? part : count) - 1] != 1.0f;
    }
}

/* Leave the communicator together with the other ranks. */
static void close_comm(mw_comm_t *comm)
{
    mw_future_t *closed = mw_comm_close(comm);
    mw_wait(closed);
    mw_future_unref(closed);
}

/* Ranks @first .. @first + @nranks - 1 of the job MW_PEERS=@peers (port
 * @port on), each a process forked before any RDMA resource exists and
 * running @rank_main(@arg) with MW_RANK set, as under a launcher; 0 when
 * every one exited 0. */
static int fork_ranks(const char *peers, const char *port, int nranks, int first,
                      int (*rank_main)(const void *), const void *arg)
{
    setenv("MW_PEERS", peers, 1);
    setenv("MW_PORT", port, 1);
    pid_t pids[256];
    for (int r = 0; r < nranks; r++) {
        char rs[16];
        snprintf(rs, sizeof rs, "%d", first + r);
        if ((pids[r] = fork()) == 0) {
            setenv("MW_RANK", rs, 1);
            _exit(rank_main(arg));
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

/* One rank: the communicator's creation time, then for each size a warm-up
 * and enough iterations to move about 32 MiB (5..500), between barriers;
 * rank 0 prints the mean.  BYTES is the result buffer per rank (allgather,
 * gather, alltoall: every rank's part together), f32. */
static int coll_rank(int op, int nsizes, char **sizes)
{
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    double t0 = now();
    mw_comm_opts_t o;
    mw_comm_opts_init(&o);
    if (getenv("MW_BENCH_SLOT_KIB"))
        o.slot_size = (unsigned)strtoul(getenv("MW_BENCH_SLOT_KIB"), NULL, 0) << 10;
    if (getenv("MW_BENCH_SLOTS"))
        o.slots = (unsigned)strtoul(getenv("MW_BENCH_SLOTS"), NULL, 0);
    mw_future_t *cf = mw_comm_create_env(ctx, &o);
    if (mw_wait(cf))
        die("communicator", mw_future_error(cf), cf);
    double created = now() - t0;
    mw_comm_t *comm = mw_future_value(cf);
    mw_future_unref(cf);
    int rank = mw_comm_rank(comm), n = mw_comm_size(comm);
    const char *algo = op == 0 && getenv("MW_ALLREDUCE_ALGO") ? getenv("MW_ALLREDUCE_ALGO") : "mw";
    if (rank == 0)
        printf("communicator %d ranks  create_s %.3f\n%-16s %-10s %6s %6s %8s %12s %12s %8s %9s "
               "%9s\n", n, created, "op", "bytes", "ranks", "algo", "iters", "time_us",
               "algbw_MiB/s", "cpu_s", "busy_pct", "wake/op");
    int bad = 0;
    for (int i = 0; i < nsizes; i++) {
        size_t count = strtoul(sizes[i], NULL, 0) / sizeof(float);
        count -= count % (size_t)n;                  /* equal parts */
        if (!count)
            count = (size_t)n;
        size_t bytes = count * sizeof(float);
        float *in = mw_alloc(ctx, bytes), *out = mw_alloc(ctx, bytes);
        for (size_t k = 0; k < count; k++)
            in[k] = 1.0f, out[k] = op == 2 && rank == 0 ? 1.0f : 0.0f;
        unsigned iters = (unsigned)((32u << 20) / bytes);
        iters = iters < 5 ? 5 : iters > 500 ? 500 : iters;
        wait_or_die(coll_start(comm, op, in, out, count), coll_ops[op]);
        wait_or_die(mw_barrier(comm), "barrier");
        mw_ctx_stats_t s0, s1;
        mw_ctx_stats(ctx, &s0);
        double t1 = now(), c0 = cpu(), m0 = machine_busy();
        for (unsigned k = 0; k < iters; k++)
            wait_or_die(coll_start(comm, op, in, out, count), coll_ops[op]);
        double t = (now() - t1) / iters, cs = cpu() - c0;
        double busy = (machine_busy() - m0) / (t * iters * (double)sysconf(_SC_NPROCESSORS_ONLN));
        mw_ctx_stats(ctx, &s1);
        bad += coll_wrong(op, out, count, rank, n);
        wait_or_die(mw_barrier(comm), "barrier");
        if (rank == 0)
            printf("%-16s %-10zu %6d %6s %8u %12.1f %12.1f %8.3f %9.1f %9.1f%s\n", coll_ops[op],
                   bytes, n, algo, iters, t * 1e6, t > 0 ? bytes / t / (1 << 20) : 0, cs,
                   busy * 100, (double)(s1.events - s0.events) / iters,
                   bad ? "  WRONG RESULT" : "");
        mw_free(ctx, in);
        mw_free(ctx, out);
        if (op == 8)
            break;                                   /* a barrier has no size */
    }
    close_comm(comm);
    mw_ctx_free(ctx);
    return bad ? 1 : 0;
}

struct coll_args {
    int op, nsizes;
    char **sizes;
};

static int coll_rank_main(const void *arg)
{
    const struct coll_args *a = arg;
    return coll_rank(a->op, a->nsizes, a->sizes);
}

/* -n RANKS: this host runs the whole job, one process a rank. */
static int coll_local(const char *addr, int nranks, int op, int nsizes, char **sizes)
{
    char peers[160], port[16];
    snprintf(peers, sizeof peers, "%s slots=%d", addr, nranks);
    snprintf(port, sizeof port, "%d", 20000 + getpid() % 20000);
    struct coll_args a = {op, nsizes, sizes};
    return fork_ranks(peers, port, nranks, 0, coll_rank_main, &a);
}

static int coll_bench(int argc, char **argv)
{
    static char *dflt[] = {"4", "64", "1024", "4096", "16384", "65536", "262144", "1048576",
                           "4194304", "16777216", "67108864"};
    int nranks = 0;
    const char *addr = NULL;
    if (argc >= 3 && !strcmp(argv[0], "-n")) {
        nranks = atoi(argv[1]);
        addr = argv[2];
        argc -= 3, argv += 3;
        if (nranks < 1 || nranks > 64)
            die("-n takes 1..64 ranks", -EINVAL, NULL);
    }
    int op = -1;
    for (int i = 0; argc && i < (int)NOPS; i++)
        if (!strcmp(argv[0], coll_ops[i]))
            op = i;
    if (op < 0)
        die("coll needs an operation: allreduce allgather broadcast reduce reduce_scatter "
            "gather scatter alltoall barrier", -EINVAL, NULL);
    argc--, argv++;
    int nsizes = argc ? argc : (int)(sizeof dflt / sizeof *dflt);
    char **sizes = argc ? argv : dflt;
    return addr ? coll_local(addr, nranks, op, nsizes, sizes) : coll_rank(op, nsizes, sizes);
}

/* --- what a rank pays as the communicator grows ------------------------------ */

static double allreduce_us(mw_comm_t *comm, float *x, size_t count, int iters)
{
    wait_or_die(mw_allreduce(comm, x, x, count, MW_F32, MW_SUM), "allreduce");
    wait_or_die(mw_barrier(comm), "barrier");
    double t0 = now();
    for (int i = 0; i < iters; i++)
        wait_or_die(mw_allreduce(comm, x, x, count, MW_F32, MW_SUM), "allreduce");
    return (now() - t0) / iters * 1e6;
}

struct scale_args {
    bool full;
    pthread_barrier_t *start;   /* shared by the node's ranks */
};

static int scale_rank(const void *arg)
{
    const struct scale_args *a = arg;
    bool full = a->full;
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    pthread_barrier_wait(a->start);   /* every rank calls create at once */
    double t0 = now();
    mw_future_t *cf = mw_comm_create_env(ctx, NULL);
    if (mw_wait(cf))
        die("communicator", mw_future_error(cf), cf);
    mw_comm_t *comm = mw_future_value(cf);
    mw_future_unref(cf);
    int rank = mw_comm_rank(comm), n = mw_comm_size(comm);
    float *x = mw_alloc(ctx, 1 << 20);
    memset(x, 0, 1 << 20);
    if (full)                                   /* every pair connected */
        wait_or_die(mw_alltoall(comm, x, x + n, 1, MW_F32), "alltoall");
    double created = now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss_created = ru.ru_maxrss / 1024.0;
    mw_comm_stats_t st;
    double small = allreduce_us(comm, x, 1024, 50), big = allreduce_us(comm, x, 1 << 18, 10);
    mw_comm_stats(comm, &st);
    getrusage(RUSAGE_SELF, &ru);
    printf("scale %s ranks %d rank %d create_s %.3f connections %u scratch_mib %.1f "
           "rss_mib %.1f allreduce_4k_us %.1f allreduce_1m_us %.1f rss_created_mib %.1f\n",
           full ? "full" : "lazy", n, rank, created, st.connections,
           st.scratch_bytes / 1048576.0, ru.ru_maxrss / 1024.0, small, big, rss_created);
    fflush(stdout);
    close_comm(comm);
    mw_free(ctx, x);
    mw_ctx_free(ctx);
    return 0;
}

/* -n RANKS processes on ADDR, or on each node of a mesh. */
static int scale_bench(int argc, char **argv)
{
    if (argc < 3 || strcmp(argv[0], "-n"))
        die("scale -n RANKS ADDR [full]", -EINVAL, NULL);
    int nranks = atoi(argv[1]);
    struct scale_args a = {.full = argc > 3 && !strcmp(argv[3], "full")};
    if (nranks < 2 || nranks > 256)
        die("-n takes 2..256 ranks", -EINVAL, NULL);
    pthread_barrierattr_t ba;
    a.start = mmap(NULL, sizeof *a.start, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (a.start == MAP_FAILED)
        die("a start barrier for the ranks", -errno, NULL);
    int rc = pthread_barrierattr_init(&ba);      /* these return the error */
    if (!rc && !(rc = pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED)))
        rc = pthread_barrier_init(a.start, &ba, (unsigned)nranks);
    if (rc)
        die("a start barrier for the ranks", -rc, NULL);
    char peers[2048] = "", port[16], list[1024];
    int first = 0;
    snprintf(port, sizeof port, "%d", 20000 + getpid() % 20000);
    if (!strcmp(argv[2], "mesh")) {   /* every node's address, RANKS times */
        char *save = NULL;
        snprintf(list, sizeof list, "%s", getenv("MW_PEER_ADDRS") ? getenv("MW_PEER_ADDRS") : "");
        for (char *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save))
            snprintf(peers + strlen(peers), sizeof peers - strlen(peers), "%s%s slots=%d",
                     peers[0] ? " " : "", a, nranks);
        first = getenv("MW_NODE") ? atoi(getenv("MW_NODE")) * nranks : 0;
        snprintf(port, sizeof port, "23400");
    } else {
        snprintf(peers, sizeof peers, "%s slots=%d", argv[2], nranks);
    }
    return fork_ranks(peers, port, nranks, first, scale_rank, &a);
}

/* --- loop stalls: the longest mw_ctx_progress() call ------------------------- */

/* The longest single mw_ctx_progress() call: its wall time, and the CPU
 * time the calling thread spent in it, in user space and in the kernel
 * (rxe's send engine runs in ibv_post_send; the rest of the wall time the
 * thread was not running). */
struct stall {
    double wall, user, sys;
};

static void thread_cpu(double *user, double *sys)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    *user = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6;
    *sys = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static void stall_max(struct stall *a, struct stall b)
{
    if (b.wall > a->wall)
        *a = b;
}

/* Drive @ctx from an epoll loop of our own, as a program with its own loop
 * would, until @f completes. */
static struct stall drive(mw_ctx_t *ctx, mw_future_t *f, const char *what)
{
    int fd = mw_ctx_fd(ctx), ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
    struct stall worst = {0, 0, 0};
    while (mw_future_state(f) == MW_FUTURE_PENDING) {
        if (epoll_wait(ep, &e, 1, 60000) != 1)
            die(what, -ETIMEDOUT, NULL);
        double t0 = now(), u0, s0, u1, s1;
        thread_cpu(&u0, &s0);
        mw_ctx_progress(ctx);
        thread_cpu(&u1, &s1);
        stall_max(&worst, (struct stall){now() - t0, u1 - u0, s1 - s0});
    }
    close(ep);
    if (mw_future_error(f))
        die(what, mw_future_error(f), f);
    return worst;
}

static void accept_into(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    if (mw_future_resolve(arg, c) < 0)
        mw_conn_abort(c);
}

/* A fresh context's first connection to itself on @addr, after @prealloc
 * bytes from mw_alloc (touched, as an application's would be). */
static struct stall stall_first_connect(const char *addr, size_t prealloc)
{
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    void *big = prealloc ? mw_alloc(ctx, prealloc) : NULL;
    if (prealloc && !big)
        die("mw_alloc", -ENOMEM, NULL);
    if (big)
        memset(big, 1, prealloc);
    mw_listener_t *l;
    mw_future_t *acc = mw_future_new(ctx);
    char a[128];
    snprintf(a, sizeof a, "%s:0", addr);
    int rc = mw_listen(ctx, a, NULL, accept_into, acc, &l);
    if (rc)
        die("listen", rc, NULL);
    snprintf(a, sizeof a, "%s:%d", addr, mw_listener_port(l));
    mw_future_t *f = mw_connect(ctx, a, NULL);
    struct stall worst = drive(ctx, f, "connect");
    stall_max(&worst, drive(ctx, acc, "accept"));
    close_conn(mw_future_value(f));
    close_conn(mw_future_value(acc));
    mw_future_unref(f);
    mw_future_unref(acc);
    mw_listener_free(l);
    mw_free(ctx, big);
    mw_ctx_free(ctx);
    return worst;
}

/* One of two ranks running allreduce on malloc'd (unregistered) buffers;
 * returns its longest progress call. */
static struct stall stall_coll_rank(int rank, const char *peers[2], size_t bytes, int iters)
{
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    mw_future_t *cf = mw_comm_create(ctx, rank, 2, peers, NULL);
    drive(ctx, cf, "communicator");
    mw_comm_t *comm = mw_future_value(cf);
    mw_future_unref(cf);
    float *x = malloc(bytes);
    memset(x, 0, bytes);
    struct stall worst = {0, 0, 0};
    for (int i = 0; i < iters; i++) {
        mw_future_t *f = mw_allreduce(comm, x, x, bytes / sizeof *x, MW_F32, MW_SUM);
        stall_max(&worst, drive(ctx, f, "allreduce"));
        mw_future_unref(f);
    }
    mw_future_t *b = mw_barrier(comm);
    drive(ctx, b, "barrier");
    mw_future_unref(b);
    free(x);
    close_comm(comm);
    mw_ctx_free(ctx);
    return worst;
}

/* Each situation runs in a fresh process, as a program's first use of
 * meshwire would: nothing opened, registered or loaded yet. */
enum stall_case { STALL_ALLREDUCE, STALL_CONNECT, STALL_CONNECT_1GIB };

static struct stall stall_case(enum stall_case k, const char *addr, const char *peers[2], int rank)
{
    switch (k) {
    case STALL_ALLREDUCE: return stall_coll_rank(rank, peers, 64u << 20, 5);
    case STALL_CONNECT: return stall_first_connect(addr, 0);
    default: return stall_first_connect(addr, 1u << 30);
    }
}

/* Run @k in @n fresh processes at once (ranks 0..n-1); the worst of their
 * longest progress calls, or wall -1 if one failed. */
static struct stall stall_fresh(enum stall_case k, const char *addr, const char *peers[2], int n)
{
    int fds[2];
    if (pipe(fds) < 0)
        die("pipe", -errno, NULL);
    for (int r = 0; r < n; r++) {
        if (fork() == 0) {
            close(fds[0]);
            struct stall w = stall_case(k, addr, peers, r);
            _exit(write(fds[1], &w, sizeof w) == sizeof w ? 0 : 1);
        }
    }
    close(fds[1]);
    struct stall worst = {0, 0, 0}, w;
    int got = 0, st, ok = 1;
    while (read(fds[0], &w, sizeof w) == sizeof w) {
        got++;
        stall_max(&worst, w);
    }
    close(fds[0]);
    for (int r = 0; r < n; r++)
        if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            ok = 0;
    return ok && got == n ? worst : (struct stall){-1, 0, 0};
}

static int stalls_bench(const char *addr)
{
    static const struct {
        enum stall_case k;
        int procs;
        const char *key, *what;
    } cases[] = {
        {STALL_ALLREDUCE, 2, "allreduce-64MiB-malloc", "allreduce, 64 MiB malloc'd, 2 ranks (worst of 5)"},
        {STALL_CONNECT, 1, "connect", "first connection of a process"},
        {STALL_CONNECT_1GIB, 1, "connect-1GiB-alloc", "first connection, 1 GiB from mw_alloc"},
    };
    /* the last column is the figure scripts/bench records */
    printf("%-22s %-50s %8s %8s %15s\n", "key", "situation", "user_ms", "sys_ms",
           "max_progress_ms");
    char p0[96], p1[96];
    int port = 20000 + getpid() % 20000, failed = 0;
    snprintf(p0, sizeof p0, "%s:%d", addr, port);
    snprintf(p1, sizeof p1, "%s:%d", addr, port + 1);
    const char *peers[2] = {p0, p1};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct stall w = stall_fresh(cases[i].k, addr, peers, cases[i].procs);
        failed |= w.wall < 0;
        printf("%-22s %-50s %8.1f %8.1f %15.1f\n", cases[i].key, cases[i].what, w.user * 1e3,
               w.sys * 1e3, w.wall * 1e3);
        fflush(stdout);
    }
    return failed;
}

/* --- futures: the API's own cost, no RDMA ---------------------------------- */

#define FWAVE 1000

static void count_done(mw_future_t *f, void *arg)
{
    (void)f;
    (*(long *)arg)++;
}

static void end_turn(mw_future_t *f, void *arg)
{
    (void)f;
    mw_future_resolve(arg, NULL);
}

/* One wave: FWAVE futures through their whole life; the loop then runs
 * their callbacks (in order: the last one's ends the wave). */
static void future_wave(mw_ctx_t *ctx, long *done)
{
    mw_future_t *turn = mw_future_new(ctx);
    for (int j = 0; j < FWAVE; j++) {
        mw_future_t *f = mw_future_new(ctx);
        mw_future_then(f, count_done, done);
        if (j == FWAVE - 1)
            mw_future_then(f, end_turn, turn);
        mw_future_resolve(f, NULL);
        mw_future_unref(f);
    }
    wait_or_die(turn, "wave");
}

static int futures_bench(long n)
{
    mw_ctx_t *ctx;
    int rc = mw_ctx_new(&ctx, NULL, NULL);
    if (rc)
        die("mw_ctx_new", rc, NULL);
    long done = 0, waves = n < FWAVE ? 1 : n / FWAVE;
    double t0 = now(), c0 = cpu();
    for (long w = 0; w < waves; w++)
        future_wave(ctx, &done);
    double t = now() - t0, cs = cpu() - c0;
    if (done != waves * FWAVE)
        die("callbacks", -EPROTO, NULL);
    printf("futures %ld  ns_per_future %.1f  cpu_s %.3f\n", done, t / done * 1e9, cs);
    /* a lookup alone: the state of one pending future, many times */
    mw_future_t *f = mw_future_new(ctx);
    long sum = 0, lookups = waves * FWAVE * 4;
    t0 = now();
    for (long i = 0; i < lookups; i++)
        sum += mw_future_state(f);
    t = now() - t0;
    printf("lookups %ld  ns_per_lookup %.2f  (state sum %ld)\n", lookups, t / lookups * 1e9, sum);
    mw_future_unref(f);
    mw_ctx_free(ctx);
    return 0;
}

/* --- batches against separate writes --------------------------------------- */

/* One way of moving the blocks, ROUNDS times: "MiB/s cpu_s/GiB completions/block". */
static void batch_line(const char *how, double t, double c, uint64_t wcs, size_t blocks,
                       size_t bytes, unsigned rounds)
{
    double gib = (double)blocks * bytes * rounds / (1u << 30);
    printf("%-8s %8zu %8zu %8u %10.1f %12.2f %12.3f\n", how, blocks, bytes, rounds,
           gib * 1024 / t, c / gib, (double)wcs / ((double)blocks * rounds));
}

static uint64_t wc_count(mw_ctx_t *ctx)
{
    mw_ctx_stats_t st;
    mw_ctx_stats(ctx, &st);
    return st.completions;
}

static int batch_bench(const char *addr, size_t blocks, size_t bytes, unsigned rounds)
{
    if (!blocks || blocks > (1u << 20) || !bytes || bytes > (64u << 20) || !rounds)
        die("blocks 1..2^20, bytes 1..64 MiB, rounds >= 1", -EINVAL, NULL);
    mw_ctx_t *ctx;
    mw_listener_t *l;
    mw_conn_t *c = loopback(addr, &ctx, &l);
    size_t slots = 2 * blocks;                  /* the pool: twice the blocks, half used */
    uint8_t *src = mw_alloc(ctx, blocks * bytes), *pool = mw_alloc(ctx, slots * bytes);
    mw_batch_entry_t *e = calloc(blocks, sizeof *e);
    size_t *perm = calloc(slots, sizeof *perm);
    mw_future_t **fs = calloc(blocks, sizeof *fs);
    if (!src || !pool || !e || !perm || !fs)
        die("memory", -ENOMEM, NULL);
    memset(src, 7, blocks * bytes);
    mw_remote_t r;
    if (mw_mem_export(accepted[0], pool, slots * bytes, &r))
        die("export", -EFAULT, NULL);
    srand(1);
    for (size_t i = 0; i < slots; i++)
        perm[i] = i;
    for (size_t i = slots - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < blocks; i++)
        e[i] = (mw_batch_entry_t){.local = src + i * bytes, .len = bytes,
                                  .offset = perm[i] * bytes};
    mw_batch_t *b;
    int rc = mw_batch_new(c, MW_DIR_WRITE, &r, 1, e, blocks, &b, NULL);
    if (rc)
        die("batch", rc, NULL);
    wait_or_die(mw_batch_post(b, NULL), "warm-up batch");
    printf("%-8s %8s %8s %8s %10s %12s %12s\n", "how", "blocks", "bytes", "rounds", "MiB/s",
           "cpu_s/GiB", "wc/block");
    double t0 = now(), c0 = cpu();
    uint64_t w0 = wc_count(ctx);
    for (unsigned k = 0; k < rounds; k++)
        wait_or_die(mw_batch_post(b, NULL), "batch");
    batch_line("batch", now() - t0, cpu() - c0, wc_count(ctx) - w0, blocks, bytes, rounds);
    t0 = now(), c0 = cpu(), w0 = wc_count(ctx);
    for (unsigned k = 0; k < rounds; k++) {
        for (size_t i = 0; i < blocks; i++)
            fs[i] = mw_write(c, e[i].local, bytes, &r, e[i].offset);
        mw_future_t *all = mw_future_all(ctx, fs, blocks);
        wait_or_die(all, "writes");
        for (size_t i = 0; i < blocks; i++)
            mw_future_unref(fs[i]);
    }
    batch_line("writes", now() - t0, cpu() - c0, wc_count(ctx) - w0, blocks, bytes, rounds);
    mw_batch_free(b);
    free(e);
    free(perm);
    free(fs);
    mw_free(ctx, src);
    mw_free(ctx, pool);
    close_conn(c);
    mw_listener_free(l);
    mw_ctx_free(ctx);
    return 0;
}

/* --- rails ------------------------------------------------------------------ */

static uint8_t *rails_pool;
static size_t rails_bytes;
static volatile sig_atomic_t terminated;

static void on_term(int sig)
{
    (void)sig;
    terminated = 1;
}

static void free_when_sent(mw_future_t *f, void *arg)
{
    (void)f;
    free(arg);
}

static void on_rails_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    (void)arg;
    mw_remote_t *r = malloc(sizeof *r);      /* a send reads its buffer later */
    if (!r || mw_mem_export(c, rails_pool, rails_bytes, r) != 0) {
        free(r);
        mw_conn_abort(c);
        return;
    }
    mw_future_t *f = mw_send(c, r, sizeof *r);
    mw_future_then(f, free_when_sent, r);
    mw_future_unref(f);
}

static int rails_serve(int port, size_t bytes)
{
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    rails_bytes = bytes;
    if (!(rails_pool = mw_alloc(ctx, bytes)))
        die("memory", -ENOMEM, NULL);
    char a[32];
    snprintf(a, sizeof a, "*:%d", port);
    mw_listener_t *l;
    int rc = mw_listen(ctx, a, NULL, on_rails_accept, NULL, &l);
    if (rc)
        die("listen", rc, NULL);
    printf("serving %zu bytes on port %d\n", bytes, port);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    while (!terminated)
        run_for(ctx, 100);
    mw_listener_free(l);
    mw_free(ctx, rails_pool);
    mw_ctx_free(ctx);
    return 0;
}

/* A connection to @addr:@port (retried while the server starts) and the
 * pool's descriptor it sends. */
static mw_conn_t *rails_connect(mw_ctx_t *ctx, const char *addr, int port, mw_remote_t *r)
{
    char a[96];
    snprintf(a, sizeof a, "%s:%d", addr, port);
    for (int tries = 0; tries < 60; tries++) {
        mw_future_t *f = mw_connect(ctx, a, NULL);
        if (mw_wait(f) == 0) {
            mw_conn_t *c = mw_future_value(f);
            mw_future_unref(f);
            recv_remote(c, r);
            return c;
        }
        mw_future_unref(f);
        run_for(ctx, 500);
    }
    die("connect", -ETIMEDOUT, NULL);
    return NULL;
}

static int rails_bench(char *addrs, int port, size_t bytes, unsigned rounds)
{
    mw_ctx_t *ctx;
    mw_ctx_new(&ctx, NULL, NULL);
    uint8_t *src = mw_alloc(ctx, bytes);
    if (!src)
        die("memory", -ENOMEM, NULL);
    memset(src, 7, bytes);
    mw_conn_t *c[MW_RAILS_MAX];
    mw_remote_t r[MW_RAILS_MAX];
    int n = 0;
    for (char *save, *a = strtok_r(addrs, ",", &save); a && n < MW_RAILS_MAX;
         a = strtok_r(NULL, ",", &save), n++)
        c[n] = rails_connect(ctx, a, port, &r[n]);
    printf("%-6s %12s %8s %10s %12s\n", "rails", "bytes", "rounds", "MiB/s", "cpu_s/GiB");
    for (int use = 1; use <= n; use += n - 1 ? n - 1 : 1) {
        mw_rails_t *g;
        mw_rails_new(ctx, 0, &g);
        for (int i = 0; i < use; i++)
            mw_rails_add(g, c[i], &r[i]);
        wait_or_die(mw_rails_write(g, src, bytes, 0), "warm-up");
        double t0 = now(), c0 = cpu();
        for (unsigned k = 0; k < rounds; k++)
            wait_or_die(mw_rails_write(g, src, bytes, 0), "rails write");
        double t = now() - t0, gib = (double)bytes * rounds / (1u << 30);
        printf("%-6d %12zu %8u %10.1f %12.2f\n", use, bytes, rounds, gib * 1024 / t,
               (cpu() - c0) / gib);
        mw_rails_free(g);
        if (n == 1)
            break;
    }
    for (int i = 0; i < n; i++)
        close_conn(c[i]);
    mw_free(ctx, src);
    mw_ctx_free(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 3 && !strcmp(argv[1], "write-bw")) {
        char *dflt[] = {"4096", "65536", "1048576", "8388608"};
        return argc > 3 ? write_bw(argv[2], argc - 3, argv + 3) : write_bw(argv[2], 4, dflt);
    }
    if ((argc == 3 || argc == 6) && !strcmp(argv[1], "batch"))
        return argc == 3 ? batch_bench(argv[2], 1000, 16384, 20)
                         : batch_bench(argv[2], strtoul(argv[3], NULL, 0),
                                       strtoul(argv[4], NULL, 0), (unsigned)atoi(argv[5]));
    if (argc == 4 && !strcmp(argv[1], "rails-serve"))
        return rails_serve(atoi(argv[2]), strtoul(argv[3], NULL, 0));
    if (argc == 6 && !strcmp(argv[1], "rails"))
        return rails_bench(argv[2], atoi(argv[3]), strtoul(argv[4], NULL, 0),
                           (unsigned)atoi(argv[5]));
    if (argc == 4 && !strcmp(argv[1], "connect"))
        return connect_bench(argv[2], atoi(argv[3]), 0);
    if (argc == 5 && !strcmp(argv[1], "idle"))
        return connect_bench(argv[2], atoi(argv[3]), atoi(argv[4]));
    if (argc >= 5 && !strcmp(argv[1], "scale"))
        return scale_bench(argc - 2, argv + 2);
    if (argc >= 3 && !strcmp(argv[1], "coll"))
        return coll_bench(argc - 2, argv + 2);
    if (argc >= 3 && !strcmp(argv[1], "lat"))
        return lat_bench(argv[2], argc - 3, argv + 3);
    if (argc == 3 && !strcmp(argv[1], "stalls"))
        return stalls_bench(argv[2]);
    if (argc >= 2 && argc <= 3 && !strcmp(argv[1], "futures"))
        return futures_bench(argc == 3 ? atol(argv[2]) : 2000000);
    fprintf(stderr, "usage: mwbench write-bw ADDR [SIZE...] | connect ADDR N | idle ADDR N SECONDS\n"
                    "       mwbench lat ADDR [SIZE...] | batch ADDR [BLOCKS BYTES ROUNDS]\n"
                    "       mwbench coll [-n RANKS ADDR] OP [BYTES...]\n"
                    "       mwbench futures [N] | stalls ADDR\n"
                    "       mwbench rails-serve PORT BYTES | rails ADDRS PORT BYTES ROUNDS\n");
    return 2;
}
