/* The connections layer's local addresses, for the layers above it (the
 * directory publishes them for a listener on "*"): a narrow door, without
 * cm.h and the rdma_cm types behind it.  Internal (mw__ names). */
#ifndef MW_CM_ADDRS_H
#define MW_CM_ADDRS_H

#include <stddef.h>

#include "meshwire.h"

struct mw__nic;               /* cm/nic.h */

/**
 * mw__cm_local_addrs() - the local addresses peers reach @ctx's listeners
 * by: RDMA-backed ones, as mw__nic_list() gives them (kept until an
 * address or a device changes), or where listeners take TCP (no RDMA
 * here, or MW_TRANSPORT=tcp) the host's IP addresses (mw__nic_list_ip).
 * @nics, @n: receive the list, owned by the layer and valid until the
 *            loop next runs; @n may be 0.
 * Loop thread only.
 * Return: 0, or a negative errno (RDMA asked for and not here).
 */
int mw__cm_local_addrs(mw_ctx_t *ctx, const struct mw__nic **nics, size_t *n);

#endif
