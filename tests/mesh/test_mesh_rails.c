/* Run on every node of a mesh with two links between every pair (rxe-vm
 * mesh -k 2): node i serves its pool to node i-1 and is a client of node
 * i+1 over a rail group of two connections, one per link.  Both rails
 * carry bytes; then, mid-transfer, the client takes its own NIC of rail 1
 * down (ip link set down; the link slowed first, so that rail 1's slices
 * are still out when it goes): the rail is taken out within 5 s and the
 * transfer completes on rail 0 with every byte right within 30 s.
 *
 * The rail coming back (a new connection, probed, used again) is tested in
 * the rxe suite (test_rails.c), not here: on rxe (Linux 6.1) a device
 * whose link went down while it had connections answers no connection
 * request afterwards -- from any process -- until it is created again,
 * and re-creating it (rdma link delete) did not always finish within 30 s
 * with this process alive. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "meshwire.h"
#include "../rxe/rxe_util.h"

#define PORT 7475
#define POOL (64u << 20)           /* 4 slices: 2 a rail; 128 MiB took twice as long, found no more */
#define SLICE (16u << 20)         /* in flight on a rail: up to 64 MiB, seconds of work */
#define FAILOVER_BOUND_S 5.0      /* link down to the rail taken out */
#define COMPLETE_BOUND_S 30.0     /* link down to the transfer's completion */
#define RAIL1_SLOW "rate 10mbit"  /* rail 1's 2 slices out for 27 s, not seconds */
#define MAXC 16

static int me, nodes;
static mw_ctx_t *ctx;
static uint8_t *pool, *src, *back;
static mw_conn_t *accepted[MAXC];
static mw_listener_t *l;
static int naccepted;

/* Serving: every connection gets the pool exported and its descriptor. */
static void on_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    (void)arg;
    static mw_remote_t sent[MAXC];              /* a send reads its buffer later */
    if (naccepted == MAXC || mw_mem_export(c, pool, POOL, &sent[naccepted]) != 0) {
        mw_conn_abort(c);
        return;
    }
    mw_future_unref(mw_send(c, &sent[naccepted], sizeof sent[0]));
    accepted[naccepted++] = c;
}

/* Node @j's address on link @k to this node (MW_PEER_LINKS), or NULL. */
static char *peer_link(int j, int k)
{
    static char out[64];
    char *all = strdup(getenv("MW_PEER_LINKS")), *save, *tok = strtok_r(all, ",", &save);
    for (int i = 0; tok && i < j; i++)
        tok = strtok_r(NULL, ",", &save);
    char *a = tok ? strtok_r(tok, "+", &save) : NULL;
    for (int i = 0; a && i < k; i++)
        a = strtok_r(NULL, "+", &save);
    if (a)
        snprintf(out, sizeof out, "%s", a);
    free(all);
    return a ? out : NULL;
}

/* A connection over @tp to @addr (retrying while the peer starts or its
 * link comes up) and the pool's descriptor it sends. */
static mw_conn_t *connect_over(const char *addr, mw_transport_t tp, mw_remote_t *r)
{
    char a[96];
    snprintf(a, sizeof a, "%s:%d", addr, PORT);
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    o.transport = tp;
    for (int tries = 0; tries < 120; tries++) {
        mw_future_t *f = mw_connect(ctx, a, &o);
        if (mw_wait(f) == 0) {
            mw_conn_t *c = mw_future_value(f);
            mw_future_unref(f);
            mw_msg_t *m = rxe_recv(c, 10000);
            assert_int_equal(m->len, sizeof *r);
            memcpy(r, m->data, sizeof *r);
            mw_msg_free(m);
            return c;
        }
        if (tries % 10 == 9)
            print_message("node%d: connecting to %s: %s\n", me, a, mw_future_message(f));
        mw_future_unref(f);
        loop_for(ctx, 500);
    }
    fail_msg("cannot connect to %s", a);
    return NULL;
}

static mw_conn_t *connect_rail(const char *addr, mw_remote_t *r)
{
    return connect_over(addr, MW_TRANSPORT_AUTO, r);
}

/* Wait (running the loop) until every node reached step @name. */
static void barrier(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/rails-%s-%d", getenv("MW_SHARED"), name, me);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    for (int j = 0; j < nodes; j++) {
        snprintf(path, sizeof path, "%s/rails-%s-%d", getenv("MW_SHARED"), name, j);
        for (int i = 0; i < 1200 && access(path, F_OK) != 0; i++)
            loop_for(ctx, 100);
        assert_int_equal(access(path, F_OK), 0);
    }
}

static mw_rail_stats_t rail(mw_rails_t *g, int i)
{
    mw_rail_stats_t st;
    assert_int_equal(mw_rails_stats(g, i, &st), 0);
    return st;
}

