/* The store's operations on etcd (etcd.h): each one a gateway call or two.
 *   put    lease/grant, then kv/put with that lease
 *   renew  kv/range: ours (our instance line in the value), then
 *          lease/keepalive; none; or another publisher's
 *   del    kv/range: ours, then lease/revoke (the key goes with its lease,
 *          and only while it is still on it: never a later publisher's)
 *   get    kv/range
 *   scan   kv/range over the prefix, a page at a time, gathered */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <json-c/json.h>

#include "core/alloc.h"
#include "core/list.h"
#include "dir/etcd/etcd.h"
#include "dir/gather.h"

#define PAGE 128                       /* entries per range request */
#define B64_LEN(n) (((n) + 2) / 3 * 4 + 1)

#define E(s) mw__container_of(s, struct mw__etcd, base)

/* The lease of one of our puts. */
struct lease {
    struct mw__list link;
    uint64_t id;
    char line[32];                     /* the instance line of the value put */
    char key[];
};

static struct lease *lease_find(struct mw__etcd *st, const char *key)
{
    struct lease *l;
    mw__list_for_each(l, &st->leases, link)
        if (!strcmp(l->key, key))
            return l;
    return NULL;
}

static void lease_drop(struct lease *l)
{
    mw__list_del(&l->link);
    mw__free(l);
}

/* Remember @id as @key's lease, holding the value whose instance line is
 * @line (the last put of a key is the one a delete means). */
static void lease_note(struct mw__etcd *st, const char *key, const char *line, uint64_t id)
{
    struct lease *l = lease_find(st, key);
    if (l)
        lease_drop(l);
    if (!*line || !(l = mw__malloc(sizeof *l + strlen(key) + 1)))
        return;
    l->id = id;
    snprintf(l->line, sizeof l->line, "%s", line);
    strcpy(l->key, key);
    mw__list_add_tail(&st->leases, &l->link);
}

/* What an operation carries from one call to the next. */
struct op {
    struct mw__etcd *st;
    union {
        mw__store_fn plain;
        mw__store_renew_fn renew;
        mw__store_get_fn get;
    } fn;
    void *arg;
    char key[B64_LEN(MW__STORE_KEY_MAX)];
    char raw[MW__STORE_KEY_MAX + 1];   /* the key itself */
    char line[32];                     /* our instance line */
    char *val;                         /* put: the value, base64 */
    unsigned ttl;                      /* put: its lease's, in seconds */
    bool regranted;                    /* put: its lease granted again */
};

static struct op *op_new(struct mw__etcd *st, const char *key, void *arg)
{
    size_t n = strlen(key);
    struct op *o = n <= MW__STORE_KEY_MAX ? mw__calloc(1, sizeof *o) : NULL;
    if (!o)
        return NULL;
    o->st = st;
    o->arg = arg;
    mw__b64_encode(key, n, o->key);
    memcpy(o->raw, key, n + 1);
    return o;
}

static void op_free(struct op *o)
{
    mw__free(o->val);
    mw__free(o);
}

/* A body of up to three "NAME":"VALUE" members (NULL names end it). */
static char *body(const char *n1, const char *v1, const char *n2, const char *v2,
                  const char *n3, const char *v3)
{
    size_t len = 16 + strlen(n1) + strlen(v1) + (n2 ? strlen(n2) + strlen(v2) + 8 : 0) +
                 (n3 ? strlen(n3) + strlen(v3) + 8 : 0);
    char *b = mw__malloc(len);
    if (!b)
        return NULL;
    int at = snprintf(b, len, "{\"%s\":\"%s\"", n1, v1);
    if (n2)
        at += snprintf(b + at, len - (size_t)at, ",\"%s\":\"%s\"", n2, v2);
    if (n3)
        at += snprintf(b + at, len - (size_t)at, ",\"%s\":\"%s\"", n3, v3);
    snprintf(b + at, len - (size_t)at, "}");
    return b;
}

typedef int (*request_fn)(struct mw__etcd *st, const char *path, const char *body,
                          mw__etcd_fn fn, void *arg);

/* Ask @path with body @b (taken) by @req: 0 or -ENOMEM. */
static int ask(struct op *o, request_fn req, const char *path, char *b, mw__etcd_fn fn)
{
    int rc = b ? req(o->st, path, b, fn, o) : -ENOMEM;
    mw__free(b);
    return rc;
}

