/* The connections layer's exports off the loop, for the layers above it
 * (the directory exports a publication's shares on every connection it
 * accepts): a narrow door, without cm.h.  Internal (mw__ names). */
#ifndef MW_CM_EXPORT_H
#define MW_CM_EXPORT_H

#include <stddef.h>

#include "meshwire.h"

/**
 * mw__mem_export_async() - mw_mem_export() without stalling the loop: a
 * large range (over 4 MiB) is registered by the context's helper thread
 * (about a second per GiB on soft-RoCE).
 * @done: runs from the loop once, if pending: @err 0 and @r the export
 *        (as mw_mem_export's @out), or an error: -ECANCELED when the
 *        connection let go of its exports first (aborted, failed, freed),
 *        -EFAULT when the memory was released meanwhile.
 * Return: 0 (exported now, *@out set; @done is not called), 1 (pending),
 * or mw_mem_export's errors.
 */
int mw__mem_export_async(mw_conn_t *c, void *addr, size_t len, mw_remote_t *out,
                         void (*done)(void *arg, int err, const mw_remote_t *r), void *arg);

#endif
