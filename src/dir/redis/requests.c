/* What the directory asks of the store, kind by kind: the Redis command
 * that asks it, and the decoder that makes its reply the caller's answer. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "core/alloc.h"
#include "dir/redis/redis.h"

#define S(s) (s), strlen(s)

/* put, del: done or not */
static void decode_plain(const struct mw__redis_caller *to, int err, const char *why,
                         const redisReply *rep)
{
    (void)rep;
    if (to->fn.plain)
        to->fn.plain(to->arg, err, why);
}

/* PEXPIRE answers 1 when the key was there. */
static void decode_renew(const struct mw__redis_caller *to, int err, const char *why,
                         const redisReply *rep)
{
    enum mw__store_held held = MW__HELD_OURS;      /* on error: nothing learnt */
    if (!err && rep && rep->type == REDIS_REPLY_INTEGER)
        held = rep->integer == 1 ? MW__HELD_OURS
             : rep->integer == 0 ? MW__HELD_NONE : MW__HELD_THEIRS;
    to->fn.renew(to->arg, err, why, held);
}

static void decode_get(const struct mw__redis_caller *to, int err, const char *why,
                       const redisReply *rep)
{
    if (!err && rep && rep->type == REDIS_REPLY_NIL)
        to->fn.get(to->arg, -ENOENT, "no such entry", NULL, 0);
    else if (!err && (!rep || rep->type != REDIS_REPLY_STRING))
        to->fn.get(to->arg, -EPROTO, "the store answered GET with a non-string", NULL, 0);
    else
        to->fn.get(to->arg, err, why, err ? NULL : rep->str, err ? 0 : rep->len);
}

/* A scan's key/value pairs, pointing into its reply. */
struct pairs {
    size_t n;
    const char **keys, **vals;
    size_t *lens;
};

/* @rep: [key, value, key, value...], every one a string.  On refusal
 * @p->n stays 0 (the arrays may be allocated). */
static int pairs_take(struct pairs *p, const redisReply *rep, const char **why)
{
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements % 2)
        return *why = "the store answered the scan with something else than key/value pairs",
               -EPROTO;
    size_t n = rep->elements / 2;
    if (!n)
        return 0;
    p->keys = mw__calloc(n, sizeof *p->keys);
    p->vals = mw__calloc(n, sizeof *p->vals);
    p->lens = mw__calloc(n, sizeof *p->lens);
    if (!p->keys || !p->vals || !p->lens)
        return *why = "out of memory", -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const redisReply *k = rep->element[2 * i], *v = rep->element[2 * i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            return *why = "the store's scan held a non-string", -EPROTO;
        p->keys[i] = k->str;
        p->vals[i] = v->str;
        p->lens[i] = v->len;
    }
    p->n = n;
    return 0;
}

static void decode_scan(const struct mw__redis_caller *to, int err, const char *why,
                        const redisReply *rep)
{
    struct pairs p = {0};
    if (!err)
        err = pairs_take(&p, rep, &why);
    to->fn.scan(to->arg, err, why, p.n, p.keys, p.vals, p.lens);
    mw__free(p.keys);
    mw__free(p.vals);
    mw__free(p.lens);
}

int mw__store_put(struct mw__store *st, const char *key, const char *val, size_t len,
                  unsigned lease_ms, mw__store_fn fn, void *arg)
{
    char px[16];
    snprintf(px, sizeof px, "%u", lease_ms);
    struct mw__redis_caller to = {.fn.plain = fn, .arg = arg};
    return mw__redis_request(st, decode_plain, to, 5, S("SET"), S(key), val, len, S("PX"),
                             S(px));
}

/* An entry is ours while it holds our instance line (entry.c writes it
 * once, whole: "\ninstance %016x\n").  A key of another type is not. */
#define OURS_LUA "local v = redis.pcall('GET', KEYS[1]) " \
                 "local ours = type(v) == 'string' and string.find(v, ARGV[1], 1, true) "
static const char RENEW_LUA[] = OURS_LUA
    "if ours then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end "
    "if v == false then return 0 end return 2";
static const char DEL_LUA[] = OURS_LUA
    "if ours then return redis.call('DEL', KEYS[1]) end return 0";

static void instance_line(uint64_t instance, char *buf, size_t cap)
{
    snprintf(buf, cap, "\ninstance %016" PRIx64 "\n", instance);
}

int mw__store_renew(struct mw__store *st, const char *key, uint64_t instance,
                    unsigned lease_ms, mw__store_renew_fn fn, void *arg)
{
    char px[16], line[32];
    snprintf(px, sizeof px, "%u", lease_ms);
    instance_line(instance, line, sizeof line);
    struct mw__redis_caller to = {.fn.renew = fn, .arg = arg};
    return mw__redis_request(st, decode_renew, to, 6, S("EVAL"), S(RENEW_LUA), S("1"), S(key),
                             S(line), S(px));
}

int mw__store_del(struct mw__store *st, const char *key, uint64_t instance, mw__store_fn fn,
                  void *arg)
{
    char line[32];
    instance_line(instance, line, sizeof line);
    struct mw__redis_caller to = {.fn.plain = fn, .arg = arg};
    return mw__redis_request(st, decode_plain, to, 5, S("EVAL"), S(DEL_LUA), S("1"), S(key),
                             S(line));
}

int mw__store_get(struct mw__store *st, const char *key, mw__store_get_fn fn, void *arg)
{
    struct mw__redis_caller to = {.fn.get = fn, .arg = arg};
    return mw__redis_request(st, decode_get, to, 2, S("GET"), S(key));
}

/* The whole prefix in one round trip, and consistent: SCAN and GET inside
 * one script; a key of another type (not ours) is left out.  (etcd: one
 * range request.) */
static const char SCAN_LUA[] =
    "local c, out = '0', {} "
    "repeat local r = redis.call('SCAN', c, 'MATCH', ARGV[1], 'COUNT', 1000) c = r[1] "
    "for _, k in ipairs(r[2]) do local v = redis.pcall('GET', k) "
    "if type(v) == 'string' then out[#out + 1] = k out[#out + 1] = v end end "
    "until c == '0' return out";

int mw__store_scan(struct mw__store *st, const char *prefix, mw__store_scan_fn fn, void *arg)
{
    /* the prefix is plain text (names exclude glob characters): match it
     * and anything after */
    size_t n = strlen(prefix);
    char *pat = mw__malloc(n + 2);
    if (!pat)
        return -ENOMEM;
    memcpy(pat, prefix, n);
    memcpy(pat + n, "*", 2);
    struct mw__redis_caller to = {.fn.scan = fn, .arg = arg};
    int rc = mw__redis_request(st, decode_scan, to, 4, S("EVAL"), S(SCAN_LUA), S("0"), S(pat));
    mw__free(pat);
    return rc;
}
