/* File-system helpers with every system call checked. */
#include "core/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_read_all(const char *path, char **data, size_t *len, Err *err) {
    int fd = open(path, O_RDONLY);
    SYS_CHECK(fd >= 0, err, "cannot open %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err_sys(err, "cannot stat %s", path);
        close(fd);
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return err_set(err, "%s is a directory, expected a file", path);
    }
    size_t cap = st.st_size > 0 ? (size_t)st.st_size : 4096, n = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (n == cap) buf = xrealloc(buf, (cap *= 2) + 1);
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

int fs_sync_dir(const char *path, Err *err) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    SYS_CHECK(fd >= 0, err, "cannot open directory %s", path);
    int rc = fsync(fd);
    close(fd);
    SYS_CHECK(rc == 0, err, "cannot sync directory %s", path);
    return 0;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return xstrdup(".");
    if (slash == path) return xstrdup("/");
    size_t n = (size_t)(slash - path);
    char *d = xmalloc(n + 1);
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

int fs_write_atomic(const char *path, const void *data, size_t len, Err *err) {
    size_t n = strlen(path) + 8;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
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
    char *dir = dir_of(path);
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

char *fs_join(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *s = xmalloc(na + nb + 2);
    memcpy(s, a, na);
    size_t k = na;
    if (na > 0 && a[na - 1] != '/') s[k++] = '/';
    memcpy(s + k, b, nb + 1);
    return s;
}
