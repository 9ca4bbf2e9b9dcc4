/* The same-host path keeps the device's promises, tried the way users and
 * strangers break it (issue 32): a peer outside its loop for 15 s while the
 * other aborts (the memory of the failed operations is never touched
 * after, and the failure says when it could not be sure); a rank outside
 * its loop for 5 x keepalive_ms in an idle and in a busy communicator (not
 * declared dead), and a killed one (noticed within the keepalive bound);
 * 64 silent connections of another user at the rendezvous; peers that
 * refuse cross-memory attach (non-dumpable, or without the capability to
 * reach one); an export whose memory was unmapped and mapped again; a
 * context freed while its peer sleeps.
 *
 * Every test runs on the path the suite runs on (the same-host one, set up
 * over rdma_cm, or over TCP under MW_TRANSPORT=auto on a host without RDMA;
 * RDMA under MW_TRANSPORT=rdma; TCP under =tcp) and asserts the promise on
 * each; where a path cannot be reached by the scenario (no rendezvous over
 * RDMA), it says so. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "meshwire.h"
#include "rxe_util.h"

extern char **environ;

static const char *addrs[2];
static char self_path[4096];

#define REGION (16u << 20)        /* the sleeper's export: read half, write half */
#define HALF (REGION / 2)

static bool over_rdma(void)
{
    return rxe_path() == MW_TRANSPORT_RDMA;
}

/* The path a connection whose same-host channel was refused goes on: the
 * one it was set up over. */
static int setup_path(void)
{
    return rxe_over_tcp() ? MW_TRANSPORT_TCP : MW_TRANSPORT_RDMA;
}

static int path_of(mw_conn_t *c)
{
    mw_conn_stats_t st;
    assert_int_equal(mw_conn_stats(c, &st), 0);
    return st.transport;
}

static pid_t spawn(char *const argv[])
{
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, self_path, NULL, NULL, argv, environ), 0);
    return pid;
}

/* Run @ctx's loop until @pid exits (at most @ms): its exit status. */
static int loop_until_exit(mw_ctx_t *ctx, pid_t pid, unsigned ms)
{
    int st;
    for (unsigned t = 0; t < ms; t += 10) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        loop_for(ctx, 10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    fail_msg("process %d did not end within %u ms", (int)pid, ms);
    return -1;
}

/* One byte from the child's pipe within @ms, running @ctx's loop (NULL:
 * blocking); 0 on timeout. */
static char from_child(int fd, mw_ctx_t *ctx, unsigned ms)
{
    for (unsigned t = 0; t <= ms; t += 10) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, ctx ? 0 : 10) == 1) {
            char b = 0;
            return read(fd, &b, 1) == 1 ? b : 0;
        }
        if (ctx)
            loop_for(ctx, 10);
    }
    return 0;
}

