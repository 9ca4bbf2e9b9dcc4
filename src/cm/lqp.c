/* The local queue pair (lqp.h): records over a stream socket, payloads
 * moved once -- by cross-memory attach on a same-host channel, in the
 * stream itself on a stream channel -- completions made here and
 * dispatched as the CQ's are.
 *
 * A record is a 32-byte header, in network byte order like every meshwire
 * wire format, then its payload when INLINE (a same-host channel inlines
 * up to MW__LQP_INLINE_MAX bytes, a stream channel every payload):
 *
 *   off size field
 *     0   1  type     SEND, WRITE, READ (requests); ACK, ERR, DATA
 *                     (answers); HELLO (the rendezvous, local.c: before
 *                     the channel)
 *     1   1  flags    INLINE, IMM
 *     2   2  zero
 *     4   4  len      the request's bytes
 *     8   8  addr     the initiator's buffer (CMA), else 0
 *    16   8  arg      WRITE/READ: the target address; ACK: requests done so
 *                     far; ERR: the request that failed; DATA: the read it
 *                     answers; HELLO: the nonce
 *    24   4  rkey     WRITE/READ: the key; ERR: the ibv_wc_status
 *    28   4  imm      WRITE with IMM: the immediate, as posted
 *
 * A payload is taken as it arrives, straight to where it goes (the
 * receive, the target memory, the read's buffer), so what a peer sends is
 * never held whole.  On a stream channel a READ is answered by DATA, the
 * target's bytes as they were when it executed the read; the target holds
 * at most MW__LQP_STREAM_READS_MAX bytes of such answers not yet written,
 * which is what an initiator may have in flight (a peer asking more is
 * cut).  And nothing of the initiator's memory is ever in the peer's
 * reach: what it sends is copied as it is posted, what a read brings is
 * written by its own loop, which stops at the end; so a failure flushes at
 * once, without the wait described below.
 *
 * Requests are numbered from 0 in each direction by both ends; an ACK says
 * how many the responder has executed, an ERR that one failed (those
 * before it succeeded) and that it executes no more.
 *
 * The end.  A side that fails (its connection failed, aborted, closed)
 * shuts its socket for writing: a same-host peer executes none of its
 * requests that copy from or to its memory once it sees that -- the
 * wake-up's EV_CLOSED, or poll()'s POLLRDHUP, asked right before every
 * cross-memory copy -- and answers by shutting its own, after the answers
 * it owes.  (The requests that came before the end with their bytes in the
 * record, or none, it still executes, as a stream's peer executes those
 * before the end: a reason sent right before an abort arrives.)  Only the peer's end (or its
 * process's exit, from a pidfd) tells the failing side that nobody will
 * touch the memory its unanswered requests name: their completions wait
 * for it, as a device's flushes wait for the queue pair to stop, up to
 * bound_ms.  Past that (the peer's process alive, outside its loop) they
 * complete MW__LQP_WC_UNCONFIRMED: the peer has been told, checks before
 * each copy, and may still finish at most the one it had begun. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "cm/lqp.h"
#include "core/alloc.h"
#include "core/bytes.h"
#include "core/cq.h"
#include "core/list.h"

enum { REC_SEND = 1, REC_WRITE, REC_READ, REC_ACK, REC_ERR, REC_HELLO, REC_DATA };
enum { REC_INLINE = 1, REC_IMM = 2 };
#define REC_LEN 32
#define READ_MAX (256u * 1024)        /* socket bytes read per wake-up */
#define TURN_BYTES (8u << 20)         /* bytes copied before the loop gets a turn */
#define BATCH 32                      /* completions dispatched at a time */

struct rec {
    uint8_t type, flags;
    uint32_t len, rkey, imm;
    uint64_t addr, arg;
};

struct swr {                          /* a request posted, not yet answered */
    uint64_t wr_id;
    uint8_t *buf;                     /* a read's, on a stream channel */
    uint32_t len;
    enum ibv_wc_opcode opcode;
    bool signaled;
    bool got;                         /* its DATA came (a read, stream channel) */
};

struct rwr {                          /* a receive posted */
    uint64_t wr_id;
    uint8_t *buf;
    uint32_t len;
};

/* The payload being taken from the socket: a request's (to execute once
 * whole), or a read's DATA.  Where it goes is @dst; NULL drops it. */
struct payload {
    struct rec r;
    uint8_t *dst;
    uint32_t left;
    enum ibv_wc_status st;            /* a request's, so far */
    struct rwr rw;                    /* a message's receive */
    bool active, request;
};

/* Read data queued on a stream channel, written once the bytes sent reach
 * @end. */
struct resp {
    uint64_t end;
    uint64_t cost;                    /* MW__LQP_STREAM_READ_COST */
};

/* A FIFO of fixed-size items, grown by doubling. */
struct fifo {
    void *v;
    size_t size, cap, head, n;
};

struct mw__lqp {
    mw_ctx_t *ctx;
    const struct mw__lqp_ops *ops;
    void *arg;
    unsigned bound_ms;                /* a failure waits this long for the peer */
    int fd, pidfd;
    pid_t peer;
    bool stream;                      /* payloads in the stream, never CMA */
    struct payload pl;
    struct event *rev, *wev, *pev, *resume_ev, *bound_ev;
    struct evbuffer *in, *out;
    struct fifo sq, rq;               /* struct swr, struct rwr */
    uint64_t sq_done;                 /* our requests answered so far */
    uint64_t served, acked;           /* the peer's requests executed / acked */
    /* stream channel: bytes of our reads unanswered; bytes ever queued
     * out and written; the read data queued (struct resp) and its bytes */
    uint64_t reads_out, out_added, out_sent, resp_bytes;
    struct fifo resp;
    bool refusing;                    /* we answered ERR: execute nothing more */
    bool shut;                    /* our end is shut: nothing more is written */
    bool peer_shut;               /* its end is shut: nothing more executes,
                                     either way (ours is shut then too) */
    bool peer_eof;                /* and it sends nothing more: its end read,
                                     its socket closed, or its process gone */
    bool peer_refused;            /* it answered ERR: it executes nothing more */
    bool past_the_end;            /* its end seen, one of its requests not
                                     executed: none after it is either */
    bool error, ended, want_out;
    bool closing;                 /* mw__lqp_error: the socket closes */
    bool lingering;               /* meanwhile, a stream channel's: the answers
                                     it owes go out first (while the peer
                                     takes some within each bound_ms), what
                                     comes is dropped */
    bool shut_when_written;       /* and its end shuts once they are out */
    bool draining;                /* meanwhile: completions wait in late */
    bool quiescing;               /* closing, waiting for the peer's end */
    enum ibv_wc_status flush_status;  /* of what is still posted at the end */
    struct ibv_wc *late;
    size_t nlate, caplate;
    struct mw__task flush_task, end_task;
    int end_err;
    char end_why[128];
};

