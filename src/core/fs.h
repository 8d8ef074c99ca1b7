/* File-system helpers: whole-file reads, atomic writes, directories. */
#ifndef QT_FS_H
#define QT_FS_H

#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>

#include "core/err.h"

/* The most fs_read_all reads of one file: whole-file reads are for configs, tokenizers and
 * token lists, and a larger one is a mistake (or a file growing under us), not a wait. */
#define FS_READ_ALL_MAX ((size_t)1 << 31)

/* Opens path for reading, the one way every reader of a user's file opens it: without
 * blocking (a FIFO with no writer would wait forever in open), then refused unless it is a
 * regular file (a FIFO, a device such as /dev/zero or a socket never ends or never starts),
 * then switched back to blocking reads. Returns the descriptor with *st filled, or -1 with a
 * sentence naming path. */
int fs_open_read(const char *path, struct stat *st, Err *err);
/* Reads a whole regular file (fs_open_read) into a NUL-terminated malloc'd buffer; *len
 * excludes the NUL. A file over FS_READ_ALL_MAX bytes is an error naming it. */
int fs_read_all(const char *path, char **data, size_t *len, Err *err);
/* Maps a whole regular file (fs_open_read) read-only: *map is NULL for an empty file. Release
 * with fs_unmap. The way a large input (a dataset file) is read without copying it. */
int fs_map_read(const char *path, const char **map, size_t *size, Err *err);
void fs_unmap(const char *map, size_t size);
/* Line-length cap of fs_read_line when the user gives none: a longer line is far more
 * likely a binary file or a missing newline than a document. */
#define FS_LINE_MAX_DEFAULT ((size_t)64 << 20)

/* Reads one line (without stripping its '\n') from f into *line (grown as needed, capacity
 * *cap) and sets *len. Returns 1 for a line, 0 at end of file, -1 with a sentence naming
 * name:lineno when the line is longer than max bytes, memory runs out or the read fails:
 * unlike getline, a failure is never mistaken for the end of the input. */
int fs_read_line(FILE *f, char **line, size_t *cap, size_t *len, size_t max, const char *name,
                 size_t lineno, Err *err);
/* A temporary name beside path that no other process or call uses: "path.tmp-<pid>-<n>"
 * (malloc'd). Two processes writing one file never share a temporary, and a leftover names
 * its owner (fs_tmp_owner_alive). Leftover temporaries of path whose owner is gone are
 * removed first (fs_remove_stale_tmps), so every atomic write and export cleans up after an
 * interrupted predecessor. */
char *fs_tmp_name(const char *path);
/* Removes every entry of dir (file or tree) whose name starts with prefix and carries
 * ".tmp-<pid>" of a process that is gone, each with a warning naming it; a live owner's
 * temporary may be a write in progress and is kept. The one rule for leftovers of interrupted
 * writes: fs_tmp_name applies it to its path's temporaries, the checkpoint folder to its
 * steps. */
int fs_remove_stale_tmps(const char *dir, const char *prefix, Err *err);
/* 1 when name (a file name such as "step-3.tmp-123" or "x.tmp-123-4") carries ".tmp-<pid>"
 * of a process that still runs, 0 when that process is gone (or the name has no pid): only
 * then may a leftover temporary be removed. */
int fs_tmp_owner_alive(const char *name);
/* Writes data to fs_tmp_name(path), fsyncs, renames over path, fsyncs the directory. */
int fs_write_atomic(const char *path, const void *data, size_t len, Err *err);
/* 1 when a and b name the same file (same device and inode: links, "./x" and "x" alike), 0
 * when they differ or either does not exist. How a command checks that an output is not one
 * of its inputs. */
int fs_same_file(const char *a, const char *b);
/* mkdir -p. */
int fs_mkdirs(const char *path, Err *err);
int fs_exists(const char *path);
/* fs_exists of dir/name. */
int fs_exists_in(const char *dir, const char *name);
int fs_is_dir(const char *path);
/* Removes a directory tree (for pruning old checkpoints). */
int fs_remove_tree(const char *path, Err *err);
/* fsyncs a directory so a rename inside it is durable. */
int fs_sync_dir(const char *path, Err *err);
/* The folder qtitan's cache of `what` ("datasets", "peaks") lives in, malloc'd: $QT_CACHE_DIR
 * itself when set (then every cache shares it, its files told apart by their names), else
 * $XDG_CACHE_HOME/qtitan/<what>, else $HOME/.cache/qtitan/<what>. */
char *fs_cache_dir(const char *what);
/* The folder path lies in (malloc'd), as dirname(1) gives it: "a/b" and "a/b/" give "a",
 * "/x" gives "/", and a bare name ".". */
char *fs_dir_of(const char *path);
/* Joins a and b with one '/' into a malloc'd string. */
char *fs_join(const char *a, const char *b);
/* path itself when it is absolute, else dir/path (malloc'd): how a folder key relative to
 * job.dump_folder is resolved, as torchtitan's os.path.join does. */
char *fs_resolve(const char *dir, const char *path);
/* 1 when path lies at or under dir, compared by their text with "." segments, repeated and
 * trailing slashes and "name/.." pairs taken out (neither needs to exist; links are not
 * followed). */
int fs_path_under(const char *path, const char *dir);

#endif
