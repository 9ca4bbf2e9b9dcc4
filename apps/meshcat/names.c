/* meshcat: receiver-side file name sanitising (see names.h for the rule),
 * and the temporary a file is received into. */
#include "names.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define PART_SUFFIX ".meshcat-part"
#define RAND_LEN 6          /* random characters ending a temporary's name */
#define OPEN_TRIES 100      /* names tried before mc_part_open() gives up */

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

/* RAND_LEN random letters and digits; @try differs between the tries of one
 * call.  Should getrandom() fail, the clock and the pid still make names
 * differ (O_EXCL keeps it correct either way). */
static void random_suffix(char *out, unsigned try)
{
    static const char abc[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t r;

    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        r = (uint64_t)t.tv_nsec ^ (uint64_t)t.tv_sec << 30 ^ (uint64_t)getpid() << 40;
    }
    r ^= try * 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < RAND_LEN; i++, r /= sizeof abc - 1)
        out[i] = abc[r % (sizeof abc - 1)];
    out[RAND_LEN] = '\0';
}

int mc_part_open(int dirfd, const char *final_name, mode_t mode, char *part, size_t cap)
{
    clear(part, cap);
    if (!final_name || !final_name[0] || last_component(final_name) != final_name)
        return -EINVAL;
    /* cut a long name to leave room for the suffix: the suffix makes it unique */
    char cut[MC_NAME_MAX + 1], prefix[MC_NAME_MAX + 1], rnd[RAND_LEN + 1];
    snprintf(cut, sizeof cut, "%.*s", MC_NAME_MAX - (int)strlen(PART_SUFFIX) - 2 - RAND_LEN,
             final_name);
    int rc = mc_partial_name(cut, prefix, sizeof prefix);
    if (rc)
        return rc;
    if (!part || strlen(prefix) + 1 + RAND_LEN >= cap)
        return -ENAMETOOLONG;
    for (unsigned try = 0; try < OPEN_TRIES; try++) {
        random_suffix(rnd, try);
        snprintf(part, cap, "%s.%s", prefix, rnd);
        int fd = openat(dirfd, part, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd >= 0)
            return fd;
        if (errno != EEXIST)
            break;
    }
    rc = -errno;
    clear(part, cap);
    return rc;
}

/* Rename @part to @final_name unless that exists.  Some file systems refuse
 * RENAME_NOREPLACE (EINVAL; ENOSYS: a kernel before 3.15): a hard link never
 * replaces either. */
static int rename_noreplace(int dirfd, const char *part, const char *final_name)
{
    if (renameat2(dirfd, part, dirfd, final_name, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS)
        return -errno;
    if (linkat(dirfd, part, dirfd, final_name, 0) < 0)
        return -errno;
    return unlinkat(dirfd, part, 0) < 0 ? -errno : 0;
}

int mc_part_publish(int dirfd, int fd, const char *part, const char *final_name, bool replace)
{
    int rc = fsync(fd) < 0 ? -errno : 0;
    if (close(fd) < 0 && !rc)
        rc = -errno;
    if (!rc && replace)
        rc = renameat(dirfd, part, dirfd, final_name) < 0 ? -errno : 0;
    else if (!rc)
        rc = rename_noreplace(dirfd, part, final_name);
    if (rc) {
        unlinkat(dirfd, part, 0);
        return rc;
    }
    /* EINVAL: a file system that cannot sync a directory */
    if (fsync(dirfd) < 0 && errno != EINVAL)
        return -errno;
    return 0;
}