/* An operation's first call, queued behind what waits. */
static int call(struct op *o, const char *path, char *b, mw__etcd_fn fn)
{
    return ask(o, mw__etcd_request, path, b, fn);
}

/* Its next call, sent before anything else (etcd.h). */
static int then(struct op *o, const char *path, char *b, mw__etcd_fn fn)
{
    return ask(o, mw__etcd_request_next, path, b, fn);
}

/* The first key-value of a range's answer, or NULL. */
static struct json_object *first_kv(struct json_object *res)
{
    struct json_object *kvs = mw__json_obj(res, "kvs");
    return kvs && json_object_is_type(kvs, json_type_array) &&
                   json_object_array_length(kvs) > 0
               ? json_object_array_get_idx(kvs, 0)
               : NULL;
}

/* Whether @kv's value holds our instance line (entry.c writes it once). */
static bool ours(const struct op *o, struct json_object *kv)
{
    size_t len;
    char *v = mw__json_bytes(kv, "value", MW__STORE_VALUE_MAX, &len);
    bool yes = v && strstr(v, o->line);
    mw__free(v);
    return yes;
}

/* ------------------------------------------------------------------------
 * put
 * ------------------------------------------------------------------------ */

/* etcd's answer for a lease that expired (404, "requested lease not found") */
static bool lease_expired(int err, const char *why)
{
    return err == -EIO && why && strstr(why, "lease not found");
}

static int grant(struct op *o, request_fn req);

static void on_put(void *arg, int err, const char *why, struct json_object *res)
{
    (void)res;
    struct op *o = arg;
    /* The lease ran out before etcd took the put (a starved store or loop:
     * its TTL after the grant, 1 s for a lease under a second): a new
     * lease, once, rather than a publish failed for the store's slowness. */
    if (lease_expired(err, why) && !o->regranted) {
        o->regranted = true;
        if (grant(o, mw__etcd_request_next) == 0)
            return;
    }
    if (o->fn.plain)
        o->fn.plain(o->arg, err, why);
    op_free(o);
}

static void on_grant(void *arg, int err, const char *why, struct json_object *res)
{
    struct op *o = arg;
    uint64_t id = err ? 0 : mw__json_u64(res, "ID", 0);
    if (!err && !id)
        err = -EPROTO, why = "etcd granted no lease";
    char lease[24];
    snprintf(lease, sizeof lease, "%" PRIu64, id);
    if (!err)
        lease_note(o->st, o->raw, o->line, id);
    if (err || then(o, "/v3/kv/put", body("key", o->key, "value", o->val, "lease", lease),
                    on_put) < 0)
        on_put(o, err ? err : -ENOMEM, err ? why : "out of memory", NULL);
}

static int grant(struct op *o, request_fn req)
{
    char ttl[16];
    snprintf(ttl, sizeof ttl, "%u", o->ttl);
    return ask(o, req, "/v3/lease/grant", body("TTL", ttl, NULL, NULL, NULL, NULL), on_grant);
}

static int op_put(struct mw__store *s, const char *key, const char *val, size_t len,
                  unsigned lease_ms, mw__store_fn fn, void *arg)
{
    struct op *o = len <= MW__STORE_VALUE_MAX ? op_new(E(s), key, arg) : NULL;
    if (!o || !(o->val = mw__malloc(B64_LEN(len)))) {
        mw__free(o);
        return -ENOMEM;
    }
    o->fn.plain = fn;
    mw__b64_encode(val, len, o->val);
    const char *inst = memmem(val, len, "\ninstance ", 10);    /* entry.c's line */
    const char *eol = inst ? memchr(inst + 1, '\n', len - (size_t)(inst + 1 - val)) : NULL;
    if (eol && (size_t)(eol - inst + 1) < sizeof o->line)
        memcpy(o->line, inst, (size_t)(eol - inst + 1));
    o->ttl = lease_ms < 1000 ? 1 : (lease_ms + 999) / 1000;
    int rc = grant(o, mw__etcd_request);
    if (rc < 0)
        op_free(o);
    return rc;
}

/* ------------------------------------------------------------------------
 * renew, del: only while the key holds our entry
 * ------------------------------------------------------------------------ */

