/* A local queue pair: what a connection between two processes of one host
 * uses instead of its RC queue pair (and, attached to a TCP socket as a
 * stream channel, what a connection without RDMA runs on).  It takes the same work requests
 * (ibv_send_wr, ibv_recv_wr) and gives the same completions, through the
 * context's dispatch, so everything above it -- fragments, credits, the
 * issue order, cancels, the keepalive -- is the code the device path runs.
 *
 * Requests travel as records over a unix stream socket; the socket is the
 * notification too (readable: the loop wakes), so an idle process sleeps and
 * nothing polls memory.  Small payloads ride in the record; larger ones move
 * once, by cross-memory attach (process_vm_readv/writev), always by the
 * side that owns the target memory: a write's target reads it from the
 * initiator, a read's target writes it there, a message's receiver reads it
 * from the sender's send slot.  So the owner checks every access against
 * its exports first (ops->access), as a device checks a key: a peer cannot
 * reach memory it was not given.
 *
 * Semantics kept from RC: requests execute in posting order; a completion
 * means the peer has executed the request; only signalled requests
 * complete, except one that fails, which completes and moves the queue
 * pair to the error state; there every request still posted, and every
 * later one, completes as a flush, from the loop (never inside a post).
 * And a flush means what it means on a device: nobody touches the memory
 * the request names any more.  Here the peer's process executes requests,
 * from its loop, so a queue pair that fails tells it to stop and flushes
 * what it posted only once the peer says it stopped (or its process is
 * gone), within a bound (lqp.c, "The end").
 * Internal (mw__ names).
 */
#ifndef MW_CM_LQP_H
#define MW_CM_LQP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <infiniband/verbs.h>

#include "core/ctx.h"

struct mw__lqp;

struct mw__lqp_ops {
    /* Whether the peer may access [addr, addr+len) of this process under
     * @rkey: 0, or -EACCES. */
    int (*access)(void *arg, uint32_t rkey, uint64_t addr, uint64_t len);
    /* The channel ended: the peer closed it or died (-ECONNRESET), never
     * took it (-ECONNREFUSED), or broke the protocol (-EPROTO); @why says how.  Called from the loop,
     * once; what the peer sent before the end has been taken. */
    void (*ended)(void *arg, int err, const char *why);
};

/* Payloads up to this ride in the record; larger ones move by CMA. */
#define MW__LQP_INLINE_MAX 4096u

/* A stream channel's reads in flight, each costing its length and 4 KiB
 * (which bounds their number too): an initiator posts no more (ENOMEM, as
 * a full queue; EINVAL for one read above it all), a target holds no more
 * of their data unwritten (a peer that asks more is cut, -EPROTO). */
#define MW__LQP_STREAM_READS_MAX (64ull << 20)
#define MW__LQP_STREAM_READ_COST(len) ((uint64_t)(len) + 4096)

/* The status of a request flushed at the bound without the peer's word that
 * it executes nothing more (mw__wc_errno: -EBUSY). */
#define MW__LQP_WC_UNCONFIRMED IBV_WC_RESP_TIMEOUT_ERR

/* mw__lqp_new() - a local queue pair not yet attached to a socket: posts
 * are kept (sends as records to write) until mw__lqp_attach.  A failure
 * waits up to @bound_ms for the peer to stop.  0, -ENOMEM. */
int mw__lqp_new(mw_ctx_t *ctx, const struct mw__lqp_ops *ops, void *arg, unsigned bound_ms,
                struct mw__lqp **qp);

/* mw__lqp_attach() - carry @q over connected unix socket @fd to process
 * @peer, whose pidfd is @pidfd (-1: none); both are taken (closed by
 * mw__lqp_free, also on failure).  The caller checked that the peer is of
 * this user and allows cross-memory attach (local.c).  @first, if not
 * NULL, is a 32-byte record written before anything posted.  0, or
 * -ECANCELED (the queue pair failed before), -ENOMEM. */
int mw__lqp_attach(struct mw__lqp *q, int fd, pid_t peer, int pidfd, const uint8_t *first);

/* mw__lqp_attach_stream() - carry @q over connected stream socket @fd
 * (TCP) to a peer anywhere: every payload moves in the stream, a read's
 * data comes back in it, and the peer never reaches this process's memory
 * but through its requests, executed here against ops->access.  So a
 * failure flushes at once, and the peer's requests that came before its
 * end are executed, as a device executes what reached it.  @fd is taken,
 * as by mw__lqp_attach.  Before anything is posted (else -EINVAL). */
int mw__lqp_attach_stream(struct mw__lqp *q, int fd, const uint8_t *first);

/* The rendezvous's records (local.c): mw__lqp_hello() encodes a HELLO
 * naming @nonce, and @probe, where the sender keeps the nonce for the peer
 * to read by cross-memory attach.  mw__lqp_read_hello() reads one at the
 * start of @fd without taking anything after it: 1 with *@nonce and
 * *@probe, 0 while incomplete (call again when readable; *@got keeps the
 * bytes so far, start at 0), -EPROTO or -ECONNRESET. */
void mw__lqp_hello(uint64_t nonce, const void *probe, uint8_t buf[32]);
int mw__lqp_read_hello(int fd, uint8_t buf[32], size_t *got, uint64_t *nonce, uint64_t *probe);

/* Post like ibv_post_send/ibv_post_recv: SEND, RDMA_WRITE, RDMA_WRITE_WITH_IMM,
 * RDMA_READ with at most one scatter/gather entry.  0, or a positive errno
 * with *@bad at the request refused (EINVAL: an opcode or list it does not
 * take, ENOMEM). */
int mw__lqp_post_send(struct mw__lqp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int mw__lqp_post_recv(struct mw__lqp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

/* mw__lqp_take_now() - take what the socket holds now (the peer's requests
 * and answers), before deciding the peer is gone. */
void mw__lqp_take_now(struct mw__lqp *q);

/* mw__lqp_error() - to the error state: the peer's requests already here
 * are executed, what was written goes out if the socket takes it, our end
 * shuts (the peer executes nothing more of ours once it sees that), and
 * every request posted completes as a flush, from the loop -- those the
 * peer has not answered once it has said it stopped (its end), or its
 * process exited, or as MW__LQP_WC_UNCONFIRMED after the bound. */
void mw__lqp_error(struct mw__lqp *q);

/* mw__lqp_quiescing() - whether @q failed and waits for the peer's word.
 * mw__lqp_settle() - wait for it, blocking, until @until_ms (mw__now_ms);
 * then the flushes are due (from the loop).  For a context's teardown,
 * which cannot leave memory in a live peer's reach. */
bool mw__lqp_quiescing(const struct mw__lqp *q);
void mw__lqp_settle(struct mw__lqp *q, uint64_t until_ms);

/* mw__lqp_free() - nothing posted completes any more. */
void mw__lqp_free(struct mw__lqp *q);

/* mw__lqp_peer_done() - whether everything the peer will ever send was
 * read (its end, or its process's exit): no answer is still to come. */
bool mw__lqp_peer_done(const struct mw__lqp *q);
/* mw__lqp_ended() - whether the channel's end was reported (ops->ended). */
bool mw__lqp_ended(const struct mw__lqp *q);

/* mw__lqp_fd() - the socket @q runs on, -1 before attach or after its end. */
int mw__lqp_fd(const struct mw__lqp *q);

/* mw__lqp_peer() - the peer's process id, 0 before attach. */
pid_t mw__lqp_peer(const struct mw__lqp *q);

#endif
