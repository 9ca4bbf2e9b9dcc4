/* The userfaultfd monitor: one helper thread asleep in poll(). */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/thread.h"
#include "mem/uffd.h"

#define PAGE ((uintptr_t)4096)

/* Ranges kept between two takes.  A fixed array: the monitor must never
 * allocate or free -- freeing can give memory back to the kernel, which can
 * be a watched range, whose event would then wait for the monitor itself.
 * When it fills, the last entry widens to everything (all is dropped: safe,
 * only slower). */
#define KEPT MW__UFFD_TAKE_MAX

struct mw__uffd {
    int fd, wake_fd, stop_fd;
    pthread_t thread;
    pthread_mutex_t lock;
    _Atomic uint64_t gen;         /* moves before each read of events */
    uint64_t taken;               /* gen when mw__uffd_take last looked */
    struct mw__gone v[KEPT];      /* under lock */
    size_t n;
};

static void add(struct mw__uffd *u, uintptr_t start, uintptr_t end)
{
    if (u->n == KEPT)
        u->v[KEPT - 1] = (struct mw__gone){0, UINTPTR_MAX};
    else
        u->v[u->n++] = (struct mw__gone){start, end};
}

/* Read every queued event, under the lock, after moving gen: the thread
 * unmapping is released by the read, and finds gen moved already. */
static void drain(struct mw__uffd *u)
{
    struct uffd_msg m[16];
    atomic_fetch_add_explicit(&u->gen, 1, memory_order_seq_cst);
    ssize_t got;
    while ((got = read(u->fd, m, sizeof m)) > 0) {
        for (size_t i = 0; i < (size_t)got / sizeof *m; i++) {
            if (m[i].event == UFFD_EVENT_UNMAP || m[i].event == UFFD_EVENT_REMOVE)
                add(u, (uintptr_t)m[i].arg.remove.start, (uintptr_t)m[i].arg.remove.end);
            else if (m[i].event == UFFD_EVENT_REMAP)
                add(u, (uintptr_t)m[i].arg.remap.from,
                    (uintptr_t)(m[i].arg.remap.from + m[i].arg.remap.len));
        }
    }
}

static void *monitor(void *arg)
{
    struct mw__uffd *u = arg;
    struct pollfd p[2] = {{.fd = u->fd, .events = POLLIN}, {.fd = u->stop_fd, .events = POLLIN}};
    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            break;
        if (!(p[0].revents & POLLIN))
            continue;
        pthread_mutex_lock(&u->lock);
        drain(u);
        bool any = u->n > 0;
        pthread_mutex_unlock(&u->lock);
        uint64_t one = 1;
        if (any)
            (void)!write(u->wake_fd, &one, sizeof one);
    }
    return NULL;
}

static int open_uffd(void)
{
    /* Unprivileged processes may use it for user-mode faults only
     * (vm.unprivileged_userfaultfd = 0, Debian's default): all we need,
     * since we handle no faults at all. */
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    if (fd < 0 && errno == EINVAL)  /* a kernel before 5.11 */
        fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_EVENT_UNMAP |
                                                          UFFD_FEATURE_EVENT_REMOVE |
                                                          UFFD_FEATURE_EVENT_REMAP};
    if (ioctl(fd, UFFDIO_API, &api) < 0 || !(api.ioctls & (1ull << _UFFDIO_REGISTER))) {
        int err = errno ? -errno : -ENOTSUP;
        close(fd);
        return err;
    }
    return fd;
}

int mw__uffd_new(struct mw__uffd **up, int wake_fd)
{
    int fd = open_uffd();
    if (fd < 0)
        return fd;
    struct mw__uffd *u = mw__calloc(1, sizeof *u);
    if (!u) {
        close(fd);
        return -ENOMEM;
    }
    u->fd = fd;
    u->wake_fd = wake_fd;
    pthread_mutex_init(&u->lock, NULL);
    int rc = (u->stop_fd = eventfd(0, EFD_CLOEXEC)) < 0 ? -errno : 0;
    if (!rc)
        rc = mw__thread_start(&u->thread, false, monitor, u);
    if (rc) {
        if (u->stop_fd >= 0)
            close(u->stop_fd);
        pthread_mutex_destroy(&u->lock);
        close(fd);
        mw__free(u);
        return rc;
    }
    *up = u;
    return 0;
}

void mw__uffd_free(struct mw__uffd *u)
{
    if (!u)
        return;
    uint64_t one = 1;
    (void)!write(u->stop_fd, &one, sizeof one);
    pthread_join(u->thread, NULL);
    close(u->stop_fd);
    close(u->fd);                 /* the kernel drops every range registered */
    pthread_mutex_destroy(&u->lock);
    mw__free(u);
}

/* Whole pages: registration covers pages, and events name pages. */
static struct uffdio_range pages(uintptr_t start, uintptr_t end)
{
    uintptr_t s = start & ~(PAGE - 1), e = (end + PAGE - 1) & ~(PAGE - 1);
    return (struct uffdio_range){.start = s, .len = e - s};
}

int mw__uffd_watch(struct mw__uffd *u, uintptr_t start, uintptr_t end)
{
    struct uffdio_register r = {.range = pages(start, end), .mode = UFFDIO_REGISTER_MODE_WP};
    return ioctl(u->fd, UFFDIO_REGISTER, &r) < 0 ? -errno : 0;
}

void mw__uffd_unwatch(struct mw__uffd *u, uintptr_t start, uintptr_t end)
{
    struct uffdio_range r = pages(start, end);
    ioctl(u->fd, UFFDIO_UNREGISTER, &r);   /* what is gone already is no error */
}

bool mw__uffd_changed(const struct mw__uffd *u)
{
    return atomic_load_explicit(&u->gen, memory_order_seq_cst) != u->taken;
}

size_t mw__uffd_take(struct mw__uffd *u, struct mw__gone out[MW__UFFD_TAKE_MAX])
{
    pthread_mutex_lock(&u->lock);
    drain(u);                     /* what the monitor has not read yet, too */
    size_t n = u->n;
    memcpy(out, u->v, n * sizeof *out);
    u->n = 0;
    u->taken = atomic_load_explicit(&u->gen, memory_order_seq_cst);
    pthread_mutex_unlock(&u->lock);
    return n;
}
