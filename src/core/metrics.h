/* Prometheus's text exposition (format 0.0.4), written by each layer for
 * mw_ctx_metrics(): the core its context's counters, then every layer
 * through its metrics hook (struct mw__layer), lowest slot first.  A
 * family's samples must be contiguous: a layer writes one family at a time
 * over all of its objects. */
#ifndef MW_CORE_METRICS_H
#define MW_CORE_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* What is written, snprintf-like: @len counts everything, @buf holds what
 * fits in @cap (NUL-terminated while @cap > 0). */
struct mw__metrics {
    char *buf;
    size_t cap, len;
};

/* mw__metrics_family() - the HELP and TYPE lines of family @name (its
 * samples follow): @type "counter" or "gauge"; @help one line. */
void mw__metrics_family(struct mw__metrics *m, const char *name, const char *type,
                        const char *help);
/* mw__metrics_sample() - one sample of @name with @labels (as
 * mw__metrics_labels made them, or "" for none). */
void mw__metrics_sample(struct mw__metrics *m, const char *name, const char *labels,
                        uint64_t value);

/* A counter or gauge that is a uint64_t field of a stats struct: tables
 * of these make families from mw_ctx_stats_t, mw_conn_stats_t... */
struct mw__metrics_field {
    const char *name, *type, *help;   /* name without "_total" */
    size_t at;                        /* offsetof in the stats struct */
};
/* mw__metrics_field_family() - @f's HELP and TYPE lines; its full name
 * (counters end in _total) into @name. */
void mw__metrics_field_family(struct mw__metrics *m, const struct mw__metrics_field *f,
                              char name[96]);
/* mw__metrics_field_value() - @f's value in @stats. */
uint64_t mw__metrics_field_value(const struct mw__metrics_field *f, const void *stats);

/* A sample's labels, escaped as the format wants (backslash, double quote,
 * newline): {k="v",...}. */
struct mw__labels {
    char s[512];
    size_t len;
};
void mw__labels_add(struct mw__labels *l, const char *key, const char *value);

#endif
