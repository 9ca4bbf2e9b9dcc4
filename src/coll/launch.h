/* Rank, world size and peer list from a launcher's environment (launch.c). */
#ifndef MW_COLL_LAUNCH_H
#define MW_COLL_LAUNCH_H

#include <stddef.h>

#include "meshwire.h"

struct mw__launch {
    int rank, nranks;
    char **peers;                 /* nranks entries "ADDR[,ADDR...]:PORT" */
};

/* mw__peer_list_parse() - entries separated by blanks, ';' or newlines, '#'
 * to the end of a line a comment; "slots=N" after an entry repeats it to N
 * ranks.  Entries without a port get @base_port plus the number of earlier
 * entries with the same addresses.  0, or a negative errno and *@why. */
int mw__peer_list_parse(const char *text, unsigned base_port, char ***peers, int *n, char *why,
                        size_t cap);
void mw__peer_list_free(char **peers, int n);

/* mw__launch_from_env() - as mw_comm_create_env documents; the caller frees
 * out->peers with mw__peer_list_free. */
int mw__launch_from_env(unsigned default_port, struct mw__launch *out, char *why, size_t cap);

#endif
