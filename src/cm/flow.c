/* Credit flow control: the only writer of struct mw__flow (flow.h states
 * the rules each change here checks). */
#include <errno.h>

#include "cm/flow.h"
#include "core/check.h"
#include "core/ctx.h"

#define FRAG_CREDITS_MAX 0xffffu  /* a fragment's credits field: 16 bits */

/* Our slots not posted to the peer's use: owed or parked, never both. */
#define OWN_SLOTS_HOLD(fl) ((fl)->owed + (fl)->parked <= (fl)->own)

void mw__flow_init(struct mw__flow *fl, mw_ctx_t *ctx, unsigned limit, unsigned own)
{
    *fl = (struct mw__flow){.ctx = ctx, .limit = limit, .own = own, .credits = limit};
}

unsigned mw__flow_to_give(const struct mw__flow *fl)
{
    return fl->owed > FRAG_CREDITS_MAX ? FRAG_CREDITS_MAX : fl->owed;
}

/* The fewest credits a fragment without data may carry (flow.h). */
static unsigned credit_frag_min(const struct mw__flow *fl)
{
    unsigned half = (fl->own + 1) / 2;
    return half < 2 ? half : 2;
}

void mw__flow_frag_sent(struct mw__flow *fl, unsigned given, bool msg)
{
    MW__CHECK(fl->ctx, given <= fl->owed);
    MW__CHECK(fl->ctx, msg ? fl->credits > 1 : fl->credits > 0);
    MW__CHECK(fl->ctx, msg || given >= credit_frag_min(fl));
    fl->owed -= given;
    fl->credits--;
}

void mw__flow_imm_sent(struct mw__flow *fl)
{
    MW__CHECK(fl->ctx, fl->credits > 1);
    fl->credits--;
}

/* Many owed go back even unasked; a side that waits for credits itself
 * returns a few too: the peer may have spent its own reserve giving some,
 * and needs these to give more.  Never fewer than credit_frag_min. */
bool mw__flow_return_due(const struct mw__flow *fl)
{
    bool many = fl->owed >= (fl->own + 1) / 2;
    bool few = fl->wait_since && fl->owed >= 2;
    return fl->owed && fl->credits && (many || few);
}

/* A wait's start: 0 means "not waiting". */
static uint64_t wait_start(void)
{
    uint64_t now = mw__now_ms();
    return now ? now : 1;
}

int mw__flow_returned(struct mw__flow *fl, unsigned n)
{
    if (n > fl->limit - fl->credits)
        return -EPROTO;
    fl->credits += n;
    if (n && fl->wait_since)          /* the peer reads: the wait starts over */
        fl->wait_since = wait_start();
    return 0;
}

void mw__flow_slot_reposted(struct mw__flow *fl)
{
    fl->owed++;
    MW__CHECK(fl->ctx, OWN_SLOTS_HOLD(fl));
}

void mw__flow_slot_parked(struct mw__flow *fl)
{
    fl->parked++;
    MW__CHECK(fl->ctx, OWN_SLOTS_HOLD(fl));
}

void mw__flow_slot_unparked(struct mw__flow *fl)
{
    MW__CHECK(fl->ctx, fl->parked > 0);
    fl->parked--;
}

bool mw__flow_wait(struct mw__flow *fl, bool waiting)
{
    if (!waiting) {
        fl->wait_since = 0;
        return false;
    }
    if (fl->wait_since)
        return false;
    fl->wait_since = wait_start();
    return true;
}

bool mw__flow_wait_expired(struct mw__flow *fl, unsigned timeout_ms)
{
    if (!fl->wait_since)
        return false;
    /* now < since: set later in this very millisecond (an unsigned
     * difference would wrap, and fail a send that just began to wait) */
    uint64_t now = mw__now_ms();
    if (now < fl->wait_since || now - fl->wait_since < timeout_ms)
        return false;
    fl->wait_since = 0;
    return true;
}
