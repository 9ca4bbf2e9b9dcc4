/* A connection's life: queue pair and buffers, the handshake's numbers,
 * failure, graceful and abortive close, and the final teardown once every
 * posted work request has come back (flushes included). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "cm/cm.h"
#include "cm/nic.h"
#include "core/alloc.h"
#include "core/check.h"
#include "core/resolve.h"
#include "core/cq.h"
#include "core/dev.h"
#include "mem/mem.h"
#include "core/future.h"
#include "core/handle.h"
#include "core/op.h"

static const char *const state_names[] = {
    [MW__CONN_RESOLVING_ADDR] = "resolving address",
    [MW__CONN_RESOLVING_ROUTE] = "resolving route",
    [MW__CONN_CONNECTING] = "connecting",
    [MW__CONN_ACCEPTING] = "accepting",
    [MW__CONN_ESTABLISHED] = "established",
    [MW__CONN_CLOSING] = "closing",
    [MW__CONN_DISCONNECTING] = "disconnecting",
    [MW__CONN_BROKEN] = "broken",
    [MW__CONN_FREED] = "freed",
};

const char *mw__conn_state_str(enum mw__conn_state s)
{
    return (unsigned)s < sizeof state_names / sizeof *state_names ? state_names[s] : "?";
}

void mw_conn_opts_init(mw_conn_opts_t *o)
{
    *o = (mw_conn_opts_t){
        .timeout_ms = 5000,
        .credits = 16,
        .slot_size = 64 << 10,
        .max_rdma_inflight = 16,
        .chunk_size = 1 << 20,
        .default_port = MW_DEFAULT_PORT,
        .send_timeout_ms = 60000,
        .max_msg_size = 256u << 20,
        .max_inbox_bytes = 1u << 30,
        .max_accepting = 64,
        .retry_count = 7,
        .rnr_retry = 6,
    };
}

/* RC's ACK timeout by default, as the IB exponent (4.096 us x 2^n): 16.8 ms
 * on RDMA hardware, where the NIC acknowledges; 134 ms on soft-RoCE, where
 * the peer's CPU does, late when it is busy.  Measured on the mesh suite's
 * rails test (three VMs on two cores): 16.8 ms gave 311 resends, thousands
 * of duplicate packets and writes failed by rxe ("remote invalid request")
 * on every node; 67 ms 22 resends; 134 ms one. */
#define MW__ACK_EXP_NIC 12
#define MW__ACK_EXP_SOFT_ROCE 15

/* The IB encoding of an ACK timeout: the least n in 1..31 with 4.096 us x
 * 2^n >= @us (0 would mean "wait for ever"). */
static uint8_t ack_timeout_exp(unsigned us)
{
    uint8_t n = 1;
    while (n < 31 && (4096ull << n) < us * 1000ull)
        n++;
    return n;
}

static uint64_t ack_timeout_exp_us(uint8_t n)
{
    return n ? ((4096ull << n) + 999) / 1000 : 0;
}

int mw__conn_opts_check(const mw_conn_opts_t *o)
{
    if (o->credits < 2 || o->credits > 4096 || o->slot_size < 256 ||
        o->slot_size > (16u << 20) || o->max_rdma_inflight < 1 || o->chunk_size < 4096 ||
        o->timeout_ms < 1 || o->default_port > 65535 || o->send_timeout_ms < 1 ||
        o->max_msg_size < 1 || o->max_msg_size > MW__MSG_MAX || o->max_inbox_bytes < 1 ||
        o->max_accepting < 1 || o->max_accepting > 65536 || o->max_conns > 65536 ||
        o->retry_count > 7 ||
        o->rnr_retry > 6 ||
        (o->transport != MW_TRANSPORT_AUTO && o->transport != MW_TRANSPORT_RDMA &&
         o->transport != MW_TRANSPORT_TCP))
        return -EINVAL;
    return 0;
}

/* The life cycle: which state may follow which (any may go to FREED, at
 * the context's teardown).  An active connection goes back to resolving
 * for each address it tries, or over TCP straight to connecting. */
