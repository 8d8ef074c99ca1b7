/* File-system helpers with every system call checked. */
#include "core/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"

int fs_open_read(const char *path, struct stat *st, Err *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    SYS_CHECK(fd >= 0, err, "cannot open %s", path);
    const char *kind = NULL;
    if (fstat(fd, st) != 0) {
        err_sys(err, "cannot stat %s", path);
        close(fd);
        return -1;
    }
    if (S_ISDIR(st->st_mode))
        kind = "a directory";
    else if (S_ISFIFO(st->st_mode))
        kind = "a FIFO";
    else if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode))
        kind = "a device";
    else if (S_ISSOCK(st->st_mode))
        kind = "a socket";
    else if (!S_ISREG(st->st_mode))
        kind = "a special file";
    if (kind) {
        close(fd);
        return err_set(err, "%s is %s, not a regular file", path, kind);
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        err_sys(err, "cannot set %s to blocking reads", path);
        close(fd);
        return -1;
    }
    return fd;
}

int fs_map_read(const char *path, const char **map, size_t *size, Err *err) {
    struct stat st;
    int fd = fs_open_read(path, &st, err);
    if (fd < 0) return -1;
    *size = (size_t)st.st_size;
    void *m = *size ? mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (m == MAP_FAILED) return err_sys(err, "cannot map %s", path);
    *map = m;
    return 0;
}

void fs_unmap(const char *map, size_t size) {
    if (map && size) munmap((void *)map, size);
}

int fs_read_all(const char *path, char **data, size_t *len, Err *err) {
    struct stat st;
    int fd = fs_open_read(path, &st, err);
    if (fd < 0) return -1;
    if ((uint64_t)st.st_size > FS_READ_ALL_MAX) {
        close(fd);
        return err_set(err, "%s is %lld bytes, over the %zu-byte limit for a file read whole", path,
                       (long long)st.st_size, FS_READ_ALL_MAX);
    }
    size_t cap = st.st_size > 0 ? (size_t)st.st_size : 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return err_set(err, "out of memory reading %s (%zu bytes)", path, cap);
    }
    for (;;) {
        if (n == cap) {
            /* The file grew while we read it (or stat said 0): grow, up to the limit. */
            if (cap >= FS_READ_ALL_MAX) {
                free(buf);
                close(fd);
                return err_set(err, "%s grew past the %zu-byte limit for a file read whole", path,
                               FS_READ_ALL_MAX);
            }
            cap = cap * 2 < FS_READ_ALL_MAX ? cap * 2 : FS_READ_ALL_MAX;
            char *grown = realloc(buf, cap + 1);
            if (!grown) {
                free(buf);
                close(fd);
                return err_set(err, "out of memory reading %s (%zu bytes)", path, cap);
            }
            buf = grown;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            err_sys(err, "cannot read %s", path);
            free(buf);
            close(fd);
            return -1;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *data = buf;
    *len = n;
    return 0;
}

int fs_read_line(FILE *f, char **line, size_t *cap, size_t *len, size_t max, const char *name,
                 size_t lineno, Err *err) {
    size_t n = 0;
    for (;;) {
        if (n + 2 > *cap) {
            if (n >= max)
                return err_set(err, "%s:%zu: line is longer than the %zu-byte limit", name, lineno,
                               max);
            size_t want = *cap ? *cap * 2 : 4096;
            if (want > max + 2) want = max + 2;
            char *grown = realloc(*line, want);
            if (!grown)
                return err_set(err, "%s:%zu: out of memory reading a line of %zu bytes", name,
                               lineno, want);
            *line = grown;
            *cap = want;
        }
        int c = getc_unlocked(f);
        if (c == EOF) {
            if (ferror(f)) return err_sys(err, "%s:%zu: cannot read", name, lineno);
            break;
        }
        (*line)[n++] = (char)c;
        if (c == '\n') break;
    }
    (*line)[n] = 0;
    *len = n;
    return n > 0;
}

char *fs_tmp_name(const char *path) {
    static _Atomic unsigned counter;
    unsigned k = counter++;
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') /* "out/" names the directory out, not a child */
        len--;
    size_t n = len + 48;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%.*s.tmp-%ld-%u", (int)len, path, (long)getpid(), k);
    /* Leftovers of earlier writes of this path by processes that are gone: a SIGKILL or a
     * power cut between create and rename leaves one, and nothing else would ever remove it. */
    char *stem = xmalloc(len + 6);
    snprintf(stem, len + 6, "%.*s.tmp-", (int)len, path);
    char *slash = strrchr(stem, '/');
    const char *prefix = slash ? slash + 1 : stem, *dir = slash == stem ? "/" : slash ? stem : ".";
    if (slash && slash != stem) *slash = 0;
    Err ignore;
    if (fs_remove_stale_tmps(dir, prefix, &ignore) != 0) log_warn("%s", ignore.msg);
    free(stem);
    return tmp;
}

int fs_remove_stale_tmps(const char *dir, const char *prefix, Err *err) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : err_sys(err, "cannot list %s", dir);
    size_t plen = strlen(prefix);
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0 || !strstr(e->d_name, ".tmp-")) continue;
        if (fs_tmp_owner_alive(e->d_name)) continue;
        char *full = fs_join(dir, e->d_name);
        log_warn("removing %s, left by an interrupted write of a process that is gone", full);
        rc = fs_remove_tree(full, err);
        free(full);
    }
    closedir(d);
    return rc;
}

