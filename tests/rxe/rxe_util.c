#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <event2/event.h>

#include "rxe_util.h"
#include "cm/cm.h"

static bool transport_is(const char *name)
{
    const char *t = getenv("MW_TRANSPORT");
    return t && !strcmp(t, name);
}

static bool no_rdma_device(void)
{
    static int none = -1;
    if (none < 0) {
        int num = 0;
        struct ibv_device **list = ibv_get_device_list(&num);
        if (list)
            ibv_free_device_list(list);
        none = num == 0;
    }
    return none;
}

bool rxe_over_tcp(void)
{
    return transport_is("tcp") || (transport_is("auto") && no_rdma_device());
}

mw_transport_t rxe_path(void)
{
    return transport_is("rdma") ? MW_TRANSPORT_RDMA
         : transport_is("tcp")  ? MW_TRANSPORT_TCP : MW_TRANSPORT_LOCAL;
}

const char *rxe_path_name(int t)
{
    return t == MW_TRANSPORT_LOCAL ? "same-host path" : t == MW_TRANSPORT_TCP ? "TCP" : "RDMA";
}

int rxe_fixed_port(unsigned salt, int span)
{
    int low = 32768;              /* the kernel's default, where unreadable */
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &low) != 1)
            low = 32768;
        fclose(f);
    }
    int first = 10000, room = low - span - first;
    return room > 0 ? first + (int)(salt % (unsigned)room) : first;
}

void rxe_require(int n, const char **addrs)
{
    if (!rxe_over_tcp() && no_rdma_device()) {
        printf("SKIP: no RDMA device (run through tools/rxe-vm)\n");
        exit(SKIP_EXIT);
    }
    static char buf[1024];
    const char *env = getenv("MW_ADDRS");
    if (!env && rxe_over_tcp())   /* loopback: every 127/8 address is this host */
        env = "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4";
    snprintf(buf, sizeof buf, "%s", env ? env : "");
    int got = 0;
    for (char *save, *t = strtok_r(buf, ",", &save); t && got < n; t = strtok_r(NULL, ",", &save))
        addrs[got++] = t;
    if (got < n) {
        printf("SKIP: needs %d RDMA addresses in MW_ADDRS, has %d\n", n, got);
        exit(SKIP_EXIT);
    }
}

static int expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
                  struct rdma_cm_id **id)
{
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ch, &ev) < 0)
        return -errno;
    int ok = ev->event == want;
    if (!ok)
        fprintf(stderr, "rdma_cm: got %s (status %d), wanted %s\n", rdma_event_str(ev->event),
                ev->status, rdma_event_str(want));
    if (id)
        *id = ev->id;
    rdma_ack_cm_event(ev);
    return ok ? 0 : -EPROTO;
}

static int make_qp(mw_ctx_t *ctx, struct rdma_cm_id *id, int depth, struct mw__dev **devp)
{
    int rc = mw__dev_get(ctx, id->verbs, devp);
    if (rc < 0)
        return rc;
    /* the helper thread registers the context's memory with a new device */
    while (!(*devp)->ready)
        event_base_loop(ctx->base, EVLOOP_ONCE);
    if (!(*devp)->pd)                 /* it could not be opened */
        return -ENODEV;
    struct ibv_cq *cq = (*devp)->cq->cq;
    struct ibv_qp_init_attr a = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = depth, .max_recv_wr = depth, .max_send_sge = 1, .max_recv_sge = 1},
    };
    return rdma_create_qp(id, (*devp)->pd, &a) < 0 ? -errno : 0;
}

static int sockaddr_of(const char *ip, int port, struct sockaddr_in *sa)
{
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    return inet_pton(AF_INET, ip, &sa->sin_addr) == 1 ? 0 : -EINVAL;
}