#define S(x) (1u << MW__CONN_##x)
static const unsigned next_ok[] = {
    [MW__CONN_RESOLVING_ADDR] = S(RESOLVING_ADDR) | S(RESOLVING_ROUTE) | S(CONNECTING) |
                                S(BROKEN),
    [MW__CONN_RESOLVING_ROUTE] = S(RESOLVING_ADDR) | S(CONNECTING) | S(BROKEN),
    [MW__CONN_CONNECTING] = S(RESOLVING_ADDR) | S(CONNECTING) | S(ESTABLISHED) | S(BROKEN),
    [MW__CONN_ACCEPTING] = S(ESTABLISHED) | S(BROKEN),
    [MW__CONN_ESTABLISHED] = S(CLOSING) | S(BROKEN),
    [MW__CONN_CLOSING] = S(DISCONNECTING) | S(BROKEN),
    [MW__CONN_DISCONNECTING] = S(BROKEN),
    [MW__CONN_BROKEN] = S(BROKEN),
    [MW__CONN_FREED] = 0,
};
#undef S

void mw__conn_set_state(struct mw__conn *c, enum mw__conn_state s)
{
    MW__CHECK(c->ctx, s == MW__CONN_FREED || (next_ok[c->state] & 1u << s));
    c->state = s;
}

static void setup_free(struct mw__conn *c)
{
    if (!c->setup)
        return;
    mw__tcp_setup_drop(c);
    struct mw__conn_setup *s = c->setup;
    for (size_t i = 0; s->names && i < s->nnames; i++) {
        if (s->lookups)
            mw__lookup_cancel(s->lookups[i].l);
        mw__free(s->names[i]);
    }
    mw__free(s->names);
    mw__free(s->lookups);
    mw__free(c->setup->peers);
    mw__free(c->setup);
    c->setup = NULL;
}

void mw__conn_hand_over(struct mw__conn *c)
{
    MW__CHECK(c->ctx, c->owner == MW__OWNER_PENDING && c->state == MW__CONN_ESTABLISHED);
    c->owner = MW__OWNER_CALLER;
    setup_free(c);
}

/* What @c's setup makes it run on: the device's queue pair (which may yet
 * give way to the same-host path), or a TCP socket. */
static const struct mw__transport *base_transport(const struct mw__conn *c)
{
    return c->opts.transport == MW_TRANSPORT_TCP ? &mw__transport_tcp : &mw__transport_rdma;
}

static void finish_task(struct mw__task *t)
{
    mw__conn_free(mw__container_of(t, struct mw__conn, finish_task));
}

int mw__conn_new(mw_ctx_t *ctx, enum mw__conn_side side, const mw_conn_opts_t *opts,
                 struct mw__conn **cp)
{
    mw_conn_opts_t o;
    if (opts)
        o = *opts;
    else
        mw_conn_opts_init(&o);
    int rc = mw__conn_opts_check(&o);
    if (rc < 0)
        return rc;
    if (!o.keepalive_ms)
        o.keepalive_ms = o.timeout_ms;
    struct mw__cm *cm;
    if ((rc = mw__transport_asked(ctx, &o)) < 0 || !(cm = mw__cm_get(ctx, &rc)))
        return rc;
    bool local_ok = o.transport == MW_TRANSPORT_AUTO;   /* before auto becomes TCP */
    if ((rc = mw__cm_transport(cm, &o)) < 0)
        return rc;
    struct mw__conn *c = mw__calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->setup = mw__calloc(1, sizeof *c->setup);
    if (!c->setup || !(c->h = mw__handle_new(MW__H_CONN, c, mw__loop_thread(ctx)))) {
        mw__free(c->setup);
        mw__free(c);
        return -ENOMEM;
    }
    c->kind = MW__CM_CONN;
    c->ctx = ctx;
    c->side = side;
    c->owner = MW__OWNER_PENDING;
    c->state = side == MW__SIDE_ACTIVE ? MW__CONN_RESOLVING_ADDR : MW__CONN_ACCEPTING;
    c->opts = o;
    c->local_ok = local_ok;
    mw__conn_set_transport(c, base_transport(c));
    c->finish_task.fn = finish_task;
    mw__list_init(&c->xfers.queue);
    mw__list_init(&c->msgs.recv_waiters);
    mw__list_init(&c->msgs.inbox);
    mw__list_add_tail(&cm->conns, &c->link);
    *cp = c;
    return 0;
}

