/* meshcat's two sides (send.c, recv.c), each a whole run from parsed
 * arguments to an exit status. */
#ifndef MESHCAT_H
#define MESHCAT_H

#include "cli.h"
#include "session.h"

int mc_send_main(const struct mc_args *a);
int mc_recv_main(const struct mc_args *a);

#endif
