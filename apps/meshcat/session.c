/* The context, progress line, user messages, signals and checksums that
 * the sender and the receiver share. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "session.h"

#define TICK_MS 250

double mc_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

void mc_conn_opts(const struct mc_args *a, mw_conn_opts_t *o)
{
    mw_conn_opts_init(o);
    o->timeout_ms = (unsigned)(a->timeout_s * 1000);
    if (a->ack_timeout_us >= 0)
        o->ack_timeout_us = a->ack_timeout_us ? (unsigned)a->ack_timeout_us : MW_ACK_TIMEOUT_PATH;
}

static int term_width(void)
{
    struct winsize w;
    return ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0 ? w.ws_col : 80;
}

static void clear_line(struct mc_session *s)
{
    if (s->shown)
        fputs("\r\033[K", stderr);
    s->shown = false;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mc_session *s = arg;
    char line[512];
    mc_rate_update(&s->rate, mc_now(), s->done);
    mc_progress_line(line, sizeof line, s->done, s->total, mc_rate_get(&s->rate),
                     term_width() - 1);
    fprintf(stderr, "\r%s\033[K", line);
    fflush(stderr);
    s->shown = true;
}

void mc_progress_done(struct mc_session *s)
{
    if (s->tick)
        event_del(s->tick);
    if (s->shown) {
        on_tick(-1, 0, s);
        fputc('\n', stderr);
        s->shown = false;
    }
}

void mc_summary(struct mc_session *s, mw_conn_t *c, char *line, size_t cap)
{
    mw_conn_stats_t st;
    mw_conn_stats(c, &st);
    char nic[200];
    snprintf(nic, sizeof nic, "%s %s", st.device, st.local);
    mc_summary_line(line, cap, s->done, mc_now() - s->t0, nic, st.remote);
}

void mc_say(struct mc_session *s, int level, const char *fmt, ...)
{
    if (level > s->a->verbose && !(level == 0 && s->a->verbose >= 0))
        return;
    clear_line(s);
    va_list ap;
    va_start(ap, fmt);
    fputs("meshcat: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    struct mc_session *s = arg;
    s->interrupted = (int)sig;
    mc_kick(&s->k);
}

static int open_dir(struct mc_session *s)
{
    mw_dir_opts_t o;
    mw_dir_opts_init(&o);
    o.timeout_ms = (unsigned)(s->a->timeout_s * 1000);
    mw_future_t *f = mw_dir_open(s->ctx, s->a->dir, &o);
    if (!f || mw_wait(f)) {
        mc_say(s, -1, "directory %s: %s", s->a->dir, f ? mw_future_message(f) : "out of memory");
        mw_future_unref(f);
        return -1;
    }
    s->dir = mw_future_value(f);
    mw_future_unref(f);
    return 0;
}

int mc_session_init(struct mc_session *s, const struct mc_args *a, void (*react)(void *),
                    void *arg)
{
    *s = (struct mc_session){.a = a};
    signal(SIGPIPE, SIG_IGN);    /* a closed stdout is an EPIPE, reported */
    if (!(s->base = event_base_new()))
        return -1;
    if (mw_ctx_new(&s->ctx, s->base, NULL) < 0)
        return -1;
    s->k = (struct mc_waker){.ctx = s->ctx, .react = react, .arg = arg};
    if (a->dir && open_dir(s) < 0)
        return -1;
    s->sigint = evsignal_new(s->base, SIGINT, on_signal, s);
    s->sigterm = evsignal_new(s->base, SIGTERM, on_signal, s);
    if (!s->sigint || !s->sigterm)
        return -1;
    evsignal_add(s->sigint, NULL);
    evsignal_add(s->sigterm, NULL);
    s->show = a->verbose >= 0 && (a->progress || isatty(STDERR_FILENO));
    s->t0 = mc_now();
    mc_rate_init(&s->rate, s->t0);
    if (s->show) {
        struct timeval tv = {0, TICK_MS * 1000};
        s->tick = event_new(s->base, -1, EV_PERSIST, on_tick, s);
        if (!s->tick)
            return -1;
        event_add(s->tick, &tv);
    }
    return 0;
}

void mc_session_free(struct mc_session *s)
{
    clear_line(s);
    if (s->tick)
        event_free(s->tick);
    if (s->sigint)
        event_free(s->sigint);
    if (s->sigterm)
        event_free(s->sigterm);
    mw_dir_free(s->dir);
    if (s->ctx)
        mw_ctx_free(s->ctx);
    if (s->base)
        event_base_free(s->base);
}

int mc_sum_init(struct mc_sum *h)
{
    h->st = XXH3_createState();
    return h->st && XXH3_128bits_reset(h->st) == XXH_OK ? 0 : -1;
}

void mc_sum_update(struct mc_sum *h, const void *p, size_t n)
{
    XXH3_128bits_update(h->st, p, n);
}

void mc_sum_final(struct mc_sum *h, uint8_t out[MC_SUM_LEN])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(h->st));
    memcpy(out, c.digest, MC_SUM_LEN);
    XXH3_freeState(h->st);
    h->st = NULL;
}

void mc_sum_drop(struct mc_sum *h)
{
    XXH3_freeState(h->st);
    h->st = NULL;
}

void mc_sum_hex(const uint8_t d[MC_SUM_LEN], char out[2 * MC_SUM_LEN + 1])
{
    for (int i = 0; i < MC_SUM_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}
