/* Wire formats: handshake and fragment header (src/cm/wire.c).  Decoders get
 * heap buffers of exactly the stated length, so ASan catches any over-read. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <cmocka.h>

#include "cm/wire.h"

#define GARBAGE_ROUNDS 5000

/* xorshift64*: seeded and reproducible, independent of libc's rand(). */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dULL;
}

/* A heap copy of exactly @len bytes (never NULL, even for len 0). */
static uint8_t *exact(const void *src, size_t len)
{
    uint8_t *p = malloc(len ? len : 1);
    assert_non_null(p);
    if (len)
        memcpy(p, src, len);
    return p;
}

static struct mw__hello good_hello(void)
{
    struct mw__hello h = {
        .magic = MW__HELLO_MAGIC, .version = MW__HELLO_VERSION,
        .purpose = MW__PURPOSE_COMM, .flags = MW__HELLO_LOCAL, .credits = 128,
        .slot_size = 65536, .nonce = 0x0123456789abcdefULL,
        .group = 7, .rank = 2, .nranks = 4, .max_msg = 0x0000000100000002ULL,
        .host = 0x1122334455667788ULL,
    };
    return h;
}

/* Field by field: the struct has tail padding that memcmp would compare. */
static void assert_hello_eq(const struct mw__hello *a, const struct mw__hello *b)
{
    assert_int_equal(a->magic, b->magic);
    assert_int_equal(a->version, b->version);
    assert_int_equal(a->purpose, b->purpose);
    assert_int_equal(a->flags, b->flags);
    assert_int_equal(a->credits, b->credits);
    assert_int_equal(a->slot_size, b->slot_size);
    assert_int_equal(a->group, b->group);
    assert_int_equal(a->rank, b->rank);
    assert_int_equal(a->nranks, b->nranks);
    assert_true(a->max_msg == b->max_msg);
    assert_true(a->host == b->host);
    assert_true(a->nonce == b->nonce);
}

/* Decode @h after encoding it into exactly @len bytes (zero padded). */
static int hello_rt(const struct mw__hello *h, size_t len, struct mw__hello *out,
                    const char **why)
{
    uint8_t raw[256] = {0};
    assert_true(len <= sizeof(raw));
    assert_int_equal(mw__hello_encode(h, raw, sizeof(raw)), MW__HELLO_LEN);
    uint8_t *p = exact(raw, len);
    int rc = mw__hello_decode(p, len, out, why);
    free(p);
    return rc;
}

static void expect_hello_refused(const struct mw__hello *h, const char *reason)
{
    struct mw__hello out;
    const char *why = NULL;
    assert_int_equal(hello_rt(h, MW__HELLO_LEN, &out, &why), -EPROTO);
    assert_non_null(why);
    assert_string_equal(why, reason);
}

static void hello_fits_private_data(void **state)
{
    (void)state;
    assert_true(MW__HELLO_LEN <= 56);           /* a connect request's */
    assert_int_equal(MW__HELLO_LEN, 52);
}

/* The same-host offer and answer: a host is required with the flag, and
 * without it the same-host fields must be empty; the offer names its
 * socket (nonce), the answer only says it took the channel. */
static void hello_same_host_offer_and_answer(void **state)
{
    (void)state;
    struct mw__hello h = good_hello(), out;
    h.host = 0;
    expect_hello_refused(&h, "same-host offer without a host");
    h.host = 0x1122334455667788ull;
    assert_int_equal(hello_rt(&h, 56, &out, NULL), 0);          /* the offer */
    assert_hello_eq(&h, &out);
    h.nonce = 0;
    assert_int_equal(hello_rt(&h, 196, &out, NULL), 0);         /* the answer */
    assert_hello_eq(&h, &out);
    h.flags = 0;                  /* no offer: nothing of one */
    expect_hello_refused(&h, "same-host fields without LOCAL");
    h.host = 0;
    h.nonce = 7;
    expect_hello_refused(&h, "same-host fields without LOCAL");
    h.nonce = 0;
    assert_int_equal(hello_rt(&h, MW__HELLO_LEN, &out, NULL), 0);
    uint8_t b[64] = {0};
    assert_int_equal(mw__hello_encode(&h, b, MW__HELLO_LEN - 1), -ENOSPC);
    assert_int_equal(mw__hello_encode(&h, b, sizeof b), MW__HELLO_LEN);
    b[MW__HELLO_LEN] = 1;         /* bytes after the hello are refused as ever */
    assert_int_equal(mw__hello_decode(b, sizeof b, &out, NULL), -EPROTO);
}