/* --- helpers -------------------------------------------------------------- */

static void *fifo_at(struct fifo *f, size_t i)
{
    return (char *)f->v + ((f->head + i) & (f->cap - 1)) * f->size;
}

static int fifo_push(struct fifo *f, const void *item)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 64;
        char *v = mw__malloc(cap * f->size);
        if (!v)
            return -ENOMEM;
        for (size_t i = 0; i < f->n; i++)
            memcpy(v + i * f->size, fifo_at(f, i), f->size);
        mw__free(f->v);
        *f = (struct fifo){.v = v, .size = f->size, .cap = cap, .n = f->n};
    }
    memcpy(fifo_at(f, f->n++), item, f->size);
    return 0;
}

static void fifo_pop(struct fifo *f, void *item)
{
    memcpy(item, fifo_at(f, 0), f->size);
    f->head = (f->head + 1) & (f->cap - 1);
    f->n--;
}

static void rec_encode(const struct rec *r, uint8_t b[REC_LEN])
{
    memset(b, 0, REC_LEN);
    b[0] = r->type;
    b[1] = r->flags;
    mw__put32(b + 4, r->len);
    mw__put64(b + 8, r->addr);
    mw__put64(b + 16, r->arg);
    mw__put32(b + 24, r->rkey);
    mw__put32(b + 28, r->imm);
}

/* Decode @b into @r; a payload inline may be up to @inline_max bytes. */
static const char *rec_decode(const uint8_t b[REC_LEN], struct rec *r, uint32_t inline_max)
{
    *r = (struct rec){.type = b[0], .flags = b[1], .len = mw__get32(b + 4),
                      .addr = mw__get64(b + 8), .arg = mw__get64(b + 16),
                      .rkey = mw__get32(b + 24), .imm = mw__get32(b + 28)};
    if (r->type < REC_SEND || r->type > REC_DATA)
        return "unknown record type";
    if (b[2] || b[3] || r->flags & ~(REC_INLINE | REC_IMM))
        return "unknown record flags";
    if (r->flags & REC_IMM && r->type != REC_WRITE)
        return "immediate on a record other than a write";
    if (r->flags & REC_INLINE && (r->type == REC_READ || (r->type >= REC_ACK &&
                                                          r->type != REC_DATA)))
        return "inline payload on a record that takes none";
    if (r->type == REC_DATA && !(r->flags & REC_INLINE))
        return "read data without its bytes";
    if (r->flags & REC_INLINE && r->len > inline_max)
        return "inline payload too long";
    return NULL;
}

/* --- writing -------------------------------------------------------------- */

static void end_later(struct mw__lqp *q, int err, const char *why);
static void shut_now(struct mw__lqp *q);
static void close_fd(struct mw__lqp *q);

/* @n bytes queued out were written (or dropped): the read data among them
 * is no longer held. */
static void out_gone(struct mw__lqp *q, size_t n)
{
    q->out_sent += n;
    while (q->resp.n && ((struct resp *)fifo_at(&q->resp, 0))->end <= q->out_sent) {
        struct resp r;
        fifo_pop(&q->resp, &r);
        q->resp_bytes -= r.cost;
    }
}

/* Arm the bound that ends a lingering channel whose peer takes nothing
 * more of what it is owed: bound_ms from now. */
static void linger_bound(struct mw__lqp *q)
{
    struct timeval tv = {q->bound_ms / 1000, (q->bound_ms % 1000) * 1000};
    mw__ev_add(q->ctx, q->bound_ev, &tv);
}

/* Write what the socket takes; wait for room otherwise (the loop's write
 * event; the peer's next answer also brings us back here).  A lingering
 * channel's bound starts again with every write: a peer slow to take a
 * large answer still gets it, one that takes nothing does not hold us. */
static void flush_out(struct mw__lqp *q)
{
    size_t before = q->out_sent;
    while (q->fd >= 0 && !q->shut && evbuffer_get_length(q->out)) {
        struct iovec iov[16];
        int n = evbuffer_peek(q->out, -1, NULL, (struct evbuffer_iovec *)iov, 16);
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)(n < 16 ? n : 16)};
        ssize_t w = sendmsg(q->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                q->peer_eof = true;   /* closed, not shut: it executes nothing more */
                end_later(q, -ECONNRESET, q->stream ? "the peer's end of the stream channel closed"
                                                    : "the peer's end of the same-host channel closed");
            }
            break;
        }
        evbuffer_drain(q->out, (size_t)w);
        out_gone(q, (size_t)w);
    }
    bool want = q->fd >= 0 && !q->shut && !q->ended && evbuffer_get_length(q->out);
    if (want != q->want_out && q->wev) {
        q->want_out = want;
        if (want)
            mw__ev_add(q->ctx, q->wev, NULL);
        else
            event_del(q->wev);
        mw__watch_fd_out(q->ctx, q->fd, want);
    }
    if (q->lingering && q->out_sent != before && q->fd >= 0)
        linger_bound(q);
    if (q->shut_when_written && !evbuffer_get_length(q->out))
        shut_now(q);
}

/* Shut our end for writing, after what the socket takes of what is
 * written (the rest is dropped: a record cut short is never executed) --
 * but a failed stream channel first writes all it owes (a read's data
 * may be large).  The peer executes nothing of ours once it sees this. */
