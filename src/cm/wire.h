/* On-the-wire formats of the connections layer: the handshake carried in
 * rdma_cm private data, and the header of each two-sided message fragment.
 *
 * Everything is encoded field by field in network byte order (core/bytes.h;
 * no packed struct cast onto a buffer: no alignment or padding surprises,
 * and the layout below is the whole contract).  Decoders validate every
 * field, read nothing past the length they are given, and say why they
 * refuse.
 * Internal (mw__ names); no RDMA headers needed.
 */
#ifndef MW_CM_WIRE_H
#define MW_CM_WIRE_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------
 * Handshake (rdma_cm private data; RC over IB/RoCE allows 56 bytes)
 *
 *   off size field          off size field
 *     0   4  magic "MWIR"     16   8  nonce
 *     4   1  version          24   4  group
 *     5   1  purpose          28   4  rank
 *     6   2  flags            32   4  nranks
 *     8   4  credits          36   8  max_msg
 *    12   4  slot_size        44   8  host
 *                             52      end
 *
 * With flag LOCAL, host is the sender's host identity (local.c): the
 * connecting side offers the same-host path, naming in nonce the socket it
 * listens on; the accepting side's answer says it took the channel (its
 * nonce is 0).  Without LOCAL, nonce and host are 0.
 * ------------------------------------------------------------------------ */

#define MW__HELLO_MAGIC 0x4d574952u /* "MWIR" */
#define MW__HELLO_VERSION 5   /* 2: DISCARD fragments; 3: max_msg; 4: host;
                                 5: the rendezvous before the accept */
#define MW__HELLO_LEN 52
#define MW__PRIVATE_DATA_MAX 56 /* rdma_connect on RC */
#define MW__HELLO_LOCAL 1u    /* flags: the same-host path */
/* flags, connecting over TCP in auto: an RDMA attempt at this address just
 * found nothing listening there (the listener may have been starting) */
#define MW__HELLO_RDMA_MISSED 2u

/* A refusal (rdma_cm's reject private data, or a TCP answer record): the
 * tag, then the reason, NUL-terminated. */
#define MW__REJECT_TAG "MWRJ"
/* An auto listener's TCP answer to a hello with MW__HELLO_RDMA_MISSED: it
 * listens over RDMA too, so the connector tries RDMA again (once). */
#define MW__REFUSE_RDMA_NOW "listening over RDMA now"

enum { MW__PURPOSE_P2P = 1, MW__PURPOSE_COMM = 2 };

#define MW__CREDITS_MIN 1u
#define MW__CREDITS_MAX 65535u          /* fits a fragment's 16-bit field */
#define MW__SLOT_MIN 64u                /* a header plus some payload */
#define MW__SLOT_MAX (16u * 1024 * 1024)
#define MW__MSG_MAX ((uint64_t)1 << 40)  /* the largest max_msg either side may set */

struct mw__hello {
    uint32_t magic;     /* MW__HELLO_MAGIC */
    uint8_t version;    /* MW__HELLO_VERSION */
    uint8_t purpose;    /* MW__PURPOSE_* */
    uint16_t flags;     /* capability bits (MW__HELLO_LOCAL).  Unknown bits
                           are kept, not refused: a peer may advertise
                           features this side does not know, and each side
                           uses only what both announce. */
    uint32_t credits;   /* receive slots the sender has posted */
    uint32_t slot_size; /* bytes per receive slot */
    uint64_t nonce;     /* LOCAL, connecting: its rendezvous socket */
    uint32_t group;     /* COMM only: communicator id */
    uint32_t rank;      /* COMM only: rank < nranks */
    uint32_t nranks;    /* COMM only: >= 1.  P2P: group, rank, nranks are 0 */
    uint64_t max_msg;   /* the largest message the sender accepts, 1..MW__MSG_MAX */
    uint64_t host;      /* LOCAL: the sender's host identity, non-zero */
};