int fs_tmp_owner_alive(const char *name) {
    const char *t = strstr(name, ".tmp-");
    if (!t) return 0;
    char *end;
    errno = 0;
    long pid = strtol(t + 5, &end, 10);
    if (errno || end == t + 5 || pid <= 0 || (*end && *end != '-')) return 0;
    if (pid == (long)getpid()) return 1;
    /* EPERM: the process exists under another user; only ESRCH says it is gone. */
    return kill((pid_t)pid, 0) == 0 || errno != ESRCH;
}

int fs_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int fs_sync_dir(const char *path, Err *err) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    SYS_CHECK(fd >= 0, err, "cannot open directory %s", path);
    int rc = fsync(fd);
    close(fd);
    SYS_CHECK(rc == 0, err, "cannot sync directory %s", path);
    return 0;
}

char *fs_dir_of(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') /* "a/b/" names b, as "a/b" does */
        n--;
    while (n > 0 && path[n - 1] != '/')
        n--;
    if (n == 0) return xstrdup(".");
    while (n > 1 && path[n - 1] == '/')
        n--;
    char *d = xmalloc(n + 1);
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

int fs_write_atomic(const char *path, const void *data, size_t len, Err *err) {
    char *tmp = fs_tmp_name(path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        err_sys(err, "cannot create %s", tmp);
        free(tmp);
        return -1;
    }
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            err_sys(err, "cannot write %s", tmp);
            close(fd);
            unlink(tmp);
            free(tmp);
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        err_sys(err, "cannot flush %s", tmp);
        unlink(tmp);
        free(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        err_sys(err, "cannot rename %s to %s", tmp, path);
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    char *dir = fs_dir_of(path);
    int rc = fs_sync_dir(dir, err);
    free(dir);
    return rc;
}

int fs_mkdirs(const char *path, Err *err) {
    char *p = xstrdup(path);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                err_sys(err, "cannot create directory %s", p);
                free(p);
                return -1;
            }
            *s = c;
            if (c == 0) break;
        }
    }
    free(p);
    if (!fs_is_dir(path)) return err_set(err, "%s exists and is not a directory", path);
    return 0;
}

int fs_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int fs_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int fs_remove_tree(const char *path, Err *err) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : err_sys(err, "cannot stat %s", path);
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        SYS_CHECK(d != NULL, err, "cannot open directory %s", path);
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char *child = fs_join(path, e->d_name);
            int rc = fs_remove_tree(child, err);
            free(child);
            if (rc != 0) {
                closedir(d);
                return -1;
            }
        }
        closedir(d);
        SYS_CHECK(rmdir(path) == 0, err, "cannot remove %s", path);
        return 0;
    }
    SYS_CHECK(unlink(path) == 0, err, "cannot remove %s", path);
    return 0;
}

int fs_exists_in(const char *dir, const char *name) {
    char *path = fs_join(dir, name);
    int found = fs_exists(path);
    free(path);
    return found;
}

char *fs_resolve(const char *dir, const char *path) {
    return path[0] == '/' ? xstrdup(path) : fs_join(dir, path);
}

/* path's text with "." segments, repeated and trailing slashes and "name/.." pairs taken out
 * (malloc'd; "." when nothing is left of a relative path). */
static char *lexical_path(const char *path) {
    size_t n = strlen(path);
    char *out = xmalloc(n + 2);
    size_t k = 0;
    int absolute = path[0] == '/';
    if (absolute) out[k++] = '/';
    size_t floor = k; /* where ".." can no longer pop a segment */
    for (const char *p = path; *p;) {
        while (*p == '/')
            p++;
        size_t len = strcspn(p, "/");
        if (len == 0) break;
        if (len == 1 && p[0] == '.') {
            p += len;
            continue;
        }
        if (len == 2 && p[0] == '.' && p[1] == '.') {
            if (k > floor) { /* pop the last segment */
                while (k > floor && out[k - 1] != '/')
                    k--;
                if (k > floor) k--;
                p += len;
                continue;
            }
            if (absolute) { /* "/.." is "/" */
                p += len;
                continue;
            }
        }
        if (k > 0 && out[k - 1] != '/') out[k++] = '/';
        memcpy(out + k, p, len);
        k += len;
        if (len == 2 && p[0] == '.' && p[1] == '.') floor = k;
        p += len;
    }
    if (k == 0) out[k++] = '.';
    out[k] = 0;
    return out;
}

int fs_path_under(const char *path, const char *dir) {
    char *a = lexical_path(path), *b = lexical_path(dir);
    size_t nb = strlen(b);
    int under = strncmp(a, b, nb) == 0 && (a[nb] == 0 || a[nb] == '/' || strcmp(b, "/") == 0);
    free(a);
    free(b);
    return under;
}

char *fs_cache_dir(const char *what) {
    const char *e = getenv("QT_CACHE_DIR");
    if (e && *e) return xstrdup(e);
    char *sub = fs_join("qtitan", what);
    e = getenv("XDG_CACHE_HOME");
    char *dir;
    if (e && *e) {
        dir = fs_join(e, sub);
    } else {
        e = getenv("HOME");
        char *base = fs_join(e && *e ? e : ".", ".cache");
        dir = fs_join(base, sub);
        free(base);
    }
    free(sub);
    return dir;
}

char *fs_join(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *s = xmalloc(na + nb + 2);
    memcpy(s, a, na);
    size_t k = na;
    if (na > 0 && a[na - 1] != '/') s[k++] = '/';
    memcpy(s + k, b, nb + 1);
    return s;
}