static void run(mw_future_t *f, const char *what)
{
    int rc = mw_wait(f);
    if (rc)
        fail_msg("%s: %s: %s", what, mw_strerror(rc), mw_future_message(f));
    mw_future_unref(f);
}

/* Write @src with pattern @round over the rails and check it by reading it
 * back over them. */
static void write_and_check(mw_rails_t *g, unsigned round)
{
    for (size_t i = 0; i < POOL; i += 8) {
        uint64_t v = (uint64_t)round << 56 | (uint64_t)me << 48 | i;
        memcpy(src + i, &v, 8);
    }
    run(mw_rails_write(g, src, POOL, 0), "write");
    memset(back, 0, POOL);
    run(mw_rails_read(g, back, POOL, 0), "read back");
    assert_memory_equal(back, src, POOL);
}

/* The netdev holding local address @local ("a.b.c.d:port"). */
static const char *netdev_of(const char *local)
{
    static char nd[64];
    char cmd[160];
    snprintf(cmd, sizeof cmd, "ip -o -4 addr show | awk '$4 ~ \"^%.*s/\" {print $2}'",
             (int)(strchr(local, ':') - local), local);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(nd, sizeof nd, p));
    pclose(p);
    nd[strcspn(nd, "\n")] = '\0';
    return nd;
}

/* Replace @dev's root qdisc by netem @spec (NULL: take it away). */
static void netem(const char *dev, const char *spec)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "tc qdisc del dev %s root 2>/dev/null; %s%s%s%s", dev,
             spec ? "tc qdisc add dev " : "true", spec ? dev : "", spec ? " root netem " : "",
             spec ? spec : "");
    assert_int_equal(system(cmd), 0);
}

static void rails_between_two_links(void **state)
{
    (void)state;
    int j = (me + 1) % nodes;
    mw_remote_t r[2];
    mw_conn_t *c[2];
    for (int k = 0; k < 2; k++)
        c[k] = connect_rail(peer_link(j, k), &r[k]);
    mw_rails_t *g;
    assert_int_equal(mw_rails_new(ctx, SLICE, &g), 0);
    for (int k = 0; k < 2; k++) {
        int rc = mw_rails_add(g, c[k], &r[k]);
        if (rc != k)
            fail_msg("rail %d: %s (region %#llx+%llu, rail 0's %#llx+%llu)", k, mw_strerror(rc),
                     (unsigned long long)r[k].addr, (unsigned long long)r[k].len,
                     (unsigned long long)r[0].addr, (unsigned long long)r[0].len);
    }

    /* Both rails carry bytes.  Under load rxe itself may fail a write
     * ("remote invalid request": seen once in a fresh-check, with 3 VMs on
     * 2 cores; see conn.c's ACK timeout): the rail is taken out and the
     * transfer completes on the other, as it should.  Such a rail is given
     * a new connection and the spread is measured again, twice at most. */
    uint64_t before[2] = {0, 0};
    for (int round = 0;; round++) {
        write_and_check(g, 1);
        int down = 0;
        for (int k = 0; k < 2; k++) {
            mw_rail_stats_t st = rail(g, k);
            print_message("node%d -> node%d rail %d on %s: %llu MiB%s%s\n", me, j, k, st.device,
                          (unsigned long long)((st.bytes - before[k]) >> 20),
                          st.state == MW_RAIL_DOWN ? ", taken out: " : "",
                          st.state == MW_RAIL_DOWN ? st.why : "");
            if (st.state == MW_RAIL_DOWN && round < 2) {
                mw_conn_abort(c[k]);
                c[k] = connect_rail(peer_link(j, k), &r[k]);
                assert_int_equal(mw_rails_replace(g, k, c[k], &r[k]), 0);
                for (int i = 0; i < 500 && rail(g, k).state == MW_RAIL_PROBING; i++)
                    loop_for(ctx, 10);               /* probed, then used */
                down++;
            }
        }
        if (!down)
            break;
        for (int k = 0; k < 2; k++)
            before[k] = rail(g, k).bytes;
    }
    for (int k = 0; k < 2; k++)
        assert_true(rail(g, k).bytes - before[k] >= POOL / 4);

    /* rail 1's link goes down under a transfer.  With two nodes both
     * directions share the links: node 0 alone takes its NIC down. */
    barrier("before-failover");
    mw_conn_stats_t cs;
    assert_int_equal(mw_conn_stats(c[1], &cs), 0);
    if (nodes > 2 || me == 0) {
        for (size_t i = 0; i < POOL; i += 8) {
            uint64_t v = (uint64_t)2 << 56 | (uint64_t)me << 48 | i;
            memcpy(src + i, &v, 8);
        }
        char dev[64], down[160], up[160];
        snprintf(dev, sizeof dev, "%s", netdev_of(cs.local));
        snprintf(down, sizeof down, "ip link set dev %s down", dev);
        snprintf(up, sizeof up, "ip link set dev %s up", dev);
        /* rail 1's two slices (posted by the call) must still be out when
         * its link goes: unslowed, rxe finished them within the 1.7 s 'ip
         * link set down' took (CI, 3 VMs), and nothing was posted again */
        netem(dev, RAIL1_SLOW);
        uint64_t s0 = rail(g, 1).slices;
        mw_future_t *f = mw_rails_write(g, src, POOL, 0);
        double t0 = now_s();
        assert_int_equal(system(down), 0);       /* the loop stopped: they stay out */
        double cmd_s = now_s() - t0;
        while (rail(g, 1).state != MW_RAIL_DOWN && now_s() - t0 < FAILOVER_BOUND_S)
            loop_for(ctx, 1);
        double out = now_s() - t0;
        run(f, "write across the link going down");
        double took = now_s() - t0;
        mw_rail_stats_t st = rail(g, 1);
        print_message("node%d: link of rail 1 down mid-transfer (ip link set down took %.3f s): "
                      "rail out after %.3f s, transfer complete %.3f s after the link went (rail 1 "
                      "%s, %llu slices posted again: %s)\n", me, cmd_s, out, took,
                      st.state == MW_RAIL_DOWN ? "down" : "still up",
                      (unsigned long long)st.reposted, st.why);
        assert_int_equal(st.state, MW_RAIL_DOWN);
        /* from the link going down: under load the command itself took
         * 5.3 s once, and the rail was out 1 ms after it returned */
        assert_true(out - cmd_s < FAILOVER_BOUND_S);
        assert_true(took < COMPLETE_BOUND_S);
        assert_true(st.reposted >= 1);
        assert_int_equal(st.slices, s0);         /* none of them completed on it */
        memset(back, 0, POOL);
        run(mw_rails_read(g, back, POOL, 0), "read back");
        assert_memory_equal(back, src, POOL);
        assert_int_equal(system(up), 0);
        netem(dev, NULL);
    }
    barrier("done");

    mw_rails_free(g);
    rxe_close_conn(c[0]);
    mw_conn_abort(c[1]);                         /* its link went down (here or, two
                                                    nodes, at the peer) */
}

