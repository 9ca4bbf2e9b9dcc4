/* meshcat: progress line, transfer rate and ETA, end-of-transfer summary. */
#include "progress.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAR_MAX 20 /* cells: a fixed bar keeps the line from jittering */
#define BAR_MIN 10 /* below this a bar says nothing the percentage doesn't */
#define LINE_MAX 160

/* Copy @s into @out, truncating to @cap - 1; returns what was written. */
static size_t put(char *out, size_t cap, const char *s)
{
    if (!out || cap == 0)
        return 0;
    size_t n = strlen(s);

    if (n >= cap)
        n = cap - 1;
    memcpy(out, s, n);
    out[n] = '\0';
    return n;
}

/* ------------------------------------------------------------------------
 * Units
 * ------------------------------------------------------------------------ */

void mc_fmt_bytes(uint64_t bytes, char *out, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    char tmp[32];

    if (bytes < 1024) {
        snprintf(tmp, sizeof tmp, "%" PRIu64 " B", bytes);
        put(out, cap, tmp);
        return;
    }
    int u = 1;
    double v = (double)bytes / 1024.0;

    while (u < 6 && v >= 1024.0) {
        v /= 1024.0;
        u++;
    }
    /* Ask printf itself whether its rounding reaches 1024: "1024.0 KiB"
     * should read "1.0 MiB". */
    snprintf(tmp, sizeof tmp, "%.*f", u >= 3 ? 2 : 1, v);
    if (u < 6 && strtod(tmp, NULL) >= 1024.0) {
        v /= 1024.0;
        u++;
    }
    snprintf(tmp, sizeof tmp, "%.*f %s", u >= 3 ? 2 : 1, v, units[u]);
    put(out, cap, tmp);
}

void mc_fmt_duration(double s, char *out, size_t cap)
{
    char tmp[48];

    /* !(s >= 0) also catches NaN; the bound keeps the cast defined. */
    if (!(s >= 0) || s >= 9.2e18) {
        put(out, cap, "--:--");
        return;
    }
    uint64_t t = (uint64_t)(s + 0.5);
    uint64_t h = t / 3600;
    unsigned m = (unsigned)(t / 60 % 60), sec = (unsigned)(t % 60);

    if (h)
        snprintf(tmp, sizeof tmp, "%" PRIu64 ":%02u:%02u", h, m, sec);
    else
        snprintf(tmp, sizeof tmp, "%u:%02u", m, sec);
    put(out, cap, tmp);
}

/* ------------------------------------------------------------------------
 * Rate
 * ------------------------------------------------------------------------ */

void mc_rate_init(struct mc_rate *r, double now)
{
    r->t0 = now;
    r->last_t = now;
    r->ewma = 0;
    r->last_bytes = 0;
    r->primed = false;
}

void mc_rate_update(struct mc_rate *r, double now, uint64_t bytes_total)
{
    double dt = now - r->last_t;

    /* dt <= 0 would divide by zero (or go backwards); keeping last_t and
     * last_bytes lets the next real interval account for these bytes. */
    if (!(dt > 0) || !isfinite(dt) || bytes_total < r->last_bytes)
        return;
    if (!r->primed) {
        double since = now - r->t0;

        r->ewma = (double)bytes_total / since;
        r->primed = since >= MC_RATE_TAU_S;
    } else {
        double inst = (double)(bytes_total - r->last_bytes) / dt;
        /* The RC low-pass weight: ~1 - exp(-dt/tau), in (0, 1) for any dt,
         * and no libm needed. */
        double alpha = dt / (MC_RATE_TAU_S + dt);

        r->ewma += alpha * (inst - r->ewma);
    }
    r->last_t = now;
    r->last_bytes = bytes_total;
}

double mc_rate_get(const struct mc_rate *r)
{
    return r->ewma;
}

/* ------------------------------------------------------------------------
 * Progress line
 * ------------------------------------------------------------------------ */

/* The pieces of a line, each formatted once. */
struct pieces {
    char pct[8];        /* " 45%" */
    char done[MC_BYTES_LEN];
    char sizes[2 * MC_BYTES_LEN + 4];
    char rate[MC_BYTES_LEN + 2];
    char eta[40];       /* "ETA 0:03" */
    double frac;
};

static void fmt_rate(double rate, char *out, size_t cap)
{
    char b[MC_BYTES_LEN];
    uint64_t r = 0;

    if (isfinite(rate) && rate > 0)
        r = rate >= 1.8e19 ? UINT64_MAX : (uint64_t)rate;
    mc_fmt_bytes(r, b, sizeof b);
    snprintf(out, cap, "%s/s", b);
}

