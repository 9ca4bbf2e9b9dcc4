/* An RDMA device deleted under live connections (rdma link delete: the
 * kernel's DEVICE_REMOVAL).  Work pending on it fails with -ENODEV naming
 * the device, meshwire releases everything it held there so the removal
 * completes, connections on the other device go on, and once the device is
 * added back a new connection over it works; the same with nothing on the
 * device but a listener on every address and memory.  Runs last in the rxe suite:
 * it changes the node's devices (and restores them), and only inside the
 * VMs of tools/rxe-vm, never on a host's own devices. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "meshwire.h"
#include "rxe_util.h"

extern char **environ;
static const char *addrs[2];

struct server {
    mw_listener_t *l;
    mw_conn_t *c;
};

static mw_conn_t *pair(mw_ctx_t *ctx, const char *addr, struct server *s)
{
    char la[64], target[80];
    snprintf(la, sizeof la, "%s:0", addr);
    *s = (struct server){0};
    assert_int_equal(mw_listen(ctx, la, NULL, rxe_keep_first, &s->c, &s->l), 0);
    snprintf(target, sizeof target, "%s:%d", addr, mw_listener_port(s->l));
    mw_future_t *f = NULL;
    for (int i = 0; i < 50; i++) {            /* a re-added device takes a moment */
        mw_future_unref(f);
        f = mw_connect(ctx, target, NULL);
        if (mw_wait(f) == 0)
            break;
        loop_for(ctx, 100);
    }
    if (mw_future_error(f))
        fail_msg("connect to %s: %s", target, mw_future_message(f));
    mw_conn_t *c = mw_future_value(f);
    mw_future_unref(f);
    while (!s->c)
        loop_for(ctx, 5);
    return c;
}

static void round_trip(mw_ctx_t *ctx, mw_conn_t *a, mw_conn_t *b)
{
    (void)ctx;
    int v = 7;
    mw_future_t *r = mw_recv(b), *s = mw_send(a, &v, sizeof v);
    assert_int_equal(mw_wait(s), 0);
    assert_int_equal(mw_wait(r), 0);
    mw_msg_t *m = mw_future_value(r);
    assert_int_equal(*(int *)m->data, 7);
    mw_msg_free(m);
    mw_future_unref(r);
    mw_future_unref(s);
}

/* The netdev under RDMA device @dev, from "rdma link show DEV/1". */
static void netdev_of(const char *dev, char *out, size_t cap)
{
    char cmd[128], line[512];
    snprintf(cmd, sizeof cmd, "rdma link show %s/1", dev);
    FILE *p = popen(cmd, "r");
    out[0] = 0;
    if (p && fgets(line, sizeof line, p)) {
        char *n = strstr(line, "netdev ");
        if (n)
            snprintf(out, cap, "%.*s", (int)strcspn(n + 7, " \n"), n + 7);
    }
    if (p)
        pclose(p);
}

/* A process that keeps connecting to @target, one attempt at a time, for
 * @ms: its requests reach the listener while the device goes, some queued
 * behind the removal.  It must end by itself: a process that has used
 * rdma_cm holds every device open, and the removal waits for it. */
static void connect_storm(const char *target, unsigned ms)
{
    mw_ctx_t *ctx;
    if (mw_ctx_new(&ctx, NULL, NULL))
        _exit(2);
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.timeout_ms = 500;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        mw_future_t *f = mw_connect(ctx, target, &o);
        if (mw_wait(f) == 0)
            mw_conn_abort(mw_future_value(f));
        mw_future_unref(f);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < (long)ms);
    mw_ctx_free(ctx);
    _exit(0);
}

static int orphans_refused;

static void count_orphans(int level, const char *msg, void *arg)
{
    (void)arg, (void)level;
    if (strstr(msg, "no longer listening"))
        orphans_refused++;
}

