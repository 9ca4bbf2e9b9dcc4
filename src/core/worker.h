/* A helper thread for work that would stall the loop: opening a device,
 * registering or deregistering large memory (ibv_reg_mr pins and maps
 * every page, about a second per GiB on soft-RoCE).  Jobs run in submission order on the
 * helper, which sleeps on a condition variable when it has none: nothing
 * spins.  Their completion comes back through the loop (an eventfd the
 * context watches), where done() runs.  The helper starts on first use. */
#ifndef MW_CORE_WORKER_H
#define MW_CORE_WORKER_H

#include "core/ctx.h"

struct mw__job {
    /* on the helper thread: may use only the job's own data and verbs
     * calls, never the context */
    void (*work)(struct mw__job *j);
    /* on the loop thread once work() returned; owns the job from then */
    void (*done)(struct mw__job *j);
    struct mw__job *next;
};

/* mw__worker_submit() - run @j.  Return 0, or -ENOMEM / the error of
 * starting the helper (then nothing runs; the caller may do it inline). */
int mw__worker_submit(mw_ctx_t *ctx, struct mw__job *j);

/* mw__worker_flush() - wait for every job submitted, and run their done():
 * before a device goes, so no job still uses its protection domain. */
void mw__worker_flush(mw_ctx_t *ctx);

/* mw__worker_free() - at teardown: the helper finishes the jobs it has and
 * stops; every done() runs before this returns. */
void mw__worker_free(mw_ctx_t *ctx);

#endif