static void make_pieces(struct pieces *p, uint64_t done, uint64_t total, double rate)
{
    char tot[MC_BYTES_LEN], d[32];

    mc_fmt_bytes(done, p->done, sizeof p->done);
    mc_fmt_bytes(total, tot, sizeof tot);
    snprintf(p->sizes, sizeof p->sizes, "%s / %s", p->done, tot);
    fmt_rate(rate, p->rate, sizeof p->rate);
    p->frac = total == 0 || done >= total ? 1.0 : (double)done / (double)total;
    int pct = (int)(p->frac * 100.0);

    if (done < total && pct == 100)
        pct = 99;   /* 100% only when it is really all there */
    snprintf(p->pct, sizeof p->pct, "%3d%%", pct);
    if (done >= total)
        mc_fmt_duration(0, d, sizeof d);
    else if (isfinite(rate) && rate > 0)
        mc_fmt_duration((double)(total - done) / rate, d, sizeof d);
    else
        mc_fmt_duration(-1, d, sizeof d);
    snprintf(p->eta, sizeof p->eta, "ETA %s", d);
}

/* "[########>           ] " with @cells inside the brackets. */
static void make_bar(char *out, double frac, int cells)
{
    int full = (int)(frac * cells);

    out[0] = '[';
    for (int i = 0; i < cells; i++)
        out[1 + i] = i < full ? '#' : ' ';
    if (full > 0 && full < cells)
        out[full] = '>';    /* the head sits on the last filled cell */
    out[1 + cells] = ']';
    out[2 + cells] = ' ';
    out[3 + cells] = '\0';
}

#define NCAND 6

/* The forms of a line with a known total, widest first. */
static int known_forms(char cand[][LINE_MAX], const struct pieces *p, int width)
{
    char bar[BAR_MAX + 4], text[LINE_MAX - sizeof bar];
    int n = 0;

    snprintf(text, sizeof text, "%s  %s  %s  %s", p->pct, p->sizes, p->rate, p->eta);
    int cells = width - 3 - (int)strlen(text);

    if (cells >= BAR_MIN) {
        make_bar(bar, p->frac, cells > BAR_MAX ? BAR_MAX : cells);
        snprintf(cand[n++], LINE_MAX, "%s%s", bar, text);
    }
    snprintf(cand[n++], LINE_MAX, "%s", text);
    snprintf(cand[n++], LINE_MAX, "%s  %s  %s", p->pct, p->sizes, p->eta);
    snprintf(cand[n++], LINE_MAX, "%s  %s", p->pct, p->eta);
    snprintf(cand[n++], LINE_MAX, "%s", p->pct);
    /* The padding is for alignment; drop it rather than the number. */
    snprintf(cand[n++], LINE_MAX, "%s", p->pct + strspn(p->pct, " "));
    return n;
}

static int unknown_forms(char cand[][LINE_MAX], const struct pieces *p)
{
    snprintf(cand[0], LINE_MAX, "%s  %s", p->done, p->rate);
    snprintf(cand[1], LINE_MAX, "%s", p->done);
    return 2;
}

size_t mc_progress_line(char *out, size_t cap, uint64_t done, uint64_t total, double rate,
                        int width)
{
    char cand[NCAND][LINE_MAX];
    struct pieces p;

    put(out, cap, "");
    if (!out || cap == 0 || width <= 0)
        return 0;
    make_pieces(&p, done, total, rate);
    int n = total ? known_forms(cand, &p, width) : unknown_forms(cand, &p);

    for (int i = 0; i < n; i++)
        if (strlen(cand[i]) <= (size_t)width)
            return put(out, cap, cand[i]);
    return 0;
}

/* ------------------------------------------------------------------------
 * Summary
 * ------------------------------------------------------------------------ */

static bool given(const char *s)
{
    return s && s[0];
}

size_t mc_summary_line(char *out, size_t cap, uint64_t bytes, double seconds,
                       const char *local_nic, const char *remote)
{
    char rate[32] = "-", where[600] = "", line[800];
    bool timed = isfinite(seconds) && seconds > 0;

    if (timed) {
        double mbs = (double)bytes / seconds / 1e6;

        /* %.1f of an absurd rate (a clock glitch) would be 300 digits. */
        snprintf(rate, sizeof rate, mbs < 1e12 ? "%.1f" : "%.3g", mbs);
    }
    if (given(local_nic) && given(remote))
        snprintf(where, sizeof where, " (local %.256s -> remote %.256s)", local_nic, remote);
    else if (given(local_nic))
        snprintf(where, sizeof where, " (local %.256s)", local_nic);
    else if (given(remote))
        snprintf(where, sizeof where, " (remote %.256s)", remote);
    snprintf(line, sizeof line, "%" PRIu64 " bytes in %.2f s, %s MB/s%s", bytes,
             timed ? seconds : 0.0, rate, where);
    return put(out, cap, line);
}
