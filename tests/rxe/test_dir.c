/* The directory with RDMA: a peer reached by name, its shared regions read
 * and written; the store restarted under transfers in flight; a
 * communicator of 3 ranks (processes) formed through Redis, past a stale
 * entry of an earlier run; one that cannot form names who is missing; a
 * rank 0 that restarts with a new run makes the others start over; a rank
 * that dies, restarted, rejoins the survivors' communicator; the port a
 * rank published stays its own until its communicator listens; a stranger
 * cannot make a publication hold more than max_conns connections. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "meshwire.h"
#include "etcd_util.h"
#include "lateness.h"
#include "redis_util.h"
#include "rxe_util.h"

extern char **environ;
static const char *addrs[2];
static char self_path[4096];
static struct redis_fixture rf;
/* MW_TEST_STORE=etcd: the same tests on an etcd of their own (rf.url). */
static struct etcd_fixture ef;
static bool on_etcd;

static bool store_exists(const char *key)
{
    return on_etcd ? etcd_exists(&ef, key) : redis_exists(rf.sock, key);
}

/* An entry as a dead process left it: under @key, with a lease running
 * (etcd: none, it is replaced by the rank's own put all the same). */
static void store_put_stale(const char *key, const char *val)
{
    if (on_etcd) {
        etcd_put(&ef, key, val);
        return;
    }
    redis_cmd(rf.sock, false, "SET %s %s PX 60000", key, val);
    redis_cmd(rf.sock, false, "ZADD mw:#index 0 %s", key);   /* as meshwire puts */
}

static void *value_of(mw_future_t *f, int want)
{
    assert_non_null(f);
    mw_future_set_timeout(f, 60000);
    int rc = mw_wait(f);
    if (rc != want)
        fail_msg("expected %d, got %d: %s", want, rc, mw_future_message(f));
    void *v = mw_future_value(f);
    mw_future_unref(f);
    return v;
}

static mw_directory_t *open_dir(mw_ctx_t *ctx)
{
    mw_dir_opts_t o;
    mw_dir_opts_init(&o);
    o.lease_ms = 3000;
    return value_of(mw_dir_open(ctx, rf.url, &o), 0);
}

/* ------------------------------------------------------------------------
 * Connect by name
 * ------------------------------------------------------------------------ */

#define KV_BYTES (4u << 20)

struct accepted {
    mw_conn_t *c[16];
    int n;
};

static void keep(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    struct accepted *a = arg;
    if (a->n < 16)
        a->c[a->n++] = c;
    else
        mw_conn_abort(c);
}