static void hello_round_trip(void **state)
{
    (void)state;
    struct mw__hello h = good_hello(), out;
    const char *why = "x";
    assert_int_equal(hello_rt(&h, MW__HELLO_LEN, &out, &why), 0);
    assert_null(why);
    assert_hello_eq(&h, &out);

    struct mw__hello p2p = {.magic = MW__HELLO_MAGIC, .version = MW__HELLO_VERSION,
                            .purpose = MW__PURPOSE_P2P, .flags = 0xffff,
                            .credits = MW__CREDITS_MAX, .slot_size = MW__SLOT_MAX,
                            .nonce = UINT64_MAX, .max_msg = MW__MSG_MAX, .host = 42};
    assert_int_equal(hello_rt(&p2p, MW__HELLO_LEN, &out, NULL), 0);
    assert_hello_eq(&p2p, &out);
}

/* The byte layout is the contract with other versions: pin it. */
static void hello_layout_big_endian(void **state)
{
    (void)state;
    struct mw__hello h = good_hello();
    uint8_t b[MW__HELLO_LEN];
    const uint8_t want[MW__HELLO_LEN] = {
        'M', 'W', 'I', 'R', MW__HELLO_VERSION, 2, 0, 1, 0, 0, 0, 128, 0, 1, 0, 0,
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
        0, 0, 0, 7, 0, 0, 0, 2, 0, 0, 0, 4,
        0, 0, 0, 1, 0, 0, 0, 2,
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
    };
    assert_int_equal(mw__hello_encode(&h, b, sizeof(b)), MW__HELLO_LEN);
    assert_memory_equal(b, want, sizeof(want));
}

static void hello_encode_nospace(void **state)
{
    (void)state;
    struct mw__hello h = good_hello();
    uint8_t b[MW__HELLO_LEN];
    assert_int_equal(mw__hello_encode(&h, b, MW__HELLO_LEN - 1), -ENOSPC);
    assert_int_equal(mw__hello_encode(&h, b, 0), -ENOSPC);
}

/* The largest message a peer accepts: 1..2^40, nothing else. */
static void hello_max_msg_range(void **state)
{
    (void)state;
    struct mw__hello h = good_hello();
    h.max_msg = 0;
    expect_hello_refused(&h, "max message size out of range");
    h.max_msg = MW__MSG_MAX + 1;
    expect_hello_refused(&h, "max message size out of range");
    h.max_msg = UINT64_MAX;
    expect_hello_refused(&h, "max message size out of range");
    struct mw__hello out;
    h.max_msg = 1;
    assert_int_equal(hello_rt(&h, MW__HELLO_LEN, &out, NULL), 0);
    assert_true(out.max_msg == 1);
}

static void hello_no_private_data(void **state)
{
    (void)state;
    struct mw__hello out;
    const char *why = NULL;
    assert_int_equal(mw__hello_decode(NULL, 0, &out, &why), -EPROTO);
    assert_string_equal(why, "no private data");
    uint8_t *p = exact("", 0);
    assert_int_equal(mw__hello_decode(p, 0, &out, &why), -EPROTO);
    assert_string_equal(why, "no private data");
    free(p);
}

