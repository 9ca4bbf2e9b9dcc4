/* Running out of the device's resources fails cleanly: completion-queue
 * entries (connections reserve theirs, the CQ grows up to the device's
 * max_cqe), device objects (queue pairs, capped for real by the kernel's
 * rdma cgroup controller) and registrable memory (RLIMIT_MEMLOCK, enforced
 * once CAP_IPC_LOCK is dropped, in a child).  Each failure is an error with
 * a message, connections made before it keep working, and freeing something
 * makes room again. */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "meshwire.h"
#include "rxe_util.h"

extern char **environ;
static const char *addrs[2];
static char self_path[4096];

#define MAXPAIRS 64

/* Connect to @s (holding @n pairs, in @conns and s->conns) until a connect
 * fails or @max pairs stand; return the number of pairs, and the failed
 * future in @failed (NULL if none failed). */
static int connect_until_failure(mw_ctx_t *ctx, struct rxe_server *s, const mw_conn_opts_t *o,
                                 mw_conn_t **conns, int n, int max, mw_future_t **failed)
{
    *failed = NULL;
    for (; n < max; n++) {
        mw_future_t *f = rxe_connect_future(ctx, addrs[1], s->port, o);
        if (mw_wait(f)) {
            *failed = f;
            return n;
        }
        conns[n] = mw_future_value(f);
        mw_future_unref(f);
        rxe_wait_accepted(s, n + 1);
    }
    return max;
}

/* Every pair still carries a message both ways. */
static void all_pairs_work(mw_conn_t **conns, struct rxe_server *s, int n)
{
    for (int i = 0; i < n; i++) {
        rxe_round_trip(conns[i], s->conns[i]);
        rxe_round_trip(s->conns[i], conns[i]);
    }
}

static void close_pairs(mw_conn_t **conns, struct rxe_server *s, int n)
{
    for (int i = 0; i < n; i++)
        rxe_close_conn(conns[i]);
    rxe_server_close(s);
}

/* --- completion-queue entries --------------------------------------------- */

static void cq_entries_run_out_cleanly(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    struct rxe_server s;
    rxe_server_start(&s, ctx, addrs[1], NULL);
    /* each client end reserves 4096 + 4096 + 1 + 4096 entries */
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.credits = 4096;
    o.slot_size = 256;
    o.max_rdma_inflight = 4096;
    mw_conn_t *conns[MAXPAIRS];
    mw_future_t *failed;
    int n = connect_until_failure(ctx, &s, &o, conns, 0, MAXPAIRS, &failed);
    assert_non_null(failed);
    printf("CQ entries: %d connections of 12289 entries each, then: %s (%s)\n", n,
           mw_strerror(mw_future_error(failed)), mw_future_message(failed));
    assert_true(n >= 1);
    assert_int_equal(mw_future_error(failed), -ENOSPC);
    assert_non_null(strstr(mw_future_message(failed), "completion queue"));
    mw_future_unref(failed);
    all_pairs_work(conns, &s, n);

    /* closing one makes room for one */
    rxe_close_conn(conns[n - 1]);
    rxe_close_conn(s.conns[n - 1]);
    s.n--;
    mw_future_t *f = rxe_connect_future(ctx, addrs[1], s.port, &o);
    assert_int_equal(mw_wait(f), 0);
    conns[n - 1] = mw_future_value(f);
    mw_future_unref(f);
    rxe_wait_accepted(&s, n);
    all_pairs_work(conns, &s, n);
    close_pairs(conns, &s, n);
    mw_ctx_free(ctx);
}

/* --- device objects, capped by the rdma cgroup ----------------------------- */

#define CG_ROOT "/sys/fs/cgroup"

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0)
        return -errno;
    ssize_t n = write(fd, text, strlen(text));
    int rc = n == (ssize_t)strlen(text) ? 0 : -errno;
    close(fd);
    return rc;
}

/* The device line of rdma.current with objects in use: "rxe1 hca_handle=1
 * hca_object=9" -> @dev "rxe1", @objects 9 (the first device using any). */