/* --- queue pair and buffers ---------------------------------------------- */

int mw__conn_lkey(const struct mw__conn *c, const void *addr, size_t len, uint32_t *lkey)
{
    if (c->opts.transport != MW_TRANSPORT_TCP)
        return mw__mem_keys(c->ctx, c->path.pd, addr, len, lkey);
    *lkey = 0;
    int rc = mw__mem_held(c->ctx, addr, len);
    return rc == -EINVAL ? -EFAULT : rc;
}

static int create_qp(struct mw__conn *c, char *why, size_t cap)
{
    struct mw__dev *dev = c->path.dev;
    unsigned send_wr = c->opts.credits + c->opts.max_rdma_inflight + 1;
    unsigned recv_wr = c->opts.credits;
    if ((int)send_wr > dev->attr.max_qp_wr || (int)recv_wr > dev->attr.max_qp_wr) {
        snprintf(why, cap, "%u work requests exceed %s's max_qp_wr %d", send_wr, dev->name,
                 dev->attr.max_qp_wr);
        return -EINVAL;
    }
    int rc = mw__dev_reserve_cqe(dev, (int)(send_wr + recv_wr));
    if (rc < 0) {
        snprintf(why, cap, "%s's completion queue is full (%d entries in use, %u more "
                 "needed, max_cqe %d): %s", dev->name, dev->cqe_used, send_wr + recv_wr,
                 dev->attr.max_cqe, mw_strerror(rc));
        return rc;
    }
    c->path.cqe_reserved = (int)(send_wr + recv_wr);
    struct ibv_cq *cq = dev->cq->cq;
    struct ibv_qp_init_attr a = {
        .qp_context = c,              /* the device's async events name it */
        .send_cq = cq,
        .recv_cq = cq,
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = send_wr, .max_recv_wr = recv_wr,
                .max_send_sge = 1, .max_recv_sge = 1},
    };
    if ((rc = mw__pd_new(c->ctx, dev, &c->path.pd)) < 0) {
        snprintf(why, cap, "cannot allocate a protection domain on %s: %s", dev->name,
                 mw_strerror(rc));
        return rc;
    }
    if (rdma_create_qp(c->id, c->path.pd->pd, &a) == 0)
        return 0;
    rc = errno ? -errno : -ENOMEM;
    snprintf(why, cap, "cannot create a queue pair on %s: %s", dev->name, mw_strerror(rc));
    return rc;
}

/* The ACK timeout rdma_cm puts on the queue pair: the option's, the
 * device's default for 0, or rdma_cm's own for MW_ACK_TIMEOUT_PATH. */
static int set_ack_timeout(struct mw__conn *c, char *why, size_t cap)
{
    unsigned us = c->opts.ack_timeout_us;
    if (us == MW_ACK_TIMEOUT_PATH)
        return 0;
    uint8_t t = us ? ack_timeout_exp(us) : c->path.dev->soft_roce ? MW__ACK_EXP_SOFT_ROCE
                                                             : MW__ACK_EXP_NIC;
    if (rdma_set_option(c->id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t) == 0)
        return 0;
    int rc = -errno;
    snprintf(why, cap, "cannot set the ACK timeout on %s: %s", c->path.dev->name, mw_strerror(rc));
    return rc;
}

void mw__conn_device_ready(struct mw__conn *c, struct mw__dev *dev, int err)
{
    if (!c->setup || !c->setup->dev_wait || c->path.dev != dev)
        return;
    c->setup->dev_wait = false;
    if (c->side == MW__SIDE_ACTIVE)
        mw__connect_device_ready(c, err);
    else
        mw__accept_device_ready(c, err);
}

/* The device's queue pair, over rdma_cm: 0, -EINPROGRESS (the device is
 * opening: mw__conn_device_ready goes on), or an error with @why. */
