/* A list (mw__store_scan): the prefix's index read a page per request, so
 * that no request makes a store shared with others work for long, and the
 * pages gathered into one answer.  Pages follow each other by key: an
 * entry changed meanwhile is listed once, as one of its values. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "core/alloc.h"
#include "dir/gather.h"
#include "dir/redis/redis.h"

#define S(s) (s), strlen(s)
#define PAGE 128                       /* entries per request */

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
    struct mw__gather g;
};

static void scan_finish(struct scan *s, int err, const char *why)
{
    mw__gather_answer(&s->g, s->fn, s->arg, err, why);
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
    return mw__gather_take(&s->g, copy(k), k->len, copy(v), v->len);
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
            return scan_finish(s, err, mw__gather_why(err));
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
