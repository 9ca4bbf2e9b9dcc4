/* The event link: one etcd watch on the directory's prefix, whose answer
 * streams a JSON message per line: first {"result":{"created":true}} (the
 * link is up: events flow from now on), then the events, puts with their
 * values and deletes (an expired lease deletes its key).  A message longer
 * than MW__ETCD_RESPONSE_MAX drops the link, as does a cancelled watch. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>
#include <json-c/json.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "dir/etcd/etcd.h"

void mw__etcd_events_ready(struct mw__etcd_link *l)
{
    struct mw__etcd *st = l->st;
    size_t n = strlen(st->prefix);
    char end[MW__STORE_KEY_MAX + 1], k[(MW__STORE_KEY_MAX + 2) / 3 * 4 + 1],
        e[sizeof k], b[2 * sizeof k + 80];
    memcpy(end, st->prefix, n);
    end[n - 1]++;                      /* printable: no carry */
    mw__b64_encode(st->prefix, n, k);
    mw__b64_encode(end, n, e);
    snprintf(b, sizeof b, "{\"create_request\":{\"key\":\"%s\",\"range_end\":\"%s\"}}", k, e);
    mw__etcd_send(l, "/v3/watch", b);
}

static void one_event(struct mw__etcd *st, struct json_object *ev)
{
    struct json_object *kv = mw__json_obj(ev, "kv");
    const char *type = mw__json_str(ev, "type");
    size_t klen, vlen = 0;
    char *key = mw__json_bytes(kv, "key", MW__STORE_KEY_MAX, &klen);
    if (!key)
        return;
    if (type && !strcmp(type, "DELETE")) {
        st->hooks.event(st->hooks.arg, key, MW__STORE_GONE, NULL, 0);
    } else {
        char *val = mw__json_bytes(kv, "value", MW__STORE_VALUE_MAX, &vlen);
        if (val)                       /* else not an entry: too long */
            st->hooks.event(st->hooks.arg, key, MW__STORE_SET, val, vlen);
        mw__free(val);
    }
    mw__free(key);
}

/* One message of the stream; false when the link dropped. */
static bool message(struct mw__etcd_link *l, const char *text)
{
    struct mw__etcd *st = l->st;
    struct json_object *o = json_tokener_parse(text);
    struct json_object *res = mw__json_obj(o, "result");
    struct json_object *canceled = mw__json_obj(res, "canceled");
    bool drop = !res || (canceled && json_object_get_boolean(canceled)) ||
                mw__json_u64(res, "compact_revision", 0);
    if (drop) {
        json_object_put(o);
        mw__etcd_link_drop(l, "the store cancelled the watch");
        return false;
    }
    struct json_object *created = mw__json_obj(res, "created");
    if (!l->up && created && json_object_get_boolean(created)) {
        mw__etcd_link_up(l);
        if (st->hooks.up)
            st->hooks.up(st->hooks.arg, false, 0);
    }
    struct json_object *evs = mw__json_obj(res, "events");
    size_t n = evs && json_object_is_type(evs, json_type_array) ? json_object_array_length(evs)
                                                                : 0;
    for (size_t i = 0; i < n && l->up; i++)
        one_event(st, json_object_array_get_idx(evs, i));
    json_object_put(o);
    return true;
}

void mw__etcd_events_data(struct mw__etcd_link *l, struct evbuffer *b)
{
    for (;;) {
        struct evbuffer_ptr nl = evbuffer_search(b, "\n", 1, NULL);
        if (nl.pos < 0) {
            if (evbuffer_get_length(b) > MW__ETCD_RESPONSE_MAX)
                mw__etcd_link_drop(l, "the store sent a message over 4 MiB");
            return;
        }
        size_t n = (size_t)nl.pos;
        char *text = mw__malloc(n + 1);
        if (!text) {
            mw__etcd_link_drop(l, "out of memory");
            return;
        }
        evbuffer_remove(b, text, n);
        evbuffer_drain(b, 1);
        text[n] = 0;
        bool going = message(l, text);
        mw__free(text);
        if (!going)
            return;
    }
}