static int device_qp(struct mw__conn *c, char *why, size_t cap)
{
    int rc = mw__dev_get(c->ctx, c->id->verbs, &c->path.dev);
    if (rc < 0) {
        snprintf(why, cap, "cannot open the RDMA device: %s", mw_strerror(rc));
        return rc;
    }
    snprintf(c->stats.device, sizeof c->stats.device, "%s", c->path.dev->name);
    if (!c->path.dev->ready) {
        c->setup->dev_wait = true;
        snprintf(why, cap, "waiting for %s to open and register memory", c->path.dev->name);
        return -EINPROGRESS;
    }
    if (!c->path.dev->pd) {           /* it failed to open, there and then */
        const char *gone = c->path.dev->why;
        snprintf(why, cap, "%s", gone[0] ? gone : "its RDMA device is gone");
        return -ENODEV;
    }
    mw__addr_str(rdma_get_local_addr(c->id), c->stats.local, sizeof c->stats.local);
    mw__addr_str(rdma_get_peer_addr(c->id), c->stats.remote, sizeof c->stats.remote);
    struct ibv_port_attr pa;
    if ((rc = -ibv_query_port(c->id->verbs, c->id->port_num, &pa)) < 0) {
        snprintf(why, cap, "cannot query %s port %u: %s", c->path.dev->name, c->id->port_num,
                 mw_strerror(rc));
        return rc;
    }
    c->xfers.max_msg = pa.max_msg_sz;
    if ((rc = create_qp(c, why, cap)) < 0)
        return rc;
    return set_ack_timeout(c, why, cap);
}

int mw__conn_setup_qp(struct mw__conn *c, char *why, size_t cap)
{
    bool tcp = c->opts.transport == MW_TRANSPORT_TCP;
    int rc = tcp ? 0 : device_qp(c, why, cap);
    if (rc < 0)
        return rc;
    /* the receives go where the data will come: the same-host path, if
     * offered or taken, else the device's queue pair or the socket's */
    rc = c->side == MW__SIDE_ACTIVE ? mw__local_offer(c) : mw__local_take(c);
    if (rc < 0) {
        snprintf(why, cap, "cannot set up the same-host path: %s", mw_strerror(rc));
        return rc;
    }
    if (tcp && !c->path.lqp && (rc = mw__tcp_path(c)) < 0) {
        snprintf(why, cap, "no memory for the connection's queue pair");
        return rc;
    }
    if ((rc = mw__msg_post_recvs(c)) < 0)
        snprintf(why, cap, "cannot set up %u receive slots of %u bytes%s%s: %s",
                 c->opts.credits, c->opts.slot_size, tcp ? "" : " on ",
                 tcp ? "" : c->path.dev->name, mw_strerror(rc));
    return rc;
}

/* RDMA reads outstanding per connection, each way, at most: with one, every
 * read waits for the one before it (on rxe a 64 KiB read then moves 13 MiB/s
 * where 16 move 56); more cost the responder memory per QP. */
#define MAX_RD_ATOMS 16

static uint8_t rd_atoms(int device_max, unsigned peer)
{
    unsigned n = device_max < MAX_RD_ATOMS ? (unsigned)device_max : MAX_RD_ATOMS;
    return (uint8_t)(peer < n ? peer : n);
}

/* Connection parameters carrying our handshake in @pd (kept by the caller
 * until rdma_connect/rdma_accept returns).  RNR retries are finite (the
 * options refuse 7, for ever); rxe reads a retry count of 7 as for ever
 * too, and keepalive.c notices a silent peer then.  Read depths: ours,
 * within what the device allows; accepting, also within what the peer
 * asked for and serves. */
int mw__conn_hello(const struct mw__conn *c, uint8_t pd[MW__HELLO_LEN])
{
    struct mw__hello h = {
        .magic = MW__HELLO_MAGIC,
        .version = MW__HELLO_VERSION,
        .purpose = MW__PURPOSE_P2P,
        .credits = c->opts.credits,
        .slot_size = c->opts.slot_size,
        .max_msg = c->opts.max_msg_size,
    };
    mw__local_hello(c, &h);
    const struct mw__conn_setup *s = c->setup;
    if (s && s->over_tcp && s->rdma_nobody && !s->rdma_again)
        h.flags |= MW__HELLO_RDMA_MISSED;
    return mw__hello_encode(&h, pd, MW__HELLO_LEN);
}

