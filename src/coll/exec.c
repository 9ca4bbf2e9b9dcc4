/* Running collectives: the head of the communicator's queue executes its
 * schedule (coll/sched.h) step by step.  A step's data moves in chunks of at
 * most one scratch slot, by RDMA WRITE WITH IMMEDIATE into the peer's
 * scratch; the peer applies each chunk (copy or reduce into its result) and
 * acks it, which frees the slot.  An ack rides on the next chunk written
 * the other way (up to 31 slots in a data immediate); where none goes, a
 * zero-length write with immediate carries it once half the slots are
 * taken.  Each such write costs a post and a completion at both ends: in
 * recursive doubling and two-rank rings every ack rides.
 * A data immediate carries the collective's sequence number and a signature
 * of (kind, type, op, count, root, step): a rank running something else is
 * caught on its first chunk instead of corrupting anyone's data. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/comm.h"
#include "coll/exec.h"
#include "coll/reduce.h"
#include "coll/sched.h"
#include "core/alloc.h"
#include "core/ctx.h"
#include "core/future.h"

/* Immediates with bit 31 set are control, not data: an ack frees as many
 * slots as its bits 0..23 say; an abort says the sender broke the
 * communicator and why (bits 24..29) because of which rank (bits 0..23);
 * a goodbye (bit 29 without bit 30) says the sender closed it. */
#define IMM_ACK (1u << 31)
#define IMM_ABORT (1u << 30)
#define IMM_BYE (1u << 29)
#define IMM_LOW_MASK 0xffffffu  /* an ack's count, an abort's rank */
/* A data immediate: bit 31 clear, the sequence number in bits 23..30,
 * slots acked in passing in bits 18..22, the signature in bits 0..17. */
#define IMM_RIDE_SHIFT 18
#define IMM_RIDE_MAX 31u
#define IMM_RIDE_MASK (IMM_RIDE_MAX << IMM_RIDE_SHIFT)
#define IMM_SIG_MASK ((1u << IMM_RIDE_SHIFT) - 1)

static uint32_t hash32(uint32_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        h = (h ^ (uint8_t)v) * 16777619u;     /* FNV-1a */
    return h;
}

static uint32_t imm_of(const struct mw__run *k, int step)
{
    uint32_t sig = hash32(k->sig_base, (uint64_t)step) & IMM_SIG_MASK;
    return (uint32_t)k->seq << 23 | sig;
}

const uint8_t *mw__step_source(const struct mw__run *k, const struct mw__step *st)
{
    return (st->send_from == MW__BUF_INPUT ? k->in : k->res) + st->send_off * k->esz;
}

bool mw__step_overlaps(const struct mw__run *k, const struct mw__step *st)
{
    if (st->send_to < 0 || st->recv_from < 0 || !st->send_len || !st->recv_len)
        return false;
    const uint8_t *src = mw__step_source(k, st), *dst = k->res + st->recv_off * k->esz;
    return src < dst + st->recv_len * k->esz && dst < src + st->send_len * k->esz;
}

void mw__coll_discard(struct mw__run *k)
{
    struct mw__comm *comm = k->comm;
    mw__sched_free(&k->s);
    mw_free(comm->ctx, k->work);
    mw_free(comm->ctx, k->in_copy);
    mw_free(comm->ctx, k->stage);
    if (k->mr_in)
        mw_dereg(comm->ctx, k->mr_in);
    if (k->mr_out)
        mw_dereg(comm->ctx, k->mr_out);
    mw__free(k);
}

/* The run is over and nothing of it is in flight: its future completes,
 * its buffers and registrations go. */
static void release_run(struct mw__run *k)
{
    struct mw__comm *comm = k->comm;
    if (k->err)
        comm->colls_failed++;
    else
        comm->colls_done++;
    if (k->f && k->err)
        mw_future_fail(k->f, k->err, "%s on rank %d: %s", mw__coll_name(k->s.kind), comm->rank,
                       k->why);
    else if (k->f)
        mw_future_resolve(k->f, NULL);
    mw_future_unref(k->f);
    mw__coll_discard(k);
    mw__comm_unref(comm);
}

static void finished(struct mw__run *k, int err, const char *why)
{
    k->finished = true;
    k->err = err;
    snprintf(k->why, sizeof k->why, "%s", why ? why : "");
    if (k->writes_out == 0 && k->regs_pending == 0)
        release_run(k);
}