static void on_keepalive(void *arg, int err, const char *why, struct json_object *res)
{
    struct op *o = arg;
    struct json_object *r = mw__json_obj(res, "result");
    enum mw__store_held held = err || mw__json_u64(r ? r : res, "TTL", 0) > 0
                                   ? MW__HELD_OURS      /* on error: nothing learnt */
                                   : MW__HELD_NONE;     /* the lease expired */
    o->fn.renew(o->arg, err, why, held);
    op_free(o);
}

static void on_renew_range(void *arg, int err, const char *why, struct json_object *res)
{
    struct op *o = arg;
    struct json_object *kv = err ? NULL : first_kv(res);
    if (err || !kv || !ours(o, kv)) {
        o->fn.renew(o->arg, err, why, err ? MW__HELD_OURS : kv ? MW__HELD_THEIRS
                                                               : MW__HELD_NONE);
        op_free(o);
        return;
    }
    char id[24];
    snprintf(id, sizeof id, "%" PRIu64, mw__json_u64(kv, "lease", 0));
    if (then(o, "/v3/lease/keepalive", body("ID", id, NULL, NULL, NULL, NULL),
             on_keepalive) < 0)
        on_keepalive(o, -ENOMEM, "out of memory", NULL);
}

static void instance_line(uint64_t instance, char *buf, size_t cap)
{
    snprintf(buf, cap, "\ninstance %016" PRIx64 "\n", instance);
}

static int op_renew(struct mw__store *s, const char *key, uint64_t instance, unsigned lease_ms,
                    mw__store_renew_fn fn, void *arg)
{
    (void)lease_ms;                    /* the lease's own TTL, from the put */
    struct op *o = op_new(E(s), key, arg);
    if (!o)
        return -ENOMEM;
    o->fn.renew = fn;
    instance_line(instance, o->line, sizeof o->line);
    int rc = call(o, "/v3/kv/range", body("key", o->key, NULL, NULL, NULL, NULL),
                  on_renew_range);
    if (rc < 0)
        op_free(o);
    return rc;
}

static void on_revoke(void *arg, int err, const char *why, struct json_object *res)
{
    (void)res;
    struct op *o = arg;
    if (lease_expired(err, why))                        /* expired meanwhile */
        err = 0;
    if (o->fn.plain)
        o->fn.plain(o->arg, err, why);
    op_free(o);
}

static void on_del_range(void *arg, int err, const char *why, struct json_object *res)
{
    struct op *o = arg;
    struct json_object *kv = err ? NULL : first_kv(res);
    if (err || !kv || !ours(o, kv)) {
        on_revoke(o, err, why, NULL);
        return;
    }
    char id[24];
    snprintf(id, sizeof id, "%" PRIu64, mw__json_u64(kv, "lease", 0));
    if (then(o, "/v3/lease/revoke", body("ID", id, NULL, NULL, NULL, NULL), on_revoke) < 0)
        on_revoke(o, -ENOMEM, "out of memory", NULL);
}

static int op_del(struct mw__store *s, const char *key, uint64_t instance, mw__store_fn fn,
                  void *arg)
{
    struct op *o = op_new(E(s), key, arg);
    if (!o)
        return -ENOMEM;
    o->fn.plain = fn;
    instance_line(instance, o->line, sizeof o->line);
    struct lease *l = lease_find(o->st, key);
    char id[24];
    int rc;
    if (l && !strcmp(l->line, o->line)) {     /* ours, put by this store: one call */
        snprintf(id, sizeof id, "%" PRIu64, l->id);
        lease_drop(l);
        rc = call(o, "/v3/lease/revoke", body("ID", id, NULL, NULL, NULL, NULL), on_revoke);
    } else {
        rc = call(o, "/v3/kv/range", body("key", o->key, NULL, NULL, NULL, NULL), on_del_range);
    }
    if (rc < 0)
        op_free(o);
    return rc;
}

/* ------------------------------------------------------------------------
 * get
 * ------------------------------------------------------------------------ */

static void on_get(void *arg, int err, const char *why, struct json_object *res)
{
    struct op *o = arg;
    struct json_object *kv = err ? NULL : first_kv(res);
    size_t len = 0;
    char *v = kv ? mw__json_bytes(kv, "value", MW__STORE_VALUE_MAX, &len) : NULL;
    if (err)
        o->fn.get(o->arg, err, why, NULL, 0);
    else if (!kv)
        o->fn.get(o->arg, -ENOENT, "no such entry", NULL, 0);
    else if (!v)
        o->fn.get(o->arg, -EPROTO, len > MW__STORE_VALUE_MAX
                                       ? "not a meshwire entry (over 8 KiB)"
                                       : "not a meshwire entry (no value)", NULL, 0);
    else
        o->fn.get(o->arg, 0, NULL, v, len);
    mw__free(v);
    op_free(o);
}

