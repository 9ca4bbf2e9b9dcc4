/* Test-side plumbing for the rxe suite: skip without devices, and a
 * connected RC queue-pair pair between two local addresses, built with
 * blocking rdma_cm calls (the library's own cm layer is not under test here;
 * the QPs use the context's PDs and CQs). */
#ifndef MW_TEST_RXE_UTIL_H
#define MW_TEST_RXE_UTIL_H

#include <rdma/rdma_cma.h>

#include "core/cq.h"
#include "core/dev.h"

#define SKIP_EXIT 77

/* rxe_require() - exit 77 (skip) unless an RDMA device exists and
 * MW_ADDRS names at least @n addresses; fills @addrs (static strings). */
void rxe_require(int n, const char **addrs);

struct qp_pair {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *listen, *client, *server;
    struct mw__dev *cdev, *sdev;    /* the devices each end resolved to */
};

/* qp_pair_connect() - an RC QP from @src to @dst (IPv4 strings), each end
 * created on its device's PD and CQ through mw__dev_get(); @depth send and
 * receive slots each.  Return 0 or a negative errno. */
int qp_pair_connect(mw_ctx_t *ctx, const char *src, const char *dst, int depth,
                    struct qp_pair *p);
void qp_pair_close(struct qp_pair *p);

/* loop_for() - run @ctx's loop for @ms milliseconds (a future that can only
 * time out). */
void loop_for(mw_ctx_t *ctx, unsigned ms);

/* cpu_seconds() - user + system CPU time of this process so far. */
double cpu_seconds(void);

#endif