static void shut_out(struct mw__lqp *q)
{
    if (q->shut || q->fd < 0)
        return;
    flush_out(q);
    if (q->lingering && evbuffer_get_length(q->out) && !q->ended) {
        q->shut_when_written = true;          /* flush_out shuts, once written */
        return;
    }
    shut_now(q);
}

static void shut_now(struct mw__lqp *q)
{
    q->shut = true;
    q->shut_when_written = false;
    flush_out(q);                 /* stops waiting for room */
    out_gone(q, evbuffer_get_length(q->out));
    evbuffer_drain(q->out, evbuffer_get_length(q->out));
    shutdown(q->fd, SHUT_WR);
    if (q->lingering && q->peer_eof)
        close_fd(q);
}

/* Queue record @r, and its payload when inline: whole, or nothing (the
 * room is made first, so neither add can fail halfway). */
static int add_rec(struct mw__lqp *q, const struct rec *r, const void *payload)
{
    uint8_t b[REC_LEN];
    rec_encode(r, b);
    size_t len = r->flags & REC_INLINE ? r->len : 0;
    if (evbuffer_expand(q->out, REC_LEN + len) < 0)
        return -ENOMEM;
    evbuffer_add(q->out, b, REC_LEN);
    if (len)
        evbuffer_add(q->out, payload, len);
    q->out_added += REC_LEN + len;
    return 0;
}

/* The requests executed since the last ACK, acknowledged. */
static void ack(struct mw__lqp *q)
{
    if (q->served == q->acked || q->refusing || q->shut)
        return;
    struct rec r = {.type = REC_ACK, .arg = q->served};
    if (add_rec(q, &r, NULL) == 0)
        q->acked = q->served;
    flush_out(q);
}

/* --- completions ---------------------------------------------------------- */

/* The oldest request posted, answered or flushed now. */
static void pop_request(struct mw__lqp *q, struct swr *s)
{
    fifo_pop(&q->sq, s);
    q->sq_done++;
    if (q->stream && s->opcode == IBV_WC_RDMA_READ)  /* (the mode is set before any post) */
        q->reads_out -= MW__LQP_STREAM_READ_COST(s->len);
}

/* Completions go to their operations now, or, while the queue pair closes
 * (mw__lqp_error), from the loop with the flushes. */
static void dispatch(struct mw__lqp *q, struct ibv_wc *wc, int *n)
{
    if (*n && q->draining) {
        if (q->nlate + (size_t)*n > q->caplate) {
            size_t cap = 2 * (q->nlate + (size_t)*n);
            struct ibv_wc *v = mw__realloc(q->late, cap * sizeof *v);
            if (!v) {             /* lost: their operations go with the connection */
                *n = 0;
                return;
            }
            q->late = v;
            q->caplate = cap;
        }
        memcpy(q->late + q->nlate, wc, (size_t)*n * sizeof *wc);
        q->nlate += (size_t)*n;
    } else if (*n) {
        mw__cq_dispatch(q->ctx, wc, *n);
    }
    *n = 0;
}

/* Every request and receive still posted completes as a flush (requests
 * with flush_status: unconfirmed, when the peer never said it stopped). */
static void flush_all(struct mw__task *t)
{
    struct mw__lqp *q = mw__container_of(t, struct mw__lqp, flush_task);
    struct ibv_wc wc[BATCH];
    int n = 0;
    if (q->quiescing)             /* not yet: the peer's end first */
        return;
    q->draining = false;
    for (size_t i = 0; i < q->nlate; i += BATCH) {   /* what completed first */
        size_t k = q->nlate - i < BATCH ? q->nlate - i : BATCH;
        mw__cq_dispatch(q->ctx, q->late + i, (int)k);
    }
    q->nlate = 0;
    if (q->pl.active) {           /* the rest of a payload: dropped, executed never */
        q->pl.dst = NULL;
        q->pl.request = false;
    }
    while (q->sq.n || q->rq.n) {
        if (q->sq.n) {
            struct swr s;
            pop_request(q, &s);
            wc[n++] = (struct ibv_wc){.wr_id = s.wr_id, .status = q->flush_status,
                                      .opcode = s.opcode};
        } else {
            struct rwr r;
            fifo_pop(&q->rq, &r);
            wc[n++] = (struct ibv_wc){.wr_id = r.wr_id, .status = IBV_WC_WR_FLUSH_ERR,
                                      .opcode = IBV_WC_RECV};
        }
        if (n == BATCH)
            dispatch(q, wc, &n);
    }
    dispatch(q, wc, &n);
}

/* Closing: the peer will execute nothing more of ours (@confirmed: it
 * said so by its end, or its process is gone; else bound_ms passed). */
static void quiesced(struct mw__lqp *q, bool confirmed)
{
    if (!q->quiescing)
        return;
    q->quiescing = false;
    if (q->bound_ev)
        event_del(q->bound_ev);
    if (!confirmed) {
        q->flush_status = MW__LQP_WC_UNCONFIRMED;
        MW_LOG(q->ctx, MW_LOG_WARN, "same-host path: process %d has not run its loop for %u ms "
               "since it was told to stop executing our requests: %zu of them fail unconfirmed "
               "(-EBUSY; it may still finish the one copy it had begun)", (int)q->peer,
               q->bound_ms, q->sq.n);
    }
    close_fd(q);
    mw__defer(q->ctx, &q->flush_task);
}

/* The peer answered our requests up to @upto (exclusive); request @upto
 * itself failed with @status when @failed. */
