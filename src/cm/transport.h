/* How a connection's work reaches its peer: one table of operations per
 * transport, so the connection's code never asks which it has.  A
 * connection set up over rdma_cm runs on its RDMA queue pair
 * (mw__transport_rdma) or, when the peer shares the host and takes the
 * channel, on a same-host queue pair beside it (mw__transport_local,
 * local.c); one set up over TCP runs on a queue pair carried by its socket
 * (mw__transport_tcp, tcp.c).  transport.c counts what is in flight over
 * any of them. */
#ifndef MW_CM_TRANSPORT_H
#define MW_CM_TRANSPORT_H

#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#include "meshwire.h"

struct mw__conn;

struct mw__transport {
    mw_transport_t kind;          /* what mw_conn_stats says */
    const char *via;              /* for the log's "connected" line */
    bool probes;                  /* a silent peer is found by keepalive
                                     probes (the NIC answers them), else by
                                     the transport itself */
    unsigned reads;               /* one-sided reads in flight; 0: as the
                                     queue pair negotiated */
    /* without probes: how long the peer's host has acknowledged nothing
     * while something waited for it, in ms (NULL: not known) */
    unsigned (*silent_ms)(const struct mw__conn *c);
    /* as ibv_post_send / ibv_post_recv */
    int (*post_send)(struct mw__conn *c, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
    int (*post_recv)(struct mw__conn *c, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
    /* a disconnect came: take the completions already on their way */
    void (*take_now)(struct mw__conn *c);
    /* rdma_disconnect was called: what is posted comes back, flushed */
    void (*stop)(struct mw__conn *c);
    /* whether the peer can answer nothing more (its end was read) */
    bool (*peer_done)(const struct mw__conn *c);
    /* context teardown: whether a failure still waits for the peer's word,
     * and waiting for it until @until_ms */
    bool (*quiescing)(const struct mw__conn *c);
    void (*settle)(struct mw__conn *c, uint64_t until_ms);
    /* the transport's own part goes (before the queue pair) */
    void (*release)(struct mw__conn *c);
};

/* One-sided reads a queue pair on a socket keeps in flight, executed by
 * the peer's loop (a stream channel's bytes are bounded by
 * MW__LQP_STREAM_READS_MAX as well). */
#define MW__LQP_READS 16

extern const struct mw__transport mw__transport_rdma;
extern const struct mw__transport mw__transport_local;
extern const struct mw__transport mw__transport_tcp;

/* The operations of a transport whose queue pair is a local queue pair
 * (c->path.lqp, lqp.h) on a socket: the same-host path's and TCP's tables
 * use them (an absent lqp: nothing to do). */
int mw__lqp_path_post_send(struct mw__conn *c, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int mw__lqp_path_post_recv(struct mw__conn *c, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
void mw__lqp_path_take_now(struct mw__conn *c);
void mw__lqp_path_stop(struct mw__conn *c);
bool mw__lqp_path_peer_done(const struct mw__conn *c);
bool mw__lqp_path_quiescing(const struct mw__conn *c);
void mw__lqp_path_settle(struct mw__conn *c, uint64_t until_ms);
void mw__lqp_path_release(struct mw__conn *c);

/* mw__transport_asked() - @o's transport option, unless the environment's
 * MW_TRANSPORT (rdma, tcp, auto) says otherwise: 0, or -EINVAL for a value
 * neither knows. */
int mw__transport_asked(mw_ctx_t *ctx, mw_conn_opts_t *o);

/* @c runs on @tp from now on (its stats say so). */
void mw__conn_set_transport(struct mw__conn *c, const struct mw__transport *tp);

/* Post on @c's transport, as ibv_post_send/recv, and count what it took
 * as in flight: sends are an array @wr of @n requests chained in order,
 * *@took of them taken (0 or -errno).  What comes back is uncounted by mw__conn_send_completed
 * (@n send-side requests: each completion handler once per completion) or
 * mw__conn_recv_completed; everything, records too, by
 * mw__conn_inflight_forget once nothing can come back. */
int mw__conn_post_send(struct mw__conn *c, struct ibv_send_wr *wr, unsigned n, unsigned *took);
int mw__conn_post_recv(struct mw__conn *c, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
void mw__conn_send_completed(struct mw__conn *c, unsigned n);
void mw__conn_recv_completed(struct mw__conn *c);
void mw__conn_inflight_forget(struct mw__conn *c);

#endif