static int cgroup_usage(const char *cg, char *dev, size_t cap, int *objects)
{
    char path[256], line[256];
    snprintf(path, sizeof path, "%s/rdma.current", cg);
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    int rc = -ENOENT;
    while (fgets(line, sizeof line, f)) {
        char name[64];
        int handles, objs;
        if (sscanf(line, "%63s hca_handle=%d hca_object=%d", name, &handles, &objs) == 3 &&
            objs > 0 && (size_t)snprintf(dev, cap, "%s", name) < cap) {
            *objects = objs;
            rc = 0;
            break;
        }
    }
    fclose(f);
    return rc;
}

/* Make a child cgroup with the rdma controller and move this process in;
 * return 0, or a reason to skip in @why. */
static int cgroup_enter(char *cg, size_t cap, const char **why)
{
    char path[256], pid[32];
    char name[128];
    snprintf(name, sizeof name, CG_ROOT "/meshwire-limits-%d", (int)getpid());
    snprintf(path, sizeof path, "%s/cgroup.controllers", CG_ROOT);
    FILE *f = fopen(path, "r");
    char ctl[512] = "";
    if (!f || !fgets(ctl, sizeof ctl, f) || !strstr(ctl, "rdma")) {
        if (f)
            fclose(f);
        *why = "no cgroup2 hierarchy with the rdma controller at " CG_ROOT;
        return -1;
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/cgroup.subtree_control", CG_ROOT);
    if (write_file(path, "+rdma") < 0 || (mkdir(name, 0755) < 0 && errno != EEXIST)) {
        *why = "cannot make a cgroup with the rdma controller (not root?)";
        return -1;
    }
    snprintf(path, sizeof path, "%s/cgroup.procs", name);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (write_file(path, pid) < 0) {
        rmdir(name);
        *why = "cannot move this process into a new cgroup";
        return -1;
    }
    snprintf(cg, cap, "%s", name);
    return 0;
}

static char cgroup_path[128];    /* the cgroup entered, until left */

/* Teardown, however the test ended: back to the root cgroup, and remove ours. */
static int cgroup_leave(void **state)
{
    (void)state;
    if (!cgroup_path[0])
        return 0;
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    int rc = write_file(CG_ROOT "/cgroup.procs", pid);
    if (rc == 0 && rmdir(cgroup_path) < 0)
        rc = -errno;
    if (rc < 0)
        fprintf(stderr, "cannot leave cgroup %s: %s\n", cgroup_path, strerror(-rc));
    cgroup_path[0] = 0;
    return rc;
}

static void device_objects_run_out_cleanly(void **state)
{
    (void)state;
    char *cg = cgroup_path, path[256], limit[128], dev[64];
    const char *why;
    if (cgroup_enter(cg, sizeof cgroup_path, &why) < 0) {
        printf("SKIP device objects: %s\n", why);
        skip();
    }
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    struct rxe_server s;
    rxe_server_start(&s, ctx, addrs[1], NULL);
    mw_conn_t *conns[MAXPAIRS];
    mw_future_t *failed;
    assert_int_equal(connect_until_failure(ctx, &s, NULL, conns, 0, 1, &failed), 1);
    int used = 0;
    assert_int_equal(cgroup_usage(cg, dev, sizeof dev, &used), 0);
    /* room for a few more queue pairs (each pair of ends takes two) */
    snprintf(path, sizeof path, "%s/rdma.max", cg);
    snprintf(limit, sizeof limit, "%s hca_object=%d", dev, used + 7);
    assert_int_equal(write_file(path, limit), 0);

    int n = connect_until_failure(ctx, &s, NULL, conns, 1, MAXPAIRS, &failed);
    assert_non_null(failed);
    printf("device objects: limit %d on %s (%d in use with one pair); %d pairs, then: %s (%s)\n",
           used + 7, dev, used, n, mw_strerror(mw_future_error(failed)),
           mw_future_message(failed));
    assert_true(n > 1 && n < MAXPAIRS);
    assert_true(mw_future_error(failed) < 0);
    assert_non_null(strstr(mw_future_message(failed), addrs[1]));
    mw_future_unref(failed);
    rxe_wait_accepted(&s, n);       /* a half-made server end is not handed over */
    loop_for(ctx, 100);
    assert_int_equal(s.n, n);
    all_pairs_work(conns, &s, n);

    /* lifting the cap, a new connection works */
    snprintf(limit, sizeof limit, "%s hca_object=max", dev);
    assert_int_equal(write_file(path, limit), 0);
    mw_future_t *f = rxe_connect_future(ctx, addrs[1], s.port, NULL);
    assert_int_equal(mw_wait(f), 0);
    conns[n] = mw_future_value(f);
    mw_future_unref(f);
    rxe_wait_accepted(&s, n + 1);
    all_pairs_work(conns, &s, n + 1);
    close_pairs(conns, &s, n + 1);
    mw_ctx_free(ctx);
}

/* --- registrable memory (child with CAP_IPC_LOCK dropped) ------------------ */

#define MEMLOCK_LIMIT (32u << 20)

/* Without CAP_IPC_LOCK, root too is held to RLIMIT_MEMLOCK when registering. */
static int drop_ipc_lock(void)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) < 0)
        return -errno;
    d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    d[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    if (syscall(SYS_capset, &h, d) < 0)
        return -errno;
    struct rlimit rl = {MEMLOCK_LIMIT, MEMLOCK_LIMIT};
    return setrlimit(RLIMIT_MEMLOCK, &rl) < 0 ? -errno : 0;
}

