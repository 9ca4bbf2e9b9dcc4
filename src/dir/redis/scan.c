/* A list (mw__store_scan): the prefix's index read a page per request, so
 * that no request makes a store shared with others work for long, and the
 * pages gathered into one answer.  Pages follow each other by key: an
 * entry changed meanwhile is listed once, as one of its values. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "core/alloc.h"
#include "dir/redis/redis.h"

#define S(s) (s), strlen(s)
#define PAGE 128                       /* entries per request */
#define SCAN_BYTES_MAX (64u << 20)     /* of keys and values gathered */

/* A page of the index KEYS[1] from ARGV[1] to ARGV[2] (ZRANGEBYLEX
 * bounds): the bound the next page starts from ('' after the last page),
 * then key/value pairs.  Members whose key is gone are dropped from the
 * index, and so are members too long to be a key (a stranger's: one such
 * member in every page's answer would swell it past what a link reads);
 * keys of another type, or too long to read, are left out. */
static const char PAGE_LUA[] =
    "local m = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', 0, "
    MW__REDIS_STR(PAGE) ") "
    "local out, last = {''}, nil "
    "for _, k in ipairs(m) do "
    "if #k > " MW__REDIS_STR(MW__STORE_KEY_MAX) " then redis.call('ZREM', KEYS[1], k) "
    "else last = k " MW__REDIS_CHECK_LUA("k")
    "if t == 'none' then redis.call('ZREM', KEYS[1], k) "
    "elseif t == 'string' and not big then "
    "out[#out + 1] = k out[#out + 1] = redis.call('GET', k) end end end "
    "if #m == " MW__REDIS_STR(PAGE) " then out[1] = last and '(' .. last or ARGV[1] end "
    "return out";

struct scan {
    struct mw__redis *st;
    mw__store_scan_fn fn;
    void *arg;
    char idx[128];
    char *from, *to;                   /* "[PREFIX", then the page's next; "(PREFIX\xff" */
    size_t n, cap, bytes;
    char **keys, **vals;
    size_t *lens;
};

static void scan_finish(struct scan *s, int err, const char *why)
{
    s->fn(s->arg, err, why, err ? 0 : s->n, (const char *const *)s->keys,
          (const char *const *)s->vals, s->lens);
    for (size_t i = 0; i < s->n; i++) {
        mw__free(s->keys[i]);
        mw__free(s->vals[i]);
    }
    mw__free(s->keys);
    mw__free(s->vals);
    mw__free(s->lens);
    mw__free(s->from);
    mw__free(s->to);
    mw__free(s);
}

static char *bound(char c, const char *a, size_t alen, const char *tail)
{
    size_t tl = strlen(tail);
    char *b = mw__malloc(1 + alen + tl + 1);
    if (b) {
        b[0] = c;
        memcpy(b + 1, a, alen);
        memcpy(b + 1 + alen, tail, tl + 1);
    }
    return b;
}

static char *copy(const redisReply *r)
{
    char *c = mw__malloc(r->len + 1);
    if (c) {
        memcpy(c, r->str, r->len);
        c[r->len] = 0;
    }
    return c;
}

static int take(struct scan *s, const redisReply *k, const redisReply *v)
{
    if (s->n == MW__STORE_SCAN_MAX || s->bytes + k->len + v->len > SCAN_BYTES_MAX)
        return -E2BIG;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : PAGE;
        char **keys = mw__realloc(s->keys, cap * sizeof *keys);
        if (keys)
            s->keys = keys;
        char **vals = mw__realloc(s->vals, cap * sizeof *vals);
        if (vals)
            s->vals = vals;
        size_t *lens = mw__realloc(s->lens, cap * sizeof *lens);
        if (lens)
            s->lens = lens;
        if (!keys || !vals || !lens)
            return -ENOMEM;
        s->cap = cap;
    }
    char *kc = copy(k), *vc = copy(v);
    if (!kc || !vc) {
        mw__free(kc);
        mw__free(vc);
        return -ENOMEM;
    }
    s->keys[s->n] = kc;
    s->vals[s->n] = vc;
    s->lens[s->n++] = v->len;
    s->bytes += k->len + v->len;
    return 0;
}

static int page_request(struct scan *s);

static void on_page(const struct mw__redis_caller *to, int err, const char *why,
                    const redisReply *rep)
{
    struct scan *s = to->arg;
    if (err)
        return scan_finish(s, err, why);
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements % 2 != 1)
        return scan_finish(s, -EPROTO, "the store answered a list with something else");
    for (size_t i = 0; i < rep->elements; i++)
        if (rep->element[i]->type != REDIS_REPLY_STRING)
            return scan_finish(s, -EPROTO, "the store's list held a non-string");
    for (size_t i = 1; i < rep->elements; i += 2)
        if ((err = take(s, rep->element[i], rep->element[i + 1])) < 0)
            return scan_finish(s, err, err == -E2BIG ? "over 100,000 entries, or 64 MiB, "
                                                       "under the prefix"
                                                     : "out of memory");
    const redisReply *next = rep->element[0];
    if (!next->len)
        return scan_finish(s, 0, NULL);
    if (next->str[0] != '(' && next->str[0] != '[')
        return scan_finish(s, -EPROTO, "the store answered a list with something else");
    mw__free(s->from);
    if (!(s->from = copy(next)) || page_request(s) < 0)
        scan_finish(s, -ENOMEM, "out of memory");
}

static int page_request(struct scan *s)
{
    struct mw__redis_caller to = {.arg = s};
    return mw__redis_request(s->st, on_page, to, 6, S("EVAL"), S(PAGE_LUA), S("1"), S(s->idx),
                             S(s->from), S(s->to));
}

int mw__redis_scan(struct mw__redis *st, const char *prefix, mw__store_scan_fn fn, void *arg)
{
    struct scan *s = mw__calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    *s = (struct scan){.st = st, .fn = fn, .arg = arg};
    mw__redis_side_key(st, "index", s->idx, sizeof s->idx);
    size_t n = strlen(prefix);
    s->from = bound('[', prefix, n, "");
    s->to = bound('(', prefix, n, "\xff");   /* names are printable: below 0xff */
    if (!s->from || !s->to || page_request(s) < 0) {
        mw__free(s->from);
        mw__free(s->to);
        mw__free(s);
        return -ENOMEM;
    }
    return 0;
}