static const char *answered(struct mw__lqp *q, uint64_t upto, bool failed,
                            enum ibv_wc_status status)
{
    if (upto < q->sq_done || upto - q->sq_done > q->sq.n || (failed && upto - q->sq_done == q->sq.n))
        return "an answer for requests never made";
    if (failed && (status == IBV_WC_SUCCESS || status == IBV_WC_WR_FLUSH_ERR ||
                   status > IBV_WC_GENERAL_ERR))
        return "a failure without a failure status";
    for (uint64_t i = 0; q->stream && i < upto - q->sq_done; i++) {
        const struct swr *s = fifo_at(&q->sq, i);
        if (s->opcode == IBV_WC_RDMA_READ && !s->got)
            return "a read answered without its data";
    }
    struct ibv_wc wc[BATCH];
    int n = 0;
    while (q->sq_done < upto) {
        struct swr s;
        pop_request(q, &s);
        if (s.signaled)
            wc[n++] = (struct ibv_wc){.wr_id = s.wr_id, .status = IBV_WC_SUCCESS,
                                      .opcode = s.opcode, .byte_len = s.len};
        if (n == BATCH)
            dispatch(q, wc, &n);
    }
    if (failed) {
        struct swr s;
        pop_request(q, &s);
        wc[n++] = (struct ibv_wc){.wr_id = s.wr_id, .status = status, .opcode = s.opcode};
        q->error = true;          /* as RC: nothing after it executes */
        q->peer_refused = true;
        mw__defer(q->ctx, &q->flush_task);
    }
    dispatch(q, wc, &n);
    if (failed || !q->sq.n)       /* the peer executes nothing more of ours */
        quiesced(q, true);
    return NULL;
}

/* --- executing the peer's requests ---------------------------------------- */

static void peer_shut(struct mw__lqp *q);

/* Whether the peer still wants its requests executed, asked right before
 * a copy to or from its memory: its end not shut (it gave up on them), and
 * its process the one the pidfd names (a pid alone may have been reused). */
static bool peer_still_wants(struct mw__lqp *q)
{
    struct pollfd p[2] = {{.fd = q->fd, .events = POLLRDHUP}, {.fd = q->pidfd, .events = POLLIN}};
    int n;
    do
        n = poll(p, q->pidfd >= 0 ? 2 : 1, 0);
    while (n < 0 && errno == EINTR);
    if (n > 0 && (p[0].revents & (POLLRDHUP | POLLHUP) || p[1].revents)) {
        peer_shut(q);
        return false;
    }
    return true;
}

/* Whether @r needs a copy from or to the peer's memory (cross-memory
 * attach): a same-host request whose payload does not ride in its record. */
static bool copies_peer_memory(const struct mw__lqp *q, const struct rec *r)
{
    return !q->stream && r->len && !(r->flags & REC_INLINE);
}

/* Move @len bytes between @local (ours) and @remote (the peer's): read
 * them from the peer, or write them there.  0, or the status to answer;
 * *@gave_up when the peer no longer wants it (nothing moved). */
static enum ibv_wc_status cma(struct mw__lqp *q, void *local, uint64_t remote, uint32_t len,
                              bool from_peer, bool *gave_up)
{
    if (!peer_still_wants(q)) {
        *gave_up = true;
        q->past_the_end = true;   /* none after it executes either */
        return IBV_WC_WR_FLUSH_ERR;
    }
    struct iovec l = {local, len}, r = {(void *)(uintptr_t)remote, len};
    ssize_t n = from_peer ? process_vm_readv(q->peer, &l, 1, &r, 1, 0)
                          : process_vm_writev(q->peer, &l, 1, &r, 1, 0);
    if (n == (ssize_t)len)
        return IBV_WC_SUCCESS;
    if (n < 0 && errno == EPERM)
        MW_LOG(q->ctx, MW_LOG_ERROR, "same-host path: the kernel refused cross-memory attach "
               "to process %d (EPERM), though it allowed it when the channel was set up",
               (int)q->peer);
    return IBV_WC_LOC_PROT_ERR;   /* the initiator's buffer is not there */
}

/* A receive for a message or an immediate; false when none is posted:
 * the peer sent beyond the credits it was given. */
static bool pop_recv(struct mw__lqp *q, struct rwr *out)
{
    if (!q->rq.n)
        return false;
    fifo_pop(&q->rq, out);
    return true;
}

/* Answer read @r, executed now, with its bytes at @mem (stream channel):
 * the peer asked for no more than it may have in flight, or it is cut. */
static const char *answer_read(struct mw__lqp *q, const struct rec *r, const void *mem)
{
    uint64_t cost = MW__LQP_STREAM_READ_COST(r->len);
    if (q->resp_bytes + cost > MW__LQP_STREAM_READS_MAX)
        return "reads beyond what the peer takes in";
    struct rec d = {.type = REC_DATA, .flags = REC_INLINE, .len = r->len, .arg = q->served};
    if (add_rec(q, &d, mem) < 0)
        return "no memory for a read's data";
    struct resp m = {.end = q->out_added, .cost = cost};
    if (fifo_push(&q->resp, &m) < 0)
        return "no memory for a read's data";
    q->resp_bytes += cost;
    return NULL;
}

/* Request @r is here (its inline payload, if any, follows in q->in):
 * check it and set q->pl to take that payload where it goes.  Return a
 * protocol violation, or NULL (a failed access is answered, not fatal). */
static const char *begin(struct mw__lqp *q, const struct rec *r)
{
    struct payload *p = &q->pl;
    *p = (struct payload){.r = *r, .left = r->flags & REC_INLINE ? r->len : 0, .active = true,
                          .request = true};
    if (r->type == REC_SEND) {
        /* its receive stays posted until the message is whole: a flush
         * meanwhile finds it there */
        if (!q->rq.n)
            return "a message with no receive posted (beyond its credits)";
        p->rw = *(struct rwr *)fifo_at(&q->rq, 0);
        if (r->len > p->rw.len)
            p->st = IBV_WC_REM_INV_REQ_ERR;
        else
            p->dst = p->rw.buf;
    } else if (r->len && q->ops->access(q->arg, r->rkey, r->arg, r->len) < 0) {
        p->st = IBV_WC_REM_ACCESS_ERR;
    } else if (r->type == REC_WRITE) {
        p->dst = (uint8_t *)(uintptr_t)r->arg;
    }
    return NULL;
}

/* DATA @r answers one of our reads (stream channel): its bytes go to the
 * read's buffer. */