static void hello_truncated_every_length(void **state)
{
    (void)state;
    struct mw__hello h = good_hello(), out;
    for (size_t len = 1; len < MW__HELLO_LEN; len++) {
        const char *why = NULL;
        assert_int_equal(hello_rt(&h, len, &out, &why), -EPROTO);
        assert_string_equal(why, "truncated handshake");
    }
}

/* rdma_cm may hand over its whole private data area, zero padded. */
static void hello_zero_padding_accepted(void **state)
{
    (void)state;
    struct mw__hello h = good_hello(), out;
    assert_int_equal(hello_rt(&h, MW__PRIVATE_DATA_MAX, &out, NULL), 0);
    assert_int_equal(hello_rt(&h, 196, &out, NULL), 0); /* RC REP maximum */
    assert_hello_eq(&h, &out);
}

static void hello_nonzero_padding_refused(void **state)
{
    (void)state;
    struct mw__hello h = good_hello(), out;
    uint8_t raw[MW__PRIVATE_DATA_MAX] = {0};
    mw__hello_encode(&h, raw, sizeof(raw));
    raw[sizeof(raw) - 1] = 1;
    uint8_t *p = exact(raw, sizeof(raw));
    const char *why;
    assert_int_equal(mw__hello_decode(p, sizeof(raw), &out, &why), -EPROTO);
    assert_string_equal(why, "non-zero bytes after handshake");
    free(p);
}

static void hello_wrong_magic(void **state)
{
    (void)state;
    struct mw__hello h = good_hello();
    h.magic = 0x52494d57; /* byte-swapped: a peer that forgot network order */
    expect_hello_refused(&h, "wrong magic");
    h.magic = 0;
    expect_hello_refused(&h, "wrong magic");
}

static void hello_bad_version_reports_it(void **state)
{
    (void)state;
    struct mw__hello h = good_hello(), out;
    const char *why;
    h.version = MW__HELLO_VERSION + 1;
    assert_int_equal(hello_rt(&h, MW__HELLO_LEN, &out, &why), -EPROTO);
    assert_string_equal(why, "unsupported protocol version");
    assert_int_equal(out.version, MW__HELLO_VERSION + 1); /* for the caller's message */
    h.version = 1;                /* before DISCARD fragments existed */
    expect_hello_refused(&h, "unsupported protocol version");
    h.version = 0;
    expect_hello_refused(&h, "unsupported protocol version");
}

static void hello_bad_purpose(void **state)
{
    (void)state;
    struct mw__hello h = good_hello();
    const uint8_t bad[] = {0, 3, 255};
    for (size_t i = 0; i < sizeof(bad); i++) {
        h.purpose = bad[i];
        expect_hello_refused(&h, "bad purpose");
    }
}

static void hello_credits_range(void **state)
{
    (void)state;
    struct mw__hello h = good_hello(), out;
    h.credits = 0;
    expect_hello_refused(&h, "credits out of range");
    h.credits = 65536;
    expect_hello_refused(&h, "credits out of range");
    h.credits = UINT32_MAX;
    expect_hello_refused(&h, "credits out of range");
    h.credits = 1;
    assert_int_equal(hello_rt(&h, MW__HELLO_LEN, &out, NULL), 0);
    h.credits = 65535;
    assert_int_equal(hello_rt(&h, MW__HELLO_LEN, &out, NULL), 0);
}

static void hello_slot_size_range(void **state)
{
    (void)state;
    struct mw__hello h = good_hello(), out;
    h.slot_size = 63;
    expect_hello_refused(&h, "slot size out of range");
    h.slot_size = 16u * 1024 * 1024 + 1;
    expect_hello_refused(&h, "slot size out of range");
    h.slot_size = 0;
    expect_hello_refused(&h, "slot size out of range");
    h.slot_size = 64;
    assert_int_equal(hello_rt(&h, MW__HELLO_LEN, &out, NULL), 0);
    h.slot_size = 16u * 1024 * 1024;
    assert_int_equal(hello_rt(&h, MW__HELLO_LEN, &out, NULL), 0);
}

