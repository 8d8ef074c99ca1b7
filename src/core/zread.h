/* Reading a file that may be compressed, as a stream of its plain bytes: ".gz" through zlib
 * (gzip, concatenated members too), ".zst" through libzstd (concatenated frames too), anything
 * else as it is. Nothing is unpacked to disk. A corrupt or truncated stream is one sentence
 * naming the file and the compressed byte offset where reading stopped; never a partial read
 * that looks complete. */
#ifndef QT_ZREAD_H
#define QT_ZREAD_H

#include <stddef.h>
#include <stdio.h>

#include "core/err.h"

typedef struct ZRead ZRead;

/* 1 when path names a compressed file (ends in .gz or .zst). */
int zread_is_compressed(const char *path);
/* path without its .gz / .zst ending, for decisions by the plain name ("x.jsonl.gz" is JSONL);
 * out must hold strlen(path) + 1 bytes. */
void zread_plain_name(const char *path, char *out);

/* Opens path through fs_open_read (regular files only, never blocking on a FIFO). */
int zread_open(ZRead **out, const char *path, Err *err);
/* Over an open stream f (closed by zread_close, also on error), decoded by path's ending. */
int zread_open_stream(ZRead **out, FILE *f, const char *path, Err *err);
/* Reads up to cap plain bytes; *got = 0 only at the clean end of the stream. */
int zread_read(ZRead *z, void *buf, size_t cap, size_t *got, Err *err);
void zread_close(ZRead *z);
/* Bytes of the file consumed so far (compressed bytes for .gz / .zst): progress over the file. */
unsigned long long zread_in_offset(const ZRead *z);

/* The whole plain content, malloc'd and NUL-terminated (not counted in *len); more than
 * FS_READ_ALL_MAX plain bytes is an error naming the file, as for fs_read_all. */
int zread_all(const char *path, char **data, size_t *len, Err *err);

/* A FILE* over the plain bytes (for line readers such as getline); a read error sets the
 * stream's error flag and leaves its sentence in *err, which must outlive the stream. */
FILE *zread_fopen(const char *path, Err *err);

#endif