static const char *begin_data(struct mw__lqp *q, const struct rec *r)
{
    if (!q->stream)
        return "read data on a channel that moves it by cross-memory attach";
    if (r->arg < q->sq_done || r->arg - q->sq_done >= q->sq.n)
        return "read data for requests never made";
    struct swr *s = fifo_at(&q->sq, r->arg - q->sq_done);
    if (s->opcode != IBV_WC_RDMA_READ || s->len != r->len || s->got)
        return "read data that is not what its read asked";
    s->got = true;
    q->pl = (struct payload){.r = *r, .left = r->len, .active = true, .dst = s->buf};
    return NULL;
}

/* A payload the peer sent that is not taken: its bytes are dropped. */
static void begin_drop(struct mw__lqp *q, const struct rec *r)
{
    q->pl = (struct payload){.r = *r, .left = r->flags & REC_INLINE ? r->len : 0, .active = true};
}

/* Take what q->in holds of the current payload; true once it is whole. */
static bool feed(struct mw__lqp *q, size_t *moved)
{
    struct payload *p = &q->pl;
    size_t have = evbuffer_get_length(q->in), n = p->left < have ? p->left : have;
    /* a write's target is checked as each part lands: the export may go
     * while the rest is on its way */
    if (p->dst && p->request && p->r.type == REC_WRITE && n &&
        q->ops->access(q->arg, p->r.rkey, (uintptr_t)p->dst, n) < 0) {
        p->st = IBV_WC_REM_ACCESS_ERR;
        p->dst = NULL;
    }
    if (p->dst)
        evbuffer_remove(q->in, p->dst, n), p->dst += n;
    else
        evbuffer_drain(q->in, n);
    p->left -= (uint32_t)n;
    *moved += n;
    return !p->left;
}

/* The current request's payload is whole: execute the rest (a copy by
 * CMA, a read's answer), answer it, deliver its receive.  Return a
 * protocol violation, or NULL (a request the peer no longer wants is
 * dropped unanswered). */
static const char *finish(struct mw__lqp *q, size_t *moved)
{
    struct payload *p = &q->pl;
    const struct rec *r = &p->r;
    enum ibv_wc_status st = p->st;
    struct ibv_wc wc = {0};
    bool deliver = false, gave_up = false;
    p->active = false;
    if (!p->request)
        return NULL;
    void *mem = (void *)(uintptr_t)r->arg;
    if (st == IBV_WC_SUCCESS && r->type == REC_READ && q->stream) {
        const char *bad = answer_read(q, r, mem);     /* (of 0 bytes too) */
        if (bad)
            return bad;
        *moved += r->len;
    } else if (st == IBV_WC_SUCCESS && copies_peer_memory(q, r)) {
        bool from_peer = r->type != REC_READ;
        st = cma(q, from_peer ? (void *)p->dst : mem, r->addr, r->len, from_peer, &gave_up);
        *moved += r->len;
    }
    if (r->type == REC_SEND) {
        struct rwr used;
        if (st == IBV_WC_REM_INV_REQ_ERR) {       /* too long for its receive */
            wc = (struct ibv_wc){.wr_id = p->rw.wr_id, .status = IBV_WC_LOC_LEN_ERR,
                                 .opcode = IBV_WC_RECV};
            deliver = true;
        } else if (st == IBV_WC_SUCCESS) {
            wc = (struct ibv_wc){.wr_id = p->rw.wr_id, .opcode = IBV_WC_RECV, .byte_len = r->len};
            deliver = true;
        }                                 /* (else unused: it stays posted, first) */
        if (deliver)
            fifo_pop(&q->rq, &used);
    } else if (st == IBV_WC_SUCCESS && r->flags & REC_IMM) {
        struct rwr rw;
        if (!pop_recv(q, &rw))
            return "an immediate with no receive posted (beyond its credits)";
        wc = (struct ibv_wc){.wr_id = rw.wr_id, .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
                             .byte_len = r->len, .imm_data = r->imm, .wc_flags = IBV_WC_WITH_IMM};
        deliver = true;
    }
    if (gave_up)
        return NULL;
    if (st != IBV_WC_SUCCESS) {
        struct rec e = {.type = REC_ERR, .arg = q->served, .rkey = st};
        q->refusing = true;
        add_rec(q, &e, NULL);
        flush_out(q);
    } else {
        q->served++;
    }
    int one = deliver;
    dispatch(q, &wc, &one);
    return NULL;
}

/* --- reading -------------------------------------------------------------- */

static void ended(struct mw__lqp *q, int err, const char *why)
{
    if (q->ended)
        return;
    q->ended = true;
    if (q->rev)
        event_del(q->rev);
    if (q->wev)
        event_del(q->wev);
    /* nothing more is read or written here: a socket at its end stays
     * readable, which would keep mw_ctx_fd() readable for ever */
    if (q->lingering)             /* nothing more goes out either */
        close_fd(q);
    else if (q->fd >= 0) {
        q->want_out = false;
        mw__unwatch_fd(q->ctx, q->fd);
    }
    q->ops->ended(q->arg, err, why);
}

static void on_end_later(struct mw__task *t)
{
    struct mw__lqp *q = mw__container_of(t, struct mw__lqp, end_task);
    ended(q, q->end_err, q->end_why);
}

static void end_later(struct mw__lqp *q, int err, const char *why)
{
    if (q->ended || q->end_err)
        return;
    q->end_err = err;
    snprintf(q->end_why, sizeof q->end_why, "%s", why);
    mw__defer(q->ctx, &q->end_task);
}

/* The peer shut its end (or its process is gone): it waits for nothing
 * more from us but the answers we owe, and our end, which says we execute
 * nothing more of its requests (take_records drops them from now on). */
static void peer_shut(struct mw__lqp *q)
{
    if (q->peer_shut)
        return;
    q->peer_shut = true;
    ack(q);
    shut_out(q);
}

/* Whether request @r executes.  Once the peer shut its end, only what
 * leaves its memory alone does, up to the first that would not: what it
 * sent whole before giving up (a reason right before an abort) is
 * delivered, in order, as a device executes what reached it before a
 * disconnect. */
