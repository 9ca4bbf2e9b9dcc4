/* The RDMA queue pair's transport, and posting on any transport with the
 * count of what it has in flight: this file alone changes wr_out and
 * recv_out.  Work requests are counted when the transport takes them and
 * uncounted when they come back (a completion, or a flush); a connection
 * whose count is zero and whose queue pair can take no more is drained
 * (mw__conn_drained) and may go. */
#include <stdlib.h>
#include <string.h>

#include "cm/cm.h"
#include "cm/lqp.h"
#include "core/cq.h"
#include "core/dev.h"
#include "core/op.h"

static int rdma_post_send(struct mw__conn *c, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    return ibv_post_send(c->id->qp, wr, bad);
}

static int rdma_post_recv(struct mw__conn *c, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    return ibv_post_recv(c->id->qp, wr, bad);
}

static void rdma_take_now(struct mw__conn *c)
{
    if (c->path.dev)
        mw__cq_drain_now(c->path.dev->cq);
}

/* rdma_disconnect moved the queue pair to the error state: nothing more */
static void nothing(struct mw__conn *c)
{
    (void)c;
}

static void nothing_until(struct mw__conn *c, uint64_t until_ms)
{
    (void)c;
    (void)until_ms;
}

/* Completions travel apart from rdma_cm's events: the peer's end is known
 * only when the queue pair's retries fail. */
static bool never(const struct mw__conn *c)
{
    (void)c;
    return false;
}

const struct mw__transport mw__transport_rdma = {
    .kind = MW_TRANSPORT_RDMA,
    .via = "",
    .probes = true,
    .post_send = rdma_post_send,
    .post_recv = rdma_post_recv,
    .take_now = rdma_take_now,
    .stop = nothing,
    .peer_done = never,
    .quiescing = never,
    .settle = nothing_until,
    .release = nothing,
};

int mw__transport_asked(mw_ctx_t *ctx, mw_conn_opts_t *o)
{
    if (o->transport != MW_TRANSPORT_AUTO && o->transport != MW_TRANSPORT_RDMA &&
        o->transport != MW_TRANSPORT_TCP)
        return -EINVAL;
    const char *env = getenv("MW_TRANSPORT");
    if (!env || !*env || !strcmp(env, "auto"))
        return 0;
    if (!strcmp(env, "rdma") || !strcmp(env, "tcp")) {
        o->transport = env[0] == 'r' ? MW_TRANSPORT_RDMA : MW_TRANSPORT_TCP;
        return 0;
    }
    MW_LOG(ctx, MW_LOG_ERROR, "MW_TRANSPORT=%s: expected rdma, tcp or auto", env);
    return -EINVAL;
}

/* --- a queue pair carried by a socket (lqp.h): same-host and TCP ------------- */

int mw__lqp_path_post_send(struct mw__conn *c, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    return mw__lqp_post_send(c->path.lqp, wr, bad);
}

int mw__lqp_path_post_recv(struct mw__conn *c, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    return mw__lqp_post_recv(c->path.lqp, wr, bad);
}

void mw__lqp_path_take_now(struct mw__conn *c)
{
    if (c->path.lqp)
        mw__lqp_take_now(c->path.lqp);
}

/* The channel ends with the queue pair: the peer learns it at its end. */
void mw__lqp_path_stop(struct mw__conn *c)
{
    if (c->path.lqp)
        mw__lqp_error(c->path.lqp);
}

bool mw__lqp_path_peer_done(const struct mw__conn *c)
{
    return mw__lqp_peer_done(c->path.lqp);
}

bool mw__lqp_path_quiescing(const struct mw__conn *c)
{
    return c->path.lqp && mw__lqp_quiescing(c->path.lqp);
}

void mw__lqp_path_settle(struct mw__conn *c, uint64_t until_ms)
{
    if (c->path.lqp)
        mw__lqp_settle(c->path.lqp, until_ms);
}

void mw__lqp_path_release(struct mw__conn *c)
{
    mw__lqp_free(c->path.lqp);
    c->path.lqp = NULL;
}

void mw__conn_set_transport(struct mw__conn *c, const struct mw__transport *tp)
{
    c->path.tp = tp;
    c->stats.transport = tp->kind;
}

int mw__conn_post_send(struct mw__conn *c, struct ibv_send_wr *wr, unsigned n, unsigned *took)
{
    struct ibv_send_wr *bad = NULL;
    int rc = c->path.tp->post_send(c, wr, &bad);
    /* refused part way, the ones before @bad were taken (and come back) */
    *took = rc == 0 ? n : bad ? (unsigned)(bad - wr) : 0;
    c->path.wr_out += *took;
    return -rc;
}

int mw__conn_post_recv(struct mw__conn *c, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    int rc = c->path.tp->post_recv(c, wr, bad);
    if (rc == 0) {                /* one at a time: msg.c posts no chains */
        c->path.wr_out++;
        c->path.recv_out++;
    }
    return rc;
}

void mw__conn_send_completed(struct mw__conn *c, unsigned n)
{
    c->path.wr_out -= n;
    mw__keepalive_heard(c);       /* acknowledged by the peer (or failing) */
    if (c->peer_left && c->path.wr_out == c->path.recv_out)
        mw__conn_peer_left_settle(c);
}

void mw__conn_recv_completed(struct mw__conn *c)
{
    c->path.wr_out--;
    c->path.recv_out--;
}

void mw__conn_inflight_forget(struct mw__conn *c)
{
    if (c->path.wr_out)                /* sends, a probe still out */
        mw__ops_drop_owner(c->ctx, c);
    c->path.wr_out = c->path.recv_out = 0;
}