/**
 * mw__hello_encode() - write @h into @buf.  Does not validate @h (the peer's
 * decoder is the one judge; tests use this to build bad handshakes).
 * Return: MW__HELLO_LEN, or -ENOSPC when @cap is smaller.
 */
int mw__hello_encode(const struct mw__hello *h, uint8_t *buf, size_t cap);

/**
 * mw__hello_decode() - read and validate a peer's handshake.
 * @buf, @len: the private data as received (@buf may be NULL when @len is 0).
 *             rdma_cm may zero-pad it up to its maximum: zero bytes after
 *             MW__HELLO_LEN are accepted, anything else there is refused.
 * @out:  the decoded fields; filled whenever @len >= MW__HELLO_LEN, even on
 *        refusal (so the caller can print e.g. the peer's out->version).
 * @why:  if not NULL, set to a static reason on refusal ("no private data",
 *        "truncated handshake", "wrong magic", "unsupported protocol version",
 *        "bad purpose", "credits out of range", "slot size out of range",
 *        "max message size out of range",
 *        "rank out of range", "group or rank set for p2p",
 *        "same-host offer without a host", "same-host fields without LOCAL",
 *        "non-zero bytes after handshake"), to NULL on success.
 * Return: 0, or -EPROTO.
 */
int mw__hello_decode(const void *buf, size_t len, struct mw__hello *out, const char **why);

/* ------------------------------------------------------------------------
 * Fragment header: the start of every receive slot, payload follows
 *
 *   off size field
 *     0   1  type            8   8  msg_id
 *     1   1  flags          16   8  total   (message length)
 *     2   2  credits        24   8  offset  (of this fragment's payload)
 *     4   4  len            32      end, then len payload bytes
 * ------------------------------------------------------------------------ */

#define MW__FRAG_HDR_LEN 32

/* DISCARD: the message msg_id, begun with DATA fragments, will not be
 * finished (its send was cancelled): drop what arrived of it. */
enum { MW__FRAG_DATA = 1, MW__FRAG_CREDIT = 2, MW__FRAG_CLOSE = 3, MW__FRAG_DISCARD = 4 };
enum { MW__FRAG_FIRST = 1, MW__FRAG_LAST = 2 };
#define MW__FRAG_FLAGS_ALL (MW__FRAG_FIRST | MW__FRAG_LAST)

struct mw__frag {
    uint8_t type;     /* MW__FRAG_* */
    uint8_t flags;    /* MW__FRAG_FIRST / MW__FRAG_LAST; DATA only */
    uint16_t credits; /* receive slots returned to the peer (any type) */
    uint32_t len;     /* payload bytes after the header; 0 unless DATA */
    uint64_t msg_id;  /* DATA, DISCARD: the message */
    uint64_t total;   /* DATA: whole message length; else 0 */
    uint64_t offset;  /* DATA: payload position in the message; else 0 */
};

/**
 * mw__frag_encode() - write the header of @f into @buf (the caller places
 * f->len payload bytes after it).  Does not validate @f.
 * Return: MW__FRAG_HDR_LEN, or -ENOSPC when @cap is smaller.
 */
int mw__frag_encode(const struct mw__frag *f, uint8_t *buf, size_t cap);

/**
 * mw__frag_decode() - read and validate a received fragment header.
 * @buf, @len: the received bytes (header + payload); a payload longer than
 *             f->len is allowed (the caller may pass the slot), shorter is not.
 * @out:  the decoded header; filled whenever @len >= MW__FRAG_HDR_LEN.
 * @why:  if not NULL, a static reason on refusal ("truncated fragment header",
 *        "unknown fragment type", "unknown fragment flags",
 *        "fragment longer than received", "control fragment with payload",
 *        "control fragment with message fields", "message too large",
 *        "fragment beyond message end", "first fragment not at offset 0",
 *        "last fragment does not end the message"), NULL on success.
 * Return: 0, or -EPROTO.
 */
int mw__frag_decode(const void *buf, size_t len, struct mw__frag *out, const char **why);

#endif