static void connect_by_name_reaches_shared_regions(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_directory_t *srv = open_dir(ctx), *cli = open_dir(ctx);
    uint8_t *kv = mw_alloc(ctx, KV_BYTES), *scratch = mw_alloc(ctx, 4096);
    for (size_t i = 0; i < KV_BYTES; i++)
        kv[i] = (uint8_t)(i * 7 + 3);
    struct accepted acc = {0};
    mw_dir_share_t shares[] = {{"kv", kv, KV_BYTES}, {"scratch", scratch, 4096}};
    mw_dir_pub_t pub = {.listen = "*:0", .on_accept = keep, .arg = &acc,
                        .shares = shares, .nshares = 2, .tag = "prefill"};
    value_of(mw_dir_publish(srv, "job/prefill/3", &pub), 0);

    mw_dir_list_t *l = value_of(mw_dir_lookup(cli, "job/prefill/3"), 0);
    assert_int_equal(l->e[0].serves, 1);
    assert_int_equal(l->e[0].nregions, 2);
    assert_string_equal(l->e[0].regions[0].name, "kv");
    assert_int_equal(l->e[0].regions[0].len, KV_BYTES);
    printf("prefill/3 published at %s\n", l->e[0].addrs);
    mw_dir_list_free(l);

    mw_dir_peer_t *p = value_of(mw_dir_connect(cli, "job/prefill/3", NULL), 0);
    assert_int_equal(p->nregions, 2);
    const mw_remote_t *rkv = mw_dir_peer_region(p, "kv");
    assert_non_null(rkv);
    assert_int_equal(rkv->len, KV_BYTES);
    assert_null(mw_dir_peer_region(p, "absent"));

    uint8_t *buf = mw_alloc(ctx, KV_BYTES);
    value_of(mw_read(p->conn, buf, KV_BYTES, rkv, 0), 0);
    assert_memory_equal(buf, kv, KV_BYTES);
    memset(buf, 0x5a, 4096);
    value_of(mw_write(p->conn, buf, 4096, mw_dir_peer_region(p, "scratch"), 0), 0);
    assert_int_equal(scratch[4095], 0x5a);
    /* the table came first: the peer's own messages follow it unchanged */
    assert_int_equal(acc.n, 1);
    mw_future_t *sent = mw_send(acc.c[0], "hello", 5);
    mw_msg_t *m = rxe_recv(p->conn, 5000);
    assert_int_equal(m->len, 5);
    assert_memory_equal(m->data, "hello", 5);
    mw_msg_free(m);
    value_of(sent, 0);
    /* out of bounds of what was shared: refused */
    value_of(mw_read(p->conn, buf, 8, mw_dir_peer_region(p, "scratch"), 4092), -ERANGE);

    /* the store restarted while reads are in flight: they are not touched */
    mw_future_t *reads[16];
    for (int i = 0; i < 16; i++)
        reads[i] = mw_read(p->conn, buf, KV_BYTES, rkv, 0);
    if (on_etcd) {
        etcd_stop(&ef, SIGKILL);
        etcd_start(&ef, true);
    } else {
        redis_stop(rf.pid, SIGKILL);
        rf.pid = redis_start(rf.sock, false);
    }
    for (int i = 0; i < 16; i++)
        value_of(reads[i], 0);
    assert_memory_equal(buf, kv, KV_BYTES);
    /* ...and the name is found again (re-published), a second peer connects */
    mw_dir_peer_t *p2 = NULL;
    for (int i = 0; i < 50 && !p2; i++) {
        mw_future_t *f = mw_dir_connect(cli, "job/prefill/3", NULL);
        if (mw_wait(f) == 0)
            p2 = mw_future_value(f);
        mw_future_unref(f);
        if (!p2)
            loop_for(ctx, 100);
    }
    assert_non_null(p2);
    value_of(mw_read(p2->conn, buf, 4096, mw_dir_peer_region(p2, "kv"), 4096), 0);
    assert_memory_equal(buf, kv + 4096, 4096);

    /* names that lead nowhere */
    value_of(mw_dir_connect(cli, "job/prefill/9", NULL), -ENOENT);
    mw_dir_pub_t dead = {.addrs = "127.0.0.1:9"};   /* no RDMA there */
    value_of(mw_dir_publish(srv, "job/dead/0", &dead), 0);
    mw_conn_opts_t co;
    mw_conn_opts_init(&co);
    co.timeout_ms = 2000;
    mw_future_t *f = mw_dir_connect(cli, "job/dead/0", &co);
    assert_int_not_equal(mw_wait(f), 0);
    printf("dead name: %s\n", mw_future_message(f));
    mw_future_unref(f);

    value_of(mw_conn_close(p->conn), 0);
    value_of(mw_conn_close(p2->conn), 0);
    for (int i = 0; i < acc.n; i++)
        value_of(mw_conn_close(acc.c[i]), 0);
    mw_dir_peer_free(p);
    mw_dir_peer_free(p2);
    mw_free(ctx, buf);
    mw_dir_free(srv);
    mw_dir_free(cli);
    rxe_wait_conns_gone(ctx);
    mw_free(ctx, kv);
    mw_free(ctx, scratch);
    mw_ctx_free(ctx);
}

static mw_conn_t *rxe_connect_addrs(mw_ctx_t *ctx, const char *target)
{
    mw_future_t *f = mw_connect(ctx, target, NULL);
    mw_future_set_timeout(f, 60000);
    if (mw_wait(f))
        fail_msg("connect to %s: %s", target, mw_future_message(f));
    mw_conn_t *c = mw_future_value(f);
    mw_future_unref(f);
    return c;
}

/* Whoever can reach a publication may connect, and each connection gets
 * its own export of every share: a stranger opening 12 connections to one
 * with max_conns 4 holds 4 (the rest refused "busy"), so what it can make
 * the publisher pin is 4 exports; once the publisher frees connections,
 * others get in. */
