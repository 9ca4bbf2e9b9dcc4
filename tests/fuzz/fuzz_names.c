/* libFuzzer target: meshcat's receiver-side name rule (apps/meshcat/names.c),
 * which turns whatever name a sender announces into one path component.
 * Every accepted result must be safe to create in the target directory. */
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "names.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    char in[4096], out[MC_NAME_MAX + 1], part[MC_NAME_MAX + 1];
    if (len >= sizeof in)
        return 0;
    memcpy(in, data, len);
    in[len] = 0;                              /* names arrive NUL-terminated */
    if (mc_safe_name(in, out, sizeof out) != 0)
        return 0;
    size_t n = strlen(out);
    assert(n > 0 && n <= MC_NAME_MAX);
    assert(strcmp(out, ".") && strcmp(out, ".."));
    for (size_t i = 0; i < n; i++)
        assert(out[i] != '/' && out[i] != '\\' && (unsigned char)out[i] >= 0x20 && out[i] != 0x7f);
    int rc = mc_partial_name(out, part, sizeof part);
    assert(rc == 0 || rc == -ENAMETOOLONG);
    if (rc == 0)
        assert(part[0] == '.' && !strchr(part, '/') && strcmp(part, out));
    return 0;
}
