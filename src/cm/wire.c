/* Handshake and fragment header encoding (see wire.h for the layouts). */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "cm/wire.h"
#include "core/bytes.h"

_Static_assert(MW__HELLO_LEN <= MW__PRIVATE_DATA_MAX,
               "the handshake must fit RC private data");
_Static_assert(MW__FRAG_HDR_LEN < MW__SLOT_MIN, "a slot must hold a header and payload");

/* Set the reason (when wanted) and refuse. */
static int refuse(const char **why, const char *reason)
{
    if (why)
        *why = reason;
    return -EPROTO;
}

/* ------------------------------------------------------------------------
 * Handshake
 * ------------------------------------------------------------------------ */

int mw__hello_encode(const struct mw__hello *h, uint8_t *buf, size_t cap)
{
    if (cap < MW__HELLO_LEN)
        return -ENOSPC;
    mw__put32(buf + 0, h->magic);
    buf[4] = h->version;
    buf[5] = h->purpose;
    mw__put16(buf + 6, h->flags);
    mw__put32(buf + 8, h->credits);
    mw__put32(buf + 12, h->slot_size);
    mw__put64(buf + 16, h->nonce);
    mw__put32(buf + 24, h->group);
    mw__put32(buf + 28, h->rank);
    mw__put32(buf + 32, h->nranks);
    mw__put64(buf + 36, h->max_msg);
    mw__put64(buf + 44, h->host);
    return MW__HELLO_LEN;
}

static void hello_read(const uint8_t *p, struct mw__hello *h)
{
    h->magic = mw__get32(p + 0);
    h->version = p[4];
    h->purpose = p[5];
    h->flags = mw__get16(p + 6);
    h->credits = mw__get32(p + 8);
    h->slot_size = mw__get32(p + 12);
    h->nonce = mw__get64(p + 16);
    h->group = mw__get32(p + 24);
    h->rank = mw__get32(p + 28);
    h->nranks = mw__get32(p + 32);
    h->max_msg = mw__get64(p + 36);
    h->host = mw__get64(p + 44);
}

/* Who the peer wants to be: a lone connection or a member of a group. */
static const char *purpose_check(const struct mw__hello *h)
{
    if (h->purpose == MW__PURPOSE_COMM)
        return h->nranks >= 1 && h->rank < h->nranks ? NULL : "rank out of range";
    if (h->purpose == MW__PURPOSE_P2P)
        return h->group == 0 && h->rank == 0 && h->nranks == 0
                   ? NULL
                   : "group or rank set for p2p";
    return "bad purpose";
}

/* rdma_cm pads private data with zeros; anything else there means the peer
 * speaks something else under our magic and version. */
static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return false;
    return true;
}

/* Magic before version: a foreign peer is "wrong magic", not a version. */
static const char *hello_check(const struct mw__hello *h)
{
    if (h->magic != MW__HELLO_MAGIC)
        return "wrong magic";
    if (h->version != MW__HELLO_VERSION)
        return "unsupported protocol version";
    if (h->purpose != MW__PURPOSE_P2P && h->purpose != MW__PURPOSE_COMM)
        return "bad purpose";
    if (h->credits < MW__CREDITS_MIN || h->credits > MW__CREDITS_MAX)
        return "credits out of range";
    if (h->slot_size < MW__SLOT_MIN || h->slot_size > MW__SLOT_MAX)
        return "slot size out of range";
    if (h->max_msg < 1 || h->max_msg > MW__MSG_MAX)
        return "max message size out of range";
    if (h->flags & MW__HELLO_LOCAL && !h->host)
        return "same-host offer without a host";
    if (!(h->flags & MW__HELLO_LOCAL) && (h->host || h->nonce))
        return "same-host fields without LOCAL";
    return purpose_check(h);
}

int mw__hello_decode(const void *buf, size_t len, struct mw__hello *out, const char **why)
{
    const uint8_t *p = buf;
    if (why)
        *why = NULL;
    /* rdma_cm pads private data with zeros to its transport's size, so a
     * peer that sent none shows up as all zeros. */
    if (!p || len == 0 || all_zero(p, len))
        return refuse(why, "no private data");
    if (len < MW__HELLO_LEN)
        return refuse(why, "truncated handshake");
    hello_read(p, out);
    const char *bad = hello_check(out);
    if (bad)
        return refuse(why, bad);
    if (!all_zero(p + MW__HELLO_LEN, len - MW__HELLO_LEN))
        return refuse(why, "non-zero bytes after handshake");
    return 0;
}

/* ------------------------------------------------------------------------
 * Fragment header
 * ------------------------------------------------------------------------ */

int mw__frag_encode(const struct mw__frag *f, uint8_t *buf, size_t cap)
{
    if (cap < MW__FRAG_HDR_LEN)
        return -ENOSPC;
    buf[0] = f->type;
    buf[1] = f->flags;
    mw__put16(buf + 2, f->credits);
    mw__put32(buf + 4, f->len);
    mw__put64(buf + 8, f->msg_id);
    mw__put64(buf + 16, f->total);
    mw__put64(buf + 24, f->offset);
    return MW__FRAG_HDR_LEN;
}

static void frag_read(const uint8_t *p, struct mw__frag *f)
{
    f->type = p[0];
    f->flags = p[1];
    f->credits = mw__get16(p + 2);
    f->len = mw__get32(p + 4);
    f->msg_id = mw__get64(p + 8);
    f->total = mw__get64(p + 16);
    f->offset = mw__get64(p + 24);
}

/* CREDIT, CLOSE and DISCARD carry only the header (credits may ride on any
 * type; DISCARD names its message in msg_id). */
static const char *control_check(const struct mw__frag *f)
{
    if (f->len != 0)
        return "control fragment with payload";
    if (f->flags != 0 || f->total != 0 || f->offset != 0)
        return "control fragment with message fields";
    return NULL;
}

/* Where this piece sits in its message: inside it, in a size this host can
 * hold, and consistent with its FIRST/LAST marks.  Overflow-safe. */
static const char *data_check(const struct mw__frag *f)
{
    if ((uint64_t)(size_t)f->total != f->total)
        return "message too large";
    if (f->offset > f->total || f->len > f->total - f->offset)
        return "fragment beyond message end";
    if ((f->flags & MW__FRAG_FIRST) && f->offset != 0)
        return "first fragment not at offset 0";
    if ((f->flags & MW__FRAG_LAST) && f->offset + f->len != f->total)
        return "last fragment does not end the message";
    return NULL;
}

static const char *frag_check(const struct mw__frag *f, size_t payload)
{
    if (f->type != MW__FRAG_DATA && f->type != MW__FRAG_CREDIT &&
        f->type != MW__FRAG_CLOSE && f->type != MW__FRAG_DISCARD)
        return "unknown fragment type";
    if (f->flags & ~MW__FRAG_FLAGS_ALL)
        return "unknown fragment flags";
    if (f->len > payload)
        return "fragment longer than received";
    return f->type == MW__FRAG_DATA ? data_check(f) : control_check(f);
}

int mw__frag_decode(const void *buf, size_t len, struct mw__frag *out, const char **why)
{
    const uint8_t *p = buf;
    if (why)
        *why = NULL;
    if (!p || len < MW__FRAG_HDR_LEN)
        return refuse(why, "truncated fragment header");
    frag_read(p, out);
    const char *bad = frag_check(out, len - MW__FRAG_HDR_LEN);
    return bad ? refuse(why, bad) : 0;
}