static bool may_execute(struct mw__lqp *q, const struct rec *r)
{
    if (q->refusing || (q->error && !q->draining))
        return false;
    if (!q->peer_shut)
        return !q->shut;
    if (copies_peer_memory(q, r))
        q->past_the_end = true;
    return !q->past_the_end;
}

/* Take the complete records in q->in, within the turn's budget: 1 when
 * some are left for the next turn.  Answers are always taken; requests
 * only while may_execute() says so. */
static int take_records(struct mw__lqp *q)
{
    size_t moved = 0;
    while (!q->ended) {
        const char *bad = NULL;
        if (q->pl.active) {       /* a payload, to take before any record */
            if (!feed(q, &moved))
                break;            /* the rest when it comes */
            if ((bad = finish(q, &moved))) {
                ended(q, -EPROTO, bad);
                return 0;
            }
            continue;
        }
        uint8_t b[REC_LEN];
        struct rec r;
        if (evbuffer_copyout(q->in, b, REC_LEN) < REC_LEN)
            break;
        bad = rec_decode(b, &r, q->stream ? UINT32_MAX : MW__LQP_INLINE_MAX);
        if (!bad && r.type == REC_HELLO)
            bad = "a greeting inside the channel";
        if (bad) {
            ended(q, -EPROTO, bad);
            return 0;
        }
        if (q->stream && (r.type == REC_SEND || r.type == REC_WRITE) &&
            !(r.flags & REC_INLINE) && r.len) {
            ended(q, -EPROTO, "a payload left out of a stream channel");
            return 0;
        }
        /* a same-host channel's payloads are small: taken whole */
        size_t inl = r.flags & REC_INLINE ? r.len : 0;
        if (!q->stream && evbuffer_get_length(q->in) < REC_LEN + inl)
            break;
        if (!q->draining && (moved >= TURN_BYTES || !mw__turn_may(q->ctx)))
            return 1;
        evbuffer_drain(q->in, REC_LEN);
        if (r.type == REC_ACK || r.type == REC_ERR)
            bad = answered(q, r.arg, r.type == REC_ERR, (enum ibv_wc_status)r.rkey);
        else if (r.type == REC_DATA)
            bad = begin_data(q, &r);
        else if (!may_execute(q, &r))
            begin_drop(q, &r);    /* executed never */
        else
            bad = begin(q, &r);
        if (bad) {
            ended(q, -EPROTO, bad);
            return 0;
        }
    }
    return 0;
}

static void take(struct mw__lqp *q)
{
    int more = take_records(q);
    if (!q->ended && !q->error)
        ack(q);
    if (more && q->resume_ev)
        mw__ev_add(q->ctx, q->resume_ev, &mw__zero_tv);
}

/* Read what the socket holds (at most @max), 0 at its end. */
static ssize_t read_some(struct mw__lqp *q, size_t max)
{
    int n;
    do
        n = evbuffer_read(q->in, q->fd, (int)max);
    while (n < 0 && errno == EINTR);
    return n;
}

/* Everything the peer sent is read: it executes nothing more of ours. */
static void at_end(struct mw__lqp *q, bool broken, const char *why)
{
    q->peer_eof = true;
    peer_shut(q);
    if (q->quiescing) {
        quiesced(q, true);
        return;
    }
    char how[96];
    if (!why)
        snprintf(how, sizeof how, broken ? "the %s channel failed"
                                         : "the peer closed the %s channel (its process closed "
                                           "the connection, or ended)",
                 q->stream ? "stream" : "same-host");
    ended(q, -ECONNRESET, why ? why : how);
}

/* A lingering channel drops what comes, and closes once both ends are
 * shut: ours after all it owes is written, the peer's read to its end
 * (closing with bytes unread would reset the connection, losing what we
 * still write). */
static void linger_read(struct mw__lqp *q)
{
    ssize_t n;
    while ((n = read_some(q, READ_MAX)) > 0)
        evbuffer_drain(q->in, evbuffer_get_length(q->in));
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        q->peer_eof = true;
        if (q->shut)
            close_fd(q);
        else
            event_del(q->rev);    /* (readable for ever now) the rest goes out first */
    }
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    struct mw__lqp *q = arg;
    if (what & EV_WRITE) {
        flush_out(q);
        return;
    }
    if (q->lingering) {
        linger_read(q);
        return;
    }
    /* Before executing what it sent: a same-host peer that gave up wants
     * its memory left alone.  A stream's requests carry their bytes, in
     * order: those that came before its end are executed, as a device's
     * queue pair executes what reached it before a disconnect -- a message
     * sent right before closing (a reason) is delivered. */
    if ((what & EV_CLOSED) && !q->stream)
        peer_shut(q);
    ssize_t n = evbuffer_get_length(q->in) > READ_MAX ? 1 : read_some(q, READ_MAX);
    bool broken = n < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
    take(q);
    flush_out(q);                 /* an answer came: room, perhaps */
    if ((n == 0 || broken) && q->fd >= 0)
        at_end(q, broken, NULL);
}

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    take(arg);
}

/* The peer's process exited: what it wrote is read, and taken as far as
 * it needs no copy from its memory. */
static void on_peer_exit(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__lqp *q = arg;
    event_del(q->pev);
    while (q->fd >= 0 && !q->ended && read_some(q, READ_MAX) > 0)
        take_records(q);
    if (q->fd >= 0 && !q->ended)
        at_end(q, false, "the peer's process ended");
    if (q->pidfd >= 0) {          /* readable for ever now; nothing copies any more */
        mw__unwatch_fd(q->ctx, q->pidfd);
        close(q->pidfd);
        q->pidfd = -1;
    }
}

static void on_bound(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__lqp *q = arg;
    if (q->lingering)             /* the peer took not all we owed it: so be it */
        close_fd(q);
    else
        quiesced(q, false);
}