/* Take @k out of the queue: it neither writes nor reduces into the
 * caller's buffers any more; it completes once nothing of it is in
 * flight (writes reading its buffers, registrations of them). */
static void finish(struct mw__run *k, int err, const char *why)
{
    mw__list_del(&k->link);
    finished(k, err, why);
}

void mw__coll_discard_later(struct mw__run *k, int err, const char *why)
{
    mw__comm_ref(k->comm);        /* as a queued run holds it */
    finished(k, err, why);
}

void mw__coll_registered(struct mw__run *k, int err)
{
    k->regs_pending--;
    if (k->finished) {
        if (k->writes_out == 0 && k->regs_pending == 0)
            release_run(k);
    } else if (err) {
        mw__comm_abort(k->comm, MW__ABORT_LOCAL, k->comm->rank, err,
                       "cannot register a buffer of a %s on rank %d: %s",
                       mw__coll_name(k->s.kind), k->comm->rank, mw_strerror(err));
    } else {
        mw__coll_advance(k->comm);
    }
}

uint32_t mw__coll_signature(int kind, int algo, mw_dtype_t dt, mw_op_t op, size_t count,
                            int root)
{
    uint32_t h = 2166136261u;
    h = hash32(h, (uint64_t)kind);
    h = hash32(h, (uint64_t)algo);
    h = hash32(h, (uint64_t)dt);
    h = hash32(h, (uint64_t)op);
    h = hash32(h, (uint64_t)count);
    return hash32(h, (uint64_t)root);
}

void mw__coll_enqueue(struct mw__comm *comm, struct mw__run *k)
{
    mw__list_add_tail(&comm->colls, &k->link);
    mw__comm_ref(comm);
    mw__coll_advance(comm);
}

void mw__coll_fail_all(struct mw__comm *comm, int err, const char *why)
{
    while (!mw__list_empty(&comm->colls))
        finish(mw__container_of(comm->colls.next, struct mw__run, link), err, why);
}

/* --- one step ------------------------------------------------------------- */

static size_t chunks_of(const struct mw__run *k, size_t len)
{
    return len ? (len + k->chunk_elems - 1) / k->chunk_elems : 1;
}

static int start_step(struct mw__run *k)
{
    const struct mw__step *st = &k->s.steps[k->step];
    k->s_chunks = st->send_to >= 0 ? chunks_of(k, st->send_len) : 0;
    k->r_chunks = st->recv_from >= 0 ? chunks_of(k, st->recv_len) : 0;
    k->s_posted = k->r_done = 0;
    k->s_base = st->send_to >= 0 ? k->comm->peers[st->send_to].sent : 0;
    k->src = mw__step_source(k, st);
    /* A step whose receive lands on what it sends (the same result range,
     * or input the caller placed in the result: in place) sends a copy, so
     * receives can be applied at once (waiting for the own send could
     * deadlock a ring once chunks outnumber slots). */
    if (mw__step_overlaps(k, st)) {
        memcpy(k->stage, k->src, st->send_len * k->esz);
        k->src = k->stage;
    }
    k->started = true;
    return 0;
}

/* A chunk written to a peer for a run. */
struct chunk {
    struct mw__peer *p;
    struct mw__run *k;
    struct mw__cb written;
};

/* A chunk's write completed: the peer's count moves on, and a run that
 * finished meanwhile (failed) goes once its last write is back. */
static void on_chunk_written(mw_future_t *f, void *arg)
{
    struct chunk *ch = arg;
    struct mw__peer *p = ch->p;
    struct mw__run *k = ch->k;
    struct mw__comm *comm = p->comm;
    mw__free(ch);
    if (mw_future_error(f))
        mw__peer_gone(p, mw_future_error(f), mw_future_message(f));
    else
        p->written++;
    if (--k->writes_out == 0 && k->finished && k->regs_pending == 0)
        release_run(k);
    if (!mw__comm_freed(comm))
        mw__coll_advance(comm);
    mw__comm_unref(comm);
}

static bool sends_done(const struct mw__run *k)
{
    const struct mw__step *st = &k->s.steps[k->step];
    return st->send_to < 0 ||
           (k->s_posted == k->s_chunks && k->comm->peers[st->send_to].written >= k->s_base + k->s_chunks);
}

/* False when a write could not even start (no memory): the communicator
 * broke, and @k is finished. */
