/* The connections' families for mw_ctx_metrics() (core/metrics.h): how
 * many are up, by path, and each established one's counters, labelled by
 * its addresses, device and path. */
#include <stddef.h>
#include <stdio.h>

#include "cm/cm.h"
#include "core/metrics.h"

#define CONN(field, kind, help) {"meshwire_conn_" #field, kind, help, offsetof(mw_conn_stats_t, field)}
static const struct mw__metrics_field conn_counters[] = {
    CONN(msgs_sent, "counter", "Messages sent on the connection."),
    CONN(msgs_received, "counter", "Messages received on the connection."),
    CONN(bytes_sent, "counter", "Message bytes sent."),
    CONN(bytes_received, "counter", "Message bytes received."),
    CONN(writes, "counter", "One-sided writes completed."),
    CONN(reads, "counter", "One-sided reads completed."),
    CONN(imms_received, "counter", "Immediates received."),
    CONN(rdma_bytes, "counter", "Bytes moved by one-sided operations."),
    CONN(credit_waits, "counter", "Times a send waited for the peer's credits."),
    CONN(inbox_bytes, "gauge", "Received message bytes not yet asked for."),
};
#undef CONN

static bool up(const struct mw__conn *c)
{
    return c->state == MW__CONN_ESTABLISHED || c->state == MW__CONN_CLOSING;
}

/* The paths, by mw_transport_t, as the "path" label says them. */
static const char *const paths[] = {
    [MW_TRANSPORT_RDMA] = "rdma", [MW_TRANSPORT_LOCAL] = "local", [MW_TRANSPORT_TCP] = "tcp"};

static const char *path_of(const struct mw__conn *c)
{
    return paths[c->stats.transport];
}

static void labels_of(const struct mw__conn *c, struct mw__labels *l)
{
    l->len = 0;
    l->s[0] = '\0';
    mw__labels_add(l, "local", c->stats.local);
    mw__labels_add(l, "remote", c->stats.remote);
    mw__labels_add(l, "device", c->stats.device);
    mw__labels_add(l, "path", path_of(c));
}

static void connections_up(struct mw__cm *cm, struct mw__metrics *m)
{
    uint64_t n[sizeof paths / sizeof *paths] = {0};
    struct mw__conn *c;
    mw__list_for_each(c, &cm->conns, link)
        if (up(c))
            n[c->stats.transport]++;
    mw__metrics_family(m, "meshwire_connections", "gauge", "Connections established, by path.");
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        char label[32];
        if (!paths[i])
            continue;
        snprintf(label, sizeof label, "path=\"%s\"", paths[i]);
        mw__metrics_sample(m, "meshwire_connections", label, n[i]);
    }
}

void mw__cm_metrics(mw_ctx_t *ctx, void *state, struct mw__metrics *m)
{
    (void)ctx;
    struct mw__cm *cm = state;
    connections_up(cm, m);
    for (size_t i = 0; i < sizeof conn_counters / sizeof conn_counters[0]; i++) {
        char name[96];
        mw__metrics_field_family(m, &conn_counters[i], name);
        struct mw__conn *c;
        mw__list_for_each(c, &cm->conns, link) {
            if (!up(c))
                continue;
            struct mw__labels l;
            labels_of(c, &l);
            mw__metrics_sample(m, name, l.s, mw__metrics_field_value(&conn_counters[i], &c->stats));
        }
    }
}
