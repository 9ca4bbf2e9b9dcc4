/* libFuzzer target: the connection layer's decoders (src/cm/wire.c), which
 * read what a remote peer sends -- the rdma_cm handshake and every message
 * fragment header.  Beyond not crashing (ASan/UBSan watch), each accepted
 * input must satisfy what the decoder promises: fields in range, and
 * re-encoding gives back the same bytes. */
#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cm/wire.h"

static void check_hello(const uint8_t *data, size_t len)
{
    struct mw__hello h;
    const char *why = "unset";
    if (mw__hello_decode(data, len, &h, &why) != 0) {
        assert(why && *why);                  /* a refusal always says why */
        return;
    }
    assert(why == NULL);
    assert(len >= MW__HELLO_LEN);
    assert(h.magic == MW__HELLO_MAGIC && h.version == MW__HELLO_VERSION);
    assert(h.credits >= MW__CREDITS_MIN && h.credits <= MW__CREDITS_MAX);
    assert(h.slot_size >= MW__SLOT_MIN && h.slot_size <= MW__SLOT_MAX);
    assert(h.max_msg >= 1 && h.max_msg <= MW__MSG_MAX);
    if (h.purpose == MW__PURPOSE_COMM)
        assert(h.nranks >= 1 && h.rank < h.nranks);
    else
        assert(h.purpose == MW__PURPOSE_P2P && !h.group && !h.rank && !h.nranks);
    if (!(h.flags & MW__HELLO_LOCAL))
        assert(!h.nonce && !h.host);          /* same-host fields only with the flag */
    else
        assert(h.host);
    for (size_t i = MW__HELLO_LEN; i < len; i++)
        assert(data[i] == 0);                 /* only zero padding after it */
    uint8_t again[MW__HELLO_LEN];
    assert(mw__hello_encode(&h, again, sizeof again) == MW__HELLO_LEN);
    assert(!memcmp(again, data, MW__HELLO_LEN));
}

static void check_frag(const uint8_t *data, size_t len)
{
    struct mw__frag f;
    const char *why = "unset";
    if (mw__frag_decode(data, len, &f, &why) != 0) {
        assert(why && *why);
        return;
    }
    assert(len >= MW__FRAG_HDR_LEN);
    assert(f.type == MW__FRAG_DATA || f.type == MW__FRAG_CREDIT || f.type == MW__FRAG_CLOSE ||
           f.type == MW__FRAG_DISCARD);
    if (f.type == MW__FRAG_DATA) {
        assert(f.len <= len - MW__FRAG_HDR_LEN);       /* payload within the slot */
        assert(f.offset <= f.total && f.len <= f.total - f.offset);
    } else {
        assert(f.len == 0 && f.total == 0 && f.offset == 0);
    }
    uint8_t again[MW__FRAG_HDR_LEN];
    assert(mw__frag_encode(&f, again, sizeof again) == MW__FRAG_HDR_LEN);
    assert(!memcmp(again, data, MW__FRAG_HDR_LEN));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    check_hello(data, len);
    check_frag(data, len);
    return 0;
}