static bool post_sends(struct mw__run *k)
{
    const struct mw__step *st = &k->s.steps[k->step];
    struct mw__peer *p = &k->comm->peers[st->send_to];
    while (k->s_posted < k->s_chunks && p->sent - p->acked < k->comm->opts.slots) {
        size_t off = k->s_posted * k->chunk_elems;
        size_t n = st->send_len - off < k->chunk_elems ? st->send_len - off : k->chunk_elems;
        uint64_t slot = p->sent % k->comm->opts.slots;
        unsigned ride = p->unacked < IMM_RIDE_MAX ? p->unacked : IMM_RIDE_MAX;
        struct chunk *ch = mw__malloc(sizeof *ch);
        /* (a zero-length write points at offset 0: the peer's stub will do) */
        mw_future_t *f = ch ? mw_write_imm(p->conn, n ? k->src + off * k->esz : NULL,
                                           n * k->esz, &p->remote,
                                           n ? slot * k->comm->opts.slot_size : 0,
                                           imm_of(k, k->step) | ride << IMM_RIDE_SHIFT)
                            : NULL;
        if (!f || mw_future_error(f) == -ENOMEM) {
            /* Not the peer's doing: tell it too, as every rank (a failure
             * of the connection shows in on_chunk_written). */
            int err = -ENOMEM;
            mw__free(ch);
            if (f)
                mw_future_unref(f);
            mw__comm_abort(k->comm, MW__ABORT_OTHER, k->comm->rank, err,
                           "cannot write to rank %d: %s", p->rank, mw_strerror(err));
            return false;
        }
        *ch = (struct chunk){.p = p, .k = k};
        mw__future_then_in(f, &ch->written, on_chunk_written, ch);
        p->unacked -= ride;
        p->sent++;
        k->s_posted++;
        k->writes_out++;
        mw__comm_ref(k->comm);
        mw_future_unref(f);
    }
    return true;
}

/* A control immediate (@imm has IMM_ACK) to @p, in a zero-length write at
 * offset 0 of its scratch or stub: false only without memory.  A failure
 * of the connection is the watch's to see (the peer may just have
 * finished and left). */
static bool send_control(struct mw__peer *p, uint32_t imm)
{
    mw_future_t *f = mw_write_imm(p->conn, NULL, 0, &p->remote, 0, imm);
    bool no_memory = !f || mw_future_error(f) == -ENOMEM;
    mw_future_unref(f);
    return !no_memory;
}

/* Ack what was taken from @p once half its slots are: then the sender has
 * always at least half its slots free, so a chunk this rank waits for can
 * always be sent (everything before it was taken, and under half of that
 * is unacked). */
static bool ack_taken(struct mw__peer *p)
{
    if (p->unacked < (p->comm->opts.slots + 1) / 2)
        return true;
    if (!send_control(p, IMM_ACK | p->unacked)) {   /* the peer would wait for its slots */
        mw__comm_abort(p->comm, MW__ABORT_OTHER, p->comm->rank, -ENOMEM,
                       "cannot ack rank %d: no memory", p->rank);
        return false;
    }
    p->unacked = 0;
    return true;
}

static void on_resume(struct mw__task *t)
{
    struct mw__comm *comm = mw__container_of(t, struct mw__comm, resume);
    mw__coll_advance(comm);
    mw__comm_unref(comm);
}

/* Come back next loop turn: the work left would hold the loop too long. */
static void resume_later(struct mw__comm *comm)
{
    if (comm->resume.queued)
        return;
    comm->resume.fn = on_resume;
    mw__comm_ref(comm);
    mw__defer(comm->ctx, &comm->resume);
}

/* Apply what has arrived from this step's peer; false on a mismatch (or
 * an ack that cannot go).
 * Reducing a chunk costs milliseconds under emulation: within the turn's
 * work budget (mw__turn_may), the rest on a later turn. */
