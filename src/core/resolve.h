/* Names looked up off the loop.  getaddrinfo() blocks for as long as the
 * resolver takes (seconds, or for good, in a DNS outage), and the loop
 * carries every transfer of the context: so a name is looked up on a
 * thread of its own, and its answer comes back through the loop (an
 * eventfd the context watches, so mw_ctx_fd() wakes for it too).  A
 * literal address is answered at once, with no thread.
 *
 * Whoever asked may give up at any time (its own deadline): the thread is
 * then left to finish alone and frees what it holds; nothing it does
 * touches the context afterwards.  At most 8 lookups run at once in a
 * process (a resolver that hangs would otherwise gather threads): beyond,
 * a start fails -EAGAIN and the asker tries again later.  Internal (mw__
 * names). */
#ifndef MW_CORE_RESOLVE_H
#define MW_CORE_RESOLVE_H

#include <netdb.h>

#include "meshwire.h"

struct mw__lookup;

/* The answer: @err 0 and @numeric, the first address as a literal
 * ("10.0.0.1", "fe80::1"), or a negative errno and @why.  Runs on the loop
 * thread, after which the lookup is gone. */
typedef void (*mw__lookup_fn)(void *arg, int err, const char *numeric, const char *why);

/* mw__lookup_start() - look @host up; @done runs later (never from inside
 * this call, even for a literal), unless mw__lookup_cancel() comes first.
 * Return: 0 with *@out, -EAGAIN (8 lookups running), or -ENOMEM / the
 * error of starting the thread. */
int mw__lookup_start(mw_ctx_t *ctx, const char *host, mw__lookup_fn done, void *arg,
                     struct mw__lookup **out);

/* mw__lookup_cancel() - @done will not run; a thread still in
 * getaddrinfo() finishes alone.  On the loop thread. */
void mw__lookup_cancel(struct mw__lookup *l);

/* For tests: the getaddrinfo() lookups call (a hook can hang), and how
 * many lookup threads are still running. */
extern int (*mw__getaddrinfo)(const char *host, const char *service,
                              const struct addrinfo *hints, struct addrinfo **res);
int mw__lookups_running(void);

#endif