static void publication_holds_at_most_max_conns(void **state)
{
    (void)state;
    enum { SHARE = 64u << 20, TRIES = 12, MAX = 4 };
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_directory_t *srv = open_dir(ctx);
    uint8_t *kv = mw_alloc(ctx, SHARE);
    memset(kv, 1, SHARE);
    struct accepted h = {0};
    mw_dir_share_t share = {"kv", kv, SHARE};
    mw_dir_pub_t pub = {.listen = "*:0", .on_accept = keep, .arg = &h,
                        .shares = &share, .nshares = 1, .max_conns = MAX};
    double pin0 = rxe_pinned_mib();
    value_of(mw_dir_publish(srv, "job/capped/0", &pub), 0);
    mw_dir_list_t *l = value_of(mw_dir_lookup(srv, "job/capped/0"), 0);
    char target[1100];
    snprintf(target, sizeof target, "%s", l->e[0].addrs);
    mw_dir_list_free(l);

    /* what one connection makes the publisher pin (its export of the
     * share, slots; the first also opens the device) */
    mw_conn_t *mine[TRIES + 2];
    mine[0] = rxe_connect_addrs(ctx, target);
    loop_for(ctx, 200);
    double one = rxe_pinned_mib() - pin0;
    mw_future_t *f[TRIES];
    for (int i = 1; i < TRIES; i++)
        f[i] = mw_connect(ctx, target, NULL);
    int ok = 1, busy = 0;
    for (int i = 1; i < TRIES; i++) {
        mw_future_set_timeout(f[i], 60000);
        if (mw_wait(f[i]) == 0)
            mine[ok++] = mw_future_value(f[i]);
        else
            busy += strstr(mw_future_message(f[i]), "busy") != NULL;
        mw_future_unref(f[i]);
    }
    loop_for(ctx, 200);
    double pinned = rxe_pinned_mib() - pin0;
    printf("%d connections of %d held, %d refused busy; %.0f MiB pinned, %.0f MiB with one\n",
           ok, TRIES, busy, pinned, one);
    assert_int_equal(ok, MAX);
    assert_int_equal(busy, TRIES - MAX);
    assert_int_equal(h.n, MAX);
    /* pinned grows with the connections held (4 x one, give or take
     * what the arena grew by), not with those asked for (12 x one); over
     * TCP nothing is pinned at all */
    if (rxe_over_tcp())
        assert_true(pinned < 1 && one < 1);
    else
        assert_true(pinned < (MAX + 1) * one);

    /* the publisher lets two go: two more get in */
    value_of(mw_conn_close(h.c[0]), 0);
    value_of(mw_conn_close(h.c[1]), 0);
    loop_for(ctx, 200);
    for (int i = 0; i < 2; i++)
        mine[ok++] = rxe_connect_addrs(ctx, target);
    loop_for(ctx, 200);
    assert_int_equal(h.n, MAX + 2);
    for (int i = 0; i < ok; i++)
        mw_conn_abort(mine[i]);
    for (int i = 2; i < h.n; i++)
        mw_conn_abort(h.c[i]);
    mw_dir_free(srv);
    rxe_wait_conns_gone(ctx);
    mw_free(ctx, kv);
    mw_ctx_free(ctx);
}

/* The stranger of the test below, in a process of its own: @n connections
 * by name at once.  Exit status: how many were held (the rest refused
 * "busy"), 250 if another failure, or if a held one cannot read the share
 * it was given. */
