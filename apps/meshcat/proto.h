/* meshcat's wire protocol, between a sender and each hop of its chain.
 *
 * Control travels as meshwire messages (one struct mc_msg each); file data
 * as RDMA WRITE WITH IMMEDIATE into the receiver's ring of `window` slots of
 * `chunk` bytes: chunk n of a transfer goes to slot n % window and its
 * immediate is its length.  The receiver returns a CREDIT for every slot it
 * has emptied (written to disk and, on a relay, passed on), so at most
 * `window` chunks are ever in flight.
 *
 *   sender                                  receiver (relays pass it all on)
 *   HELLO chunk, window, later hops  ->
 *                                    <-     READY ring (after its own next hop is ready)
 *   per file:  FILE name, size       ->
 *                                    <-     FILE_OK (or ERROR)
 *              chunks ...            ->     <- CREDIT ...
 *              END chunks, bytes, checksum ->
 *                                    <-     DONE (verified and renamed, on every hop)
 *   BYE                              ->     (the receiver closes)
 *
 * Any side may send ERROR instead, with a message; the transfer is then over.
 * Both ends are assumed to share byte order (as on all RDMA hosts in use). */
#ifndef MESHCAT_PROTO_H
#define MESHCAT_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meshwire.h"

#define MC_MAGIC 0x5441434du      /* "MCAT" */
#define MC_PROTO_VERSION 2
#define MC_TEXT_MAX 1024
#define MC_SIZE_UNKNOWN UINT64_MAX

enum mc_type {
    MC_HELLO = 1, MC_READY, MC_FILE, MC_FILE_OK, MC_END, MC_DONE, MC_CREDIT, MC_BYE, MC_ERROR,
    MC_TYPE_END
};

struct mc_msg {
    uint32_t magic;
    uint16_t version, type;
    uint64_t a, b;                /* HELLO: chunk, window; FILE: size, mode;
                                     END: chunks, bytes; CREDIT: slots freed */
    mw_remote_t ring;             /* READY */
    uint8_t sum[16];              /* END: XXH3-128 of the file */
    char text[MC_TEXT_MAX];       /* HELLO: later hops "h:p,h:p"; FILE: name;
                                     READY: the receiver's NIC; ERROR: why */
};

/* mc_send() - send a copy of @m (magic and version filled in); the future is
 * dropped: a failed send fails the connection, which its reader notices. */
void mc_send(mw_conn_t *c, const struct mc_msg *m);
/* mc_send_simple() - the same for a message of @type with a, b and text. */
void mc_send_simple(mw_conn_t *c, enum mc_type type, uint64_t a, uint64_t b, const char *text);

/* mc_msg_check() - @m as struct mc_msg if it is a well-formed one, else NULL
 * with *@why set. */
const struct mc_msg *mc_msg_check(const mw_msg_t *m, const char **why);

const char *mc_type_name(int type);

#endif