static void hello_rank_range(void **state)
{
    (void)state;
    struct mw__hello h = good_hello(), out;
    h.rank = 4; /* == nranks */
    expect_hello_refused(&h, "rank out of range");
    h.rank = 0;
    h.nranks = 0;
    expect_hello_refused(&h, "rank out of range");
    h.rank = UINT32_MAX - 1;
    h.nranks = UINT32_MAX;
    assert_int_equal(hello_rt(&h, MW__HELLO_LEN, &out, NULL), 0);
    h.rank = 0;
    h.nranks = 1;
    assert_int_equal(hello_rt(&h, MW__HELLO_LEN, &out, NULL), 0);
}

static void hello_p2p_without_group(void **state)
{
    (void)state;
    struct mw__hello h = good_hello();
    h.purpose = MW__PURPOSE_P2P;
    expect_hello_refused(&h, "group or rank set for p2p");
    h.group = h.rank = h.nranks = 0;
    h.nranks = 1;
    expect_hello_refused(&h, "group or rank set for p2p");
}

/* Independent restatement of the rules, for accepted random input. */
static void assert_hello_valid(const struct mw__hello *h)
{
    assert_int_equal(h->magic, MW__HELLO_MAGIC);
    assert_int_equal(h->version, MW__HELLO_VERSION);
    assert_in_range(h->credits, 1, 65535);
    assert_in_range(h->slot_size, 64, 16 * 1024 * 1024);
    if (h->purpose == MW__PURPOSE_COMM) {
        assert_true(h->rank < h->nranks);
    } else {
        assert_int_equal(h->purpose, MW__PURPOSE_P2P);
        assert_true(h->group == 0 && h->rank == 0 && h->nranks == 0);
    }
}

/* Fill @b (len bytes) with noise: pure random, or a valid handshake with a
 * few random bytes changed (reaches the checks past the magic). */
static void hello_noise(uint64_t *s, uint8_t *b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t)rng_next(s);
    if (rng_next(s) % 2 && len >= MW__HELLO_LEN) {
        struct mw__hello h = good_hello();
        memset(b, 0, len);
        mw__hello_encode(&h, b, len);
        for (int k = (int)(rng_next(s) % 3); k >= 0; k--)
            b[rng_next(s) % len] = (uint8_t)rng_next(s);
    }
}

static void hello_random_garbage(void **state)
{
    (void)state;
    uint64_t seed = 0x6d65736877697265ULL;
    unsigned accepted = 0, refused = 0;
    for (int i = 0; i < GARBAGE_ROUNDS; i++) {
        uint8_t raw[64];
        size_t len = rng_next(&seed) % (sizeof(raw) + 1);
        hello_noise(&seed, raw, len);
        uint8_t *p = exact(raw, len);
        struct mw__hello out;
        const char *why = NULL;
        int rc = mw__hello_decode(p, len, &out, &why);
        if (rc == 0) {
            assert_null(why);
            assert_hello_valid(&out);
            accepted++;
        } else {
            assert_int_equal(rc, -EPROTO);
            assert_non_null(why);
            refused++;
        }
        free(p);
    }
    assert_true(refused > GARBAGE_ROUNDS / 2);
    assert_true(accepted > 0); /* mutations of padding/nonce keep it valid */
}

/* ------------------------------------------------------------------------
 * Fragments
 * ------------------------------------------------------------------------ */

static struct mw__frag data_frag(uint8_t flags, uint64_t total, uint64_t offset,
                                 uint32_t len)
{
    struct mw__frag f = {.type = MW__FRAG_DATA, .flags = flags, .credits = 3,
                         .len = len, .msg_id = 42, .total = total, .offset = offset};
    return f;
}