static int stranger_main(const char *name, int n)
{
    mw_ctx_t *ctx;
    if (mw_ctx_new(&ctx, NULL, NULL))
        return 250;
    mw_directory_t *d = open_dir(ctx);
    mw_future_t **f = calloc((size_t)n, sizeof *f);
    mw_dir_peer_t **held = calloc((size_t)n, sizeof *held);
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.timeout_ms = 120000;
    for (int i = 0; i < n; i++)
        f[i] = mw_dir_connect(d, name, &o);
    int ok = 0, busy = 0, other = 0;
    for (int i = 0; i < n; i++) {
        mw_future_set_timeout(f[i], 180000);
        if (mw_wait(f[i]) == 0)
            held[ok++] = mw_future_value(f[i]);
        else if (strstr(mw_future_message(f[i]), "busy"))
            busy++;
        else if (other++ == 0)
            printf("stranger: %s\n", mw_future_message(f[i]));
        mw_future_unref(f[i]);
    }
    uint8_t *buf = mw_alloc(ctx, 4096);
    int bad = !buf;
    for (int i = 0; i < ok && !bad; i++) {
        mw_future_t *rd = mw_read(held[i]->conn, buf, 4096, mw_dir_peer_region(held[i], "kv"),
                                  4096);
        bad = mw_wait(rd) != 0 || buf[0] != 1 || buf[4095] != 1;
        mw_future_unref(rd);
    }
    printf("stranger: %d connections of %d held, %d refused busy, %d failed otherwise%s\n",
           ok, n, busy, other, bad ? "; a held one could not read its share" : "");
    for (int i = 0; i < ok; i++) {
        mw_conn_abort(held[i]->conn);
        mw_dir_peer_free(held[i]);
    }
    mw_free(ctx, buf);
    mw_dir_free(d);
    mw_ctx_free(ctx);
    free(f);
    free(held);
    return bad || other ? 250 : ok;
}

/* A stranger opening 200 connections to a publication of a 1 GiB share:
 * each one held gets its own export of it, registered off the publisher's
 * loop, each posts from windows of its memory, not whole regions, and
 * those that waited for the device's opening and registration go on one
 * per turn:
 * the loop keeps turning, and what it pins is bounded by max_conns. */
static void large_share_is_exported_off_the_loop(void **state)
{
    (void)state;
    enum { TRIES = 200, MAX = 16 };
    size_t share_len = (size_t)1 << 30;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_directory_t *srv = open_dir(ctx);
    uint8_t *kv = mw_alloc(ctx, share_len);
    assert_non_null(kv);
    memset(kv, 1, share_len);
    struct accepted *h = calloc(1, sizeof *h);
    mw_dir_share_t share = {"kv", kv, share_len};
    mw_dir_pub_t pub = {.listen = "*:0", .on_accept = keep, .arg = h,
                        .shares = &share, .nshares = 1, .max_conns = MAX};
    double pin0 = rxe_pinned_mib();
    value_of(mw_dir_publish(srv, "job/big/0", &pub), 0);
    char n[16];
    snprintf(n, sizeof n, "%d", TRIES);
    char *argv[] = {self_path, "stranger", "job/big/0", n, rf.url, NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, self_path, NULL, NULL, argv, environ), 0);

    struct lateness t;
    assert_int_equal(lateness_start(ctx, &t), 0);
    t.cpu_bound_ms = lateness_bound_ms(20);
    double t0 = now_s(), pinned = 0;
    int st, held = -1;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        loop_for(ctx, 50);
        double p = rxe_pinned_mib() - pin0;
        if (p > pinned)
            pinned = p;
    }
    lateness_stop(&t);
    held = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    printf("%d of %d connections held in %.1f s; the publisher's loop at most %.1f ms "
           "late, its longest turn %.1f ms of CPU (%d over %.0f); at most %.0f MiB pinned "
           "beside the share's own\n", held, TRIES, now_s() - t0, t.worst_ms, t.worst_cpu_ms,
           t.cpu_over, t.cpu_bound_ms, pinned);
    assert_int_equal(held, MAX);
    /* its exports, and the device's own registration of the memory, made
     * at the first connection; not what 200 would pin */
    assert_true(pinned < (MAX + 2) * (share_len >> 20));
    /* the loop's own work (its timer also waits for the CPUs the stranger,
     * 200 connections on soft-RoCE in a 2-CPU VM, keeps busy): 10-14 ms of
     * CPU at most in the VM, a connection's setup; an export made on the
     * loop took 276-385, the device opened there 15-23.  Work the loop
     * does per held connection shows in all MAX of them; a few turns over
     * the bound are the VM's clock: a vCPU the host set aside still counts
     * as running in the guest (with the host's CPUs shared by other work,
     * 3-6 turns of the 16 connections' went over 20 ms, the worst at 135;
     * on a quiet host one at 116 ms, once; with two VMs and a sanitizer
     * build on the host's 2 CPUs, 11 turns, the worst at 42 ms).  So the
     * count is printed, and the bound is on the worst turn: below what one
     * export made on the loop costs. */
    assert_true(t.worst_cpu_ms < lateness_bound_ms(200));
    for (int i = 0; i < h->n; i++)
        mw_conn_abort(h->c[i]);
    free(h);
    mw_dir_free(srv);
    rxe_wait_conns_gone(ctx);
    mw_free(ctx, kv);
    mw_ctx_free(ctx);
}

