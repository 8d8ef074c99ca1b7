/* The dump-folder lock (and an absolute checkpoint folder's), and the ranks' agreement on which
 * folder that is. */
#include "train/lock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
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

/* Every rank's folder (the dump folder, or an absolute checkpoint.folder) against rank 0's,
 * by identity rather than by path: rank 0 has written its own "pid P on HOST" into the
 * folder's lock file (fd), and every other rank must read that same line through its own
 * path. A relative path from another working directory, or a folder of the same absolute path
 * on another host's own disk, names another folder and fails; one shared folder mounted under
 * different paths passes. key names the config key in the sentence. */
static int check_same_folder(Comm *world, int fd0, const char *folder, const char *key, Err *err) {
    char first[256] = "", mine[256] = "";
    if (world->rank == 0) {
        ssize_t n = pread(fd0, first, sizeof first - 1, 0);
        first[n > 0 ? n : 0] = 0;
    }
    TRY(comm_broadcast(world, first, sizeof first, 0, err));
    int rc = 0;
    if (world->rank != 0) {
        char *path = fs_join(folder, TRAIN_LOCK_FILE);
        int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        ssize_t n = fd >= 0 ? pread(fd, mine, sizeof mine - 1, 0) : -1;
        mine[n > 0 ? n : 0] = 0;
        if (fd >= 0) close(fd);
        if (strcmp(mine, first) != 0) {
            char here[PATH_MAX];
            resolve(folder, here);
            mine[strcspn(mine, "\n")] = 0;
            first[strcspn(first, "\n")] = 0;
            rc = err_set(err,
                         "%s %s (%s on this rank) is not the folder rank 0 locked: its %s %s%s%s, "
                         "not rank 0's \"%s\" (a relative path from another working directory, "
                         "or another host's own disk?); every rank must use the same folder",
                         key, folder, here, TRAIN_LOCK_FILE, fd < 0 ? "is missing" : "holds \"",
                         fd < 0 ? "" : mine, fd < 0 ? "" : "\"", first);
        }
        free(path);
    }
    return comm_agree(world, rc, err);
}

/* Rank 0: takes lock i, of folder (config key `key`), which exists. */
static int lock_folder(TrainLock *l, int i, const char *folder, const char *key, Err *err) {
    l->path[i] = fs_join(folder, TRAIN_LOCK_FILE);
    l->fd[i] = open(l->path[i], O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    SYS_CHECK(l->fd[i] >= 0, err, "cannot open the lock file %s", l->path[i]);
    char holder[256] = "";
    ssize_t n = pread(l->fd[i], holder, sizeof holder - 1, 0);
    holder[n > 0 ? n : 0] = 0;
    holder[strcspn(holder, "\n")] = 0;
    if (flock(l->fd[i], LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK)
            err_sys(err, "cannot lock %s", l->path[i]);
        else
            err_set(err,
                    "%s %s is in use by another training run (%s holds %s); two runs on one "
                    "folder would overwrite each other's checkpoints%s: wait for it, stop it, or "
                    "choose another %s",
                    key, folder, holder[0] ? holder : "a process", l->path[i],
                    i == 0 ? " and metrics" : "", key);
        close(l->fd[i]);
        l->fd[i] = -1;
        return -1;
    }
    /* Read again under the lock: the holder may have released it in between. */
    n = pread(l->fd[i], holder, sizeof holder - 1, 0);
    holder[n > 0 ? n : 0] = 0;
    holder[strcspn(holder, "\n")] = 0;
    if (holder[0])
        log_warn("%s %s: taking over the lock left by %s, which ended without releasing it", key,
                 folder, holder);
    char host[128] = "?", line[256];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    int len = snprintf(line, sizeof line, "pid %ld on %s\n", (long)getpid(), host);
    if (ftruncate(l->fd[i], 0) != 0 || pwrite(l->fd[i], line, (size_t)len, 0) != len)
        return err_sys(err, "cannot write the lock file %s", l->path[i]);
    return 0;
}

/* 1 when a and b (which exist) are one directory. */
static int same_dir(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

int train_lock_take(TrainLock *l, Comm *world, const JobConfig *cfg, Err *err) {
    static const char *const keys[TRAIN_LOCK_MAX] = {"job.dump_folder", "checkpoint.folder"};
    const char *folders[TRAIN_LOCK_MAX] = {cfg->job.dump_folder, cfg->checkpoint.folder};
    for (int i = 0; i < TRAIN_LOCK_MAX; i++)
        l->fd[i] = -1, l->path[i] = NULL;
    /* A relative checkpoint.folder lies in the dump folder, whose lock covers it; an absolute
     * one (another disk, a shared store) gets a lock of its own, unless it is the dump folder.
     * Rank 0 decides, so every rank makes the same collectives. */
    int n = cfg->checkpoint.enable && cfg->checkpoint.folder[0] == '/' ? 2 : 1, rc = 0;
    if (world->rank == 0) {
        for (int i = 0; i < n && rc == 0; i++)
            if ((rc = fs_mkdirs(folders[i], err)) != 0)
                err_wrap(err, "%s %s cannot be created", keys[i], folders[i]);
        if (rc == 0 && n == 2 && same_dir(folders[0], folders[1])) n = 1;
        for (int i = 0; i < n && rc == 0; i++)
            rc = lock_folder(l, i, folders[i], keys[i], err);
    }
    rc = comm_agree_own(world, rc, err);
    if (rc == 0) rc = comm_broadcast(world, &n, sizeof n, 0, err);
    for (int i = 0; i < n && rc == 0; i++)
        rc = check_same_folder(world, l->fd[i], folders[i], keys[i], err);
    if (rc != 0) train_lock_release(l);
    return rc;
}

void train_lock_release(TrainLock *l) {
    for (int i = 0; i < TRAIN_LOCK_MAX; i++) {
        if (l->fd[i] >= 0) {
            /* Emptied while still held: a lock file with a pid in it then means a run that
             * died. */
            if (ftruncate(l->fd[i], 0) != 0) log_warn("cannot empty the lock file %s", l->path[i]);
            close(l->fd[i]);
        }
        free(l->path[i]);
        l->fd[i] = -1;
        l->path[i] = NULL;
    }
}
