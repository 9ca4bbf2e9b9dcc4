/* Running out of resources fails cleanly: meshwire's own bookkeeping memory
 * (any one allocation, through mw_replace_allocator), completion-queue
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
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/dev.h"
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
    o.transport = MW_TRANSPORT_RDMA;  /* the device's limit (auto goes on over TCP) */
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

/* The objects device @dev uses, from its line of rdma.current: "rxe1
 * hca_handle=1 hca_object=9" -> 9.  (Not the first device listed: the
 * context may have opened another one too.) */
static int cgroup_usage(const char *cg, const char *dev, int *objects)
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
            !strcmp(name, dev)) {
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

/* Into a cgroup of our own (or skip the test @what), with a context and a
 * server on it. */
static mw_ctx_t *cgroup_ctx_server(const char *what, struct rxe_server *s)
{
    const char *why;
    if (cgroup_enter(cgroup_path, sizeof cgroup_path, &why) < 0) {
        printf("SKIP %s: %s\n", what, why);
        skip();
    }
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    rxe_server_start(s, ctx, addrs[1], NULL);
    return ctx;
}

static void device_objects_run_out_cleanly(void **state)
{
    (void)state;
    char *cg = cgroup_path, path[256], limit[128], dev[64];
    struct rxe_server s;
    mw_ctx_t *ctx = cgroup_ctx_server("device objects", &s);
    mw_conn_t *conns[MAXPAIRS] = {0};
    mw_future_t *failed;
    assert_int_equal(connect_until_failure(ctx, &s, NULL, conns, 0, 1, &failed), 1);
    mw_conn_stats_t st;
    assert_int_equal(mw_conn_stats(conns[0], &st), 0);
    snprintf(dev, sizeof dev, "%s", st.device);     /* the device the pairs use */
    int used = 0;
    assert_int_equal(cgroup_usage(cg, dev, &used), 0);
    assert_true(used > 0);
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

/* rdma.max of @cg: hca_object=@objects ("max" for none) on every RDMA device. */
static void cap_objects(const char *cg, const char *objects)
{
    char path[256], limit[320];
    snprintf(path, sizeof path, "%s/rdma.max", cg);
    DIR *d = opendir("/sys/class/infiniband");
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(limit, sizeof limit, "%s hca_object=%s", e->d_name, objects);
        assert_int_equal(write_file(path, limit), 0);
    }
    closedir(d);
}

/* A device that cannot be opened (no protection domain to be had) fails
 * the connection through it with the reason; once it can be, the next
 * connection opens it, in the same record: failed opens take no new one. */
static void device_open_failure_is_retried_in_place(void **state)
{
    (void)state;
    struct rxe_server s;
    mw_ctx_t *ctx = cgroup_ctx_server("device open", &s);
    cap_objects(cgroup_path, "0");
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.transport = MW_TRANSPORT_RDMA;
    for (int i = 0; i < 3; i++) {
        mw_future_t *f = rxe_connect_future(ctx, addrs[1], s.port, &o);
        assert_int_not_equal(mw_wait(f), 0);
        printf("capped: %s\n", mw_future_message(f));
        assert_non_null(strstr(mw_future_message(f), "protection domain"));
        mw_future_unref(f);
    }
    const char *forced = getenv("MW_TRANSPORT");
    if (!forced || !strcmp(forced, "auto")) {
        /* auto: no usable device, so set up over TCP -- and, the peer being
         * a process of this host, on the same-host path */
        mw_conn_t *c = rxe_connect(ctx, addrs[1], s.port, NULL);
        mw_conn_stats_t st;
        assert_int_equal(mw_conn_stats(c, &st), 0);
        assert_int_equal(st.transport, MW_TRANSPORT_LOCAL);
        rxe_wait_accepted(&s, 1);
        all_pairs_work(&c, &s, 1);
        rxe_close_conn(c);
        rxe_close_conn(s.conns[0]);
        s.n = 0;
    }
    assert_int_equal(mw__dev_count(ctx), 1);
    cap_objects(cgroup_path, "max");
    mw_future_t *f = rxe_connect_future(ctx, addrs[1], s.port, NULL);
    assert_int_equal(mw_wait(f), 0);
    mw_conn_t *c = mw_future_value(f);
    mw_future_unref(f);
    assert_int_equal(mw__dev_count(ctx), 1);
    assert_non_null(mw__dev_at(ctx, 0)->pd);
    rxe_wait_accepted(&s, 1);
    all_pairs_work(&c, &s, 1);
    close_pairs(&c, &s, 1);
    mw_ctx_free(ctx);
}

/* --- registrable memory (child with CAP_IPC_LOCK dropped) ------------------ */

/* Room for the arena's first mappings registered three times over: with
 * the device, and in each end's protection domain of the one connection. */
#define MEMLOCK_LIMIT (64u << 20)

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

    /* a connection whose receive ring does not fit (16 x 8 MiB slots) */
    printf("memlock: pinned with one connection: %.1f MiB\n", rxe_pinned_mib());
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.slot_size = 8u << 20;
    mw_future_t *f = rxe_connect_future(ctx, addrs[1], s.port, &o);
    rc = mw_wait(f);
    printf("memlock: connect with a 128 MiB receive ring: %s (%s)\n", mw_strerror(rc),
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

/* --- bookkeeping memory: every allocation meshwire makes can fail -------- */

/* A counting allocator that fails call number oom.fail_at (0: none). */
static struct {
    atomic_long calls, fail_at, held, failed;
} oom;

static bool oom_refuse(void)
{
    long n = atomic_fetch_add(&oom.calls, 1) + 1;
    if (n != atomic_load(&oom.fail_at))
        return false;
    atomic_fetch_add(&oom.failed, 1);
    return true;
}

static void *oom_malloc(size_t size)
{
    void *p = oom_refuse() ? NULL : malloc(size);
    if (p)
        atomic_fetch_add(&oom.held, 1);
    return p;
}

static void *oom_calloc(size_t n, size_t size)
{
    void *p = oom_refuse() ? NULL : calloc(n, size);
    if (p)
        atomic_fetch_add(&oom.held, 1);
    return p;
}

static void *oom_realloc(void *p, size_t size)
{
    void *q = oom_refuse() ? NULL : realloc(p, size);
    if (q && !p)
        atomic_fetch_add(&oom.held, 1);
    return q;
}

static void oom_free(void *p)
{
    if (p)
        atomic_fetch_sub(&oom.held, 1);
    free(p);
}

/* The scenario's log at debug level, kept to show when it fails; warnings
 * and errors also go to stderr as usual. */
static struct {
    char *buf;
    size_t len, cap;
} oom_trace;

static void oom_trace_line(int level, const char *msg, void *arg)
{
    (void)arg;
    if (level <= MW_LOG_WARN)
        fprintf(stderr, "meshwire %s: %s\n", level == MW_LOG_ERROR ? "error" : "warn", msg);
    size_t n = strlen(msg) + 1;
    if (oom_trace.len + n + 1 > oom_trace.cap) {
        size_t cap = 2 * (oom_trace.cap + n) + 4096;
        char *b = realloc(oom_trace.buf, cap);    /* the C library's: never failed */
        if (!b)
            return;
        oom_trace.buf = b;
        oom_trace.cap = cap;
    }
    memcpy(oom_trace.buf + oom_trace.len, msg, n - 1);
    oom_trace.len += n;
    oom_trace.buf[oom_trace.len - 1] = '\n';
    oom_trace.buf[oom_trace.len] = '\0';
}

/* The future's outcome within its deadline; a failure must say something. */
static int oom_wait(mw_future_t *f, const char *what, const char **where)
{
    if (!f) {
        if (!**where)
            *where = what;
        return -ENOMEM;
    }
    mw_future_set_timeout(f, 5000);
    int rc = mw_wait(f);
    if (rc) {
        if (!**where)             /* the first failure is the one to name */
            *where = what;
        assert_true(rc < 0);
        assert_non_null(mw_future_message(f));
        if (rc == -ETIMEDOUT && oom_trace.buf)    /* failing cleanly is failing fast */
            fprintf(stderr, "the scenario's log:\n%s", oom_trace.buf);
        if (rc == -ETIMEDOUT)
            fail_msg("allocation %ld: %s timed out: %s", atomic_load(&oom.fail_at), what,
                     mw_future_message(f));
    }
    return rc;
}

static void oom_keep(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    mw_conn_t **kept = arg;
    if (*kept)
        mw_conn_abort(c);
    else
        *kept = c;
}

/* Two ranks' futures, both waited for.  A rank whose call returned NULL
 * never joined: the other is cancelled (it would wait for it until its
 * deadline, as a rank that never calls waits in MPI); with @cancel also
 * once one failed (a rank whose creation failed never comes).  A failed
 * collective breaks the communicator for both: nothing to cancel. */
static int oom_wait_pair(mw_ctx_t *ctx, mw_future_t **f, bool cancel, const char *what,
                         const char **where)
{
    for (int i = 0; i < 500; i++) {
        bool failed = false, pending = false;
        for (int k = 0; k < 2; k++) {
            failed |= !f[k] || (cancel && mw_future_state(f[k]) == MW_FUTURE_FAILED);
            pending |= f[k] && mw_future_state(f[k]) == MW_FUTURE_PENDING;
        }
        if (failed)
            for (int k = 0; k < 2; k++)
                if (f[k])
                    mw_future_cancel(f[k]);
        if (failed || !pending)
            break;
        loop_for(ctx, 10);
    }
    int rc = 0;                   /* the failure that was not a cancel first */
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < 2; k++) {
            bool cancelled = f[k] && mw_future_error(f[k]) == -ECANCELED;
            if (cancelled == (pass == 1)) {
                int e = oom_wait(f[k], what, where);
                rc = rc ? rc : e;
            }
        }
    return rc;
}

/* Connect, a message, an exported write, a two-rank communicator and an
 * allreduce, all in one context; 0 when everything worked, else the first
 * error (named in *@where).  Everything is released either way. */
static int oom_scenario(int port, const char **where)
{
    mw_ctx_t *ctx = NULL;
    mw_listener_t *l = NULL;
    mw_conn_t *server = NULL, *client = NULL;
    mw_comm_t *comm[2] = {NULL, NULL};
    mw_future_t *f = NULL, *cf[2] = {NULL, NULL};
    char *mem = NULL;
    char la[80];
    mw_ctx_opts_t co;
    mw_ctx_opts_init(&co);
    co.log_level = MW_LOG_DEBUG;
    co.log_fn = oom_trace_line;
    oom_trace.len = 0;
    int rc = mw_ctx_new(&ctx, NULL, &co);
    if (rc) {
        *where = "mw_ctx_new";
        return rc;
    }
    snprintf(la, sizeof la, "%s:0", addrs[1]);
    if ((rc = mw_listen(ctx, la, NULL, oom_keep, &server, &l))) {
        *where = "mw_listen";
        goto out;
    }
    char to[80];
    snprintf(to, sizeof to, "%s:%d", addrs[1], mw_listener_port(l));
    f = mw_connect(ctx, to, NULL);
    if ((rc = oom_wait(f, "mw_connect", where)))
        goto out;
    client = mw_future_value(f);
    mw_future_unref(f);
    f = NULL;
    for (int i = 0; !server && i < 500; i++)
        loop_for(ctx, 10);
    if (!server) {                /* the accept side failed: the client is told */
        mw_listener_stats_t st;
        mw_listener_stats(l, &st);
        *where = "accept";
        rc = st.failed + st.rejected ? -ENOMEM : -ETIMEDOUT;
        assert_int_equal(rc, -ENOMEM);
        goto out;
    }

    /* a message */
    f = mw_send(client, "hello", 6);
    if ((rc = oom_wait(f, "mw_send", where)))
        goto out;
    mw_future_unref(f);
    f = mw_recv(server);
    if ((rc = oom_wait(f, "mw_recv", where)))
        goto out;
    mw_msg_t *m = mw_future_value(f);
    assert_int_equal(m->len, 6);
    assert_string_equal(m->data, "hello");
    mw_msg_free(m);
    mw_future_unref(f);
    f = NULL;

    /* a one-sided write into an export */
    mem = mw_alloc(ctx, 8192);
    mw_remote_t r;
    if (!mem) {
        *where = "mw_alloc";
        rc = -errno;
        goto out;
    }
    memset(mem, 0, 8192);
    memset(mem + 4096, 'x', 4096);
    if ((rc = mw_mem_export(server, mem, 4096, &r))) {
        *where = "mw_mem_export";
        goto out;
    }
    f = mw_write(client, mem + 4096, 4096, &r, 0);
    if ((rc = oom_wait(f, "mw_write", where)))
        goto out;
    mw_future_unref(f);
    f = NULL;
    assert_memory_equal(mem, mem + 4096, 4096);

    /* a communicator of two ranks in this context, and an allreduce */
    char peers[2][80];
    const char *pv[2] = {peers[0], peers[1]};
    snprintf(peers[0], sizeof peers[0], "%s:%d", addrs[1], port);
    snprintf(peers[1], sizeof peers[1], "%s:%d", addrs[0], port + 1);
    mw_comm_opts_t o;
    mw_comm_opts_init(&o);
    o.timeout_ms = 5000;
    o.slot_size = 4096;
    for (int k = 0; k < 2; k++)
        cf[k] = mw_comm_create(ctx, k, 2, pv, &o);
    if (!(rc = oom_wait_pair(ctx, cf, true, "mw_comm_create", where)))
        for (int k = 0; k < 2; k++)
            comm[k] = mw_future_value(cf[k]);
    if (rc)
        goto out;
    float x[2][64];
    mw_future_t *af[2];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 64; i++)
            x[k][i] = (float)(k + i);
        af[k] = mw_allreduce(comm[k], x[k], x[k], 64, MW_F32, MW_SUM);
    }
    rc = oom_wait_pair(ctx, af, false, "mw_allreduce", where);
    for (int k = 0; k < 2; k++)
        if (af[k])
            mw_future_unref(af[k]);
    for (int i = 0; !rc && i < 64; i++) {
        assert_true(x[0][i] == (float)(1 + 2 * i));
        assert_true(x[1][i] == (float)(1 + 2 * i));
    }