/* ------------------------------------------------------------------------
 * Communicators
 * ------------------------------------------------------------------------ */

static int allreduce_ok(mw_comm_t *comm, int rank, int nranks)
{
    int32_t v[1000], sum[1000];
    for (int i = 0; i < 1000; i++)
        v[i] = rank * 1000 + i;
    mw_future_t *f = mw_allreduce(comm, v, sum, 1000, MW_INT32, MW_SUM);
    mw_future_set_timeout(f, 60000);
    int bad = mw_wait(f) != 0;
    if (bad)
        printf("rank %d: allreduce: %s\n", rank, mw_future_message(f));
    mw_future_unref(f);
    for (int i = 0; i < 1000 && !bad; i++)
        bad = sum[i] != nranks * i + 1000 * nranks * (nranks - 1) / 2;
    return bad;
}

/* A job "rejoin...": rank 2 dies after a first allreduce; ranks 0 and 1
 * see their next one fail, free the communicator and form it again through
 * the directory, where a restarted rank 2 (MW_TEST_RESTARTED) joins them. */
static int lose_rank_2_and_reform(mw_directory_t *d, const char *job, int rank, int nranks,
                                  const mw_comm_opts_t *co, mw_comm_t **comm)
{
    if (rank == 2)
        raise(SIGKILL);
    if (!allreduce_ok(*comm, rank, nranks))
        return 1;                             /* rank 2's loss went unnoticed */
    mw_comm_free(*comm);
    *comm = NULL;
    mw_future_t *cf = mw_dir_comm_create(d, job, rank, nranks, co);
    int rc = mw_wait(cf);
    printf("rank %d: formed again with the restarted rank 2: %s\n", rank,
           rc ? mw_future_message(cf) : "ok");
    if (!rc)
        *comm = mw_future_value(cf);
    mw_future_unref(cf);
    return rc ? 1 : allreduce_ok(*comm, rank, nranks);
}

/* One rank: form "JOB" through the directory, allreduce, close. */
static int rank_main(const char *job, int rank, int nranks, unsigned timeout_ms)
{
    mw_ctx_t *ctx;
    if (mw_ctx_new(&ctx, NULL, NULL))
        return 2;
    mw_dir_opts_t o;
    mw_dir_opts_init(&o);
    o.lease_ms = 3000;
    mw_future_t *df = mw_dir_open(ctx, rf.url, &o);
    if (mw_wait(df))
        return 3;
    mw_directory_t *d = mw_future_value(df);
    mw_future_unref(df);
    mw_comm_opts_t co;
    mw_comm_opts_init(&co);
    co.timeout_ms = timeout_ms;
    mw_future_t *cf = mw_dir_comm_create(d, job, rank, nranks, &co);
    int rc = mw_wait(cf);
    if (rc) {
        printf("rank %d: %s (%s)\n", rank, mw_strerror(rc), mw_future_message(cf));
        /* rank 2 is named; so is a rank that gave up first (its entry went) */
        const char *m = strstr(mw_future_message(cf), "missing in the directory: ranks ");
        bool named = m && (!strcmp(m + 32, "2") || strstr(m, ", 2"));
        mw_future_unref(cf);
        mw_dir_free(d);
        mw_ctx_free(ctx);
        return rc == -ETIMEDOUT && named ? 4 : 5;
    }
    mw_comm_t *comm = mw_future_value(cf);
    mw_future_unref(cf);
    int bad = allreduce_ok(comm, rank, nranks);
    if (!bad && !strncmp(job, "rejoin", 6) && !getenv("MW_TEST_RESTARTED"))
        bad = lose_rank_2_and_reform(d, job, rank, nranks, &co, &comm);
    if (comm) {
        mw_future_t *closed = mw_comm_close(comm);
        bad += mw_wait(closed) != 0;
        mw_future_unref(closed);
    }
    mw_dir_free(d);
    mw_ctx_free(ctx);
    printf("rank %d: %s\n", rank, bad ? "wrong result" : "ok");
    return bad ? 6 : 0;
}