void mw__conn_param(const struct mw__conn *c, uint8_t pd[MW__HELLO_LEN],
                    struct rdma_conn_param *p)
{
    bool passive = c->side == MW__SIDE_PASSIVE;
    const struct mw__conn_setup *s = c->setup;   /* only setting up */
    int len = mw__conn_hello(c, pd);
    *p = (struct rdma_conn_param){
        .private_data = pd, .private_data_len = (uint8_t)len,
        .responder_resources = rd_atoms(c->path.dev->attr.max_qp_rd_atom,
                                        passive ? s->peer_rd_depth : MAX_RD_ATOMS),
        .initiator_depth = rd_atoms(c->path.dev->attr.max_qp_init_rd_atom,
                                    passive ? s->peer_rd_resources : MAX_RD_ATOMS),
        .retry_count = (uint8_t)c->opts.retry_count,
        .rnr_retry_count = (uint8_t)c->opts.rnr_retry,
    };
}

int mw__conn_take_peer_hello(struct mw__conn *c, const void *pd, size_t len, const char **why)
{
    int rc = mw__hello_decode(pd, len, &c->peer, why);
    if (rc < 0)
        return rc;
    /* Our send slots: as many as the peer has receive slots, sized to the
     * smaller of the two slot sizes. */
    c->msgs.nsend = c->peer.credits < c->opts.credits ? c->peer.credits : c->opts.credits;
    mw__flow_init(&c->flow, c->ctx, c->msgs.nsend, c->opts.credits);
    unsigned slot = c->peer.slot_size < c->opts.slot_size ? c->peer.slot_size : c->opts.slot_size;
    c->msgs.max_frag = slot - MW__FRAG_HDR_LEN;
    c->stats.peer_max_msg = c->peer.max_msg;
    return 0;
}

/* --- timers -------------------------------------------------------------- */

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct mw__conn *c = arg;
    c->deadline.fn(c);
}

int mw__conn_arm_timer_ms(struct mw__conn *c, void (*fn)(struct mw__conn *c), unsigned ms)
{
    if (!c->deadline.ev && !(c->deadline.ev = evtimer_new(c->ctx->base, on_timer, c)))
        return -ENOMEM;
    c->deadline.fn = fn;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    mw__ev_add(c->ctx, c->deadline.ev, &tv);
    return 0;
}

void mw__conn_arm_timer(struct mw__conn *c, void (*fn)(struct mw__conn *c))
{
    mw__conn_arm_timer_ms(c, fn, c->opts.timeout_ms);   /* no memory: no deadline */
}

void mw__conn_disarm_timer(struct mw__conn *c)
{
    if (c->deadline.ev)
        evtimer_del(c->deadline.ev);
}

/* --- established, broken, closed ----------------------------------------- */

/* What the queue pair really runs, for mw_conn_stats: on the passive side
 * the retry count is the connecting side's, and MW_ACK_TIMEOUT_PATH
 * leaves the ACK timeout to rdma_cm. */
static void query_retries(struct mw__conn *c)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    if (!c->id)                   /* no queue pair of a device: nothing to say */
        return;
    if (ibv_query_qp(c->id->qp, &a, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY, &ia))
        return;
    c->stats.ack_timeout_us = ack_timeout_exp_us(a.timeout);
    c->stats.retry_count = a.retry_cnt;
    c->stats.rnr_retry = a.rnr_retry;
}

/* The RDMA reads this QP may have in flight: on rxe one (core/dev.h says
 * why; the handshake cannot ask for it: the connecting side's depth comes
 * from the peer's answer), else as negotiated (more would only wait in the
 * device). */
static unsigned reads_in_flight(struct mw__conn *c)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    if (c->path.tp->reads)
        return c->path.tp->reads;
    if (!c->path.dev)             /* the same-host path, set up over TCP */
        return MW__LQP_READS;
    if (c->path.dev->soft_roce)
        return MW__RXE_READS;
    if (ibv_query_qp(c->id->qp, &a, IBV_QP_MAX_QP_RD_ATOMIC, &ia) || a.max_rd_atomic < 1)
        return 1;
    return a.max_rd_atomic;
}