out:
    if (f)
        mw_future_unref(f);
    for (int k = 0; k < 2; k++) {
        mw_comm_free(comm[k]);
        if (cf[k])
            mw_future_unref(cf[k]);
    }
    if (client)
        mw_conn_abort(client);
    if (server)
        mw_conn_abort(server);
    mw_listener_free(l);
    mw_free(ctx, mem);
    mw_ctx_free(ctx);
    return rc;
}

/* stderr goes to a file while allocations fail: meshwire reports there a
 * released handle passed to it, and its own cleanup must never pass one. */
static struct {
    FILE *file;
    int saved;
} oom_log = {NULL, -1};

static void oom_capture_stderr(void)
{
    assert_non_null(oom_log.file = tmpfile());
    oom_log.saved = dup(2);
    assert_true(oom_log.saved >= 0 && dup2(fileno(oom_log.file), 2) == 2);
}

/* stderr back, with what was written meanwhile; how many released
 * handles meshwire was handed. */
static int oom_release_stderr(void)
{
    int dead = 0;
    if (!oom_log.file)
        return 0;
    dup2(oom_log.saved, 2);
    close(oom_log.saved);
    rewind(oom_log.file);
    char line[512];
    while (fgets(line, sizeof line, oom_log.file)) {
        fputs(line, stderr);
        dead += strstr(line, "not a live") != NULL;
    }
    fclose(oom_log.file);
    oom_log.file = NULL;
    return dead;
}

