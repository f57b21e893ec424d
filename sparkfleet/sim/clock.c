/* SIMULATION: the clock-skew fault's node clock (sparkfleet/sim/clock.py builds this; sim/faults.py turns it on).

   Every node of the lab shares this machine's kernel, so no node can have a wall clock of its own. While the
   fault is on, the node's /etc/ld.so.preload names this library, and every dynamically linked program started
   in the node (its shell, `date`, python3, sshd's sessions, the sim's shims) reads the node's clock: the wall
   clock plus the skew in /etc/sparkfleet-sim-clock (seconds, negative = behind). File times are read and set on
   the same clock (stat reports them shifted, utimensat stores them unshifted), so the node sees the files it
   makes stamped in its own time, as a node whose real clock is off does. Monotonic clocks are left alone (a
   wrong wall clock does not change them). Go programs (dockerd, runc) call the kernel themselves and keep the
   true time, and so do a real dockerd's containers (their /etc is their image's): the lab's dockerd stamps
   containers, and a rank's own log lines, with this machine's clock; files a container makes still read back in
   the node's time, as any file does. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define SKEW_FILE "/etc/sparkfleet-sim-clock"

static long long skew_ns;

__attribute__((constructor)) static void load_skew(void) {
    char buf[64] = {0};
    int fd = open(SKEW_FILE, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n > 0)
        skew_ns = (long long)(strtod(buf, NULL) * 1e9);
}

static int wall(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI;
}

static void shift(struct timespec *t, long long ns) {
    long long v = (long long)t->tv_sec * 1000000000LL + t->tv_nsec + ns;
    t->tv_sec = v / 1000000000LL;
    t->tv_nsec = v % 1000000000LL;
    if (t->tv_nsec < 0) {
        t->tv_nsec += 1000000000LL;
        t->tv_sec -= 1;
    }
}

#define REAL(name) static __typeof__(name) *real; if (!real) real = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

int clock_gettime(clockid_t id, struct timespec *tp) {
    REAL(clock_gettime);
    int rc = real(id, tp);
    if (rc == 0 && wall(id))
        shift(tp, skew_ns);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}

/* struct stat and struct stat64 have the same time fields */
#define SHIFT_STAT(st) do { shift(&(st)->st_atim, skew_ns); shift(&(st)->st_mtim, skew_ns); \
                            shift(&(st)->st_ctim, skew_ns); } while (0)

#define STAT_LIKE(name, proto, call) \
    int name proto { REAL(name); int rc = real call; if (rc == 0) SHIFT_STAT(st); return rc; }

STAT_LIKE(stat, (const char *restrict path, struct stat *restrict st), (path, st))
STAT_LIKE(lstat, (const char *restrict path, struct stat *restrict st), (path, st))
STAT_LIKE(fstat, (int fd, struct stat *st), (fd, st))
STAT_LIKE(fstatat, (int dirfd, const char *restrict path, struct stat *restrict st, int flags),
          (dirfd, path, st, flags))
STAT_LIKE(stat64, (const char *restrict path, struct stat64 *restrict st), (path, st))
STAT_LIKE(lstat64, (const char *restrict path, struct stat64 *restrict st), (path, st))
STAT_LIKE(fstat64, (int fd, struct stat64 *st), (fd, st))
STAT_LIKE(fstatat64, (int dirfd, const char *restrict path, struct stat64 *restrict st, int flags),
          (dirfd, path, st, flags))

static void shift_statx(struct statx_timestamp *t) {
    struct timespec ts = {t->tv_sec, t->tv_nsec};
    shift(&ts, skew_ns);
    t->tv_sec = ts.tv_sec;
    t->tv_nsec = (unsigned)ts.tv_nsec;
}

int statx(int dirfd, const char *restrict path, int flags, unsigned int mask, struct statx *restrict st) {
    REAL(statx);
    int rc = real(dirfd, path, flags, mask, st);
    if (rc == 0) {
        shift_statx(&st->stx_atime);
        shift_statx(&st->stx_btime);
        shift_statx(&st->stx_ctime);
        shift_statx(&st->stx_mtime);
    }
    return rc;
}

/* Times a program sets are on the node's clock: stored as this machine's, so stat gives them back as set. */
static const struct timespec *unshift(const struct timespec in[2], struct timespec out[2]) {
    if (!in)
        return NULL;
    for (int i = 0; i < 2; i++) {
        out[i] = in[i];
        if (in[i].tv_nsec != UTIME_NOW && in[i].tv_nsec != UTIME_OMIT)
            shift(&out[i], -skew_ns);
    }
    return out;
}

int utimensat(int dirfd, const char *path, const struct timespec times[2], int flags) {
    REAL(utimensat);
    struct timespec t[2];
    return real(dirfd, path, unshift(times, t), flags);
}

int futimens(int fd, const struct timespec times[2]) {
    REAL(futimens);
    struct timespec t[2];
    return real(fd, unshift(times, t));
}