static bool all_bytes(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* --- a peer outside its loop while the other aborts ------------------------ */

/* A child's server: a context of its own, listening on addrs[1]:@port (it
 * writes @say on @fd once it listens, if @say), and the first connection
 * accepted within 30 s, or NULL. */
static mw_conn_t *accept_one(int port, int fd, char say, mw_ctx_t **ctx, mw_listener_t **l)
{
    mw_conn_t *c = NULL;
    char a[64];
    snprintf(a, sizeof a, "%s:%d", addrs[1], port);
    if (mw_ctx_new(ctx, NULL, NULL) < 0)
        return NULL;
    if (mw_listen(*ctx, a, NULL, rxe_keep_first, &c, l) < 0 ||
        (say && write(fd, &say, 1) != 1))
        return NULL;
    for (int i = 0; i < 3000 && !c; i++)
        loop_for(*ctx, 10);
    return c;
}

/* The sleeper (a process of its own): listen, accept one connection, export
 * REGION bytes of 0xbb and send the descriptor; say "asleep" on @fd and
 * sleep @ms outside the loop; then run the loop for 1.5 s (a same-host
 * peer executes what it still has now) and check that no byte of its
 * region came from memory the other side reused after its write failed
 * (0xcc).  Exit 0, or 1 when one did. */
static int sleeper(int port, unsigned ms, int fd)
{
    mw_ctx_t *ctx;
    mw_listener_t *l;
    mw_conn_t *c = accept_one(port, fd, 0, &ctx, &l);
    uint8_t *mem = c ? mw_alloc(ctx, REGION) : NULL;
    mw_remote_t r;
    if (!mem || mw_mem_export(c, mem, REGION, &r) < 0)
        return 2;
    memset(mem, 0xbb, REGION);
    mw_future_t *f = mw_send(c, &r, sizeof r);
    if (mw_wait(f) < 0)
        return 2;
    mw_future_unref(f);
    if (write(fd, "s", 1) != 1)
        return 2;
    usleep(ms * 1000u);           /* outside the loop: a model load */
    loop_for(ctx, 1500);
    bool touched = memchr(mem, 0xcc, REGION) != NULL;
    printf("sleeper: back after %u ms; its region %s\n", ms,
           touched ? "HAS BYTES FROM REUSED MEMORY" : "has none of the reused memory");
    mw_conn_abort(c);
    mw_listener_free(l);
    mw_free(ctx, mem);
    mw_ctx_free(ctx);
    return touched;
}

static int next_port(void)
{
    static int n;
    return 21000 + (getpid() * 13 + n++ * 7) % 9000;
}

/* Start a sleeper (sleeping @sleep_ms once asleep) and connect to it with
 * @o: the connection, its export's descriptor in *@r; *@pid the sleeper,
 * *@said the pipe on which it says "asleep". */
static mw_conn_t *connect_to_sleeper(mw_ctx_t *ctx, unsigned sleep_ms, const mw_conn_opts_t *o,
                                     mw_remote_t *r, pid_t *pid, int *said)
{
    int port = next_port(), pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    char ps[16], ms[16], fs[16];
    snprintf(ps, sizeof ps, "%d", port);
    snprintf(ms, sizeof ms, "%u", sleep_ms);
    snprintf(fs, sizeof fs, "%d", pipefd[1]);
    *pid = spawn((char *[]){self_path, "sleeper", ps, ms, fs, NULL});
    close(pipefd[1]);
    *said = pipefd[0];
    mw_future_t *cf = NULL;
    for (int i = 0; i < 100; i++) {          /* while the sleeper starts */
        cf = rxe_connect_future(ctx, addrs[1], port, o);
        if (mw_wait(cf) == 0)
            break;
        mw_future_unref(cf);
        cf = NULL;
        loop_for(ctx, 50);
    }
    assert_non_null(cf);
    mw_conn_t *c = mw_future_value(cf);
    mw_future_unref(cf);
    mw_msg_t *m = rxe_recv(c, 5000);
    assert_int_equal(m->len, sizeof *r);
    memcpy(r, m->data, sizeof *r);
    mw_msg_free(m);
    return c;
}

/* A reads one half of the sleeper's region and writes the other from its
 * own buffers, aborts after 1 s, and reuses both buffers the moment the
 * futures fail.  Neither buffer may change after, nor may the sleeper's
 * region take the reused bytes.  On the same-host path the failure waits
 * for the sleeper: a plain abort when it runs its loop within the bound
 * (timeout_ms), -EBUSY when not; over RDMA the device finished both before
 * the abort. */
static void abort_while_the_peer_sleeps(unsigned sleep_ms, unsigned bound_ms)
{
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.timeout_ms = bound_ms;
    mw_remote_t r;
    pid_t pid;
    int said;
    mw_conn_t *c = connect_to_sleeper(ctx, sleep_ms, &o, &r, &pid, &said);
    assert_int_equal(from_child(said, ctx, 5000), 's');   /* it sleeps now */
    double asleep = now_s();
    uint8_t *rbuf = mw_alloc(ctx, HALF), *wbuf = mw_alloc(ctx, HALF);
    memset(rbuf, 0xaa, HALF);
    memset(wbuf, 0xaa, HALF);
    mw_future_t *rf = mw_read(c, rbuf, HALF, &r, 0);
    mw_future_t *wf = mw_write(c, wbuf, HALF, &r, HALF);
    loop_for(ctx, 1000);
    int path = path_of(c);
    bool local = path == MW_TRANSPORT_LOCAL;
    double t0 = now_s(), wakes = asleep + sleep_ms / 1000.0;
    assert_int_equal(mw_conn_abort(c), 0);
    int rr = mw_wait(rf), wr = mw_wait(wf);
    double took = now_s() - t0, failed = now_s();
    char error_text[512];
    snprintf(error_text, sizeof error_text, "%s", rr ? mw_future_message(rf) : "done");
    printf("peer outside its loop for %u ms, abort at 1 s, bound %u ms, %s: read %s, write %s, "
           "%.2f s after the abort\n  (%s)\n", sleep_ms, bound_ms,
           rxe_path_name(path), mw_strerror(rr), mw_strerror(wr), took,
           error_text);
    memset(rbuf, 0xcc, HALF);                 /* reused at once */
    memset(wbuf, 0xcc, HALF);
    mw_future_unref(rf);
    mw_future_unref(wf);
    /* first what matters: the sleeper, back in its loop, took none of the
     * reused bytes into its region (its exit status) nor wrote ours */
    assert_int_equal(loop_until_exit(ctx, pid, sleep_ms + 20000), 0);
    assert_true(all_bytes(rbuf, HALF, 0xcc));
    if (local) {
        /* the read was posted; the write queued behind it (never lent:
         * it fails at once) or posted too, with as many reads in flight
         * as the path takes (lent: it fails as the read does) */
        bool in_time = wakes < t0 + bound_ms / 1000.0;
        assert_int_equal(rr, in_time ? -ECONNABORTED : -EBUSY);
        assert_true(wr == -ECONNABORTED || wr == rr);
        if (in_time)                          /* it waited for the sleeper's word */
            assert_true(failed > wakes - 0.05);
        else
            assert_true(took > bound_ms / 1000.0 - 0.1 && failed < wakes);
        if (!in_time)
            assert_non_null(strstr(error_text, "it may still finish"));
    } else {                                  /* the device's: done, or flushed */
        assert_true(rr == 0 || rr == -ECONNABORTED);
        assert_true(wr == 0 || wr == -ECONNABORTED);
    }
    close(said);
    mw_free(ctx, rbuf);
    mw_free(ctx, wbuf);
    mw_ctx_free(ctx);
}

static void a_peer_outside_its_loop_for_15_s_while_the_other_aborts(void **state)
{
    (void)state;
    abort_while_the_peer_sleeps(15000, 5000);
}

static void a_peer_back_in_its_loop_within_the_bound(void **state)
{
    (void)state;
    abort_while_the_peer_sleeps(2500, 5000);
}

/* mw_ctx_free() with an operation posted to a sleeping peer: it waits for
 * the peer's word up to the bound (the peer sleeps longer: the operation
 * fails -EBUSY, its callback run), and the memory is never touched after. */
static void on_failed(mw_future_t *f, void *arg)
{
    *(int *)arg = mw_future_error(f);
}

static void a_context_freed_while_its_peer_sleeps(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.timeout_ms = 1000;
    mw_remote_t r;
    pid_t pid;
    int said;
    mw_conn_t *c = connect_to_sleeper(ctx, 3000, &o, &r, &pid, &said);
    assert_int_equal(from_child(said, ctx, 5000), 's');
    uint8_t *buf = malloc(HALF);              /* the caller's memory, registered */
    memset(buf, 0xaa, HALF);
    mw_mr_t *mr;
    assert_int_equal(mw_reg(ctx, buf, HALF, &mr), 0);
    int path = path_of(c);
    bool local = path == MW_TRANSPORT_LOCAL;
    int err = 1;
    mw_future_t *rf = mw_read(c, buf, HALF, &r, 0);
    assert_int_equal(mw_future_then(rf, on_failed, &err), 0);
    mw_future_unref(rf);
    double t0 = now_s();
    mw_ctx_free(ctx);
    double took = now_s() - t0;
    printf("context freed with a read to a sleeping peer (%s): %.2f s, the read %s\n",
           rxe_path_name(path), took, err ? mw_strerror(err) : "done");
    if (local) {
        assert_int_equal(err, -EBUSY);
        assert_true(took > 0.7 && took < 2.5);   /* the bound, not the sleep */
    } else {                                  /* the device's: done, or flushed */
        assert_true(err == 0 || err == -ECANCELED);
    }
    memset(buf, 0xcc, HALF);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_true(all_bytes(buf, HALF, 0xcc));
    close(said);
    free(buf);
}

/* --- ranks outside their loop ------------------------------------------------ */

#define KEEPALIVE_MS 200

/* Rank @rank of 2 (a process each), keepalive KEEPALIVE_MS: (1) idle, rank 1
 * sleeps 5 x keepalive_ms outside its loop, then both barrier; (2) busy,
 * rank 0 in an allreduce while rank 1 sleeps as long before joining it;
 * (3) rank 0 in a barrier while rank 1 is killed (by rank 0's parent: rank
 * 1 waits for it, in its loop).  Rank 0 reports how long (3) took to fail
 * in @fail_ms.  0, or what broke. */
static int two_ranks(int rank, int port, double *fail_ms)
{
    mw_ctx_t *ctx;
    if (mw_ctx_new(&ctx, NULL, NULL) < 0)
        return 2;
    char p0[64], p1[64];
    snprintf(p0, sizeof p0, "%s:%d", addrs[1], port);
    snprintf(p1, sizeof p1, "%s:%d", addrs[1], port + 1);
    const char *peers[] = {p0, p1};
    mw_comm_opts_t o;
    mw_comm_opts_init(&o);
    o.conn.keepalive_ms = KEEPALIVE_MS;
    mw_future_t *cf = mw_comm_create(ctx, rank, 2, peers, &o);
    if (mw_wait(cf) < 0) {
        fprintf(stderr, "rank %d: %s\n", rank, mw_future_message(cf));
        return 3;
    }
    mw_comm_t *comm = mw_future_value(cf);
    mw_future_unref(cf);
    unsigned nap = 5 * KEEPALIVE_MS * 1000u;
    if (rank == 1)
        usleep(nap);              /* (1) idle */
    mw_future_t *b = mw_barrier(comm);
    int rc = mw_wait(b);
    if (rc < 0)
        fprintf(stderr, "rank %d, idle: %s\n", rank, mw_future_message(b));
    mw_future_unref(b);
    if (rc < 0)
        return 4;
    enum { N = 1 << 18 };
    float *x = mw_alloc(ctx, N * sizeof *x);
    for (int i = 0; i < N; i++)
        x[i] = (float)(rank + 1);
    if (rank == 1)
        usleep(nap);              /* (2) rank 0 waits inside the allreduce */
    mw_future_t *ar = mw_allreduce(comm, x, x, N, MW_F32, MW_SUM);
    rc = mw_wait(ar);
    if (rc < 0)
        fprintf(stderr, "rank %d, busy: %s\n", rank, mw_future_message(ar));
    mw_future_unref(ar);
    if (rc < 0 || x[0] != 3.0f || x[N - 1] != 3.0f)
        return 5;
    b = mw_barrier(comm);         /* both are through (2) */
    rc = mw_wait(b);
    mw_future_unref(b);
    if (rc < 0)
        return 6;
    if (rank == 1) {
        printf("rank 1: through both naps; waiting to be killed\n");
        loop_for(ctx, 30000);
        return 7;
    }
    printf("rank 0: through both naps; the parent kills rank 1 now\n");
    fflush(stdout);
    mw_future_t *last = mw_barrier(comm);
    kill(getppid(), SIGUSR1);     /* "kill rank 1" */
    double t0 = now_s();
    mw_future_set_timeout(last, 30000);   /* a backstop only */
    rc = mw_wait(last);
    *fail_ms = (now_s() - t0) * 1e3;
    printf("rank 0: the barrier with a killed rank 1 failed after %.0f ms: %s\n", *fail_ms,
           mw_future_message(last));
    mw_future_unref(last);
    mw_free(ctx, x);
    mw_comm_free(comm);
    mw_ctx_free(ctx);
    return rc == 0 || rc == -ETIMEDOUT ? 9 : 0;
}

static volatile sig_atomic_t kill_now;
static void on_usr1(int sig)
{
    (void)sig;
    kill_now = 1;
}

static void ranks_outside_their_loop_for_5_keepalives(void **state)
{
    (void)state;
    int port = next_port();
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    signal(SIGUSR1, on_usr1);
    kill_now = 0;
    pid_t r1 = spawn((char *[]){self_path, "rank", "1", ps, "-1", NULL});
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    char fs[16];
    snprintf(fs, sizeof fs, "%d", pipefd[1]);
    /* rank 0 a process of its own too (no fork: a verbs process's child
     * may not use the parent's devices), so that this one can kill rank 1 */
    pid_t r0 = spawn((char *[]){self_path, "rank", "0", ps, fs, NULL});
    close(pipefd[1]);
    int st0 = -1;
    for (int i = 0; i < 6000 && !kill_now; i++) {
        if (waitpid(r0, &st0, WNOHANG) == r0)
            break;
        usleep(10000);
    }
    if (kill_now)
        kill(r1, SIGKILL);
    int st1;
    waitpid(r1, &st1, 0);
    if (st0 == -1)
        waitpid(r0, &st0, 0);
    double ms = -1;
    assert_int_equal(read(pipefd[0], &ms, sizeof ms), sizeof ms);
    close(pipefd[0]);
    signal(SIGUSR1, SIG_DFL);
    printf("rank 1 asleep for %d ms (5 x keepalive_ms) idle and busy: survived; killed: noticed "
           "after %.0f ms (keepalive bound %d ms)\n", 5 * KEEPALIVE_MS, ms, 2 * KEEPALIVE_MS);
    assert_true(kill_now);
    assert_true(WIFSIGNALED(st1) && WTERMSIG(st1) == SIGKILL);
    assert_true(WIFEXITED(st0));
    assert_int_equal(WEXITSTATUS(st0), 0);
    assert_true(ms >= 0 && ms < 2 * KEEPALIVE_MS + 1000);   /* (slack for a loaded VM) */
}

/* --- strangers at the rendezvous --------------------------------------------- */

/* The listening rendezvous sockets of this host ("@meshwire-<nonce>" in
 * /proc/net/unix), up to @max: how many. */
static int rendezvous_sockets(struct sockaddr_un *a, socklen_t *len, int max)
{
    FILE *f = fopen("/proc/net/unix", "r");
    char line[512];
    int n = 0;
    while (f && n < max && fgets(line, sizeof line, f)) {
        char *at = strstr(line, "@meshwire-"), name[108];
        if (!at || !strstr(line, " 00010000 0001 01 ") || sscanf(at + 1, "%100s", name) != 1)
            continue;
        a[n] = (struct sockaddr_un){.sun_family = AF_UNIX};
        memcpy(a[n].sun_path + 1, name, strlen(name));
        len[n++] = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    }
    if (f)
        fclose(f);
    return n;
}

/* A process of another user (nobody): it finds the rendezvous sockets
 * listening now and holds 64 silent connections to each, then reports on
 * @fd how many it made and how many the far end closed within 1 s. */
static int stranger(int fd)
{
    if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
        return 77;
    struct sockaddr_un a[8];
    socklen_t len[8];
    int n = 0;
    for (int i = 0; i < 300 && !(n = rendezvous_sockets(a, len, 8)); i++)
        usleep(10000);
    int fds[64 * 8], made = 0, closed = 0;
    for (int k = 0; k < n; k++)
        for (int i = 0, tries = 0; i < 64 && tries < 2000; tries++) {
            int s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
            if (connect(s, (struct sockaddr *)&a[k], len[k]) == 0) {
                fds[made++] = s;
                i++;
            } else {
                close(s);
                usleep(1000);         /* its backlog is full: it drains as it closes */
            }
        }
    if (write(fd, "h", 1) != 1)
        return 2;
    usleep(1000000);
    for (int i = 0; i < made; i++) {
        char b;
        closed += recv(fds[i], &b, 1, MSG_DONTWAIT) == 0;
        close(fds[i]);
    }
    int out[2] = {made, closed};
    return write(fd, out, sizeof out) == sizeof out ? 0 : 2;
}

/* A same-host server that accepts one connection, makes a round trip and
 * closes; it says "listening" on @fd first. */
static int one_shot_server(int port, int fd, bool nodump)
{
    if (nodump && prctl(PR_SET_DUMPABLE, 0) < 0)
        return 2;
    mw_ctx_t *ctx;
    mw_listener_t *l;
    mw_conn_t *c = accept_one(port, fd, 'l', &ctx, &l);
    if (!c)
        return 3;
    mw_msg_t *m = rxe_recv(c, 10000);
    mw_future_t *f = mw_send(c, m->data, m->len);
    int rc = mw_wait(f);
    mw_future_unref(f);
    mw_msg_free(m);
    mw_conn_stats_t st;
    mw_conn_stats(c, &st);
    f = mw_conn_close(c);
    mw_wait(f);
    mw_future_unref(f);
    mw_listener_free(l);
    mw_ctx_free(ctx);
    return rc < 0 ? 4 : st.transport == MW_TRANSPORT_LOCAL ? 0 : 10;
}

/* Connect to @port (retrying while the server starts) and make a round
 * trip: the connection's path, or -1. */
static int round_trip_to(mw_ctx_t *ctx, int port)
{
    mw_conn_t *c = rxe_connect(ctx, addrs[1], port, NULL);
    int path = path_of(c);
    mw_future_t *f = mw_send(c, "ping", 5);
    if (mw_wait(f) < 0)
        path = -1;
    mw_future_unref(f);
    mw_msg_t *m = rxe_recv(c, 10000);
    if (m->len != 5 || memcmp(m->data, "ping", 5))
        path = -1;
    mw_msg_free(m);
    rxe_close_conn(c);
    return path;
}

static void sixty_four_silent_connections_of_another_user(void **state)
{
    if (rxe_path() == MW_TRANSPORT_TCP) {
        printf("SKIP over TCP: the same-host rendezvous's strangers\n");
        skip();
    }
    (void)state;
    if (over_rdma()) {
        printf("MW_TRANSPORT=rdma: no rendezvous to attack\n");
        return;
    }
    if (geteuid() != 0) {
        printf("not root: no other user to be (skipped)\n");
        return;
    }
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    int port = next_port(), sp[2], tp[2];
    assert_int_equal(pipe(sp), 0);
    assert_int_equal(pipe(tp), 0);
    char ps[16], fs[16], ts[16];
    snprintf(ps, sizeof ps, "%d", port);
    snprintf(fs, sizeof fs, "%d", sp[1]);
    snprintf(ts, sizeof ts, "%d", tp[1]);
    pid_t server = spawn((char *[]){self_path, "server", ps, fs, "dump", NULL});
    assert_int_equal(from_child(sp[0], NULL, 10000), 'l');
    kill(server, SIGSTOP);        /* our offer waits: its socket stays listening */
    pid_t strange = spawn((char *[]){self_path, "stranger", ts, NULL});
    mw_future_t *cf = rxe_connect_future(ctx, addrs[1], port, NULL);
    assert_int_equal(from_child(tp[0], ctx, 8000), 'h');     /* it holds its connections */
    loop_for(ctx, 200);
    kill(server, SIGCONT);
    if (mw_wait(cf) < 0)
        fail_msg("connect past the strangers: %s", mw_future_message(cf));
    mw_conn_t *c = mw_future_value(cf);
    mw_future_unref(cf);
    int path = path_of(c);
    mw_future_t *f = mw_send(c, "ping", 5);
    assert_int_equal(mw_wait(f), 0);
    mw_future_unref(f);
    mw_msg_free(rxe_recv(c, 10000));
    rxe_close_conn(c);
    int out[2] = {0, 0};
    for (int i = 0; i < 300; i++) {
        struct pollfd p = {.fd = tp[0], .events = POLLIN};
        if (poll(&p, 1, 10) == 1)
            break;
        loop_for(ctx, 10);
    }
    assert_int_equal(read(tp[0], out, sizeof out), sizeof out);
    int tst;
    waitpid(strange, &tst, 0);
    assert_int_equal(loop_until_exit(ctx, server, 10000), 0);   /* its end: same-host too */
    printf("another user held %d silent connections at the rendezvous; %d closed at once by "
           "meshwire; the same-user connection made meanwhile: %s\n", out[0], out[1],
           rxe_path_name(path));
    assert_true(WIFEXITED(tst) && WEXITSTATUS(tst) == 0);
    assert_true(out[0] >= 64);                /* the attack happened */
    assert_int_equal(out[1], out[0]);         /* and held nothing */
    assert_int_equal(path, MW_TRANSPORT_LOCAL);
    for (int i = 0; i < 2; i++) {
        close(sp[i]);
        close(tp[i]);
    }
    mw_ctx_free(ctx);
}

/* --- peers that refuse cross-memory attach ------------------------------------- */

/* Drop CAP_SYS_PTRACE: as root, this process then reaches a non-dumpable
 * one no more (the kernel's ptrace rule for process_vm_readv). */
static int drop_ptrace(void)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) < 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        d[i].effective &= ~(i == CAP_SYS_PTRACE / 32 ? 1u << (CAP_SYS_PTRACE % 32) : 0);
        d[i].permitted &= ~(i == CAP_SYS_PTRACE / 32 ? 1u << (CAP_SYS_PTRACE % 32) : 0);
    }
    return (int)syscall(SYS_capset, &h, d);
}