static bool take_receives(struct mw__run *k)
{
    const struct mw__step *st = &k->s.steps[k->step];
    struct mw__peer *p = &k->comm->peers[st->recv_from];
    unsigned slots = k->comm->opts.slots;
    while (k->r_done < k->r_chunks && p->arrived > p->consumed) {
        if (!mw__turn_may(k->comm->ctx)) {
            resume_later(k->comm);
            break;
        }
        uint32_t imm = p->imm[p->consumed % slots];
        if (imm != imm_of(k, k->step)) {
            mw__comm_abort(k->comm, MW__ABORT_MISMATCH, p->rank, -EPROTO,
                           "rank %d is running a different collective (or count, type, op, root)",
                           p->rank);
            return false;
        }
        size_t off = k->r_done * k->chunk_elems;
        size_t n = st->recv_len - off < k->chunk_elems ? st->recv_len - off : k->chunk_elems;
        const uint8_t *from = p->scratch + (p->consumed % slots) * k->comm->opts.slot_size;
        uint8_t *to = k->res + (st->recv_off + off) * k->esz;
        if (st->recv_action == MW__RECV_REDUCE)
            mw__reduce(to, from, n, k->dt, k->op);
        else if (n)
            memcpy(to, from, n * k->esz);
        p->consumed++;
        p->unacked++;
        k->r_done++;
    }
    return ack_taken(p);
}

static void local_copy(struct mw__run *k)
{
    const struct mw__sched_copy *c = &k->s.copy;
    if (c->len && c->at == k->step)
        memmove(k->res + c->dst * k->esz, k->in + c->src * k->esz, c->len * k->esz);
}

/* A peer this step still needs, if it is gone: its sends not all written
 * (a peer that said goodbye took all it wanted: those posted are in its
 * scratch, their completions on their way), or its chunks not all arrived. */
static const struct mw__peer *peer_still_needed_but_gone(const struct mw__run *k)
{
    const struct mw__step *st = &k->s.steps[k->step];
    const struct mw__peer *peers = k->comm->peers;
    if (st->send_to >= 0 && peers[st->send_to].gone &&
        (peers[st->send_to].said_bye ? k->s_posted < k->s_chunks : !sends_done(k)))
        return &peers[st->send_to];
    if (st->recv_from >= 0 && peers[st->recv_from].gone) {
        const struct mw__peer *p = &peers[st->recv_from];
        if (k->r_done + (p->arrived - p->consumed) < k->r_chunks)
            return p;
    }
    return NULL;
}

/* Ask for a connection to every peer of @k's schedule, once: those not
 * yet connected are dialled (or dial us) while the first steps run.
 * 0, or -ENOMEM (nothing has failed yet: the caller breaks the
 * communicator, @k with it). */
static int need_peers(struct mw__run *k)
{
    int rc = 0;
    k->peers_asked = true;
    for (int i = 0; i < k->s.nsteps && !rc; i++) {
        const struct mw__step *st = &k->s.steps[i];
        if (st->send_to >= 0)
            rc = mw__comm_need(k->comm, st->send_to);
        if (!rc && st->recv_from >= 0)
            rc = mw__comm_need(k->comm, st->recv_from);
        if (!rc && st->recv_from >= 0 && st->recv_len)
            rc = mw__comm_need_scratch(k->comm, st->recv_from);
    }
    return rc;
}

/* Whether this step's peers are connected, and the one it sends data to
 * has announced its scratch (a gone one is the lost-peer check's to
 * report). */
static bool step_peers_ready(const struct mw__run *k)
{
    const struct mw__step *st = &k->s.steps[k->step];
    const struct mw__peer *to = st->send_to < 0 ? NULL : &k->comm->peers[st->send_to];
    const struct mw__peer *from = st->recv_from < 0 ? NULL : &k->comm->peers[st->recv_from];
    return (!to || (to->ready && (!st->send_len || mw__peer_has_scratch(to)))) &&
           (!from || from->ready);
}

/* Run the head collective as far as it can go now; returns true when it
 * finished (the next one may start). */
static bool advance_one(struct mw__run *k)
{
    if (k->regs_pending)
        return false;             /* its buffers are being registered */
    if (!k->peers_asked && need_peers(k) < 0) {
        mw__comm_abort(k->comm, MW__ABORT_LOCAL, k->comm->rank, -ENOMEM,
                       "%s on rank %d: no memory to reach its peers",
                       mw__coll_name(k->s.kind), k->comm->rank);
        return true;              /* finished (failed) through mw__comm_abort */
    }
    while (k->step < k->s.nsteps) {
        if (!k->started) {
            local_copy(k);
            start_step(k);
        }
        const struct mw__step *st = &k->s.steps[k->step];
        const struct mw__peer *lost = peer_still_needed_but_gone(k);
        if (lost) {
            mw__comm_abort(k->comm, MW__ABORT_LOST, lost->rank, lost->gone, "%s",
                           lost->gone_why);
            return true;
        }
        if (!step_peers_ready(k))
            return false;         /* peer_ready() advances us */
        if (st->send_to >= 0 && !post_sends(k))
            return true;          /* failed: finish() ran through mw__comm_abort */
        if (st->recv_from >= 0 && !take_receives(k))
            return true;          /* failed: finish() ran through mw__comm_abort */
        if (!sends_done(k) || k->r_done < k->r_chunks)
            return false;
        k->step++;
        k->started = false;
    }
    local_copy(k);                /* a copy placed after the last step */
    if (k->out != k->res && k->s.bufs.ans_len)
        memcpy(k->out, k->res + k->s.bufs.ans_off * k->esz, k->s.bufs.ans_len * k->esz);
    finish(k, 0, NULL);
    return true;
}

