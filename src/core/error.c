/* Error names and the library version. */
#include <errno.h>
#include <string.h>

#include "meshwire.h"

const char *mw_version(void)
{
    return MW_VERSION;
}

const char *mw_strerror(int err)
{
    if (err < 0)
        err = -err;
    if (err == 0)
        return "success";
    /* Handles that outlived their object (core/handle.h). */
    if (err == ESTALE)
        return "stale handle: what it named was released, closed or freed";
    /* strerror() is not thread-safe in general; strerrordesc_np (glibc
     * >= 2.32) returns a static string for every errno. */
    const char *s = strerrordesc_np(err);
    return s ? s : "unknown error";
}
