/* libFuzzer target: what an etcd store sends the directory's etcd backend
 * (a hostile store, or whatever listens on its port): HTTP/1.1 responses
 * read as they come (src/dir/etcd/resp.c), fed in pieces, plainly and as
 * a stream, and their bodies as JSON with base64 in it (json.c).  A body
 * kept is never over MW__ETCD_RESPONSE_MAX; base64 decodes what it
 * encoded. */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <json-c/json.h>

#include "dir/etcd/etcd.h"

/* json.c's allocator, without the rest of meshwire */
void *mw__malloc(size_t size) { return malloc(size); }
void mw__free(void *p) { free(p); }

static void check_json(const char *text, size_t len)
{
    struct json_object *o = mw__json_parse(text, len);
    if (!o)
        return;
    struct json_object *res = mw__json_obj(o, "result");
    struct json_object *kvs = mw__json_obj(res ? res : o, "kvs");
    size_t n = kvs && json_object_is_type(kvs, json_type_array) ? json_object_array_length(kvs)
                                                                : 0;
    for (size_t i = 0; i < n && i < 16; i++) {
        struct json_object *kv = json_object_array_get_idx(kvs, i);
        size_t vlen;
        char *v = mw__json_bytes(kv, "value", 8192, &vlen);
        assert(!v || vlen <= 8192);
        free(v);
        (void)mw__json_u64(kv, "lease", 0);
        (void)mw__json_str(kv, "key");
    }
    json_object_put(o);
}

/* @data fed to a reader in pieces whose sizes the input's first byte
 * picks; every body it completes checked. */
static void read_all(const uint8_t *data, size_t len, bool stream)
{
    struct mw__resp r = {.stream = stream};
    struct evbuffer *in = evbuffer_new(), *body = evbuffer_new();
    size_t piece = len ? (size_t)data[0] % 61 + 1 : 1, at = 0;
    while (at < len) {
        size_t n = len - at < piece ? len - at : piece;
        evbuffer_add(in, data + at, n);
        at += n;
        enum mw__resp_step s;
        while ((s = mw__resp_step(&r, in, body)) != MW__RESP_MORE && s != MW__RESP_BAD) {
            size_t b = evbuffer_get_length(body);
            assert(stream || b <= MW__ETCD_RESPONSE_MAX);
            if (s == MW__RESP_DONE) {
                assert(r.status >= 100 && r.status <= 999);
                assert(!r.too_long || b == 0);
            }
            check_json((const char *)evbuffer_pullup(body, -1), b);
            evbuffer_drain(body, b);
        }
        if (s == MW__RESP_BAD)
            break;
    }
    evbuffer_free(in);
    evbuffer_free(body);
}

static void check_b64(const uint8_t *data, size_t len)
{
    if (len > 4096)
        len = 4096;
    char enc[4096 / 3 * 4 + 8], dec[4096 + 8];
    mw__b64_encode(data, len, enc);
    assert(mw__b64_decode(enc, dec) == (long)len && !memcmp(dec, data, len));
    char raw[512];                      /* the input itself as base64: any answer, no overrun */
    size_t m = len < sizeof raw - 1 ? len : sizeof raw - 1;
    memcpy(raw, data, m);
    raw[m] = 0;
    long got = mw__b64_decode(raw, dec);
    assert(got <= (long)(strlen(raw) / 4 * 3));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    read_all(data, len, false);
    read_all(data, len, true);
    check_b64(data, len);
    return 0;
}