static void device_deleted_under_live_connections(void **state)
{
    (void)state;
    const char *where = getenv("MW_RXE_WHERE");
    if (!where || strcmp(where, "vm")) {
        printf("not in a throwaway rxe VM: no device is deleted here\n");
        skip();
    }
    mw_ctx_t *ctx;
    mw_ctx_opts_t co;
    mw_ctx_opts_init(&co);
    co.log_fn = count_orphans;
    assert_int_equal(mw_ctx_new(&ctx, NULL, &co), 0);
    struct server s0, s1;
    mw_conn_t *c0 = pair(ctx, addrs[0], &s0), *c1 = pair(ctx, addrs[1], &s1);
    round_trip(ctx, c0, s0.c);
    round_trip(ctx, c1, s1.c);
    mw_conn_stats_t st0, st1;
    mw_conn_stats(c0, &st0);
    mw_conn_stats(c1, &st1);
    if (!strcmp(st0.device, st1.device))
        skip();                   /* both on one device: nothing would survive */
    char dev[64], netdev[64];
    snprintf(dev, sizeof dev, "%s", st1.device);
    netdev_of(dev, netdev, sizeof netdev);
    assert_true(netdev[0] != 0);

    mw_future_t *pending = mw_recv(c1), *other = mw_recv(s1.c);
    char target[80];
    int port1 = mw_listener_port(s1.l);
    snprintf(target, sizeof target, "%s:%d", addrs[1], port1);
    pid_t storm = RXE_FORK_OK ? fork() : -1;    /* see rxe_util.h */
    if (storm == 0)
        connect_storm(target, 1500);
    loop_for(ctx, 300);                       /* its requests are coming in */
    double took;
    char *del[] = {"rdma", "link", "delete", dev, NULL};
    int rc = rxe_run_while_looping(ctx, del, &took);
    printf("rdma link delete %s: exit %d after %.2f s\n", dev, rc, took);
    assert_int_equal(rc, 0);                  /* meshwire let go of the device */
    loop_for(ctx, 50);
    assert_int_equal(mw_future_error(pending), -ENODEV);
    assert_int_equal(mw_future_error(other), -ENODEV);
    printf("pending receive: %s\n", mw_future_message(pending));
    assert_non_null(strstr(mw_future_message(pending), dev));
    mw_future_unref(pending);
    mw_future_unref(other);
    /* its rdma_cm side lost the device; in auto its TCP side goes on */
    const char *forced = getenv("MW_TRANSPORT");
    assert_int_equal(mw_listener_port(s1.l), forced && !strcmp(forced, "rdma") ? -ENODEV : port1);
    int st = 0;                               /* the storm ended (the removal waited) */
    bool reaped = storm < 0;
    for (int t = 0; !reaped && t < 100; t++) {
        reaped = waitpid(storm, &st, WNOHANG) == storm;
        if (!reaped)
            loop_for(ctx, 50);
    }
    if (!reaped) {
        kill(storm, SIGKILL);
        waitpid(storm, &st, 0);
        fail_msg("the connecting process did not end by itself");
    }
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    printf("connects that arrived after the listener lost its device: %d, refused\n",
           orphans_refused);

    round_trip(ctx, c0, s0.c);                /* the other device goes on */

    char *add[] = {"rdma", "link", "add", dev, "type", "rxe", "netdev", netdev, NULL};
    rc = rxe_run_while_looping(ctx, add, &took);
    printf("rdma link add %s type rxe netdev %s: exit %d\n", dev, netdev, rc);
    assert_int_equal(rc, 0);
    struct server s2;
    mw_conn_t *c2 = pair(ctx, addrs[1], &s2);  /* a new connection over it */
    round_trip(ctx, c2, s2.c);
    mw_conn_stats_t st2;
    mw_conn_stats(c2, &st2);
    printf("after re-adding: a new connection on %s works\n", st2.device);

    mw_conn_abort(c0);
    mw_conn_abort(s0.c);
    mw_conn_abort(c1);
    mw_conn_abort(s1.c);
    mw_conn_abort(c2);
    mw_conn_abort(s2.c);
    mw_listener_free(s0.l);
    mw_listener_free(s1.l);
    mw_listener_free(s2.l);
    mw_ctx_free(ctx);
}

/* A process whose only uses of a device are a listener on every address
 * ("*": no id of its own is bound to the device) and memory registered
 * there (a connection came and went): the device is deleted all the same,
 * the listener goes on accepting over the other device, and over the
 * device once it is added back. */
static void device_removed_under_a_listener_and_memory(void **state)
{
    (void)state;
    const char *where = getenv("MW_RXE_WHERE");
    if (!where || strcmp(where, "vm"))
        skip();
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    void *mem = mw_alloc(ctx, 64u << 20);
    memset(mem, 1, 64u << 20);
    struct server s;
    mw_listener_t *any;
    mw_conn_t *accepted = NULL;
    assert_int_equal(mw_listen(ctx, "*:0", NULL, rxe_keep_first, &accepted, &any), 0);
    int port = mw_listener_port(any);
    /* a connection over the device: its PD and CQ open, the memory
     * registered with it; then gone */
    mw_conn_t *c = pair(ctx, addrs[1], &s);
    round_trip(ctx, c, s.c);
    mw_conn_stats_t st;
    mw_conn_stats(c, &st);
    char dev[64], netdev[64];
    snprintf(dev, sizeof dev, "%s", st.device);
    netdev_of(dev, netdev, sizeof netdev);
    assert_true(netdev[0] != 0);
    mw_conn_abort(c);
    mw_conn_abort(s.c);
    mw_listener_free(s.l);
    rxe_wait_conns_gone(ctx);

    double took;
    char *del[] = {"rdma", "link", "delete", dev, NULL};
    int rc = rxe_run_while_looping(ctx, del, &took);
    printf("rdma link delete %s under a \"*\" listener and 64 MiB registered: exit %d after "
           "%.2f s\n", dev, rc, took);
    assert_int_equal(rc, 0);
    assert_true(took < 10);
    /* the listener goes on, over the other device */
    mw_conn_t *c0 = rxe_connect(ctx, addrs[0], port, NULL);
    while (!accepted)
        loop_for(ctx, 5);
    round_trip(ctx, c0, accepted);
    mw_conn_abort(c0);
    mw_conn_abort(accepted);
    accepted = NULL;

    char *add[] = {"rdma", "link", "add", dev, "type", "rxe", "netdev", netdev, NULL};
    rc = rxe_run_while_looping(ctx, add, &took);
    assert_int_equal(rc, 0);
    /* and over the device added back (the kernel listens there anew) */
    mw_conn_t *c1 = NULL;
    for (int i = 0; i < 50 && !c1; i++) {
        mw_future_t *f = rxe_connect_future(ctx, addrs[1], port, NULL);
        if (mw_wait(f) == 0)
            c1 = mw_future_value(f);
        mw_future_unref(f);
        if (!c1)
            loop_for(ctx, 100);
    }
    assert_non_null(c1);
    while (!accepted)
        loop_for(ctx, 5);
    round_trip(ctx, c1, accepted);
    mw_conn_abort(c1);
    mw_conn_abort(accepted);
    mw_listener_free(any);
    rxe_wait_conns_gone(ctx);
    mw_free(ctx, mem);
    mw_ctx_free(ctx);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rxe_require(2, addrs);
    if (getuid() != 0) {
        printf("SKIP: deleting an RDMA device needs root\n");
        return SKIP_EXIT;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_deleted_under_live_connections),
        cmocka_unit_test(device_removed_under_a_listener_and_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