static void memory_runs_out_cleanly(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    struct rxe_server s;
    rxe_server_start(&s, ctx, addrs[1], NULL);
    mw_conn_t *c = rxe_connect(ctx, addrs[1], s.port, NULL);
    rxe_wait_accepted(&s, 1);

    /* an allocation beyond the limit */
    errno = 0;
    void *big = mw_alloc(ctx, 2 * MEMLOCK_LIMIT);
    printf("memlock %u MiB: mw_alloc(%u MiB): %s\n", MEMLOCK_LIMIT >> 20,
           2 * MEMLOCK_LIMIT >> 20, big ? "succeeded" : strerror(errno));
    assert_null(big);
    assert_int_equal(errno, ENOMEM);

    /* a registration beyond the limit */
    size_t len = 2 * MEMLOCK_LIMIT;
    char *mem = malloc(len);
    assert_non_null(mem);
    mw_mr_t *mr = NULL;
    int rc = mw_reg(ctx, mem, len, &mr);
    printf("memlock: mw_reg(%zu MiB): %s\n", len >> 20, rc ? mw_strerror(rc) : "succeeded");
    assert_int_equal(rc, -ENOMEM);
    assert_null(mr);

    /* a connection whose receive ring does not fit (16 x 4 MiB slots) */
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.slot_size = 4u << 20;
    mw_future_t *f = rxe_connect_future(ctx, addrs[1], s.port, &o);
    rc = mw_wait(f);
    printf("memlock: connect with a 64 MiB receive ring: %s (%s)\n", mw_strerror(rc),
           mw_future_message(f));
    assert_int_equal(rc, -ENOMEM);
    mw_future_unref(f);

    /* what fits still works, and the connection made before goes on */
    char *small = mw_alloc(ctx, 1 << 20);
    assert_non_null(small);
    rc = mw_reg(ctx, mem, 1 << 20, &mr);
    assert_int_equal(rc, 0);
    rxe_round_trip(c, s.conns[0]);
    rxe_round_trip(s.conns[0], c);
    assert_int_equal(mw_dereg(ctx, mr), 0);
    mw_free(ctx, small);
    free(mem);
    rxe_close_conn(c);
    rxe_server_close(&s);
    mw_ctx_free(ctx);
}

static int memlock_child(void)
{
    int rc = drop_ipc_lock();
    if (rc < 0) {
        fprintf(stderr, "cannot drop CAP_IPC_LOCK or set RLIMIT_MEMLOCK: %s\n", strerror(-rc));
        return 2;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(memory_runs_out_cleanly)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

static void registrable_memory_runs_out_cleanly(void **state)
{
    (void)state;
    char *argv[] = {self_path, "memlock-child", NULL};
    pid_t pid;
    int status;
    assert_int_equal(posix_spawn(&pid, self_path, NULL, NULL, argv, environ), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rxe_require(2, addrs);
    if (argc == 2 && !strcmp(argv[1], "memlock-child"))
        return memlock_child();
    if (readlink("/proc/self/exe", self_path, sizeof self_path - 1) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cq_entries_run_out_cleanly),
        cmocka_unit_test_teardown(device_objects_run_out_cleanly, cgroup_leave),
        cmocka_unit_test(registrable_memory_runs_out_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
