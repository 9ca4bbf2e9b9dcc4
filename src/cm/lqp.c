/* The local queue pair (lqp.h): records over a unix socket, payloads moved
 * once by cross-memory attach, completions made here and dispatched as the
 * CQ's are.
 *
 * A record is a 32-byte header, in network byte order like every meshwire
 * wire format, then up to MW__LQP_INLINE_MAX payload bytes when INLINE:
 *
 *   off size field
 *     0   1  type     SEND, WRITE, READ (requests); ACK, ERR (answers);
 *                     HELLO (the connecting side's first, see local.c)
 *     1   1  flags    INLINE, IMM
 *     2   2  zero
 *     4   4  len      the request's bytes
 *     8   8  addr     the initiator's buffer (CMA), else 0
 *    16   8  arg      WRITE/READ: the target address; ACK: requests done so
 *                     far; ERR: the request that failed; HELLO: the token
 *    24   4  rkey     WRITE/READ: the key; ERR: the ibv_wc_status
 *    28   4  imm      WRITE with IMM: the immediate, as posted
 *
 * Requests are numbered from 0 in each direction by both ends; an ACK says
 * how many the responder has executed, an ERR that one failed (those
 * before it succeeded) and that it executes no more. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "cm/lqp.h"
#include "cm/wire.h"
#include "core/alloc.h"
#include "core/cq.h"
#include "core/list.h"

enum { REC_SEND = 1, REC_WRITE, REC_READ, REC_ACK, REC_ERR, REC_HELLO };
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
    uint32_t len;
    enum ibv_wc_opcode opcode;
    bool signaled;
};

struct rwr {                          /* a receive posted */
    uint64_t wr_id;
    uint8_t *buf;
    uint32_t len;
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
    int fd;
    pid_t peer;
    struct event *rev, *wev, *resume_ev;
    struct evbuffer *in, *out;
    struct fifo sq, rq;               /* struct swr, struct rwr */
    uint64_t sq_done;                 /* our requests answered so far */
    uint64_t served, acked;           /* the peer's requests executed / acked */
    bool refusing;                    /* we answered ERR: execute nothing more */
    uint64_t awaited;                 /* the greeting the peer must answer with */
    bool error, ended, want_out;
    bool closing;                 /* mw__lqp_error: the socket closes */
    bool draining;                /* meanwhile: completions wait in late */
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

/* Put back the item just popped, first again. */
static void fifo_unpop(struct fifo *f, const void *item)
{
    f->head = (f->head - 1) & (f->cap - 1);
    f->n++;
    memcpy(fifo_at(f, 0), item, f->size);
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

static const char *rec_decode(const uint8_t b[REC_LEN], struct rec *r)
{
    *r = (struct rec){.type = b[0], .flags = b[1], .len = mw__get32(b + 4),
                      .addr = mw__get64(b + 8), .arg = mw__get64(b + 16),
                      .rkey = mw__get32(b + 24), .imm = mw__get32(b + 28)};
    if (r->type < REC_SEND || r->type > REC_HELLO)
        return "unknown record type";
    if (b[2] || b[3] || r->flags & ~(REC_INLINE | REC_IMM))
        return "unknown record flags";
    if (r->flags & REC_IMM && r->type != REC_WRITE)
        return "immediate on a record other than a write";
    if (r->flags & REC_INLINE && (r->type == REC_READ || r->type >= REC_ACK))
        return "inline payload on a record that takes none";
    if (r->flags & REC_INLINE && r->len > MW__LQP_INLINE_MAX)
        return "inline payload too long";
    return NULL;
}

/* --- writing -------------------------------------------------------------- */

static void end_later(struct mw__lqp *q, int err, const char *why);

/* Write what the socket takes; wait for room otherwise (the loop's write
 * event; the peer's next answer also brings us back here). */
static void flush_out(struct mw__lqp *q)
{
    while (q->fd >= 0 && evbuffer_get_length(q->out)) {
        struct iovec iov[16];
        int n = evbuffer_peek(q->out, -1, NULL, (struct evbuffer_iovec *)iov, 16);
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)(n < 16 ? n : 16)};
        ssize_t w = sendmsg(q->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                end_later(q, -ECONNRESET, "the peer's end of the same-host channel closed");
            break;
        }
        evbuffer_drain(q->out, (size_t)w);
    }
    bool want = q->fd >= 0 && !q->ended && evbuffer_get_length(q->out);
    if (want != q->want_out && q->wev) {
        q->want_out = want;
        if (want)
            mw__ev_add(q->ctx, q->wev, NULL);
        else
            event_del(q->wev);
        mw__watch_fd_out(q->ctx, q->fd, want);
    }
}