/* A client in a process of its own: non-dumpable (@nodump), or without
 * CAP_SYS_PTRACE; round trip to @port: exit 0 over the path it was set up
 * over (RDMA or TCP), 10 over the same-host path, else what failed. */
static int one_shot_client(int port, bool nodump)
{
    if ((nodump ? prctl(PR_SET_DUMPABLE, 0) : drop_ptrace()) < 0)
        return 2;
    mw_ctx_t *ctx;
    if (mw_ctx_new(&ctx, NULL, NULL) < 0)
        return 2;
    int path = round_trip_to(ctx, port);
    mw_ctx_free(ctx);
    return path == setup_path() ? 0 : path == MW_TRANSPORT_LOCAL ? 10 : 3;
}

/* Non-dumpable processes (setcap cap_ipc_lock+ep makes one, the usual fix
 * for memlock limits) refuse cross-memory copies to peers without
 * CAP_SYS_PTRACE.  Both ways round: the rendezvous's probe finds out, the
 * connection goes on over what it was set up over (RDMA, TCP) and works. */
static void peers_that_refuse_cross_memory_attach(void **state)
{
    if (rxe_path() == MW_TRANSPORT_TCP) {
        printf("SKIP over TCP: cross-memory attach is the same-host path's\n");
        skip();
    }
    (void)state;
    if (geteuid() != 0) {
        printf("not root: cannot drop CAP_SYS_PTRACE to test it (skipped)\n");
        return;
    }
    for (int way = 0; way < 2; way++) {
        int port = next_port(), sp[2];
        assert_int_equal(pipe(sp), 0);
        char ps[16], fs[16];
        snprintf(ps, sizeof ps, "%d", port);
        snprintf(fs, sizeof fs, "%d", sp[1]);
        /* way 0: the server non-dumpable, the client without the capability;
         * way 1: the server without it (the parent's children drop it), the
         * client non-dumpable */
        pid_t server = spawn((char *[]){self_path, "server", ps, fs, way ? "nocap" : "nodump",
                                        NULL});
        assert_int_equal(from_child(sp[0], NULL, 10000), 'l');
        pid_t client = spawn((char *[]){self_path, "client", ps, way ? "nodump" : "nocap", NULL});
        int cst, sst;
        waitpid(client, &cst, 0);
        waitpid(server, &sst, 0);
        printf("%s server, %s client: client exit %d (0: over %s), server exit %d (10: "
               "not the same-host path)\n", way ? "a capability-less" : "a non-dumpable",
               way ? "non-dumpable" : "capability-less", WEXITSTATUS(cst),
               rxe_path_name(setup_path()), WEXITSTATUS(sst));
        assert_true(WIFEXITED(cst) && WEXITSTATUS(cst) == 0);
        assert_true(WIFEXITED(sst) && WEXITSTATUS(sst) == 10);
        close(sp[0]);
        close(sp[1]);
    }
}