void mw__conn_established(struct mw__conn *c)
{
    mw__conn_disarm_timer(c);
    c->xfers.max_reads = reads_in_flight(c);
    query_retries(c);
    int rc = mw__send_slots_new(c);
    if (rc < 0) {
        mw__conn_fail(c, rc, "no memory for send slots");
        return;
    }
    mw__conn_set_state(c, MW__CONN_ESTABLISHED);
    mw__local_up(c);
    c->ctx->stats.local_connections += c->stats.transport == MW_TRANSPORT_LOCAL;
    mw__msg_established(c);
    MW_LOG(c->ctx, MW_LOG_INFO, "connected %s -> %s on %s%s (credits %u, fragment %u bytes, "
           "%u reads in flight, ACK timeout %llu us, retries %u)", c->stats.local,
           c->stats.remote, c->stats.device, c->path.tp->via,
           c->msgs.nsend, c->msgs.max_frag, c->xfers.max_reads,
           (unsigned long long)c->stats.ack_timeout_us, c->stats.retry_count);
    mw__conn_pump(c);
}

/* Fail everything pending on @c with @err and a message naming the peer
 * (before its address is known, a connect's message names those tried). */
static void fail_pending(struct mw__conn *c, int err)
{
    char why[256];
    snprintf(why, sizeof why, "%s%s%s", c->stats.remote, c->stats.remote[0] ? ": " : "", c->why);
    mw__queue_fail_all(c, err, why);
    mw__recv_fail_all(c, err, why);
    if (c->setup && c->side == MW__SIDE_ACTIVE)
        mw__connect_fail(c, err, why);
}

static void disconnect(struct mw__conn *c)
{
    if (c->path.stopped || (!c->id && !c->path.lqp))
        return;
    c->path.stopped = true;
    /* Moves the QP to the error state: everything posted comes back as a
     * flush, and the final teardown waits for exactly that. */
    if (c->id)
        rdma_disconnect(c->id);
    c->path.tp->stop(c);
}

void mw__conn_fail(struct mw__conn *c, int err, const char *fmt, ...)
{
    if (c->state == MW__CONN_FREED)
        return;
    if (!c->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->why, sizeof c->why, fmt, ap);
        va_end(ap);
        c->err = err;
        if (err == -EPROTO || err == -EMSGSIZE)   /* the peer broke the protocol */
            c->ctx->stats.protocol_errors++;
        /* a peer closing, our own abort or teardown, or a connect that
         * failed (its future tells the caller) is an ordinary end */
        bool ordinary = err == -ECONNRESET || err == -ECONNABORTED || err == -ECANCELED ||
                        mw__conn_setting_up(c);
        MW_LOG(c->ctx, ordinary ? MW_LOG_INFO : MW_LOG_WARN,
               "connection %s -> %s: %s", c->stats.local,
               c->stats.remote[0] ? c->stats.remote : "?", c->why);
    }
    mw__conn_disarm_timer(c);
    mw__conn_set_state(c, MW__CONN_BROKEN);
    fail_pending(c, c->err);
    disconnect(c);
    mw__conn_maybe_finish(c);
}

/* How long the completions of what we sent may trail the peer's leaving. */
#define PEER_LEFT_GRACE_MS 500

static void peer_left(struct mw__conn *c)
{
    c->peer_left = false;
    /* The peer's disconnect leaves our QP as it was: move it to the error
     * state ourselves, so the receives still posted come back as flushes. */
    disconnect(c);
    if (c->state == MW__CONN_DISCONNECTING || c->state == MW__CONN_CLOSING) {
        if (mw__queue_busy(c))
            mw__conn_fail(c, -ECONNRESET, "peer disconnected");
        mw__conn_maybe_finish(c);
        return;
    }
    mw__conn_fail(c, -ECONNRESET, "peer disconnected");
}

void mw__conn_peer_left_settle(struct mw__conn *c)
{
    mw__conn_arm_timer_ms(c, peer_left, 0);   /* from the loop, not this handler */
}

