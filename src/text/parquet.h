/* Apache Parquet files read for their text: the values of one top-level string column
 * (BYTE_ARRAY, REQUIRED or OPTIONAL; nulls skipped), row group by row group, in row order, as
 * the datasets on the Hugging Face Hub ship them (a "text" column, Snappy or Zstandard
 * pages, dictionary-encoded).
 *
 * Read: the footer (FileMetaData in Thrift's compact protocol), data pages v1 and v2 and
 * dictionary pages; the encodings PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY,
 * DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY (with RLE / bit-packed levels); the codecs
 * UNCOMPRESSED, SNAPPY, GZIP, ZSTD, LZ4_RAW and BROTLI. Anything else (another codec or
 * encoding, a column in another file, a nested or repeated column) is an error sentence naming
 * the file and what it found, never a silent skip. Every length and count in the file is checked
 * against the bytes that hold it before it is used, so a damaged or hostile file gives a sentence
 * (with the byte offset where one applies), never a crash; fuzz_parquet feeds it arbitrary bytes.
 */
#ifndef QT_PARQUET_H
#define QT_PARQUET_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/err.h"

typedef struct ParquetStr {
    const char *p;
    size_t n;
} ParquetStr;

typedef struct Parquet Parquet;

/* Opens the size bytes at data (kept, not copied: a mapped file), `name` naming them in
 * sentences, for the string column `column`: checks the magic bytes, the footer, the schema
 * (the column exists at the top level and holds strings) and that every row group's chunk of
 * it lies inside the file. A missing column is a sentence listing the columns there are. */
int parquet_open(Parquet **pq, const void *data, size_t size, const char *name, const char *column,
                 Err *err);
void parquet_close(Parquet *pq);
int parquet_row_groups(const Parquet *pq);
/* The file offset where row group g's chunk of the column ends (for progress). */
int64_t parquet_group_end(const Parquet *pq, int g);

/* The non-null values of row group g, in row order: (*vals)[0 .. *n). They point into the file
 * or into pages decompressed here, valid until the next call or parquet_close. */
int parquet_read_group(Parquet *pq, int g, const ParquetStr **vals, int64_t *n, Err *err);

/* Conversations in a Parquet file, the shape of the chat datasets on the Hub: a top-level list
 * column (`column`, e.g. "messages") whose elements are structures with string fields "role"
 * and "content", and optionally the reasoning fields "reasoning_content", "thinking",
 * "reasoning", and "tool_calls", a list of calls whose "name" and "arguments" strings lie in
 * the call or in its "function" structure (each list a 3-level LIST as pyarrow writes it, with
 * the list/element or the older list/item names, or a 2-level repeated group). fn gets each
 * row's messages in order, a null role or content as p = NULL, per message the first reasoning
 * field that is not null (as transformers takes them) or p = NULL, and per message its tool
 * calls as the JSON the JSON Lines reader would parse (an array of {"function": {"name",
 * "arguments"}} or {"name", "arguments"}, nulls as JSON null; other fields of a call are not
 * read), or NULL where tool_calls is null; valid while fn runs. A row whose list is null or
 * empty gets n = 0. Rows count from 0 over the whole file. Any other element field is an error
 * sentence (it would be lost), as are a column of another shape and fields whose levels
 * disagree. */
typedef int (*ParquetConvFn)(void *ctx, int64_t row, const ParquetStr *roles,
                             const ParquetStr *contents, const ParquetStr *reasonings,
                             const json_t *const *tool_calls, int64_t n, Err *err);
int parquet_read_conversations(const void *data, size_t size, const char *name, const char *column,
                               ParquetConvFn fn, void *ctx, Err *err);

/* Rows of top-level string columns cols[0 .. ncols) read side by side: fn gets each row's
 * values, vals[k] of column k (p = NULL where the value is null, or where column k is absent
 * and not required[k]). A required column that is absent is a sentence listing the columns
 * there are; a column that is not one string a row is a sentence too. */
typedef int (*ParquetRowFn)(void *ctx, int64_t row, const ParquetStr *vals, Err *err);
int parquet_read_rows(const void *data, size_t size, const char *name, const char *const *cols,
                      const int *required, int ncols, ParquetRowFn fn, void *ctx, Err *err);

/* Like parquet_read_group, but hands the values to fn in batches as the pages are read (a few
 * thousand values, or 64 MiB of pages, at a time), releasing each batch's pages once fn
 * returns: a group costs a batch's memory, not the whole group's (pyarrow's default row group
 * of a million documents is gigabytes of text). */
typedef int (*ParquetBatchFn)(void *ctx, const ParquetStr *vals, int64_t n, Err *err);
int parquet_stream_group(Parquet *pq, int g, ParquetBatchFn fn, void *ctx, Err *err);

/* *has = 1 when the file has a top-level column named `column` (0 when not). */
int parquet_has_column(const void *data, size_t size, const char *name, const char *column,
                       int *has, Err *err);

/* The string column `column` of the Parquet bytes data[0..size) (`name` in sentences), every
 * row group streamed to fn in turn (parquet_stream_group); group_done (NULL: none) hears after
 * each group the file offset where it ends (for progress). */
int parquet_stream_column(const void *data, size_t size, const char *name, const char *column,
                          ParquetBatchFn fn, void (*group_done)(void *ctx, int64_t end), void *ctx,
                          Err *err);

/* Whether a file name ends in .parquet. */
int parquet_is_name(const char *path);

#endif
