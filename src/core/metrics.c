/* mw_ctx_metrics(): the context's counters in Prometheus's text format,
 * then each layer's (see metrics.h). */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/ctx.h"
#include "core/metrics.h"

static void put(struct mw__metrics *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct mw__metrics *m, const char *fmt, ...)
{
    size_t room = m->len < m->cap ? m->cap - m->len : 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(room ? m->buf + m->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        m->len += (size_t)n;
}

void mw__metrics_family(struct mw__metrics *m, const char *name, const char *type,
                        const char *help)
{
    put(m, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void mw__metrics_sample(struct mw__metrics *m, const char *name, const char *labels,
                        uint64_t value)
{
    put(m, "%s%s%s%s %llu\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "",
        (unsigned long long)value);
}

void mw__labels_add(struct mw__labels *l, const char *key, const char *value)
{
    size_t cap = sizeof l->s;
    int n = snprintf(l->s + l->len, cap - l->len, "%s%s=\"", l->len ? "," : "", key);
    size_t at = l->len + (n > 0 ? (size_t)n : cap);
    for (const char *p = value; at < cap && *p; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        size_t k = esc ? 2 : 1;
        if (at + k + 2 > cap) {
            at = cap;
            break;
        }
        memcpy(l->s + at, esc ? esc : p, k);
        at += k;
    }
    if (at + 2 > cap) {           /* no room: the label is left out whole */
        l->s[l->len] = '\0';
        return;
    }
    l->s[at++] = '"';
    l->s[at] = '\0';
    l->len = at;
}

void mw__metrics_field_family(struct mw__metrics *m, const struct mw__metrics_field *f,
                              char name[96])
{
    snprintf(name, 96, "%s%s", f->name, f->type[0] == 'c' ? "_total" : "");
    mw__metrics_family(m, name, f->type, f->help);
}

uint64_t mw__metrics_field_value(const struct mw__metrics_field *f, const void *stats)
{
    uint64_t v;
    memcpy(&v, (const char *)stats + f->at, sizeof v);
    return v;
}

/* The context's own counters: name, help, and where each is. */
#define CTX(field, kind, help) {"meshwire_" #field, kind, help, offsetof(mw_ctx_stats_t, field)}
static const struct mw__metrics_field ctx_counters[] = {
    CTX(events, "counter", "Completion-channel wake-ups handled."),
    CTX(polls, "counter", "ibv_poll_cq calls."),
    CTX(completions, "counter", "Work completions reaped."),
    CTX(completion_errors, "counter", "Work completions that failed (not flushes)."),
    CTX(stray_completions, "counter", "Completions of operations already released."),
    CTX(registrations, "counter", "ibv_reg_mr calls."),
    CTX(deregistrations, "counter", "ibv_dereg_mr calls."),
    CTX(reg_cache_hits, "counter", "mw_reg calls served by an existing registration."),
    CTX(futures_created, "counter", "Futures created."),
    CTX(futures_live, "gauge", "Futures allocated and not yet released."),
    CTX(protocol_errors, "counter", "Connections failed for what a peer sent."),
    CTX(devices, "counter", "RDMA devices opened."),
    CTX(flushes, "counter", "Completions that are flushes of work never executed."),
    CTX(local_connections, "counter", "Connections established on the same-host path."),
};
#undef CTX

long mw_ctx_metrics(mw_ctx_t *ctx, char *buf, size_t cap)
{
    if (!ctx || (!buf && cap))
        return -EINVAL;
    struct mw__metrics m = {buf, cap, 0};
    if (cap)
        buf[0] = '\0';
    mw_ctx_stats_t st;
    mw_ctx_stats(ctx, &st);
    for (size_t i = 0; i < sizeof ctx_counters / sizeof ctx_counters[0]; i++) {
        char name[96];
        mw__metrics_field_family(&m, &ctx_counters[i], name);
        mw__metrics_sample(&m, name, "", mw__metrics_field_value(&ctx_counters[i], &st));
    }
    for (int s = 0; s < MW__LAYERS; s++)
        if (ctx->layers[s].metrics)
            ctx->layers[s].metrics(ctx, ctx->layers[s].state, &m);
    return m.len > (size_t)LONG_MAX ? -EOVERFLOW : (long)m.len;
}