/* Encode @f followed by @payload bytes (all 0xab) into an exact buffer. */
static int frag_rt(const struct mw__frag *f, size_t payload, struct mw__frag *out,
                   const char **why)
{
    size_t len = MW__FRAG_HDR_LEN + payload;
    uint8_t *p = malloc(len);
    assert_non_null(p);
    memset(p, 0xab, len);
    assert_int_equal(mw__frag_encode(f, p, len), MW__FRAG_HDR_LEN);
    int rc = mw__frag_decode(p, len, out, why);
    free(p);
    return rc;
}

static void expect_frag_refused(const struct mw__frag *f, size_t payload,
                                const char *reason)
{
    struct mw__frag out;
    const char *why = NULL;
    assert_int_equal(frag_rt(f, payload, &out, &why), -EPROTO);
    assert_non_null(why);
    assert_string_equal(why, reason);
}

static void frag_round_trip(void **state)
{
    (void)state;
    struct mw__frag out;
    const struct mw__frag cases[] = {
        data_frag(MW__FRAG_FIRST | MW__FRAG_LAST, 100, 0, 100),
        data_frag(MW__FRAG_FIRST, 1000, 0, 100),
        data_frag(0, 1000, 100, 100),
        data_frag(MW__FRAG_LAST, 1000, 900, 100),
        data_frag(MW__FRAG_FIRST | MW__FRAG_LAST, 0, 0, 0), /* empty message */
        {.type = MW__FRAG_CREDIT, .credits = 65535, .msg_id = UINT64_MAX},
        {.type = MW__FRAG_CLOSE},
        {.type = MW__FRAG_DISCARD, .credits = 3, .msg_id = 42},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *why = "x";
        assert_int_equal(frag_rt(&cases[i], cases[i].len, &out, &why), 0);
        assert_null(why);
        assert_memory_equal(&cases[i], &out, sizeof(out));
    }
}

static void frag_layout_big_endian(void **state)
{
    (void)state;
    struct mw__frag f = {.type = 1, .flags = 3, .credits = 0x0102, .len = 0x03040506,
                         .msg_id = 0x0708090a0b0c0d0eULL, .total = 0x10,
                         .offset = 0x0f0e0d0c0b0a0908ULL};
    const uint8_t want[MW__FRAG_HDR_LEN] = {
        1, 3, 1, 2, 3, 4, 5, 6,
        7, 8, 9, 10, 11, 12, 13, 14,
        0, 0, 0, 0, 0, 0, 0, 0x10,
        15, 14, 13, 12, 11, 10, 9, 8,
    };
    uint8_t b[MW__FRAG_HDR_LEN];
    assert_int_equal(MW__FRAG_HDR_LEN, 32);
    assert_int_equal(mw__frag_encode(&f, b, sizeof(b)), MW__FRAG_HDR_LEN);
    assert_memory_equal(b, want, sizeof(want));
    assert_int_equal(mw__frag_encode(&f, b, MW__FRAG_HDR_LEN - 1), -ENOSPC);
}

static void frag_truncated_every_length(void **state)
{
    (void)state;
    struct mw__frag f = data_frag(MW__FRAG_FIRST | MW__FRAG_LAST, 0, 0, 0), out;
    uint8_t raw[MW__FRAG_HDR_LEN];
    mw__frag_encode(&f, raw, sizeof(raw));
    for (size_t len = 0; len < MW__FRAG_HDR_LEN; len++) {
        uint8_t *p = exact(raw, len);
        const char *why = NULL;
        assert_int_equal(mw__frag_decode(p, len, &out, &why), -EPROTO);
        assert_string_equal(why, "truncated fragment header");
        free(p);
    }
    assert_int_equal(mw__frag_decode(NULL, 0, &out, NULL), -EPROTO);
}