static int oom_teardown(void **state)
{
    (void)state;
    oom_release_stderr();         /* a failed run's log, for its reader */
    return 0;
}

/* For every N, the Nth allocation fails: each failure is an error with a
 * message, nothing hangs, and nothing is left allocated after the
 * teardown.  The run where no allocation failed works. */
static void every_allocation_can_fail(void **state)
{
    (void)state;
    assert_int_equal(mw_replace_allocator(NULL, realloc, calloc, free), -EINVAL);
    assert_int_equal(mw_replace_allocator(oom_malloc, oom_realloc, oom_calloc, oom_free), 0);
    int port = rxe_fixed_port((unsigned)getpid() * 13, 102);   /* port - 2 to port + 99 */
    /* a first run grows what lives as long as the process (the handle
     * table): the baseline of what a run leaves held */
    const char *where = "";
    assert_int_equal(oom_scenario(port - 2, &where), 0);
    long baseline = atomic_load(&oom.held);
    int errors = 0, absorbed = 0;
    long n;
    double t0 = now_s();
    oom_capture_stderr();
    for (n = 1;; n++) {
        atomic_store(&oom.calls, 0);
        atomic_store(&oom.failed, 0);
        atomic_store(&oom.fail_at, n);
        where = "";
        int rc = oom_scenario(port + (int)(n % 50) * 2, &where);
        bool injected = atomic_load(&oom.failed) > 0;
        if (atomic_load(&oom.held) != baseline)
            fail_msg("allocation %ld failed (%s: %s): %ld blocks left", n, where,
                     mw_strerror(rc), atomic_load(&oom.held) - baseline);
        if (!injected) {          /* past the last allocation: all of it works */
            assert_int_equal(rc, 0);
            break;
        }
        rc ? errors++ : absorbed++;
        if (getenv("MW_TEST_VERBOSE"))
            printf("allocation %ld: %s%s%s\n", n, rc ? where : "absorbed", rc ? ": " : "",
                   rc ? mw_strerror(rc) : "");
    }
    atomic_store(&oom.fail_at, 0);
    assert_int_equal(oom_release_stderr(), 0);
    printf("%ld allocations along connect, send/recv, write, communicator, allreduce: "
           "%d failures reported as errors, %d absorbed (retried or not needed), %.1f s\n",
           n - 1, errors, absorbed, now_s() - t0);
    assert_int_equal(mw_replace_allocator(malloc, realloc, calloc, free), 0);
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
    if (getenv("MW_TEST_FILTER"))
        cmocka_set_test_filter(getenv("MW_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(every_allocation_can_fail, oom_teardown),
        cmocka_unit_test(cq_entries_run_out_cleanly),
        cmocka_unit_test_teardown(device_objects_run_out_cleanly, cgroup_leave),
        cmocka_unit_test_teardown(device_open_failure_is_retried_in_place, cgroup_leave),
        cmocka_unit_test(registrable_memory_runs_out_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
