/* Why registering memory failed, in words a user can act on.  Without
 * CAP_IPC_LOCK the kernel refuses a registration (ENOMEM) once the pages
 * the process has pinned would pass RLIMIT_MEMLOCK -- 8 MiB by default on
 * Debian, less than one context and one connection pin -- and "Cannot
 * allocate memory" alone sends people looking for a leak. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/capability.h>

#include "mem/region.h"

static bool has_ipc_lock(void)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) < 0)
        return false;
    return d[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32));
}

/* What the kernel counts against RLIMIT_MEMLOCK for registrations (its
 * pinned_vm), KiB; 0 when unknown. */
static uint64_t pinned_kib(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[128];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmPin: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

bool mw__memlock_why(int err, uint64_t bytes, char *buf, size_t n)
{
    struct rlimit rl;
    uint64_t mib = (bytes + (1u << 20) - 1) >> 20;
    if (err != -ENOMEM || getrlimit(RLIMIT_MEMLOCK, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY ||
        has_ipc_lock()) {
        snprintf(buf, n, "cannot register %" PRIu64 " MiB: %s", mib, mw_strerror(err));
        return false;
    }
    uint64_t need = pinned_kib() + (bytes + 1023) / 1024;
    snprintf(buf, n, "cannot register %" PRIu64 " MiB: RLIMIT_MEMLOCK (ulimit -l) is %" PRIu64
             " KiB, needs %" PRIu64 " KiB or more", mib, (uint64_t)rl.rlim_cur / 1024, need);
    return true;
}