/* --- a lossy link: the RDMA rail fails over to a TCP rail ------------------ */

#define LOSSY_BYTES (50u << 20)
#define LOSSY_NETEM "loss 1% delay 1ms 1ms"
#define LOSSY_BOUND_S 120.0       /* RC alone gave up after 102 s at this loss */

/* The netdev the route to @peer ("a.b.c.d") leaves by. */
static const char *netdev_to(const char *peer)
{
    static char nd[64];
    char cmd[160];
    snprintf(cmd, sizeof cmd, "ip -o route get %s | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p'",
             peer);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(nd, sizeof nd, p));
    pclose(p);
    nd[strcspn(nd, "\n")] = '\0';
    return nd;
}

static void fill(size_t len, unsigned round)
{
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = (uint64_t)round << 56 | (uint64_t)me << 48 | i;
        memcpy(src + i, &v, 8);
    }
}

static void check_back(mw_rails_t *g, size_t len)
{
    memset(back, 0, len);
    run(mw_rails_read(g, back, len, 0), "read back");
    assert_memory_equal(back, src, len);
}

/* Node 0 writes 50 MB to node 1 over an RDMA rail and a TCP rail on the
 * same link, which drops 1% of packets each way with 1 ms +- 1 ms of
 * delay (so reordered too).  RC's go-back-N resends make next to no
 * progress there; the group judges the RDMA rail stalled, fails it, and the
 * transfer finishes over TCP, every byte right.  On the link made clean
 * again, a new RDMA connection replaces the rail and takes its share. */