void mw__conn_on_disconnected(struct mw__conn *c)
{
    /* The rdma_cm event and the completions travel apart: completions of
     * what the peer delivered before it left may still sit in the CQ.  Take
     * them first, so they count, and only then fail what remains. */
    c->path.tp->take_now(c);
    if (c->state == MW__CONN_FREED || c->peer_left)
        return;
    if (c->msgs.nearly)
        mw__msg_take_early(c);
    /* What we sent may have reached the peer before it left with its
     * completion still to come here (a collective's last chunk to a rank
     * that finished on it and freed its communicator at once: seen failing
     * a final barrier, 2 full runs in 4).  Moving our QP to the error state
     * now would flush it as failed: let those completions come -- the
     * device's acks, or the QP's retries failing -- for a bounded time.
     * (On the same-host path, once the peer's end was read, no answer is
     * still on its way.) */
    if (c->state == MW__CONN_ESTABLISHED && c->path.wr_out > c->path.recv_out &&
        !c->path.tp->peer_done(c) &&
        mw__conn_arm_timer_ms(c, peer_left, PEER_LEFT_GRACE_MS) == 0) {
        c->peer_left = true;
        return;
    }
    peer_left(c);
}

int mw__conn_disconnected_later(struct mw__conn *c)
{
    return mw__conn_arm_timer_ms(c, mw__conn_on_disconnected, 0);
}

void mw__conn_maybe_finish(struct mw__conn *c)
{
    if (c->state == MW__CONN_CLOSING && !mw__queue_busy(c)) {
        mw__conn_set_state(c, MW__CONN_DISCONNECTING);
        disconnect(c);
    }
    /* nobody holds it and nothing can complete on it any more */
    if (c->owner != MW__OWNER_CALLER && mw__conn_drained(c))
        mw__defer(c->ctx, &c->finish_task);
}

/* The caller is done with @c (closed, aborted): its handle stops matching,
 * and no callback names it again. */
static void release_handle(struct mw__conn *c)
{
    MW__CHECK(c->ctx, c->owner == MW__OWNER_CALLER);
    c->owner = MW__OWNER_RELEASED;
    mw__handle_release(c->h);
    c->h = 0;
    c->on_imm.fn = NULL;
}

/* The QP goes, and all that lives with it: exports, the protection domain,
 * CQ entries, queued operations, buffers, and the records of whatever is
 * still posted (a completion already queued for the QP then turns stray
 * instead of reaching them).  Again is a no-op. */
static void release_qp(struct mw__conn *c)
{
    c->path.tp->release(c);
    if (c->id && c->id->qp)
        rdma_destroy_qp(c->id);
    mw__rdma_drop_exports(c);         /* before the PD may go (device removal) */
    mw__pd_free(c->ctx, c->path.pd);       /* after the QP and the exports in it */
    c->path.pd = NULL;
    if (c->path.cqe_reserved)
        mw__dev_release_cqe(c->path.dev, c->path.cqe_reserved);
    c->path.cqe_reserved = 0;
    mw__queue_drop_all(c);            /* nothing posted will come back */
    mw__msg_free_buffers(c);
    mw__conn_inflight_forget(c);
    mw__keepalive_drop(c);
}

void mw__conn_free(struct mw__conn *c)
{
    if (c->state == MW__CONN_FREED)
        return;
    /* only the context's teardown frees what the caller still holds */
    MW__CHECK(c->ctx, c->ctx->closing || (c->owner != MW__OWNER_CALLER && mw__conn_drained(c)) ||
                          (!c->id && !c->path.lqp));
    mw__conn_set_state(c, MW__CONN_FREED);
    if (c->counted_by)
        c->counted_by->live--;
    mw__handle_release(c->h);
    c->h = 0;
    mw__defer_cancel(c->ctx, &c->finish_task);
    mw__list_del(&c->link);
    if (c->deadline.ev)
        event_free(c->deadline.ev);
    if (c->xfers.pump_ev)
        event_free(c->xfers.pump_ev);
    if (c->keepalive.probe_ev)
        event_free(c->keepalive.probe_ev);
    release_qp(c);
    if (c->id)
        rdma_destroy_id(c->id);
    setup_free(c);
    if (c->close_f) {
        if (c->err && c->err != -ECONNABORTED && c->err != -ECONNRESET)
            mw_future_fail(c->close_f, c->err, "%s", c->why);
        else
            mw_future_resolve(c->close_f, NULL);
        mw_future_unref(c->close_f);
    }
    mw__free(c);
}

static void on_close_timeout(struct mw__conn *c)
{
    mw__conn_fail(c, -ETIMEDOUT, "close timed out after %u ms with work pending", c->opts.timeout_ms);
}