static int op_get(struct mw__store *s, const char *key, mw__store_get_fn fn, void *arg)
{
    struct op *o = op_new(E(s), key, arg);
    if (!o)
        return -ENOMEM;
    o->fn.get = fn;
    int rc = ask(o, mw__etcd_read, "/v3/kv/range", body("key", o->key, NULL, NULL, NULL, NULL),
                 on_get);
    if (rc < 0)
        op_free(o);
    return rc;
}

/* ------------------------------------------------------------------------
 * scan: the prefix's range, a page per request
 * ------------------------------------------------------------------------ */

struct scan {
    struct mw__etcd *st;
    mw__store_scan_fn fn;
    void *arg;
    char *from;                        /* base64; a stranger's key may be long */
    char end[B64_LEN(MW__STORE_KEY_MAX + 1)];
    int limit;                         /* PAGE, less after a page over 4 MiB */
    struct mw__gather g;
};

static void scan_finish(struct scan *s, int err, const char *why)
{
    mw__gather_answer(&s->g, s->fn, s->arg, err, why);
    mw__free(s->from);
    mw__free(s);
}

/* One key-value of a page: kept when it could be an entry. */
static int take(struct scan *s, struct json_object *kv)
{
    size_t klen, vlen;
    char *k = mw__json_bytes(kv, "key", MW__STORE_KEY_MAX, &klen);
    char *v = k ? mw__json_bytes(kv, "value", MW__STORE_VALUE_MAX, &vlen) : NULL;
    if (!v) {                          /* not an entry: too long, or no value */
        mw__free(k);
        return 0;
    }
    return mw__gather_take(&s->g, k, klen, v, vlen);
}

static int page_request(struct scan *s);

/* The next page starts just after @last (base64): LAST + "\0". */
static int after(struct scan *s, const char *last)
{
    size_t n = strlen(last);
    char *raw = mw__malloc(n / 4 * 3 + 4), *from = mw__malloc(B64_LEN(n / 4 * 3 + 4));
    long rl = raw && from ? mw__b64_decode(last, raw) : -ENOMEM;
    if (rl >= 0) {
        raw[rl] = 0;
        mw__b64_encode(raw, (size_t)rl + 1, from);
        mw__free(s->from);
        s->from = from;
        from = NULL;
    }
    mw__free(raw);
    mw__free(from);
    return rl == -ENOMEM ? -ENOMEM : rl < 0 ? -EPROTO : 0;
}

/* A page of one entry was over 4 MiB: its key alone, to go past it. */
static void on_key_only(void *arg, int err, const char *why, struct json_object *res)
{
    struct scan *s = arg;
    struct json_object *kv = err ? NULL : first_kv(res);
    const char *k = kv ? mw__json_str(kv, "key") : NULL;
    if (err)
        return scan_finish(s, err, why);
    if (!k)                            /* gone meanwhile */
        return scan_finish(s, 0, NULL);
    if ((err = after(s, k)) < 0)
        return scan_finish(s, err, "the store's list held a malformed key");
    s->limit = PAGE;
    if (page_request(s) < 0)
        scan_finish(s, -ENOMEM, "out of memory");
}

/* A page over 4 MiB (values no entry has): the same page, smaller, down
 * to one entry, which is then passed over. */
static void page_too_long(struct scan *s)
{
    size_t cap = strlen(s->from) + sizeof s->end + 96;
    char *b = mw__malloc(cap);
    int rc = b ? 0 : -ENOMEM;
    if (!rc && s->limit > 1) {
        s->limit = s->limit / 8 > 1 ? s->limit / 8 : 1;
        rc = page_request(s);
    } else if (!rc) {
        snprintf(b, cap, "{\"key\":\"%s\",\"range_end\":\"%s\",\"limit\":1,"
                 "\"keys_only\":true}", s->from, s->end);
        rc = mw__etcd_request(s->st, "/v3/kv/range", b, on_key_only, s);
    }
    mw__free(b);
    if (rc < 0)
        scan_finish(s, -ENOMEM, "out of memory");
}