/* Read and take everything the socket holds now, and answer it. */
static void drain_socket(struct mw__lqp *q)
{
    ssize_t n;
    while ((n = read_some(q, READ_MAX)) > 0)
        take_records(q);
    take_records(q);
    if (!q->ended && (!q->error || q->draining))
        ack(q);
    if (n == 0)
        q->peer_eof = true;
}

void mw__lqp_take_now(struct mw__lqp *q)
{
    if (q->fd >= 0 && !q->ended && !q->error)
        drain_socket(q);
}

/* --- life cycle and posting ------------------------------------------------ */

int mw__lqp_new(mw_ctx_t *ctx, const struct mw__lqp_ops *ops, void *arg, unsigned bound_ms,
                struct mw__lqp **qp)
{
    struct mw__lqp *q = mw__calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    *q = (struct mw__lqp){.ctx = ctx, .ops = ops, .arg = arg, .bound_ms = bound_ms, .fd = -1,
                          .pidfd = -1, .flush_status = IBV_WC_WR_FLUSH_ERR,
                          .sq = {.size = sizeof(struct swr)}, .rq = {.size = sizeof(struct rwr)},
                          .resp = {.size = sizeof(struct resp)},
                          .flush_task = {.fn = flush_all}, .end_task = {.fn = on_end_later}};
    if (!(q->in = evbuffer_new()) || !(q->out = evbuffer_new()) ||
        !(q->resume_ev = evtimer_new(ctx->base, on_resume, q)) ||
        !(q->bound_ev = evtimer_new(ctx->base, on_bound, q))) {
        mw__lqp_free(q);
        return -ENOMEM;
    }
    *qp = q;
    return 0;
}

int mw__lqp_attach_stream(struct mw__lqp *q, int fd, const uint8_t *first)
{
    if (q->sq.n || evbuffer_get_length(q->out)) {   /* posted in the same-host form */
        close(fd);
        return -EINVAL;
    }
    q->stream = true;
    return mw__lqp_attach(q, fd, 0, -1, first);
}

int mw__lqp_attach(struct mw__lqp *q, int fd, pid_t peer, int pidfd, const uint8_t *first)
{
    int rc = 0;
    if (q->closing)               /* failed before its socket came */
        rc = -ECANCELED;
    else if (!(q->rev = event_new(q->ctx->base, fd, EV_READ | EV_CLOSED | EV_PERSIST,
                                  on_readable, q)) ||
             !(q->wev = event_new(q->ctx->base, fd, EV_WRITE | EV_PERSIST, on_readable, q)) ||
             (pidfd >= 0 && !(q->pev = event_new(q->ctx->base, pidfd, EV_READ, on_peer_exit, q))))
        rc = -ENOMEM;
    else if ((rc = mw__watch_fd(q->ctx, fd)) == 0 && pidfd >= 0 &&
             (rc = mw__watch_fd(q->ctx, pidfd)) < 0)
        mw__unwatch_fd(q->ctx, fd);
    if (rc < 0) {
        close(fd);
        if (pidfd >= 0)
            close(pidfd);
        return rc;
    }
    q->fd = fd;
    q->pidfd = pidfd;
    q->peer = peer;
    if (first && evbuffer_prepend(q->out, first, REC_LEN) < 0)
        return -ENOMEM;           /* before anything posted */
    q->out_added += first ? REC_LEN : 0;
    mw__ev_add(q->ctx, q->rev, NULL);
    if (q->pev)
        mw__ev_add(q->ctx, q->pev, NULL);
    flush_out(q);
    return 0;
}

void mw__lqp_hello(uint64_t nonce, const void *probe, uint8_t buf[32])
{
    rec_encode(&(struct rec){.type = REC_HELLO, .arg = nonce, .addr = (uintptr_t)probe}, buf);
}

int mw__lqp_read_hello(int fd, uint8_t buf[32], size_t *got, uint64_t *nonce, uint64_t *probe)
{
    while (*got < REC_LEN) {
        ssize_t n = recv(fd, buf + *got, REC_LEN - *got, MSG_DONTWAIT);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -ECONNRESET;
        *got += (size_t)n;
    }
    struct rec r;
    if (rec_decode(buf, &r, 0) || r.type != REC_HELLO || r.flags || r.len || r.rkey || r.imm ||
        !r.arg || !r.addr)
        return -EPROTO;
    *nonce = r.arg;
    *probe = r.addr;
    return 1;
}

static enum ibv_wc_opcode wc_opcode(enum ibv_wr_opcode op)
{
    return op == IBV_WR_SEND ? IBV_WC_SEND : op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ
                                                                     : IBV_WC_RDMA_WRITE;
}

/* One request as a record (and its payload, if small). */
static int post_one(struct mw__lqp *q, const struct ibv_send_wr *wr)
{
    enum ibv_wr_opcode op = wr->opcode;
    if ((op != IBV_WR_SEND && op != IBV_WR_RDMA_WRITE && op != IBV_WR_RDMA_WRITE_WITH_IMM &&
         op != IBV_WR_RDMA_READ) || wr->num_sge > 1)
        return EINVAL;
    const void *buf = wr->num_sge ? (const void *)(uintptr_t)wr->sg_list[0].addr : NULL;
    uint32_t len = wr->num_sge ? wr->sg_list[0].length : 0;
    struct rec r = {.type = op == IBV_WR_SEND ? REC_SEND : op == IBV_WR_RDMA_READ ? REC_READ
                                                                                   : REC_WRITE,
                    .len = len, .addr = q->stream ? 0 : (uintptr_t)buf};
    if (op != IBV_WR_SEND) {
        r.arg = wr->wr.rdma.remote_addr;
        r.rkey = wr->wr.rdma.rkey;
    }
    if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
        r.flags |= REC_IMM;
        r.imm = wr->imm_data;
    }
    if (op != IBV_WR_RDMA_READ && (q->stream || len <= MW__LQP_INLINE_MAX)) {
        r.flags |= REC_INLINE;
        r.addr = 0;
    }
    bool stream_read = q->stream && op == IBV_WR_RDMA_READ;
    uint64_t cost = stream_read ? MW__LQP_STREAM_READ_COST(len) : 0;
    if (cost > MW__LQP_STREAM_READS_MAX)
        return EINVAL;            /* never: larger than every read in flight */
    if (cost > MW__LQP_STREAM_READS_MAX - q->reads_out)
        return ENOMEM;            /* as a full queue: again once reads complete */
    struct swr s = {.wr_id = wr->wr_id, .len = len, .opcode = wc_opcode(op),
                    .signaled = wr->send_flags & IBV_SEND_SIGNALED,
                    .buf = (uint8_t *)buf};
    if (fifo_push(&q->sq, &s) < 0)
        return ENOMEM;
    if (q->error || q->shut || add_rec(q, &r, buf) == 0) {
        q->reads_out += cost;
        return 0;
    }
    q->sq.n--;                    /* not sent: not posted */
    return ENOMEM;
}