struct mw__conn *mw__conn_of(const mw_conn_t *h, const char *fn, int *err)
{
    return mw__handle_get(MW__HANDLE(h), MW__H_CONN, fn, err);
}

mw_conn_t *mw__conn_handle(const struct mw__conn *c)
{
    return MW__HANDLE_PTR(mw_conn_t, c->h);
}

/* Cancelling (or a deadline on) the close's future: the close goes on,
 * only nobody waits for it any more. */
static void close_cancel(mw_future_t *f, void *arg)
{
    struct mw__conn *c = arg;
    c->close_f = NULL;
    mw_future_fail(f, -ECANCELED, "cancelled");   /* the recorded error wins */
    mw_future_unref(f);
}

mw_future_t *mw__conn_future(mw_conn_t *h, const char *fn, struct mw__conn **cp)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, fn, &err);
    if (!c) {
        errno = -err;
        return NULL;
    }
    *cp = c;
    return mw_future_new(c->ctx);
}

mw_future_t *mw_conn_close(mw_conn_t *h)
{
    struct mw__conn *c;
    mw_future_t *f = mw__conn_future(h, __func__, &c);
    if (!f)
        return NULL;
    release_handle(c);
    c->close_f = mw_future_ref(f);
    mw__future_on_cancel(f, close_cancel, c);
    if (c->state == MW__CONN_ESTABLISHED) {
        mw__conn_set_state(c, MW__CONN_CLOSING);
        mw__conn_arm_timer(c, on_close_timeout);
    }
    mw__conn_maybe_finish(c);
    return f;
}

int mw_conn_abort(mw_conn_t *h)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, __func__, &err);
    if (!c)
        return err;
    release_handle(c);
    mw__conn_fail(c, -ECONNABORTED, "aborted");
    mw__conn_maybe_finish(c);
    return 0;
}

int mw_conn_on_imm(mw_conn_t *h, mw_imm_fn fn, void *arg)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, __func__, &err);
    if (!c)
        return err;
    c->on_imm.fn = fn;
    c->on_imm.arg = arg;
    return 0;
}

int mw_conn_stats(const mw_conn_t *h, mw_conn_stats_t *out)
{
    int err;
    struct mw__conn *c = mw__conn_of(h, __func__, &err);
    if (out)
        *out = c ? c->stats : (mw_conn_stats_t){0};
    if (!c)
        return err;
    return out ? 0 : -EINVAL;
}

/* The QP and buffers go now: a failed attempt's, or a connection's whose
 * device is gone or broken (nothing posted on a destroyed QP completes, so
 * what waits for that fails now); the id goes after the current rdma_cm
 * event is acked. */
void mw__conn_take_id(struct mw__conn *c, struct rdma_cm_id *id)
{
    c->id = id;
    id->context = c;
}

void mw__conn_refused(struct mw__conn *c, int err)
{
    c->err = err;
    mw__conn_maybe_finish(c);
}

void mw__conn_drop_attempt(struct mw__conn *c)
{
    if (c->opts.transport == MW_TRANSPORT_TCP) {
        release_qp(c);
        mw__tcp_setup_drop(c);
        return;
    }
    if (!c->id)
        return;
    release_qp(c);
    mw__conn_set_transport(c, base_transport(c));   /* the next address decides anew */
    c->id->context = NULL;
    mw__cm_destroy_id_later(c->ctx, c->id);
    c->id = NULL;
    c->path.dev = NULL;
}

/* Events an established (or closing) connection gets, on either side. */
void mw__conn_common_event(struct mw__conn *c, struct rdma_cm_event *ev)
{
    switch (ev->event) {
    case RDMA_CM_EVENT_DISCONNECTED:
        mw__conn_on_disconnected(c);
        break;
    case RDMA_CM_EVENT_ADDR_CHANGE:
        MW_LOG(c->ctx, MW_LOG_WARN, "%s: local address changed", c->stats.local);
        break;
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
        break;
    default:
        MW_LOG(c->ctx, MW_LOG_DEBUG, "%s: unexpected %s in state %s", c->stats.remote,
               rdma_event_str(ev->event), mw__conn_state_str(c->state));
        break;
    }
}
