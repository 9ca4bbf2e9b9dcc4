/* The event link: keyspace notifications of the directory's keys.  Once
 * connected it checks that the store sends them (set, del and expired:
 * "K$gx"; turned on only when the directory was opened with
 * configure_store: a store's configuration is its owner's), then
 * subscribes to those of "PREFIX*"; it is up once the store confirmed the
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
    l->up = true;
    if (l->st->hooks.up)
        l->st->hooks.up(l->st->hooks.arg, false, err);
}

/* ["pmessage", pattern, "__keyspace@N__:KEY", event] */
static void keyspace_message(struct mw__store *st, const redisReply *rep)
{
    if (rep->elements != 4 || rep->element[2]->type != REDIS_REPLY_STRING ||
        rep->element[3]->type != REDIS_REPLY_STRING)
        return;
    const char *key = strchr(rep->element[2]->str, ':');
    const char *what = rep->element[3]->str;
    if (!key || !st->hooks.event)
        return;
    if (!strcmp(what, "set"))
        st->hooks.event(st->hooks.arg, key + 1, MW__STORE_SET);
    else if (!strcmp(what, "del") || !strcmp(what, "expired"))
        st->hooks.event(st->hooks.arg, key + 1, MW__STORE_GONE);
}

/* ["psubscribe", pattern, n] once, then pmessages. */
static void on_event_msg(redisAsyncContext *ac, void *reply, void *privdata)
{
    (void)ac;
    struct mw__redis_link *l = privdata;
    const redisReply *rep = reply;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3 ||
        rep->element[0]->type != REDIS_REPLY_STRING)
        return;
    if (!strcmp(rep->element[0]->str, "psubscribe"))
        events_up(l, 0);
    else if (!strcmp(rep->element[0]->str, "pmessage"))
        keyspace_message(l->st, rep);
}

static void subscribe(struct mw__redis_link *l)
{
    struct mw__store *st = l->st;
    redisAsyncCommand(l->ac, on_event_msg, l, "PSUBSCRIBE __keyspace@%d__:%s*", st->addr.db,
                      st->prefix);
}

/* Whether @flags (a notify-keyspace-events value) covers K, $, g, x. */
static bool config_covers(const char *flags)
{
    bool all = strchr(flags, 'A') != NULL;
    return strchr(flags, 'K') && (all || (strchr(flags, '$') && strchr(flags, 'g') &&
                                          strchr(flags, 'x')));
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
                "notify-keyspace-events to include K$gx in its configuration to watch",
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
               "notify-keyspace-events is %s%.32s%s; set it to include K$gx (redis.conf, or "
               "CONFIG SET), or open the directory with configure_store",
               cur ? "\"" : "", cur ? cur : "unreadable (CONFIG refused)", cur ? "\"" : "");
        events_up(l, -ENOTSUP);
        return;
    }
    char want[64];
    snprintf(want, sizeof want, "%sK$gx", cur && strlen(cur) < 32 ? cur : "");
    redisAsyncCommand(ac, on_config_set, l, "CONFIG SET notify-keyspace-events %s", want);
}

/* A store restarted may have lost the setting: ask each time. */
void mw__redis_events_ready(struct mw__redis_link *l)
{
    redisAsyncCommand(l->ac, on_config, l, "CONFIG GET notify-keyspace-events");
}