/* --- an export over memory unmapped and mapped again --------------------------- */

/* The exporter munmaps its region and maps new memory at the same address,
 * keeping its registration: a write meant for the old pages reaches
 * nothing new (-EACCES). */
static void a_remapped_export_takes_no_write(void **state)
{
    (void)state;
    struct rxe_pair p;
    rxe_pair_open(&p, addrs[1], NULL);
    size_t len = 1 << 20;
    uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(mem != MAP_FAILED);
    mw_mr_t *mr;
    assert_int_equal(mw_reg(p.ctx, mem, len, &mr), 0);
    mw_remote_t r;
    assert_int_equal(mw_mem_export(p.b, mem, len, &r), 0);
    uint8_t *src = mw_alloc(p.ctx, 65536);
    memset(src, 0xee, 65536);
    mw_future_t *f = mw_write(p.a, src, 65536, &r, 0);
    assert_int_equal(mw_wait(f), 0);          /* the export works */
    mw_future_unref(f);
    assert_int_equal(mem[65535], 0xee);
    assert_true(mmap(mem, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                     -1, 0) == mem);          /* new pages, same address */
    int path = path_of(p.a);
    bool checked = path != MW_TRANSPORT_RDMA;   /* the target's loop checks each access */
    f = mw_write(p.a, src, 65536, &r, 4096);
    int rc = mw_wait(f);
    mw_future_unref(f);
    printf("a write to an export whose memory was mapped anew (%s): %s; the new memory %s\n",
           rxe_path_name(path), mw_strerror(rc),
           all_bytes(mem, len, 0) ? "untouched" : "WRITTEN");
    assert_true(all_bytes(mem, len, 0));
    /* refused on the same-host path and over TCP; over RDMA too where
     * userfaultfd told the registration cache (the export is withdrawn),
     * else the old pages, pinned, take it unseen */
    assert_true(rc == -EACCES || (!checked && rc == 0));
    mw_dereg(p.ctx, mr);
    munmap(mem, len);
    mw_free(p.ctx, src);
    mw_conn_abort(p.a);           /* (broken by the refusal, on the same-host path) */
    mw_conn_abort(p.b);
    mw_listener_free(p.s.l);
    mw_ctx_free(p.ctx);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rxe_require(2, addrs);
    if (argc == 5 && !strcmp(argv[1], "sleeper"))
        return sleeper(atoi(argv[2]), (unsigned)atoi(argv[3]), atoi(argv[4]));
    if (argc == 5 && !strcmp(argv[1], "rank")) {
        double ms = -1;
        int rc = two_ranks(atoi(argv[2]), atoi(argv[3]), &ms), fd = atoi(argv[4]);
        if (fd >= 0 && write(fd, &ms, sizeof ms) != sizeof ms)
            rc = 10;
        return rc;
    }
    if (argc == 3 && !strcmp(argv[1], "stranger"))
        return stranger(atoi(argv[2]));
    if (argc == 5 && !strcmp(argv[1], "server")) {
        if (!strcmp(argv[4], "nocap") && drop_ptrace() < 0)
            return 2;
        return one_shot_server(atoi(argv[2]), atoi(argv[3]), !strcmp(argv[4], "nodump"));
    }
    if (argc == 4 && !strcmp(argv[1], "client"))
        return one_shot_client(atoi(argv[2]), !strcmp(argv[3], "nodump"));
    if (getenv("MW_TEST_FILTER"))
        cmocka_set_test_filter(getenv("MW_TEST_FILTER"));
    if (readlink("/proc/self/exe", self_path, sizeof self_path - 1) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_peer_back_in_its_loop_within_the_bound),
        cmocka_unit_test(a_peer_outside_its_loop_for_15_s_while_the_other_aborts),
        cmocka_unit_test(a_context_freed_while_its_peer_sleeps),
        cmocka_unit_test(ranks_outside_their_loop_for_5_keepalives),
        cmocka_unit_test(sixty_four_silent_connections_of_another_user),
        cmocka_unit_test(peers_that_refuse_cross_memory_attach),
        cmocka_unit_test(a_remapped_export_takes_no_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
