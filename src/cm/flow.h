/* Credit flow control of a connection's messages.  Each receive slot one
 * side posts is a credit the other may spend on one SEND (a fragment) or one
 * RDMA WRITE with immediate; slots reposted are credits owed back, carried
 * by the next fragment out.  flow.c is the only writer of these counters,
 * and checks their rules (MW__CHECK) where they change:
 *
 *  - credits are never spent below zero, and data (a fragment with data, an
 *    immediate) never takes the last one: it is kept for a credit-only
 *    fragment, so two sides that both wait for credits can always tell each
 *    other (without it, each waits for the other for ever);
 *  - a credit-only fragment carries at least two credits (one when there
 *    are fewer than three slots): one credit alone pays only for
 *    its own slot, and two waiting sides passed such fragments back and
 *    forth for ever (seen: 8 circling, neither with two credits for data);
 *  - slots owed and slots parked are disjoint sets of our own slots;
 *  - the peer never returns more credits than it was given (a peer that
 *    does breaks the protocol: mw__flow_returned says so, it is no check).
 */
#ifndef MW_CM_FLOW_H
#define MW_CM_FLOW_H

#include <stdbool.h>
#include <stdint.h>

#include "meshwire.h"

struct mw__flow {
    mw_ctx_t *ctx;                /* for the checks' log (release builds) */
    unsigned limit;               /* the peer's slots we may use: the most
                                     credits we can hold */
    unsigned own;                 /* our receive slots */
    unsigned credits;             /* the peer's slots free for us */
    unsigned owed;                /* our slots reposted, not yet told */
    unsigned parked;              /* our slots held back: the inbox is full */
    uint64_t wait_since;          /* ms when the queue's head began to wait
                                     for credits (0: it does not) */
};

/* Established: @limit credits to spend, @own slots of ours to give. */
void mw__flow_init(struct mw__flow *fl, mw_ctx_t *ctx, unsigned limit, unsigned own);

/* Whether a fragment with data, or an immediate, may go now. */
static inline bool mw__flow_data_ok(const struct mw__flow *fl)
{
    return fl->credits > 1;
}

/* The credits the next fragment out carries (all owed, up to its field). */
unsigned mw__flow_to_give(const struct mw__flow *fl);

/* A fragment went, carrying @given credits: a message's (@msg: data or a
 * discard), or the credits alone. */
void mw__flow_frag_sent(struct mw__flow *fl, unsigned given, bool msg);

/* A write with immediate went: it takes a slot of the peer's. */
void mw__flow_imm_sent(struct mw__flow *fl);

/* Whether owed credits should go back alone, in a credit-only fragment. */
bool mw__flow_return_due(const struct mw__flow *fl);

/* The peer gave back @n credits.  -EPROTO: more than it had. */
int mw__flow_returned(struct mw__flow *fl, unsigned n);

/* One of our slots was reposted (a credit owed), or parked instead. */
void mw__flow_slot_reposted(struct mw__flow *fl);
void mw__flow_slot_parked(struct mw__flow *fl);

/* A parked slot is taken back to be reposted. */
void mw__flow_slot_unparked(struct mw__flow *fl);

/* The queue's head waits for credits (@waiting) or not.  True when this
 * begins a wait (its deadline is to be armed: keepalive.c). */
bool mw__flow_wait(struct mw__flow *fl, bool waiting);

/* Whether a wait began @timeout_ms ago or more: then it ends here (the
 * waiting operation gives up). */
bool mw__flow_wait_expired(struct mw__flow *fl, unsigned timeout_ms);

#endif