static void frag_unknown_type_and_flags(void **state)
{
    (void)state;
    struct mw__frag f = data_frag(MW__FRAG_FIRST | MW__FRAG_LAST, 8, 0, 8);
    const uint8_t types[] = {0, 5, 255};
    for (size_t i = 0; i < sizeof(types); i++) {
        f.type = types[i];
        expect_frag_refused(&f, 8, "unknown fragment type");
    }
    f.type = MW__FRAG_DATA;
    for (unsigned bit = 2; bit < 8; bit++) {
        f.flags = (uint8_t)(MW__FRAG_FIRST | MW__FRAG_LAST | (1u << bit));
        expect_frag_refused(&f, 8, "unknown fragment flags");
    }
}

static void frag_len_vs_received(void **state)
{
    (void)state;
    struct mw__frag f = data_frag(MW__FRAG_FIRST | MW__FRAG_LAST, 100, 0, 100), out;
    expect_frag_refused(&f, 99, "fragment longer than received");
    expect_frag_refused(&f, 0, "fragment longer than received");
    f.len = UINT32_MAX;
    expect_frag_refused(&f, 100, "fragment longer than received");
    /* more bytes than len: the caller may pass the whole slot */
    f = data_frag(MW__FRAG_FIRST | MW__FRAG_LAST, 100, 0, 100);
    assert_int_equal(frag_rt(&f, 4096, &out, NULL), 0);
}

static void frag_control_is_header_only(void **state)
{
    (void)state;
    const uint8_t types[] = {MW__FRAG_CREDIT, MW__FRAG_CLOSE, MW__FRAG_DISCARD};
    for (size_t i = 0; i < sizeof(types); i++) {
        struct mw__frag f = {.type = types[i], .credits = 5, .len = 1};
        expect_frag_refused(&f, 1, "control fragment with payload");
        f.len = 0;
        f.flags = MW__FRAG_FIRST;
        expect_frag_refused(&f, 0, "control fragment with message fields");
        f.flags = 0;
        f.total = 1;
        expect_frag_refused(&f, 0, "control fragment with message fields");
        f.total = 0;
        f.offset = 1;
        expect_frag_refused(&f, 0, "control fragment with message fields");
    }
}

static void frag_beyond_message_end(void **state)
{
    (void)state;
    struct mw__frag f = data_frag(0, 100, 50, 51);
    expect_frag_refused(&f, 51, "fragment beyond message end");
    f = data_frag(0, 100, 101, 0);
    expect_frag_refused(&f, 0, "fragment beyond message end");
    /* offset + len would wrap around 2^64 */
    f = data_frag(0, 100, UINT64_MAX - 1, 4);
    expect_frag_refused(&f, 4, "fragment beyond message end");
    f = data_frag(0, UINT64_MAX, UINT64_MAX - 1, 4);
    if (SIZE_MAX == UINT64_MAX)
        expect_frag_refused(&f, 4, "fragment beyond message end");
}

static void frag_message_too_large(void **state)
{
    (void)state;
    struct mw__frag f = data_frag(0, UINT64_MAX, 0, 4), out;
    if (SIZE_MAX < UINT64_MAX) {
        expect_frag_refused(&f, 4, "message too large");
    } else { /* 64-bit: every total fits a size_t */
        assert_int_equal(frag_rt(&f, 4, &out, NULL), 0);
    }
}

static void frag_first_and_last_marks(void **state)
{
    (void)state;
    struct mw__frag f = data_frag(MW__FRAG_FIRST, 100, 10, 10);
    expect_frag_refused(&f, 10, "first fragment not at offset 0");
    f = data_frag(MW__FRAG_LAST, 100, 10, 10);
    expect_frag_refused(&f, 10, "last fragment does not end the message");
    f = data_frag(MW__FRAG_FIRST | MW__FRAG_LAST, 100, 0, 99);
    expect_frag_refused(&f, 99, "last fragment does not end the message");
}

