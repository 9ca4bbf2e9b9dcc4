/* JSON and base64 for etcd's gateway: keys and values travel base64, and
 * 64-bit numbers as decimal strings. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "core/alloc.h"
#include "dir/etcd/etcd.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void mw__b64_encode(const void *in, size_t len, char *out)
{
    const unsigned char *p = in;
    size_t i = 0;
    for (; i + 2 < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        *out++ = B64[v >> 18];
        *out++ = B64[v >> 12 & 63];
        *out++ = B64[v >> 6 & 63];
        *out++ = B64[v & 63];
    }
    if (i < len) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < len ? (unsigned)p[i + 1] << 8 : 0);
        *out++ = B64[v >> 18];
        *out++ = B64[v >> 12 & 63];
        *out++ = i + 1 < len ? B64[v >> 6 & 63] : '=';
        *out++ = '=';
    }
    *out = 0;
}

static int b64_value(char c)
{
    const char *p = c ? strchr(B64, c) : NULL;
    return p ? (int)(p - B64) : -1;
}

long mw__b64_decode(const char *in, char *out)
{
    size_t n = strlen(in);
    if (n % 4)
        return -1;
    long len = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            bool last = i + 4 == n;
            if (in[i + j] == '=' && last && j >= 2 && (j == 3 || in[i + 3] == '=')) {
                v[j] = 0;
                pad++;
            } else if ((v[j] = b64_value(in[i + j])) < 0 || pad) {
                return -1;
            }
        }
        unsigned x = (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 |
                     (unsigned)v[3];
        out[len++] = (char)(x >> 16);
        if (pad < 2)
            out[len++] = (char)(x >> 8 & 255);
        if (pad < 1)
            out[len++] = (char)(x & 255);
    }
    return len;
}

struct json_object *mw__json_parse(const char *text, size_t len)
{
    struct json_tokener *t = len <= (size_t)INT32_MAX ? json_tokener_new() : NULL;
    struct json_object *o = t ? json_tokener_parse_ex(t, text, (int)len) : NULL;
    if (t)
        json_tokener_free(t);
    return o;
}

struct json_object *mw__json_obj(struct json_object *o, const char *name)
{
    struct json_object *m;
    return o && json_object_object_get_ex(o, name, &m) ? m : NULL;
}

const char *mw__json_str(struct json_object *o, const char *name)
{
    struct json_object *m = mw__json_obj(o, name);
    return m && json_object_is_type(m, json_type_string) ? json_object_get_string(m) : NULL;
}

uint64_t mw__json_u64(struct json_object *o, const char *name, uint64_t def)
{
    struct json_object *m = mw__json_obj(o, name);
    if (!m)
        return def;
    if (json_object_is_type(m, json_type_int))
        return (uint64_t)json_object_get_int64(m);
    const char *s = json_object_is_type(m, json_type_string) ? json_object_get_string(m) : NULL;
    char *end;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    return s && *s && !*end ? v : def;
}

char *mw__json_bytes(struct json_object *o, const char *name, size_t max, size_t *len)
{
    const char *s = mw__json_str(o, name);
    *len = s ? strlen(s) / 4 * 3 : 0;
    if (!s || *len > max + 2)
        return NULL;
    char *out = mw__malloc(*len + 1);
    long n = out ? mw__b64_decode(s, out) : -1;
    if (n < 0 || (size_t)n > max) {
        *len = n < 0 ? 0 : (size_t)n;
        mw__free(out);
        return NULL;
    }
    out[n] = 0;
    *len = (size_t)n;
    return out;
}
