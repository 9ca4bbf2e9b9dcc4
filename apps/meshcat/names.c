/* meshcat: receiver-side file name sanitising (see names.h for the rule). */
#include "names.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define PART_SUFFIX ".meshcat-part"

static bool is_sep(char c)
{
    return c == '/' || c == '\\';
}

/* Both separators count: a Windows sender's "dir\\x" must not become a
 * file literally named "dir\\x", nor "..\\x" a traversal on some share. */
static const char *last_component(const char *s)
{
    const char *base = s;

    for (; *s; s++)
        if (is_sep(*s))
            base = s + 1;
    return base;
}

static bool has_control(const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f)
            return true;
    }
    return false;
}

static void clear(char *out, size_t cap)
{
    if (out && cap)
        out[0] = '\0';
}

int mc_safe_name(const char *sent, char *out, size_t cap)
{
    clear(out, cap);
    if (!sent)
        return -EINVAL;
    const char *name = last_component(sent);
    size_t len = strlen(name);

    if (len == 0 || len > MC_NAME_MAX || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0 || has_control(name))
        return -EINVAL;
    if (!out || len >= cap)
        return -ENAMETOOLONG;
    memcpy(out, name, len + 1);
    return 0;
}

int mc_partial_name(const char *final_name, char *out, size_t cap)
{
    clear(out, cap);
    /* A separator here means the caller skipped mc_safe_name(). */
    if (!final_name || !final_name[0] || last_component(final_name) != final_name)
        return -EINVAL;
    size_t len = 1 + strlen(final_name) + strlen(PART_SUFFIX);

    if (len > MC_NAME_MAX || !out || len >= cap)
        return -ENAMETOOLONG;
    snprintf(out, cap, ".%s" PART_SUFFIX, final_name);
    return 0;
}