static void assert_frag_valid(const struct mw__frag *f, size_t len)
{
    assert_true(f->type >= MW__FRAG_DATA && f->type <= MW__FRAG_DISCARD);
    assert_int_equal(f->flags & ~3u, 0);
    assert_true(f->len <= len - MW__FRAG_HDR_LEN);
    if (f->type != MW__FRAG_DATA) {
        assert_true(f->len == 0 && f->flags == 0 && f->total == 0 && f->offset == 0);
        return;
    }
    assert_true(f->offset <= f->total && f->len <= f->total - f->offset);
    if (f->flags & MW__FRAG_FIRST)
        assert_true(f->offset == 0);
    if (f->flags & MW__FRAG_LAST)
        assert_true(f->offset + f->len == f->total);
}

/* Random bytes, or a valid header with a few bytes (often the small fields)
 * changed, so that each check is reached many times. */
static void frag_noise(uint64_t *s, uint8_t *b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t)rng_next(s);
    if (rng_next(s) % 2 && len >= MW__FRAG_HDR_LEN) {
        uint32_t pl = (uint32_t)(len - MW__FRAG_HDR_LEN);
        struct mw__frag f = data_frag(MW__FRAG_FIRST | MW__FRAG_LAST, pl, 0, pl);
        mw__frag_encode(&f, b, len);
        for (int k = (int)(rng_next(s) % 3); k >= 0; k--)
            b[rng_next(s) % MW__FRAG_HDR_LEN] = (uint8_t)(rng_next(s) % 4);
    }
}

static void frag_random_garbage(void **state)
{
    (void)state;
    uint64_t seed = 0x667261676d656e74ULL;
    unsigned accepted = 0, refused = 0;
    for (int i = 0; i < GARBAGE_ROUNDS; i++) {
        uint8_t raw[MW__FRAG_HDR_LEN + 16];
        size_t len = rng_next(&seed) % (sizeof(raw) + 1);
        frag_noise(&seed, raw, len);
        uint8_t *p = exact(raw, len);
        struct mw__frag out;
        const char *why = NULL;
        int rc = mw__frag_decode(p, len, &out, &why);
        if (rc == 0) {
            assert_null(why);
            assert_frag_valid(&out, len);
            accepted++;
        } else {
            assert_int_equal(rc, -EPROTO);
            assert_non_null(why);
            refused++;
        }
        free(p);
    }
    assert_true(refused > GARBAGE_ROUNDS / 2);
    assert_true(accepted > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hello_fits_private_data),
        cmocka_unit_test(hello_round_trip),
        cmocka_unit_test(hello_same_host_offer_and_answer),
        cmocka_unit_test(hello_max_msg_range),
        cmocka_unit_test(hello_layout_big_endian),
        cmocka_unit_test(hello_encode_nospace),
        cmocka_unit_test(hello_no_private_data),
        cmocka_unit_test(hello_truncated_every_length),
        cmocka_unit_test(hello_zero_padding_accepted),
        cmocka_unit_test(hello_nonzero_padding_refused),
        cmocka_unit_test(hello_wrong_magic),
        cmocka_unit_test(hello_bad_version_reports_it),
        cmocka_unit_test(hello_bad_purpose),
        cmocka_unit_test(hello_credits_range),
        cmocka_unit_test(hello_slot_size_range),
        cmocka_unit_test(hello_rank_range),
        cmocka_unit_test(hello_p2p_without_group),
        cmocka_unit_test(hello_random_garbage),
        cmocka_unit_test(frag_round_trip),
        cmocka_unit_test(frag_layout_big_endian),
        cmocka_unit_test(frag_truncated_every_length),
        cmocka_unit_test(frag_unknown_type_and_flags),
        cmocka_unit_test(frag_len_vs_received),
        cmocka_unit_test(frag_control_is_header_only),
        cmocka_unit_test(frag_beyond_message_end),
        cmocka_unit_test(frag_message_too_large),
        cmocka_unit_test(frag_first_and_last_marks),
        cmocka_unit_test(frag_random_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