void mw__coll_advance(struct mw__comm *comm)
{
    while (!comm->err && !mw__list_empty(&comm->colls)) {
        struct mw__run *k = mw__container_of(comm->colls.next, struct mw__run, link);
        if (!advance_one(k))
            return;
    }
    if (comm->close_f)
        mw__comm_close_progress(comm);
}

/* --- breaking the communicator --------------------------------------------- */

static const char *abort_reason(enum mw__abort_why why)
{
    switch (why) {
    case MW__ABORT_LOST:      return "lost";
    case MW__ABORT_MISMATCH:  return "ran a different collective than";
    case MW__ABORT_CANCELLED: return "had a collective cancelled or timed out on";
    case MW__ABORT_LOCAL:     return "had a collective fail before it started on";
    default:                  return "failed with";
    }
}

/* Every rank that breaks tells all the others, so a rank that never talks
 * to the culprit (in a ring, most of them) fails in one hop instead of
 * waiting forever on a rank that has given up. */
void mw__comm_abort(struct mw__comm *comm, enum mw__abort_why why, int culprit, int err,
                    const char *fmt, ...)
{
    if (comm->err)
        return;
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mw__comm_tell_abort(comm, why, culprit);
    mw__comm_fail(comm, err, "%s", msg);
}

/* Gone peers too: one may be gone by a failure on this side (no memory to
 * receive from it) with its connection up and its collective waiting for
 * us; on a connection that is down the write just fails. */
void mw__comm_tell_abort(struct mw__comm *comm, enum mw__abort_why why, int culprit)
{
    uint32_t imm = IMM_ACK | IMM_ABORT | (uint32_t)why << 24 | ((uint32_t)culprit & IMM_LOW_MASK);
    for (int r = 0; r < comm->nranks; r++) {
        struct mw__peer *p = &comm->peers[r];
        if (r != comm->rank && p->conn && p->ready)
            send_control(p, imm);     /* best effort: we break either way */
    }
}

/* Passed on to every connected peer: with connections made only where
 * collectives need them, the others may reach the culprit only through us
 * (the ring neighbours connect every rank). */
static void on_abort(struct mw__peer *p, uint32_t imm)
{
    enum mw__abort_why why = (imm >> 24) & 0x3f;
    int culprit = (int)(imm & IMM_LOW_MASK);
    mw__comm_abort(p->comm, why, culprit, -ECONNABORTED, "rank %d aborted: it %s rank %d",
                   p->rank, abort_reason(why), culprit);
}

bool mw__comm_send_bye(struct mw__peer *p)
{
    return send_control(p, IMM_ACK | IMM_BYE);
}

void mw__comm_on_imm(mw_conn_t *c, uint32_t imm, void *arg)
{
    (void)c;
    struct mw__peer *p = arg;
    struct mw__comm *comm = p->comm;
    if ((imm & (IMM_ACK | IMM_ABORT)) == (IMM_ACK | IMM_ABORT)) {
        on_abort(p, imm);
        return;
    } else if ((imm & (IMM_ACK | IMM_BYE)) == (IMM_ACK | IMM_BYE)) {
        mw__peer_said_bye(p);     /* advances the queue */
        return;
    } else if (imm & IMM_ACK) {
        p->acked += imm & IMM_LOW_MASK;
    } else if (p->arrived - p->consumed >= comm->opts.slots) {
        mw__comm_abort(comm, MW__ABORT_MISMATCH, p->rank, -EPROTO,
                       "rank %d overran its scratch slots", p->rank);
        return;
    } else {
        p->acked += (imm & IMM_RIDE_MASK) >> IMM_RIDE_SHIFT;
        p->imm[p->arrived++ % comm->opts.slots] = imm & ~IMM_RIDE_MASK;
    }
    mw__coll_advance(comm);
}