static pid_t spawn_rank(const char *job, int rank, int nranks, unsigned timeout_ms)
{
    char a[4][32];
    snprintf(a[0], sizeof a[0], "%d", rank);
    snprintf(a[1], sizeof a[1], "%d", nranks);
    snprintf(a[2], sizeof a[2], "%u", timeout_ms);
    char *argv[] = {self_path, "rank", (char *)job, a[0], a[1], a[2], rf.url, NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, self_path, NULL, NULL, argv, environ), 0);
    return pid;
}

static int reap(pid_t pid)
{
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void comm_forms_past_a_stale_entry(void **state)
{
    (void)state;
    /* rank 2 of an earlier run, its lease still running, at an address
     * where nothing listens */
    store_put_stale("mw:job1/rank/2",
                    "mw-dir 1\naddrs 10.255.255.1:7\ninstance 0000000000000001\n"
                    "tag run=00000000deadbeef nranks=3\n");
    pid_t p[3];
    for (int r = 0; r < 3; r++)
        p[r] = spawn_rank("job1", r == 0 ? 2 : r == 2 ? 0 : r, 3, 60000);  /* 2 first */
    for (int r = 0; r < 3; r++)
        assert_int_equal(reap(p[r]), 0);
}

/* MW_TEST_QUICK (the sanitizer run): the forming and the cancel; these
 * two wait out deadlines and restarts, the same code over again */
static void comm_missing_rank_is_named(void **state)
{
    (void)state;
    if (getenv("MW_TEST_QUICK"))
        skip();
    /* rank 0 first, published before rank 1 starts its clock: on a slow
     * VM opening the device takes seconds */
    pid_t p0 = spawn_rank("job2", 0, 3, 5000);
    for (int i = 0; i < 400 && !store_exists("mw:job2/rank/0"); i++)
        usleep(20000);
    pid_t p1 = spawn_rank("job2", 1, 3, 5000);
    assert_int_equal(reap(p0), 4);           /* -ETIMEDOUT, and the output names rank 2 */
    assert_int_equal(reap(p1), 4);
}

static void comm_restarted_rank0_starts_over(void **state)
{
    (void)state;
    if (getenv("MW_TEST_QUICK"))
        skip();
    /* ranks 1 and 2 find a rank 0 of an earlier run (dead) and try it,
     * then the new rank 0 comes with a new run */
    store_put_stale("mw:job3/rank/0",
                    "mw-dir 1\naddrs 10.255.255.1:7\ninstance 0000000000000002\n"
                    "tag run=00000000cafef00d nranks=3\n");
    pid_t p1 = spawn_rank("job3", 1, 3, 60000), p2 = spawn_rank("job3", 2, 3, 60000);
    sleep(2);
    pid_t p0 = spawn_rank("job3", 0, 3, 60000);
    assert_int_equal(reap(p0), 0);
    assert_int_equal(reap(p1), 0);
    assert_int_equal(reap(p2), 0);
}

/* A rank that dies is restarted and rejoins: the survivors form the
 * communicator again through the directory, with it. */
static void comm_restarted_rank_rejoins(void **state)
{
    (void)state;
    pid_t p[3];
    for (int r = 0; r < 3; r++)
        p[r] = spawn_rank("rejoin5", r, 3, 60000);
    assert_int_equal(reap(p[2]), 128 + SIGKILL);
    setenv("MW_TEST_RESTARTED", "1", 1);
    pid_t again = spawn_rank("rejoin5", 2, 3, 60000);
    unsetenv("MW_TEST_RESTARTED");
    assert_int_equal(reap(again), 0);
    assert_int_equal(reap(p[0]), 0);
    assert_int_equal(reap(p[1]), 0);
}

/* The port a rank publishes stays its own while the ranks gather: another
 * listener (of any process; or an outgoing connection given it as its
 * source port) cannot take it, and the communicator listens there once
 * the last rank comes.  (Freed between the publish and the forming, the
 * port was once taken by another rank's connection: "cannot start".) */
static void comm_port_stays_ours_while_ranks_gather(void **state)
{
    (void)state;
    mw_ctx_t *ctx, *other;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    assert_int_equal(mw_ctx_new(&other, NULL, NULL), 0);
    mw_directory_t *d = open_dir(ctx);
    mw_comm_opts_t co;
    mw_comm_opts_init(&co);
    co.timeout_ms = 60000;
    mw_future_t *cf = mw_dir_comm_create(d, "job6", 0, 2, &co);
    for (int i = 0; i < 100 && !store_exists("mw:job6/rank/0"); i++)
        loop_for(ctx, 50);
    mw_dir_list_t *l = value_of(mw_dir_lookup(d, "job6/rank/0"), 0);
    const char *colon = strrchr(l->e[0].addrs, ':');
    assert_non_null(colon);
    char at[16];
    snprintf(at, sizeof at, "*:%s", colon + 1);
    mw_dir_list_free(l);
    mw_listener_t *thief = NULL;
    int rc = mw_listen(other, at, NULL, keep, NULL, &thief);
    if (rc == 0)
        fail_msg("another listener took %s, the port rank 0 published", at);
    pid_t p1 = spawn_rank("job6", 1, 2, 60000);
    mw_comm_t *comm = value_of(cf, 0);
    assert_int_equal(allreduce_ok(comm, 0, 2), 0);
    mw_future_t *closed = mw_comm_close(comm);
    assert_int_equal(mw_wait(closed), 0);
    mw_future_unref(closed);
    assert_int_equal(reap(p1), 0);
    mw_dir_free(d);
    mw_ctx_free(other);
    mw_ctx_free(ctx);
}

/* The impatient caller: cancelled while it waits for ranks that never
 * come, it stops at once and takes its entry back. */
static void comm_cancelled_takes_its_entry_back(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    mw_directory_t *d = open_dir(ctx);
    mw_future_t *cf = mw_dir_comm_create(d, "job4", 0, 2, NULL);
    for (int i = 0; i < 100 && !store_exists("mw:job4/rank/0"); i++)
        loop_for(ctx, 50);
    assert_true(store_exists("mw:job4/rank/0"));
    assert_int_equal(mw_future_cancel(cf), 0);
    assert_int_equal(mw_wait(cf), -ECANCELED);
    mw_future_unref(cf);
    loop_for(ctx, 300);
    assert_false(store_exists("mw:job4/rank/0"));
    mw_dir_free(d);
    mw_ctx_free(ctx);
}

static int group_setup(void **state)
{
    (void)state;
    redis_fixture_up(&rf);
    if (on_etcd) {
        etcd_fixture_up(&ef);
        snprintf(rf.url, sizeof rf.url, "%s", ef.url);
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    redis_fixture_down(&rf);
    if (on_etcd)
        etcd_fixture_down(&ef);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rxe_require(2, addrs);
    if (readlink("/proc/self/exe", self_path, sizeof self_path - 1) < 0)
        return 1;
    if (argc == 5 && !strcmp(argv[1], "stranger")) {
        snprintf(rf.url, sizeof rf.url, "%s", argv[4]);
        return stranger_main(argv[2], atoi(argv[3]));
    }
    if (argc == 7 && !strcmp(argv[1], "rank")) {
        snprintf(rf.url, sizeof rf.url, "%s", argv[6]);
        return rank_main(argv[2], atoi(argv[3]), atoi(argv[4]), (unsigned)atoi(argv[5]));
    }
    const char *store = getenv("MW_TEST_STORE");
    on_etcd = store && !strcmp(store, "etcd");
    if (!redis_installed() || (on_etcd && !etcd_installed())) {
        printf("SKIP: %s not installed (scripts/setup installs it)\n",
               redis_installed() ? ETCD_SERVER : REDIS_SERVER);
        return SKIP_EXIT;
    }
    if (getenv("MW_TEST_FILTER"))
        cmocka_set_test_filter(getenv("MW_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(connect_by_name_reaches_shared_regions),
        cmocka_unit_test(publication_holds_at_most_max_conns),
        cmocka_unit_test(large_share_is_exported_off_the_loop),
        cmocka_unit_test(comm_forms_past_a_stale_entry),
        cmocka_unit_test(comm_missing_rank_is_named),
        cmocka_unit_test(comm_restarted_rank0_starts_over),
        cmocka_unit_test(comm_restarted_rank_rejoins),
        cmocka_unit_test(comm_cancelled_takes_its_entry_back),
        cmocka_unit_test(comm_port_stays_ours_while_ranks_gather),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
