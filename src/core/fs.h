/* File-system helpers: whole-file reads, atomic writes, directories. */
#ifndef QT_FS_H
#define QT_FS_H

#include <stddef.h>

#include "core/err.h"

/* Reads a whole file into a NUL-terminated malloc'd buffer; *len excludes the NUL. */
int fs_read_all(const char *path, char **data, size_t *len, Err *err);
/* Writes data to path.tmp, fsyncs, renames over path, fsyncs the directory. */
int fs_write_atomic(const char *path, const void *data, size_t len, Err *err);
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
/* Joins a and b with one '/' into a malloc'd string. */
char *fs_join(const char *a, const char *b);
/* path itself when it is absolute, else dir/path (malloc'd): how a folder key relative to
 * job.dump_folder is resolved, as torchtitan's os.path.join does. */
char *fs_resolve(const char *dir, const char *path);

#endif
