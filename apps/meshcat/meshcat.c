/* meshcat: netcat-style file transfer over RDMA (see cli.h for usage,
 * proto.h for the wire protocol).  Uses only the public meshwire API. */
#include <stdio.h>

#include "meshcat.h"

int main(int argc, char **argv)
{
    struct mc_args a;
    char err[512];
    switch (mc_parse_args(argc, argv, &a, err, sizeof err)) {
    case MC_PARSE_HELP:
        mc_usage(stdout);
        return MC_EXIT_OK;
    case MC_PARSE_VERSION:
        mc_version(stdout);
        return MC_EXIT_OK;
    case MC_PARSE_USAGE:
        fprintf(stderr, "meshcat: %s\nTry 'meshcat --help'.\n", err);
        return MC_EXIT_USAGE;
    default:
        break;
    }
    return a.mode == MC_RECV ? mc_recv_main(&a) : mc_send_main(&a);
}
