/* The event link: what happens to the directory's keys.  Values put come
 * on the channel PREFIX#events (redis.h); keys gone come as keyspace
 * notifications (del and expired: "Kgx").  Once connected the link checks
 * that the store sends those (turned on only when the directory was
 * opened with configure_store: a store's configuration is its owner's),
 * subscribes to both, and is up once the store confirmed the second
 * subscription. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "core/ctx.h"
#include "dir/redis/redis.h"

/* The event link is up: events flow (@err 0), or none will (-ENOTSUP). */
static void events_up(struct mw__redis_link *l, int err)
{
    mw__redis_link_up(l);
    if (l->st->hooks.up)
        l->st->hooks.up(l->st->hooks.arg, false, err);
}

/* ["pmessage", pattern, "__keyspace@N__:KEY", event] */
static void keyspace_message(struct mw__redis *st, const redisReply *rep)
{
    if (rep->elements != 4 || rep->element[2]->type != REDIS_REPLY_STRING ||
        rep->element[3]->type != REDIS_REPLY_STRING)
        return;
    const char *key = strchr(rep->element[2]->str, ':');
    const char *what = rep->element[3]->str;
    if (key && (!strcmp(what, "del") || !strcmp(what, "expired")))
        st->hooks.event(st->hooks.arg, key + 1, MW__STORE_GONE, NULL, 0);
}

/* ["message", "PREFIX#events", "KEY\nVALUE"]: a put (redis.h) */
static void put_message(struct mw__redis *st, const redisReply *rep)
{
    const redisReply *m = rep->elements == 3 ? rep->element[2] : NULL;
    if (!m || m->type != REDIS_REPLY_STRING)
        return;
    char key[MW__STORE_KEY_MAX + 1];
    const char *nl = memchr(m->str, '\n', m->len < sizeof key ? m->len : sizeof key);
    size_t vlen = nl ? m->len - (size_t)(nl + 1 - m->str) : 0;
    if (!nl || vlen > MW__STORE_VALUE_MAX)
        return;                         /* not a put's: no key, or too long */
    memcpy(key, m->str, (size_t)(nl - m->str));
    key[nl - m->str] = 0;
    st->hooks.event(st->hooks.arg, key, MW__STORE_SET, nl + 1, vlen);
}

/* ["psubscribe", pattern, n], ["subscribe", channel, n] once each, then
 * pmessages and messages. */
static void on_event_msg(redisAsyncContext *ac, void *reply, void *privdata)
{
    (void)ac;
    struct mw__redis_link *l = privdata;
    const redisReply *rep = reply;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3 ||
        rep->element[0]->type != REDIS_REPLY_STRING)
        return;
    const char *kind = rep->element[0]->str;
    if (!strcmp(kind, "subscribe"))     /* the second: both are in place */
        events_up(l, 0);
    else if (!strcmp(kind, "pmessage"))
        keyspace_message(l->st, rep);
    else if (!strcmp(kind, "message"))
        put_message(l->st, rep);
}

static void subscribe(struct mw__redis_link *l)
{
    struct mw__redis *st = l->st;
    char chan[128];
    mw__redis_side_key(st, "events", chan, sizeof chan);
    redisAsyncCommand(l->ac, on_event_msg, l, "PSUBSCRIBE __keyspace@%d__:%s*", st->addr.db,
                      st->prefix);
    redisAsyncCommand(l->ac, on_event_msg, l, "SUBSCRIBE %s", chan);
}

/* Whether @flags (a notify-keyspace-events value) covers K, g, x. */
static bool config_covers(const char *flags)
{
    bool all = strchr(flags, 'A') != NULL;
    return strchr(flags, 'K') && (all || (strchr(flags, 'g') && strchr(flags, 'x')));
}

static void on_config_set(redisAsyncContext *ac, void *reply, void *privdata)
{
    (void)ac;
    struct mw__redis_link *l = privdata;
    const redisReply *rep = reply;
    if (!rep)
        return;
    if (rep->type == REDIS_REPLY_ERROR) {
        MW_LOG(l->st->ctx, MW_LOG_ERROR,
                "directory: the store refused to send keyspace notifications (%s): set "
                "notify-keyspace-events to include Kgx in its configuration to watch",
                rep->str);
        events_up(l, -ENOTSUP);
        return;
    }
    subscribe(l);
}

static void on_config(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct mw__redis_link *l = privdata;
    const redisReply *rep = reply;
    if (!rep)
        return;
    const char *cur = rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
                              rep->element[1]->type == REDIS_REPLY_STRING
                          ? rep->element[1]->str
                          : NULL;
    if (cur && config_covers(cur)) {
        subscribe(l);
        return;
    }
    if (!l->st->configure) {
        MW_LOG(l->st->ctx, MW_LOG_ERROR,
               "directory: watches need the store's keyspace notifications: its "
               "notify-keyspace-events is %s%.32s%s; set it to include Kgx (redis.conf, or "
               "CONFIG SET), or open the directory with configure_store",
               cur ? "\"" : "", cur ? cur : "unreadable (CONFIG refused)", cur ? "\"" : "");
        events_up(l, -ENOTSUP);
        return;
    }
    char want[64];
    snprintf(want, sizeof want, "%sKgx", cur && strlen(cur) < 32 ? cur : "");
    redisAsyncCommand(ac, on_config_set, l, "CONFIG SET notify-keyspace-events %s", want);
}

/* A store restarted may have lost the setting: ask each time. */
void mw__redis_events_ready(struct mw__redis_link *l)
{
    redisAsyncCommand(l->ac, on_config, l, "CONFIG GET notify-keyspace-events");
}
