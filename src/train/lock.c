/* The dump-folder lock and the ranks' agreement on which folder that is. */
#include "train/lock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/log.h"

/* A path as this process sees it, for messages: realpath when it exists; else its folder's
 * realpath joined with the last part; else the path made absolute against the working
 * directory. Empty for NULL. */
static void resolve(const char *path, char out[PATH_MAX]) {
    out[0] = 0;
    if (!path || !*path) return;
    char buf[PATH_MAX];
    if (realpath(path, buf)) {
        snprintf(out, PATH_MAX, "%s", buf);
        return;
    }
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash == path) snprintf(dir, sizeof dir, "/");
    if (realpath(dir, buf)) {
        snprintf(out, PATH_MAX, "%s/%s", strcmp(buf, "/") == 0 ? "" : buf,
                 slash ? slash + 1 : path);
        return;
    }
    char cwd[PATH_MAX];
    if (path[0] != '/' && getcwd(cwd, sizeof cwd))
        snprintf(out, PATH_MAX, "%s/%s", cwd, path);
    else
        snprintf(out, PATH_MAX, "%s", path);
}

/* Every rank's dump folder against rank 0's, by identity rather than by path: rank 0 has
 * written its own "pid P on HOST" into the folder's lock file, and every other rank must read
 * that same line through its own job.dump_folder. A relative path from another working
 * directory names another folder and fails; one shared folder mounted under different paths
 * passes. */
static int check_same_folder(Comm *world, const TrainLock *l, const JobConfig *cfg, Err *err) {
    char first[256] = "", mine[256] = "";
    if (world->rank == 0) {
        ssize_t n = pread(l->fd, first, sizeof first - 1, 0);
        first[n > 0 ? n : 0] = 0;
    }
    TRY(comm_broadcast(world, first, sizeof first, 0, err));
    int rc = 0;
    if (world->rank != 0) {
        char *path = fs_join(cfg->job.dump_folder, TRAIN_LOCK_FILE);
        int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        ssize_t n = fd >= 0 ? pread(fd, mine, sizeof mine - 1, 0) : -1;
        mine[n > 0 ? n : 0] = 0;
        if (fd >= 0) close(fd);
        if (strcmp(mine, first) != 0) {
            char here[PATH_MAX];
            resolve(cfg->job.dump_folder, here);
            mine[strcspn(mine, "\n")] = 0;
            first[strcspn(first, "\n")] = 0;
            rc = err_set(err,
                         "job.dump_folder %s (%s on this rank) is not the folder rank 0 locked: "
                         "its %s %s%s%s, not rank 0's \"%s\" (a relative path from another "
                         "working directory?); every rank must use the same folder",
                         cfg->job.dump_folder, here, TRAIN_LOCK_FILE,
                         fd < 0 ? "is missing" : "holds \"", fd < 0 ? "" : mine, fd < 0 ? "" : "\"",
                         first);
        }
        free(path);
    }
    return comm_agree(world, rc, err);
}

/* Rank 0: takes the lock of dump_folder, which exists. */
static int lock_folder(TrainLock *l, const char *dump_folder, Err *err) {
    l->path = fs_join(dump_folder, TRAIN_LOCK_FILE);
    l->fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    SYS_CHECK(l->fd >= 0, err, "cannot open the lock file %s", l->path);
    char holder[256] = "";
    ssize_t n = pread(l->fd, holder, sizeof holder - 1, 0);
    holder[n > 0 ? n : 0] = 0;
    holder[strcspn(holder, "\n")] = 0;
    if (flock(l->fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK)
            err_sys(err, "cannot lock %s", l->path);
        else
            err_set(err,
                    "job.dump_folder %s is in use by another training run (%s holds %s); two "
                    "runs on one folder would overwrite each other's checkpoints and metrics: "
                    "wait for it, stop it, or choose another job.dump_folder",
                    dump_folder, holder[0] ? holder : "a process", l->path);
        close(l->fd);
        l->fd = -1;
        return -1;
    }
    /* Read again under the lock: the holder may have released it in between. */
    n = pread(l->fd, holder, sizeof holder - 1, 0);
    holder[n > 0 ? n : 0] = 0;
    holder[strcspn(holder, "\n")] = 0;
    if (holder[0])
        log_warn("job.dump_folder %s: taking over the lock left by %s, which ended without "
                 "releasing it",
                 dump_folder, holder);
    char host[128] = "?", line[256];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    int len = snprintf(line, sizeof line, "pid %ld on %s\n", (long)getpid(), host);
    if (ftruncate(l->fd, 0) != 0 || pwrite(l->fd, line, (size_t)len, 0) != len)
        return err_sys(err, "cannot write the lock file %s", l->path);
    return 0;
}

int train_lock_take(TrainLock *l, Comm *world, const JobConfig *cfg, Err *err) {
    l->fd = -1;
    l->path = NULL;
    int rc = 0;
    if (world->rank == 0) {
        rc = fs_mkdirs(cfg->job.dump_folder, err);
        if (rc != 0) err_wrap(err, "job.dump_folder %s cannot be created", cfg->job.dump_folder);
        if (rc == 0) rc = lock_folder(l, cfg->job.dump_folder, err);
    }
    rc = comm_agree_own(world, rc, err);
    if (rc == 0) rc = check_same_folder(world, l, cfg, err);
    if (rc != 0) train_lock_release(l);
    return rc;
}

void train_lock_release(TrainLock *l) {
    if (l->fd >= 0) {
        /* Emptied while still held: a lock file with a pid in it then means a run that died. */
        if (ftruncate(l->fd, 0) != 0) log_warn("cannot empty the lock file %s", l->path);
        close(l->fd);
    }
    free(l->path);
    l->fd = -1;
    l->path = NULL;
}
