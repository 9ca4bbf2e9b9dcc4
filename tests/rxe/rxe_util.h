/* Test-side plumbing for the rxe suite: skip without devices; a connected
 * RC queue-pair pair between two local addresses, built with blocking
 * rdma_cm calls (for tests below the cm layer; the QPs use the context's PDs
 * and CQs); and meshwire connections within one context, for tests above. */
#ifndef MW_TEST_RXE_UTIL_H
#define MW_TEST_RXE_UTIL_H

#include <stdbool.h>

#include <rdma/rdma_cma.h>

#include "core/cq.h"
#include "core/dev.h"
#include "meshwire.h"

/* The thread sanitizer cannot follow fork() in a process using jemalloc:
 * jemalloc's fork handler takes every arena's lock, more than TSan's
 * deadlock detector can track (its CHECK fails).  Tests that fork say so
 * and skip that part under it; the plain and ASan runs do it. */
#if defined(__SANITIZE_THREAD__)
#define RXE_FORK_OK 0
#else
#define RXE_FORK_OK 1
#endif

#define SKIP_EXIT 77

/* rxe_require() - exit 77 (skip) unless an RDMA device exists and
 * MW_ADDRS names at least @n addresses; fills @addrs (static strings). */
void rxe_require(int n, const char **addrs);
/* rxe_over_tcp() - whether the tests' connections are set up over TCP
 * (MW_TRANSPORT=tcp, or =auto on a host without RDMA): no RDMA device
 * needed, addresses on loopback unless MW_ADDRS says. */
bool rxe_over_tcp(void);
/* rxe_path() - the path the tests' data takes between their processes (all
 * on one host): MW_TRANSPORT=rdma, =tcp, else (auto, the default) the
 * same-host path, whether set up over rdma_cm or over TCP. */
mw_transport_t rxe_path(void);
/* rxe_path_name() - transport @t (mw_conn_stats) as the tests print it. */
const char *rxe_path_name(int t);

struct qp_pair {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *listen, *client, *server;
    struct mw__dev *cdev, *sdev;    /* the devices each end resolved to */
};

/* qp_pair_connect() - an RC QP from @src to @dst (IPv4 strings), each end
 * created on its device's PD and CQ through mw__dev_get(); @depth send and
 * receive slots each.  Return 0 or a negative errno. */
int qp_pair_connect(mw_ctx_t *ctx, const char *src, const char *dst, int depth,
                    struct qp_pair *p);
void qp_pair_close(struct qp_pair *p);

/* rxe_recv() - the next message on @c within @ms, or fail the test. */
mw_msg_t *rxe_recv(mw_conn_t *c, unsigned ms);

/* rxe_rss_kib() - this process's resident memory, KiB. */
long rxe_rss_kib(void);
/* rxe_pinned_mib() - what the kernel counts as pinned for this process
 * (VmPin), in MiB; negative when it says nothing. */
double rxe_pinned_mib(void);
/* rxe_conns_left() - connections the context's cm layer still has (any
 * state): 0 once everything made has gone. */
size_t rxe_conns_left(mw_ctx_t *ctx);
/* rxe_wait_conns_gone() - run the loop until none is left (fail after 3 s). */
void rxe_wait_conns_gone(mw_ctx_t *ctx);

/* loop_for() - run @ctx's loop for @ms milliseconds (a future that can only
 * time out). */
void loop_for(mw_ctx_t *ctx, unsigned ms);

/* cpu_seconds() - user + system CPU time of this process so far. */
double cpu_seconds(void);

/* rxe_fixed_port() - a port to listen on by number, from @salt (a pid,
 * say): the first of @span free ones below ip_local_port_range, which no
 * connection's local end takes from under the test. */
int rxe_fixed_port(unsigned salt, int span);

/* --- meshwire connections within one context (cmocka asserts) ------------ */

#define RXE_MAXC 128
/* A listener in the test's own context that keeps what it accepts. */
struct rxe_server {
    mw_ctx_t *ctx;
    mw_listener_t *l;
    int port;
    mw_conn_t *conns[RXE_MAXC];
    int n;
};

/* rxe_server_start() - listen on @addr (an address, "*" for all) at a free
 * port with @o (NULL: defaults). */
void rxe_server_start(struct rxe_server *s, mw_ctx_t *ctx, const char *addr,
                      const mw_conn_opts_t *o);
/* rxe_server_close() - close every accepted connection and the listener. */
void rxe_server_close(struct rxe_server *s);
/* An accept callback that keeps the first connection in *(mw_conn_t **)arg
 * and aborts any later one. */
void rxe_keep_first(mw_listener_t *l, mw_conn_t *c, void *arg);

/* rxe_wait_accepted() - run the loop until @s accepted @n (fail after 10 s). */
void rxe_wait_accepted(struct rxe_server *s, int n);

/* rxe_connect_future() - mw_connect() to @addr:@port; rxe_connect() waits
 * and fails the test unless it connects. */
mw_future_t *rxe_connect_future(mw_ctx_t *ctx, const char *addr, int port,
                                const mw_conn_opts_t *o);
mw_conn_t *rxe_connect(mw_ctx_t *ctx, const char *addr, int port, const mw_conn_opts_t *o);
/* rxe_close_conn() - graceful close, which must succeed. */
void rxe_close_conn(mw_conn_t *c);
/* Two connected ends in a context of their own: @a connected to @b. */
struct rxe_pair {
    mw_ctx_t *ctx;
    struct rxe_server s;
    mw_conn_t *a, *b;
};
/* rxe_pair_open() - a new context, a listener on @addr, a connection to it
 * (@o for both ends, NULL: defaults); rxe_pair_close() closes all. */
void rxe_pair_open(struct rxe_pair *p, const char *addr, const mw_conn_opts_t *o);
void rxe_pair_close(struct rxe_pair *p);

/* rxe_round_trip() - a message from @a arrives intact at @b. */
void rxe_round_trip(mw_conn_t *a, mw_conn_t *b);

/* rxe_run_while_looping() - run a command to its end while @ctx's loop keeps
 * running (a device's removal waits for meshwire to let go of it); its
 * exit status, and in *@took how long it ran. */
int rxe_run_while_looping(mw_ctx_t *ctx, char *const argv[], double *took);

/* now_s() - CLOCK_MONOTONIC in seconds. */
double now_s(void);

#endif
