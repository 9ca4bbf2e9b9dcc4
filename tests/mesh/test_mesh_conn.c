/* Run on every node of the mesh at once: each node connects to every other
 * node by name ("node<j>", from the VM's /etc/hosts) and the connection uses
 * the local NIC on the subnet shared with that peer; a message crosses each
 * connection both ways. */
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

#define PORT 7471
#define MAXN 16

static int me, nodes;
static mw_conn_t *accepted[MAXN];
static int naccepted;

static void on_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    (void)arg;
    if (naccepted < MAXN)
        accepted[naccepted++] = c;
}

/* Connect to node @j by name, retrying while it is still starting up. */
static mw_conn_t *connect_node(mw_ctx_t *ctx, int j)
{
    char a[64];
    snprintf(a, sizeof a, "node%d:%d", j, PORT);
    for (int tries = 0; tries < 120; tries++) {
        mw_future_t *f = mw_connect(ctx, a, NULL);
        int rc = mw_wait(f);
        mw_conn_t *c = rc ? NULL : mw_future_value(f);
        if (rc && tries % 10 == 0)
            printf("node%d -> %s: %s (retrying)\n", me, a, mw_future_message(f));
        mw_future_unref(f);
        if (c)
            return c;
        loop_for(ctx, 500);
    }
    fail_msg("node%d cannot connect to %s", me, a);
    return NULL;
}

/* The RDMA device whose netdev holds local address @ip (rxe's "parent"). */
static void expect_device_of_local(const char *local, const char *dev)
{
    char ip[96];
    snprintf(ip, sizeof ip, "%s", local);
    char *colon = strrchr(ip, ':');
    if (colon)
        *colon = 0;
    char cmd[256], parent[64] = "", want[64] = "";
    snprintf(cmd, sizeof cmd, "ip -o -4 addr show | awk '$4 ~ /^%s\\//{print $2}'", ip);
    FILE *p = popen(cmd, "r");
    if (p && fscanf(p, "%63s", parent) != 1)
        parent[0] = 0;
    if (p)
        pclose(p);
    snprintf(cmd, sizeof cmd, "grep -l '^%s$' /sys/class/infiniband/*/parent | cut -d/ -f5", parent);
    p = popen(cmd, "r");
    if (p && fscanf(p, "%63s", want) != 1)
        want[0] = 0;
    if (p)
        pclose(p);
    printf("  local %s is on %s (netdev %s); connection uses %s\n", ip, want, parent, dev);
    assert_string_equal(dev, want);
}

static void barrier(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%d", getenv("MW_SHARED"), name, me);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    for (int waited = 0; waited < 600; waited++) {
        int n = 0;
        for (int j = 0; j < nodes; j++) {
            snprintf(path, sizeof path, "%s/%s.%d", getenv("MW_SHARED"), name, j);
            n += access(path, F_OK) == 0;
        }
        if (n == nodes)
            return;
        usleep(200000);
    }
    fail_msg("barrier %s: peers did not arrive", name);
}

static void every_node_reaches_every_node_on_the_shared_subnet(void **state)
{
    (void)state;
    mw_ctx_t *ctx;
    mw_listener_t *l;
    assert_int_equal(mw_ctx_new(&ctx, NULL, NULL), 0);
    char la[32];
    snprintf(la, sizeof la, "*:%d", PORT);
    assert_int_equal(mw_listen(ctx, la, NULL, on_accept, NULL, &l), 0);
    mw_conn_t *out[MAXN] = {0};
    for (int j = 0; j < nodes; j++) {
        if (j == me)
            continue;
        out[j] = connect_node(ctx, j);
        mw_conn_stats_t st;
        mw_conn_stats(out[j], &st);
        printf("node%d -> node%d: %s -> %s on %s\n", me, j, st.local, st.remote, st.device);
        expect_device_of_local(st.local, st.device);
        int v = me * 100 + j;
        mw_future_t *s = mw_send(out[j], &v, sizeof v);
        assert_int_equal(mw_wait(s), 0);
        mw_future_unref(s);
    }
    while (naccepted < nodes - 1)
        loop_for(ctx, 50);
    for (int i = 0; i < naccepted; i++) {
        mw_future_t *r = mw_recv(accepted[i]);
        assert_int_equal(mw_wait(r), 0);
        mw_msg_t *m = mw_future_value(r);
        int v = *(int *)m->data;
        assert_int_equal(v % 100, me);              /* meant for this node */
        printf("node%d got %d from node%d\n", me, v, v / 100);
        mw_msg_free(m);
        mw_future_unref(r);
    }
    barrier("conn-done");                          /* nobody closes early */
    for (int j = 0; j < nodes; j++)
        if (out[j]) {
            mw_future_t *f = mw_conn_close(out[j]);
            assert_int_equal(mw_wait(f), 0);
            mw_future_unref(f);
        }
    for (int i = 0; i < naccepted; i++) {
        mw_future_t *f = mw_conn_close(accepted[i]);
        mw_wait(f);                                 /* the peer may have closed first */
        mw_future_unref(f);
    }
    mw_listener_free(l);
    mw_ctx_free(ctx);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *addrs[1];
    rxe_require(1, addrs);
    if (!getenv("MW_NODE") || !getenv("MW_NODES") || !getenv("MW_SHARED")) {
        printf("SKIP: not in a mesh (run through tools/rxe-vm mesh)\n");
        return SKIP_EXIT;
    }
    me = atoi(getenv("MW_NODE"));
    nodes = atoi(getenv("MW_NODES"));
    if (nodes < 2 || nodes > MAXN) {
        printf("SKIP: a mesh needs 2..%d nodes\n", MAXN);
        return SKIP_EXIT;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_node_reaches_every_node_on_the_shared_subnet),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
