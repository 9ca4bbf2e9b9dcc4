/* meshcat: progress line, transfer rate and ETA, end-of-transfer summary.
 *
 * Formatting only: nothing here reads a clock or writes to a terminal.  The
 * caller passes times (seconds, any monotonic origin), adds '\r' and escape
 * codes itself, and decides when to redraw.  No state beyond the caller's
 * struct mc_rate; safe from any thread on distinct objects.
 */
#ifndef MESHCAT_PROGRESS_H
#define MESHCAT_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MC_BYTES_LEN 16   /* mc_fmt_bytes() output, NUL included, always fits */
#define MC_RATE_TAU_S 2.0 /* time constant of the rate average, seconds */

/**
 * mc_fmt_bytes() - a byte count in binary units.
 * @bytes: the count.
 * @out, @cap: receive e.g. "0 B", "1023 B", "1.0 KiB", "300.0 MiB",
 *             "1.50 GiB": one decimal below GiB, two from GiB up (KiB..EiB).
 *             A value that would round to 1024 of a unit moves up one unit.
 *             Fits in MC_BYTES_LEN; truncated (still NUL-terminated) if @cap
 *             is smaller.
 */
void mc_fmt_bytes(uint64_t bytes, char *out, size_t cap);

/**
 * mc_fmt_duration() - seconds as "M:SS" or "H:MM:SS", rounded to the nearest
 * second: "0:07", "12:34", "1:02:03".
 * @s: seconds; negative, NaN, infinite or absurdly large (>= 2^63) gives
 *     "--:--".
 * @out, @cap: receive the text (truncated if @cap is too small).
 */
void mc_fmt_duration(double s, char *out, size_t cap);

/**
 * struct mc_rate - an exponentially weighted transfer rate, bytes/s.
 * During the first MC_RATE_TAU_S seconds it is the plain average since
 * mc_rate_init() (a young EWMA would over-weight the first burst); from then
 * on each update moves it by 1 - exp(-dt / MC_RATE_TAU_S) toward the rate
 * seen since the previous update.  Fields are private to progress.c.
 */
struct mc_rate {
    double t0, last_t, ewma;
    uint64_t last_bytes;
    bool primed;
};

/**
 * mc_rate_init() - start measuring at time @now, with 0 bytes done.
 */
void mc_rate_init(struct mc_rate *r, double now);

/**
 * mc_rate_update() - record that @bytes_total bytes were done by time @now.
 * Call it on a timer as well as on progress, so a stall shows as a falling
 * rate.  An update whose time did not move forward (dt <= 0, NaN) changes
 * nothing: its bytes are counted by the next update that has a real dt.  A
 * @bytes_total below the previous one (a restart) resets the reference point
 * without changing the rate.
 */
void mc_rate_update(struct mc_rate *r, double now, uint64_t bytes_total);

/**
 * mc_rate_get() - the current estimate in bytes/s; 0 before the first
 * update with a positive dt.
 */
double mc_rate_get(const struct mc_rate *r);

/**
 * mc_progress_line() - one line of progress, at most @width columns.
 * @out, @cap: receive the line (ASCII, no '\r', no escape codes); truncated
 *             to @cap - 1 if @cap is the tighter limit.
 * @done:  bytes done so far.
 * @total: bytes expected; 0 = unknown (stdin): no bar, percent or ETA.
 * @rate:  bytes/s (e.g. mc_rate_get()); <= 0 or not finite shows as 0 B/s
 *         with ETA "--:--".
 * @width: columns available.  The widest form that fits is used:
 *   "[########>           ]  45%  135.0 MiB / 300.0 MiB  68.2 MiB/s  ETA 0:03"
 *   then without the bar, without the rate, without the sizes, and finally
 *   only "45%"; an unknown total gives "135.0 MiB  68.2 MiB/s", then
 *   "135.0 MiB".  When nothing fits (width < 3 or so) the line is empty.
 * Return: strlen(@out) (0 when @cap is 0).
 */
size_t mc_progress_line(char *out, size_t cap, uint64_t done, uint64_t total, double rate,
                        int width);

/**
 * mc_summary_line() - the line printed when a transfer ends, e.g.
 *   "314572800 bytes in 4.52 s, 69.6 MB/s (local rxe0 198.19.1.1 -> remote 198.19.1.2:7471)"
 * @bytes:   bytes transferred.
 * @seconds: elapsed time; <= 0 or NaN prints the rate as "-".
 * @local_nic: e.g. "rxe0 198.19.1.1"; NULL or "" leaves out "local ...".
 * @remote:  e.g. "198.19.1.2:7471"; NULL or "" leaves out "remote ...".
 *           With neither, there is no parenthesis at all.
 * The rate is in MB/s, 10^6 bytes per second (the unit of link speeds).
 * Return: strlen(@out) (0 when @cap is 0); truncated to @cap - 1.
 */
size_t mc_summary_line(char *out, size_t cap, uint64_t bytes, double seconds,
                       const char *local_nic, const char *remote);

#endif
