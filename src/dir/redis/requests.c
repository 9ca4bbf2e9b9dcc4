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

void mw__redis_side_key(const struct mw__redis *st, const char *what, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s#%s", st->prefix, what);
}

static const char PUT_LUA[] =
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) "
    "redis.call('ZADD', KEYS[2], 0, KEYS[1]) "
    "redis.call('PUBLISH', ARGV[3], KEYS[1] .. '\\n' .. ARGV[1]) return 1";

int mw__redis_put(struct mw__redis *st, const char *key, const char *val, size_t len,
                  unsigned lease_ms, mw__store_fn fn, void *arg)
{
    char px[16], idx[128], chan[128];
    snprintf(px, sizeof px, "%u", lease_ms);
    mw__redis_side_key(st, "index", idx, sizeof idx);
    mw__redis_side_key(st, "events", chan, sizeof chan);
    struct mw__redis_caller to = {.fn.plain = fn, .arg = arg};
    return mw__redis_request(st, decode_plain, to, 8, S("EVAL"), S(PUT_LUA), S("2"), S(key),
                             S(idx), val, len, S(px), S(chan));
}

/* An entry is ours while it holds our instance line (entry.c writes it
 * once, whole: "\ninstance %016x\n").  A key of another type is not. */
#define OURS_LUA "local v = redis.pcall('GET', KEYS[1]) " \
                 "local ours = type(v) == 'string' and string.find(v, ARGV[1], 1, true) "
static const char RENEW_LUA[] = OURS_LUA
    "if ours then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end "
    "if v == false then return 0 end return 2";
static const char DEL_LUA[] = OURS_LUA
    "if ours then redis.call('ZREM', KEYS[2], KEYS[1]) return redis.call('DEL', KEYS[1]) end "
    "return 0";

static void instance_line(uint64_t instance, char *buf, size_t cap)
{
    snprintf(buf, cap, "\ninstance %016" PRIx64 "\n", instance);
}

int mw__redis_renew(struct mw__redis *st, const char *key, uint64_t instance,
                    unsigned lease_ms, mw__store_renew_fn fn, void *arg)
{
    char px[16], line[32];
    snprintf(px, sizeof px, "%u", lease_ms);
    instance_line(instance, line, sizeof line);
    struct mw__redis_caller to = {.fn.renew = fn, .arg = arg};
    return mw__redis_request(st, decode_renew, to, 6, S("EVAL"), S(RENEW_LUA), S("1"), S(key),
                             S(line), S(px));
}

int mw__redis_del(struct mw__redis *st, const char *key, uint64_t instance, mw__store_fn fn,
                  void *arg)
{
    char line[32], idx[128];
    instance_line(instance, line, sizeof line);
    mw__redis_side_key(st, "index", idx, sizeof idx);
    struct mw__redis_caller to = {.fn.plain = fn, .arg = arg};
    return mw__redis_request(st, decode_plain, to, 6, S("EVAL"), S(DEL_LUA), S("2"), S(key),
                             S(idx), S(line));
}

static const char GET_LUA[] = MW__REDIS_CHECK_LUA("KEYS[1]")
    "if t == 'none' then return false end "
    "if t ~= 'string' then return redis.error_reply('MWTYPE') end "
    "if big then return redis.error_reply('MWBIG') end "
    "return redis.call('GET', KEYS[1])";

int mw__redis_get(struct mw__redis *st, const char *key, mw__store_get_fn fn, void *arg)
{
    struct mw__redis_caller to = {.fn.get = fn, .arg = arg};
    return mw__redis_request(st, decode_get, to, 4, S("EVAL"), S(GET_LUA), S("1"), S(key));
}