int mw__lqp_post_send(struct mw__lqp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    int rc = 0;
    for (; wr; wr = wr->next)
        if ((rc = post_one(q, wr))) {
            *bad = wr;
            break;
        }
    if (q->error)
        mw__defer(q->ctx, &q->flush_task);
    else
        flush_out(q);
    return rc;
}

int mw__lqp_post_recv(struct mw__lqp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    for (; wr; wr = wr->next) {
        struct rwr r = {.wr_id = wr->wr_id};
        if (wr->num_sge > 1) {
            *bad = wr;
            return EINVAL;
        }
        if (wr->num_sge) {
            r.buf = (uint8_t *)(uintptr_t)wr->sg_list[0].addr;
            r.len = wr->sg_list[0].length;
        }
        if (fifo_push(&q->rq, &r) < 0) {
            *bad = wr;
            return ENOMEM;
        }
    }
    if (q->error)
        mw__defer(q->ctx, &q->flush_task);
    return 0;
}

static void close_fd(struct mw__lqp *q)
{
    if (q->lingering) {
        q->lingering = false;
        event_del(q->bound_ev);
    }
    if (q->pidfd >= 0) {
        mw__unwatch_fd(q->ctx, q->pidfd);
        if (q->pev)
            event_del(q->pev);
        close(q->pidfd);
        q->pidfd = -1;
    }
    if (q->fd < 0)
        return;
    if (q->want_out)
        mw__watch_fd_out(q->ctx, q->fd, false);
    mw__unwatch_fd(q->ctx, q->fd);
    if (q->rev)
        event_del(q->rev);
    if (q->wev)
        event_del(q->wev);
    close(q->fd);
    q->fd = -1;
}

/* As a device would have acknowledged what reached it before the queue
 * pair failed, the peer's requests already in the socket are executed and
 * answered before our end shuts (their completions come with the flushes):
 * a peer that finished its last send to us and left at once must not see
 * it fail.  Then our requests not yet answered wait for the peer's end
 * (see the top of the file). */
void mw__lqp_error(struct mw__lqp *q)
{
    q->error = true;
    if (q->closing) {
        mw__defer(q->ctx, &q->flush_task);
        return;
    }
    q->closing = true;
    q->lingering = q->stream && q->fd >= 0 && !q->ended;
    if (q->fd >= 0 && !q->ended && !q->peer_shut) {
        q->draining = true;
        drain_socket(q);
    }
    shut_out(q);
    /* (a stream channel's peer never reaches our memory: nothing to wait for) */
    if (q->fd >= 0 && q->sq.n && !q->peer_eof && !q->peer_refused && !q->stream) {
        q->quiescing = true;
        struct timeval tv = {q->bound_ms / 1000, (q->bound_ms % 1000) * 1000};
        mw__ev_add(q->ctx, q->bound_ev, &tv);
        if (q->ended)             /* (a protocol error stopped the reading) */
            quiesced(q, false);
        return;
    }
    if (q->lingering && q->fd >= 0) {
        linger_bound(q);
        linger_read(q);           /* (the peer may be gone already) */
    } else {
        close_fd(q);
    }
    mw__defer(q->ctx, &q->flush_task);
}

bool mw__lqp_quiescing(const struct mw__lqp *q)
{
    return q && q->quiescing;
}

void mw__lqp_settle(struct mw__lqp *q, uint64_t until_ms)
{
    while (q->quiescing) {
        uint64_t now = mw__now_ms();
        struct pollfd p[2] = {{.fd = q->fd, .events = POLLIN}, {.fd = q->pidfd, .events = POLLIN}};
        int n = now >= until_ms ? 0 : poll(p, q->pidfd >= 0 ? 2 : 1, (int)(until_ms - now));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            quiesced(q, false);
            break;
        }
        if (p[1].revents) {
            on_peer_exit(q->pidfd, EV_READ, q);
        } else {
            ssize_t got = read_some(q, READ_MAX);
            take_records(q);
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
                at_end(q, got < 0, NULL);
        }
    }
}

void mw__lqp_free(struct mw__lqp *q)
{
    if (!q)
        return;
    close_fd(q);
    mw__defer_cancel(q->ctx, &q->flush_task);
    mw__defer_cancel(q->ctx, &q->end_task);
    if (q->rev)
        event_free(q->rev);
    if (q->wev)
        event_free(q->wev);
    if (q->pev)
        event_free(q->pev);
    if (q->resume_ev)
        event_free(q->resume_ev);
    if (q->bound_ev)
        event_free(q->bound_ev);
    if (q->in)
        evbuffer_free(q->in);
    if (q->out)
        evbuffer_free(q->out);
    mw__free(q->sq.v);
    mw__free(q->rq.v);
    mw__free(q->resp.v);
    mw__free(q->late);
    mw__free(q);
}

bool mw__lqp_ended(const struct mw__lqp *q)
{
    return q && q->ended;
}

bool mw__lqp_peer_done(const struct mw__lqp *q)
{
    return q && q->peer_eof;
}

pid_t mw__lqp_peer(const struct mw__lqp *q)
{
    return q ? q->peer : 0;
}

int mw__lqp_fd(const struct mw__lqp *q)
{
    return q && !q->ended ? q->fd : -1;
}
