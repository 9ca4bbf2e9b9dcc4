/* A local queue pair: what a connection between two processes of one host
 * uses instead of its RC queue pair.  It takes the same work requests
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

/* mw__lqp_new() - a local queue pair not yet attached to a socket: posts
 * are kept (sends as records to write) until mw__lqp_attach.  0, -ENOMEM. */
int mw__lqp_new(mw_ctx_t *ctx, const struct mw__lqp_ops *ops, void *arg, struct mw__lqp **qp);

/* mw__lqp_attach() - carry @q over connected unix socket @fd (taken: closed
 * by mw__lqp_free, also on failure).  The peer's process is the socket's
 * (SO_PEERCRED), of this user.  A non-zero @greeting goes out first, before
 * anything posted: the connecting side names its connection with it, the
 * accepting side answers with it.  @answered: the peer must answer with
 * @greeting before anything else; its socket ending first ends the channel
 * -ECONNREFUSED (the peer did not take it).
 * 0, or -ESRCH (the peer's process is not visible here), -EPERM (another
 * user's), -errno. */
int mw__lqp_attach(struct mw__lqp *q, int fd, uint64_t greeting, bool answered);

/* mw__lqp_read_greeting() - a greeting at the start of @fd, read without
 * taking anything after it: 1 with *@token, 0 while incomplete (call again
 * when readable; *@got keeps the bytes so far, start at 0), -EPROTO or
 * -ECONNRESET. */
int mw__lqp_read_greeting(int fd, uint8_t buf[32], size_t *got, uint64_t *token);

/* Post like ibv_post_send/ibv_post_recv: SEND, RDMA_WRITE, RDMA_WRITE_WITH_IMM,
 * RDMA_READ with at most one scatter/gather entry.  0, or a positive errno
 * with *@bad at the request refused (EINVAL: an opcode or list it does not
 * take, ENOMEM). */
int mw__lqp_post_send(struct mw__lqp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int mw__lqp_post_recv(struct mw__lqp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

/* mw__lqp_take_now() - take what the socket holds now (the peer's requests
 * and answers), before deciding the peer is gone. */
void mw__lqp_take_now(struct mw__lqp *q);

/* mw__lqp_error() - to the error state: what was written goes out if the
 * socket takes it, then the socket closes (the peer sees its end), and
 * every request posted completes as a flush, from the loop. */
void mw__lqp_error(struct mw__lqp *q);

/* mw__lqp_free() - nothing posted completes any more. */
void mw__lqp_free(struct mw__lqp *q);

/* mw__lqp_peer() - the peer's process id, 0 before attach. */
pid_t mw__lqp_peer(const struct mw__lqp *q);

#endif
