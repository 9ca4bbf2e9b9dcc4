/* How late a context's loop runs: a 1 ms timer on it, the longest gap seen
 * between two of its ticks (what a turn that stalls the loop costs every
 * other timer and descriptor), and the most CPU the loop's thread used
 * between two ticks (its own work: a gap without it is the thread waiting
 * for a CPU others hold, or blocked).
 *
 * A gap counts without the time the loop's thread sat ready to run while
 * other processes held the CPUs (the kernel's run-queue delay for it,
 * /proc/thread-self/schedstat): a stall is the loop's own work or its
 * blocking, which a host busy with other work does not excuse and does
 * not fake (a test VM and two sanitizer builds on two cores held a ready
 * loop back 1 s).  worst_wall_ms keeps the gap as the clock saw it. */
#ifndef MW_TEST_LATENESS_H
#define MW_TEST_LATENESS_H

#include "meshwire.h"

struct lateness {
    struct event *ev;
    int schedstat_fd;             /* the loop thread's (-1: none, no delay known) */
    double last_s, last_cpu_s, last_wait_s;
    double worst_ms;              /* the longest gap between ticks, less waits for a CPU */
    double worst_wall_ms;         /* the longest gap between ticks, as the clock saw it */
    double worst_cpu_ms;          /* the most CPU time between ticks */
    double cpu_bound_ms;          /* set by the caller (0: none)... */
    int cpu_over;                 /* ...and the gaps whose CPU time passed it */
};

/* lateness_start() - tick on @ctx's loop from now.  Return 0 or -1. */
int lateness_start(mw_ctx_t *ctx, struct lateness *t);
void lateness_stop(struct lateness *t);

/* lateness_bound_ms() - the gap a test may allow where @ms is the aim: 5x
 * under a sanitizer, 300 ms under valgrind (everything ~30x slower).  The
 * aim itself is held by the plain build. */
double lateness_bound_ms(double ms);

/* lateness_slowdown() - how much slower than the plain build this process
 * runs: 30 under valgrind, 5 under a sanitizer, else 1 (for deadlines that
 * must hold however the build was made). */
double lateness_slowdown(void);

#endif