static void a_lossy_rdma_rail_fails_over_to_tcp(void **state)
{
    (void)state;
    const char *peer = me < 2 ? peer_link(me ^ 1, 0) : NULL;
    char dev[64] = "";
    mw_rails_t *g = NULL;
    mw_conn_t *c[2] = {NULL, NULL};
    mw_remote_t r[2];
    if (peer)
        snprintf(dev, sizeof dev, "%s", netdev_to(peer));
    if (me == 0) {
        c[0] = connect_over(peer, MW_TRANSPORT_RDMA, &r[0]);
        c[1] = connect_over(peer, MW_TRANSPORT_TCP, &r[1]);
        assert_int_equal(mw_rails_new(ctx, 1 << 20, &g), 0);
        assert_int_equal(mw_rails_set_stall(g, 2000), 0);   /* 1 MiB slices: ~10 ms each here */
        for (int k = 0; k < 2; k++)
            assert_int_equal(mw_rails_add(g, c[k], &r[k]), k);
        fill(LOSSY_BYTES, 3);
        run(mw_rails_write(g, src, LOSSY_BYTES, 0), "write on the clean link");
    }
    barrier("lossy-ready");
    if (peer)
        netem(dev, LOSSY_NETEM);
    barrier("lossy-on");
    if (me == 0) {
        fill(LOSSY_BYTES, 4);
        uint64_t b0 = rail(g, 0).bytes, b1 = rail(g, 1).bytes;
        double t0 = now_s();
        mw_future_t *f = mw_rails_write(g, src, LOSSY_BYTES, 0);
        while (mw_future_state(f) == MW_FUTURE_PENDING && now_s() - t0 < LOSSY_BOUND_S)
            loop_for(ctx, 100);
        double took = now_s() - t0;
        mw_rail_stats_t st0 = rail(g, 0), st1 = rail(g, 1);
        print_message("node0: 50 MB over a link at %s in %.1f s: RDMA rail %llu MiB (%s%s), "
                      "TCP rail %llu MiB (%s)\n", LOSSY_NETEM, took,
                      (unsigned long long)((st0.bytes - b0) >> 20),
                      st0.state == MW_RAIL_DOWN ? "taken out: " : "up",
                      st0.state == MW_RAIL_DOWN ? st0.why : "",
                      (unsigned long long)((st1.bytes - b1) >> 20),
                      st1.state == MW_RAIL_DOWN ? "down" : "up");
        assert_int_not_equal(mw_future_state(f), MW_FUTURE_PENDING);
        run(f, "write over the lossy link");
        assert_int_equal(st0.state, MW_RAIL_DOWN);
        assert_int_equal(st1.state, MW_RAIL_UP);
        assert_true(st1.bytes - b1 >= LOSSY_BYTES / 2);
    }
    barrier("lossy-measured");
    if (peer)
        netem(dev, NULL);
    barrier("lossy-off");
    if (me == 0) {
        check_back(g, LOSSY_BYTES);              /* over TCP: the RDMA rail is out */
        mw_conn_abort(c[0]);
        c[0] = connect_over(peer, MW_TRANSPORT_RDMA, &r[0]);
        assert_int_equal(mw_rails_replace(g, 0, c[0], &r[0]), 0);
        for (int i = 0; i < 500 && rail(g, 0).state == MW_RAIL_PROBING; i++)
            loop_for(ctx, 10);
        assert_int_equal(rail(g, 0).state, MW_RAIL_UP);
        uint64_t b0 = rail(g, 0).bytes;
        fill(LOSSY_BYTES, 5);
        run(mw_rails_write(g, src, LOSSY_BYTES, 0), "write on the clean link again");
        uint64_t took0 = rail(g, 0).bytes - b0;
        print_message("node0: the link clean again: the new RDMA rail took %llu MiB of 50\n",
                      (unsigned long long)(took0 >> 20));
        /* Used again, slice after slice: each slice goes to the rail with
         * the fewest bytes out, so the share follows the rails' speeds,
         * and under emulation rxe's against TCP's varies (6, 9, 10 and 22
         * MiB of 50 in four runs of the mesh, the rail up throughout). */
        assert_int_equal(rail(g, 0).state, MW_RAIL_UP);
        assert_true(took0 >= LOSSY_BYTES / 10);
        check_back(g, LOSSY_BYTES);
        mw_rails_free(g);
        for (int k = 0; k < 2; k++)
            mw_conn_abort(c[k]);
    }
    barrier("lossy-done");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!getenv("MW_NODE") || !getenv("MW_NODES") || !getenv("MW_PEER_LINKS")) {
        printf("SKIP: run through tools/rxe-vm mesh -k 2\n");
        return SKIP_EXIT;
    }
    me = atoi(getenv("MW_NODE"));
    nodes = atoi(getenv("MW_NODES"));
    if (nodes < 2 || !peer_link((me + 1) % nodes, 1) || strcmp(getenv("MW_RXE_WHERE"), "vm")) {
        printf("SKIP: needs two links to the next node, in VMs (rxe-vm mesh -k 2): "
               "the test takes a link down\n");
        return SKIP_EXIT;
    }
    if (getenv("MW_TEST_FILTER"))
        cmocka_set_test_filter(getenv("MW_TEST_FILTER"));
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    pool = mw_alloc(ctx, POOL);
    src = mw_alloc(ctx, POOL);
    back = mw_alloc(ctx, POOL);
    char a[32];
    snprintf(a, sizeof a, "*:%d", PORT);
    assert_int_equal(mw_listen(ctx, a, NULL, on_accept, NULL, &l), 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rails_between_two_links),
        cmocka_unit_test(a_lossy_rdma_rail_fails_over_to_tcp),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < naccepted; i++)
        mw_conn_abort(accepted[i]);
    mw_listener_free(l);
    mw_free(ctx, pool);
    mw_free(ctx, src);
    mw_free(ctx, back);
    mw_ctx_free(ctx);
    return failed;
}