static int add_rec(struct mw__lqp *q, const struct rec *r, const void *payload)
{
    uint8_t b[REC_LEN];
    rec_encode(r, b);
    if (evbuffer_add(q->out, b, REC_LEN) < 0 ||
        (r->flags & REC_INLINE && r->len && evbuffer_add(q->out, payload, r->len) < 0))
        return -ENOMEM;
    return 0;
}

/* The requests executed since the last ACK, acknowledged. */
static void ack(struct mw__lqp *q)
{
    if (q->served == q->acked || q->refusing)
        return;
    struct rec r = {.type = REC_ACK, .arg = q->served};
    if (add_rec(q, &r, NULL) == 0)
        q->acked = q->served;
    flush_out(q);
}

/* --- completions ---------------------------------------------------------- */

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

/* Every request and receive still posted completes as a flush. */
static void flush_all(struct mw__task *t)
{
    struct mw__lqp *q = mw__container_of(t, struct mw__lqp, flush_task);
    struct ibv_wc wc[BATCH];
    int n = 0;
    q->draining = false;
    for (size_t i = 0; i < q->nlate; i += BATCH) {   /* what completed first */
        size_t k = q->nlate - i < BATCH ? q->nlate - i : BATCH;
        mw__cq_dispatch(q->ctx, q->late + i, (int)k);
    }
    q->nlate = 0;
    while (q->sq.n || q->rq.n) {
        if (q->sq.n) {
            struct swr s;
            fifo_pop(&q->sq, &s);
            q->sq_done++;
            wc[n++] = (struct ibv_wc){.wr_id = s.wr_id, .status = IBV_WC_WR_FLUSH_ERR,
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
    struct ibv_wc wc[BATCH];
    int n = 0;
    while (q->sq_done < upto) {
        struct swr s;
        fifo_pop(&q->sq, &s);
        q->sq_done++;
        if (s.signaled)
            wc[n++] = (struct ibv_wc){.wr_id = s.wr_id, .status = IBV_WC_SUCCESS,
                                      .opcode = s.opcode, .byte_len = s.len};
        if (n == BATCH)
            dispatch(q, wc, &n);
    }
    if (failed) {
        struct swr s;
        fifo_pop(&q->sq, &s);
        q->sq_done++;
        wc[n++] = (struct ibv_wc){.wr_id = s.wr_id, .status = status, .opcode = s.opcode};
        q->error = true;          /* as RC: nothing after it executes */
        mw__defer(q->ctx, &q->flush_task);
    }
    dispatch(q, wc, &n);
    return NULL;
}

/* --- executing the peer's requests ---------------------------------------- */

/* Move @len bytes between @local (ours) and @remote (the peer's): read
 * them from the peer, or write them there.  0, or the status to answer. */
static enum ibv_wc_status cma(struct mw__lqp *q, void *local, uint64_t remote, uint32_t len,
                              bool from_peer)
{
    struct iovec l = {local, len}, r = {(void *)(uintptr_t)remote, len};
    ssize_t n = from_peer ? process_vm_readv(q->peer, &l, 1, &r, 1, 0)
                          : process_vm_writev(q->peer, &l, 1, &r, 1, 0);
    if (n == (ssize_t)len)
        return IBV_WC_SUCCESS;
    if (n < 0 && errno == EPERM)
        MW_LOG(q->ctx, MW_LOG_ERROR, "same-host path: the kernel refused cross-memory attach "
               "to process %d (EPERM: kernel.yama.ptrace_scope?); MW_TRANSPORT=rdma avoids it",
               (int)q->peer);
    return IBV_WC_LOC_PROT_ERR;   /* the initiator's buffer is not there */
}

/* Payload of request @r into @dst: from the record, or from the peer. */
static enum ibv_wc_status take_payload(struct mw__lqp *q, const struct rec *r, void *dst)
{
    if (!(r->flags & REC_INLINE))
        return r->len ? cma(q, dst, r->addr, r->len, true) : IBV_WC_SUCCESS;
    evbuffer_remove(q->in, dst, r->len);
    return IBV_WC_SUCCESS;
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

/* Execute one request; its payload, if inline, is in q->in.  Return a
 * protocol violation, or NULL (a failed access is answered, not fatal). */
static const char *execute(struct mw__lqp *q, const struct rec *r, size_t *moved)
{
    enum ibv_wc_status st = IBV_WC_SUCCESS;
    struct rwr rw;
    struct ibv_wc wc = {0};
    bool deliver = false;
    if (r->type == REC_SEND) {
        if (!pop_recv(q, &rw))
            return "a message with no receive posted (beyond its credits)";
        if (r->len > rw.len) {
            st = IBV_WC_REM_INV_REQ_ERR;
            wc = (struct ibv_wc){.wr_id = rw.wr_id, .status = IBV_WC_LOC_LEN_ERR,
                                 .opcode = IBV_WC_RECV};
            deliver = true;
        } else if ((st = take_payload(q, r, rw.buf)) == IBV_WC_SUCCESS) {
            wc = (struct ibv_wc){.wr_id = rw.wr_id, .opcode = IBV_WC_RECV, .byte_len = r->len};
            deliver = true;
        } else {
            fifo_unpop(&q->rq, &rw);  /* unused: it stays posted, first */
        }
    } else {
        bool write = r->type == REC_WRITE;
        void *mem = (void *)(uintptr_t)r->arg;
        if (r->len && q->ops->access(q->arg, r->rkey, r->arg, r->len) < 0)
            st = IBV_WC_REM_ACCESS_ERR;
        else if (write)
            st = take_payload(q, r, mem);
        else
            st = r->len ? cma(q, mem, r->addr, r->len, false) : IBV_WC_SUCCESS;
        if (st == IBV_WC_SUCCESS && r->flags & REC_IMM) {
            if (!pop_recv(q, &rw))
                return "an immediate with no receive posted (beyond its credits)";
            wc = (struct ibv_wc){.wr_id = rw.wr_id, .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
                                 .byte_len = r->len, .imm_data = r->imm, .wc_flags = IBV_WC_WITH_IMM};
            deliver = true;
        }
    }
    if (r->flags & REC_INLINE && st != IBV_WC_SUCCESS)
        evbuffer_drain(q->in, r->len);        /* not taken */
    *moved += r->len;
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

/* Take the complete records in q->in, within the turn's budget: 1 when
 * some are left for the next turn. */
static int take_records(struct mw__lqp *q)
{
    size_t moved = 0;
    while ((!q->error || q->draining) && !q->ended) {
        uint8_t b[REC_LEN];
        struct rec r;
        if (evbuffer_copyout(q->in, b, REC_LEN) < REC_LEN)
            break;
        const char *bad = rec_decode(b, &r);
        if (!bad && r.type == REC_HELLO && q->awaited && r.arg == q->awaited) {
            evbuffer_drain(q->in, REC_LEN);   /* the peer took the channel */
            q->awaited = 0;
            continue;
        }
        if (bad || r.type == REC_HELLO || q->awaited) {
            ended(q, -EPROTO, bad ? bad : q->awaited ? "no answer to the greeting"
                                                     : "a second greeting");
            return 0;
        }
        size_t inl = r.flags & REC_INLINE ? r.len : 0;
        if (evbuffer_get_length(q->in) < REC_LEN + inl)
            break;
        if (!q->draining && (moved >= TURN_BYTES || !mw__turn_may(q->ctx)))
            return 1;
        evbuffer_drain(q->in, REC_LEN);
        if (r.type == REC_ACK || r.type == REC_ERR) {
            bad = answered(q, r.arg, r.type == REC_ERR, (enum ibv_wc_status)r.rkey);
        } else if (q->refusing) {
            evbuffer_drain(q->in, inl);   /* after a failure: executed never */
        } else {
            bad = execute(q, &r, &moved);
        }
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

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    struct mw__lqp *q = arg;
    if (what & EV_WRITE) {
        flush_out(q);
        return;
    }
    ssize_t n = evbuffer_get_length(q->in) > READ_MAX ? 1 : read_some(q, READ_MAX);
    bool broken = n < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
    take(q);
    flush_out(q);                 /* an answer came: room, perhaps */
    if ((n == 0 || broken) && q->awaited)
        ended(q, -ECONNREFUSED, "the peer did not take the same-host channel");
    else if (n == 0 || broken)
        ended(q, -ECONNRESET, n == 0 ? "the peer closed the same-host channel (its process "
                                       "closed the connection, or ended)"
                                     : "the same-host channel failed");
}

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    take(arg);
}

/* Read and take everything the socket holds now, and answer it. */
static void drain_socket(struct mw__lqp *q)
{
    while (read_some(q, READ_MAX) > 0)
        take_records(q);
    take_records(q);
    if (!q->ended && (!q->error || q->draining))
        ack(q);
}

void mw__lqp_take_now(struct mw__lqp *q)
{
    if (q->fd >= 0 && !q->ended && !q->error)
        drain_socket(q);
}

/* --- life cycle and posting ------------------------------------------------ */

int mw__lqp_new(mw_ctx_t *ctx, const struct mw__lqp_ops *ops, void *arg, struct mw__lqp **qp)
{
    struct mw__lqp *q = mw__calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    *q = (struct mw__lqp){.ctx = ctx, .ops = ops, .arg = arg, .fd = -1,
                          .sq = {.size = sizeof(struct swr)}, .rq = {.size = sizeof(struct rwr)},
                          .flush_task = {.fn = flush_all}, .end_task = {.fn = on_end_later}};
    if (!(q->in = evbuffer_new()) || !(q->out = evbuffer_new()) ||
        !(q->resume_ev = evtimer_new(ctx->base, on_resume, q))) {
        mw__lqp_free(q);
        return -ENOMEM;
    }
    *qp = q;
    return 0;
}

int mw__lqp_attach(struct mw__lqp *q, int fd, uint64_t greeting, bool answered)
{
    if (q->closing) {             /* failed before its socket came */
        close(fd);
        return 0;
    }
    struct ucred cr;
    socklen_t len = sizeof cr;
    int rc = 0;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
        rc = -errno;
    else if (cr.pid <= 0)
        rc = -ESRCH;              /* another pid namespace: no CMA */
    else if (cr.uid != geteuid())
        rc = -EPERM;              /* the handshake said same user: not this one */
    if (rc == 0 && !(q->rev = event_new(q->ctx->base, fd, EV_READ | EV_PERSIST, on_readable, q)))
        rc = -ENOMEM;
    if (rc == 0 && !(q->wev = event_new(q->ctx->base, fd, EV_WRITE | EV_PERSIST, on_readable, q)))
        rc = -ENOMEM;
    if (rc == 0)
        rc = mw__watch_fd(q->ctx, fd);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    q->fd = fd;
    q->peer = cr.pid;
    q->awaited = answered ? greeting : 0;
    if (greeting) {               /* first: before anything posted */
        uint8_t b[REC_LEN];
        rec_encode(&(struct rec){.type = REC_HELLO, .arg = greeting}, b);
        if (evbuffer_prepend(q->out, b, REC_LEN) < 0)
            return -ENOMEM;
    }
    mw__ev_add(q->ctx, q->rev, NULL);
    flush_out(q);
    return 0;
}

int mw__lqp_read_greeting(int fd, uint8_t buf[32], size_t *got, uint64_t *token)
{
    while (*got < REC_LEN) {
        ssize_t n = recv(fd, buf + *got, REC_LEN - *got, MSG_DONTWAIT);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno == EINTR ? 0 : -ECONNRESET;
        *got += (size_t)n;
    }
    struct rec r = {.type = buf[0], .arg = mw__get64(buf + 16)};
    for (int i = 1; i < REC_LEN; i++)
        if (i < 16 || i >= 24 ? buf[i] != 0 : false)
            return -EPROTO;
    if (r.type != REC_HELLO || !r.arg)
        return -EPROTO;
    *token = r.arg;
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
                    .len = len, .addr = (uintptr_t)buf};
    if (op != IBV_WR_SEND) {
        r.arg = wr->wr.rdma.remote_addr;
        r.rkey = wr->wr.rdma.rkey;
    }
    if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
        r.flags |= REC_IMM;
        r.imm = wr->imm_data;
    }
    if (op != IBV_WR_RDMA_READ && len <= MW__LQP_INLINE_MAX) {
        r.flags |= REC_INLINE;
        r.addr = 0;
    }
    struct swr s = {.wr_id = wr->wr_id, .len = len, .opcode = wc_opcode(op),
                    .signaled = wr->send_flags & IBV_SEND_SIGNALED};
    if (fifo_push(&q->sq, &s) < 0)
        return ENOMEM;
    if (q->error || add_rec(q, &r, buf) == 0)
        return 0;
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
 * answered before it closes (their completions come with the flushes): a
 * peer that finished its last send to us and left at once must not see it
 * fail. */
void mw__lqp_error(struct mw__lqp *q)
{
    q->error = true;
    mw__defer(q->ctx, &q->flush_task);
    if (q->closing)
        return;
    q->closing = true;
    if (q->fd >= 0 && !q->ended) {
        q->draining = true;
        drain_socket(q);
    }
    flush_out(q);                 /* our last answers, if the socket takes them */
    close_fd(q);
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
    if (q->resume_ev)
        event_free(q->resume_ev);
    if (q->in)
        evbuffer_free(q->in);
    if (q->out)
        evbuffer_free(q->out);
    mw__free(q->sq.v);
    mw__free(q->rq.v);
    mw__free(q->late);
    mw__free(q);
}

pid_t mw__lqp_peer(const struct mw__lqp *q)
{
    return q ? q->peer : 0;
}