int qp_pair_connect(mw_ctx_t *ctx, const char *src, const char *dst, int depth,
                    struct qp_pair *p)
{
    memset(p, 0, sizeof *p);
    struct sockaddr_in s, d;
    struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1,
                                 .retry_count = 7, .rnr_retry_count = 7};
    int rc;
    if (sockaddr_of(src, 0, &s) < 0 || sockaddr_of(dst, 0, &d) < 0)
        return -EINVAL;
    if (!(p->ch = rdma_create_event_channel()))
        return -errno;
    if (rdma_create_id(p->ch, &p->listen, NULL, RDMA_PS_TCP) < 0 ||
        rdma_bind_addr(p->listen, (struct sockaddr *)&d) < 0 || rdma_listen(p->listen, 4) < 0 ||
        rdma_create_id(p->ch, &p->client, NULL, RDMA_PS_TCP) < 0)
        return -errno;
    d.sin_port = rdma_get_src_port(p->listen);
    if (rdma_resolve_addr(p->client, (struct sockaddr *)&s, (struct sockaddr *)&d, 2000) < 0)
        return -errno;
    if ((rc = expect(p->ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL)) < 0)
        return rc;
    if (rdma_resolve_route(p->client, 2000) < 0)
        return -errno;
    if ((rc = expect(p->ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL)) < 0 ||
        (rc = make_qp(ctx, p->client, depth, &p->cdev)) < 0)
        return rc;
    if (rdma_connect(p->client, &cp) < 0)
        return -errno;
    if ((rc = expect(p->ch, RDMA_CM_EVENT_CONNECT_REQUEST, &p->server)) < 0 ||
        (rc = make_qp(ctx, p->server, depth, &p->sdev)) < 0)
        return rc;
    if (rdma_accept(p->server, &cp) < 0)
        return -errno;
    /* both ends report ESTABLISHED, in either order */
    if ((rc = expect(p->ch, RDMA_CM_EVENT_ESTABLISHED, NULL)) < 0 ||
        (rc = expect(p->ch, RDMA_CM_EVENT_ESTABLISHED, NULL)) < 0)
        return rc;
    return 0;
}

void qp_pair_close(struct qp_pair *p)
{
    struct rdma_cm_id *ids[] = {p->client, p->server};
    for (int i = 0; i < 2; i++)
        if (ids[i]) {
            rdma_disconnect(ids[i]);
            if (ids[i]->qp)
                rdma_destroy_qp(ids[i]);
        }
    for (int i = 0; i < 2; i++)
        if (ids[i])
            rdma_destroy_id(ids[i]);
    if (p->listen)
        rdma_destroy_id(p->listen);
    if (p->ch)
        rdma_destroy_event_channel(p->ch);
    memset(p, 0, sizeof *p);
}

double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

void loop_for(mw_ctx_t *ctx, unsigned ms)
{
    mw_future_t *t = mw_future_new(ctx);
    mw_future_set_timeout(t, ms);
    mw_wait(t);
    mw_future_unref(t);
}

/* --- meshwire connections within one context ------------------------------ */

static void keep_accepted(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    struct rxe_server *s = arg;
    assert_true(s->n < RXE_MAXC);
    s->conns[s->n++] = c;
}

void rxe_keep_first(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    mw_conn_t **first = arg;
    if (*first)
        mw_conn_abort(c);
    else
        *first = c;
}

void rxe_server_start(struct rxe_server *s, mw_ctx_t *ctx, const char *addr,
                      const mw_conn_opts_t *o)
{
    char la[80];
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    snprintf(la, sizeof la, "%s:0", addr);
    assert_int_equal(mw_listen(ctx, la, o, keep_accepted, s, &s->l), 0);
    s->port = mw_listener_port(s->l);
    assert_true(s->port > 0);
}

void rxe_server_close(struct rxe_server *s)
{
    for (int i = 0; i < s->n; i++)
        rxe_close_conn(s->conns[i]);
    s->n = 0;
    mw_listener_free(s->l);
    s->l = NULL;
}

void rxe_wait_accepted(struct rxe_server *s, int n)
{
    for (int i = 0; s->n < n && i < 1000; i++)
        loop_for(s->ctx, 10);
    assert_int_equal(s->n, n);
}