static void on_page(void *arg, int err, const char *why, struct json_object *res)
{
    struct scan *s = arg;
    if (err == -EMSGSIZE)
        return page_too_long(s);
    if (err)
        return scan_finish(s, err, why);
    struct json_object *kvs = mw__json_obj(res, "kvs");
    size_t n = kvs && json_object_is_type(kvs, json_type_array) ? json_object_array_length(kvs)
                                                                : 0;
    const char *last = NULL;
    for (size_t i = 0; i < n; i++) {
        struct json_object *kv = json_object_array_get_idx(kvs, i);
        if ((err = take(s, kv)) < 0)
            return scan_finish(s, err, mw__gather_why(err));
        last = mw__json_str(kv, "key");
    }
    struct json_object *more = mw__json_obj(res, "more");
    if (!more || !json_object_get_boolean(more) || !last)
        return scan_finish(s, 0, NULL);
    if ((err = after(s, last)) < 0)
        return scan_finish(s, err, "the store's list held a malformed key");
    s->limit = PAGE;
    if (page_request(s) < 0)
        scan_finish(s, -ENOMEM, "out of memory");
}

static int page_request(struct scan *s)
{
    size_t cap = strlen(s->from) + sizeof s->end + 64;
    char *b = mw__malloc(cap);
    if (!b)
        return -ENOMEM;
    snprintf(b, cap, "{\"key\":\"%s\",\"range_end\":\"%s\",\"limit\":%d}", s->from,
             s->end, s->limit);
    int rc = mw__etcd_request(s->st, "/v3/kv/range", b, on_page, s);
    mw__free(b);
    return rc;
}

static int op_scan(struct mw__store *st, const char *prefix, mw__store_scan_fn fn, void *arg)
{
    size_t n = strlen(prefix);
    struct scan *s = n && n <= MW__STORE_KEY_MAX ? mw__calloc(1, sizeof *s) : NULL;
    if (!s)
        return -ENOMEM;
    *s = (struct scan){.st = E(st), .fn = fn, .arg = arg, .limit = PAGE};
    char end[MW__STORE_KEY_MAX + 1];
    memcpy(end, prefix, n);
    end[n - 1]++;                      /* names are printable: no carry */
    if (!(s->from = mw__malloc(B64_LEN(n)))) {
        mw__free(s);
        return -ENOMEM;
    }
    mw__b64_encode(prefix, n, s->from);
    mw__b64_encode(end, n, s->end);
    int rc = page_request(s);
    if (rc < 0) {
        mw__free(s->from);
        mw__free(s);
    }
    return rc;
}

static void op_close(struct mw__store *s, struct mw__list *finishing);
static void op_reap(struct mw__store *s);
static bool op_up(const struct mw__store *s);

const struct mw__store_ops mw__etcd_ops = {
    .close = op_close, .reap = op_reap, .up = op_up, .put = op_put, .renew = op_renew,
    .del = op_del, .get = op_get, .scan = op_scan,
};

/* Everything goes: links, what waits, the store. */
static void op_reap(struct mw__store *s)
{
    struct mw__etcd *st = E(s);
    st->closing = true;
    mw__list_del(&st->base.finishing);
    mw__etcd_requests_cancel(st, false);
    mw__etcd_link_close(&st->req);
    mw__etcd_link_close(&st->ev);
    while (!mw__list_empty(&st->leases))
        lease_drop(mw__list_first(&st->leases, struct lease, link));
    if (st->reap_ev)
        event_free(st->reap_ev);
    mw__free(st->prefix);
    mw__free(st);
}

/* The revokes just asked still go out, on the request link kept open
 * until they are answered (or time out); then the store frees itself. */
static void op_close(struct mw__store *s, struct mw__list *finishing)
{
    struct mw__etcd *st = E(s);
    st->closing = true;
    mw__etcd_link_close(&st->ev);
    if (!st->reap_ev || !mw__etcd_requests_cancel(st, true)) {
        op_reap(s);
        return;
    }
    mw__list_add_tail(finishing, &st->base.finishing);
}

void mw__etcd_reap_now(struct mw__etcd *st)
{
    op_reap(&st->base);
}

static bool op_up(const struct mw__store *s)
{
    return mw__container_of(s, const struct mw__etcd, base)->req.up;
}