mw_future_t *rxe_connect_future(mw_ctx_t *ctx, const char *addr, int port,
                                const mw_conn_opts_t *o)
{
    char a[128];
    snprintf(a, sizeof a, "%s:%d", addr, port);
    mw_future_t *f = mw_connect(ctx, a, o);
    assert_non_null(f);
    return f;
}

mw_conn_t *rxe_connect(mw_ctx_t *ctx, const char *addr, int port, const mw_conn_opts_t *o)
{
    mw_future_t *f = rxe_connect_future(ctx, addr, port, o);
    int rc = mw_wait(f);
    if (rc)
        fail_msg("connect %s:%d: %s: %s", addr, port, mw_strerror(rc), mw_future_message(f));
    mw_conn_t *c = mw_future_value(f);
    mw_future_unref(f);
    return c;
}

void rxe_close_conn(mw_conn_t *c)
{
    mw_future_t *f = mw_conn_close(c);
    int rc = mw_wait(f);
    if (rc)
        fail_msg("close: %s: %s", mw_strerror(rc), mw_future_message(f));
    mw_future_unref(f);
}

void rxe_round_trip(mw_conn_t *a, mw_conn_t *b)
{
    static const char text[] = "still connected";
    mw_future_t *r = mw_recv(b), *s = mw_send(a, text, sizeof text);
    assert_int_equal(mw_wait(s), 0);
    assert_int_equal(mw_wait(r), 0);
    mw_msg_t *m = mw_future_value(r);
    assert_int_equal(m->len, sizeof text);
    assert_memory_equal(m->data, text, sizeof text);
    mw_msg_free(m);
    mw_future_unref(s);
    mw_future_unref(r);
}

double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int rxe_run_while_looping(mw_ctx_t *ctx, char *const argv[], double *took)
{
    extern char **environ;
    pid_t pid;
    double t0 = now_s();
    assert_int_equal(posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ), 0);
    for (int i = 0; i < 3000; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            *took = now_s() - t0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        loop_for(ctx, 10);
    }
    fail_msg("'%s %s %s' did not finish in 30 s", argv[0], argv[1], argv[2]);
    return -1;
}

double rxe_pinned_mib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmPin: %lf kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib / 1024;
}

long rxe_rss_kib(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2)
        resident = 0;
    if (f)
        fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

size_t rxe_conns_left(mw_ctx_t *ctx)
{
    struct mw__cm *cm = ctx->layers[MW__LAYER_CM].state;
    size_t n = 0;
    struct mw__conn *c;
    if (cm)
        mw__list_for_each(c, &cm->conns, link)
            n++;
    return n;
}

mw_msg_t *rxe_recv(mw_conn_t *c, unsigned ms)
{
    mw_future_t *f = mw_recv(c);
    mw_future_set_timeout(f, ms);
    int rc = mw_wait(f);
    if (rc)
        fail_msg("recv: %s: %s", mw_strerror(rc), mw_future_message(f));
    mw_msg_t *m = mw_future_value(f);
    mw_future_unref(f);
    return m;
}

void rxe_pair_open(struct rxe_pair *p, const char *addr, const mw_conn_opts_t *o)
{
    assert_int_equal(mw_ctx_new(&p->ctx, NULL, NULL), 0);
    rxe_server_start(&p->s, p->ctx, addr, o);
    p->a = rxe_connect(p->ctx, addr, p->s.port, o);
    rxe_wait_accepted(&p->s, 1);
    p->b = p->s.conns[0];
}

void rxe_pair_close(struct rxe_pair *p)
{
    rxe_close_conn(p->a);
    rxe_server_close(&p->s);
    mw_ctx_free(p->ctx);
}

void rxe_wait_conns_gone(mw_ctx_t *ctx)
{
    for (int i = 0; i < 300 && rxe_conns_left(ctx); i++)
        loop_for(ctx, 10);
    assert_int_equal(rxe_conns_left(ctx), 0);
}
