/* Parquet string columns (see parquet.h). The format: "PAR1", the column chunks, the footer
 * (FileMetaData, Thrift compact protocol), its length (4 bytes, little-endian), "PAR1". */
#include "text/parquet.h"

#include <brotli/decode.h>
#include <jansson.h>
#include <lz4.h>
#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "core/strutil.h"
#include "text/chat_template.h"

/* Limits that keep a hostile file from asking for unbounded memory: a page's declared
 * uncompressed size, and the values of one page and of one row group's chunk. */
#define PQ_MAX_PAGE ((int64_t)1 << 30)
#define PQ_MAX_PAGE_VALUES ((int64_t)1 << 24)
#define PQ_MAX_GROUP_VALUES ((int64_t)1 << 26)
#define PQ_MAX_DEPTH 32

enum {
    T_STOP,
    T_TRUE,
    T_FALSE,
    T_BYTE,
    T_I16,
    T_I32,
    T_I64,
    T_DOUBLE,
    T_BINARY,
    T_LIST,
    T_SET,
    T_MAP,
    T_STRUCT
};
enum { TYPE_BYTE_ARRAY = 6 };
enum { REP_REQUIRED, REP_OPTIONAL, REP_REPEATED };
enum { PAGE_DATA, PAGE_INDEX, PAGE_DICTIONARY, PAGE_DATA_V2 };
enum {
    ENC_PLAIN = 0,
    ENC_PLAIN_DICTIONARY = 2,
    ENC_RLE = 3,
    ENC_DELTA_LENGTH_BYTE_ARRAY = 6,
    ENC_DELTA_BYTE_ARRAY = 7,
    ENC_RLE_DICTIONARY = 8
};
enum {
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_GZIP,
    CODEC_LZO,
    CODEC_BROTLI,
    CODEC_LZ4,
    CODEC_ZSTD,
    CODEC_LZ4_RAW
};

static const char *const CODEC_NAMES[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                                          "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
static const char *const ENCODING_NAMES[] = {
    "PLAIN",          "GROUP_VAR_INT",       "PLAIN_DICTIONARY",        "RLE",
    "BIT_PACKED",     "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
    "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};

static const char *const TYPE_NAMES[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                         "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};

/* A 4-byte little-endian length (the footer's, a PLAIN string's, v1 levels'). */
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static const char *codec_name(int64_t c) {
    return c >= 0 && c < 8 ? CODEC_NAMES[c] : "an unknown codec";
}
static const char *encoding_name(int64_t e) {
    return e >= 0 && e < 10 ? ENCODING_NAMES[e] : "an unknown encoding";
}

/* ---- Thrift compact protocol ------------------------------------------------------------- */

typedef struct Rd {
    const uint8_t *base, *p, *end; /* base: the file's first byte, for offsets in sentences */
    const char *name;
    Err *err;
    int depth;
} Rd;

static int bad(Rd *r, const char *what) {
    return err_set(r->err, "%s: malformed Parquet metadata at byte %lld: %s", r->name,
                   (long long)(r->p - r->base), what);
}

static int rd_varint(Rd *r, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return bad(r, "a number runs past the end");
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return bad(r, "a number of more than 10 bytes");
}

static int rd_zigzag(Rd *r, int64_t *out) {
    uint64_t u;
    if (rd_varint(r, &u)) return -1;
    *out = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
    return 0;
}

static int rd_binary(Rd *r, const uint8_t **p, size_t *n) {
    uint64_t len;
    *p = NULL;
    *n = 0;
    if (rd_varint(r, &len)) return -1;
    if (len > (uint64_t)(r->end - r->p)) return bad(r, "a string runs past the end");
    *p = r->p;
    *n = (size_t)len;
    r->p += len;
    return 0;
}

static int rd_list_header(Rd *r, int64_t *n, int *etype) {
    if (r->p >= r->end) return bad(r, "a list header runs past the end");
    uint8_t h = *r->p++;
    *etype = h & 0x0f;
    uint64_t size = h >> 4;
    if (size == 15 && rd_varint(r, &size)) return -1;
    /* Every element takes at least one byte (a boolean list packs one a byte too). */
    if (size > (uint64_t)(r->end - r->p)) return bad(r, "a list longer than its bytes");
    *n = (int64_t)size;
    return 0;
}

static int rd_skip(Rd *r, int type);

static int rd_skip_struct(Rd *r) {
    if (++r->depth > PQ_MAX_DEPTH) return bad(r, "structures nested too deep");
    for (;;) {
        if (r->p >= r->end) return bad(r, "a structure runs past the end");
        uint8_t h = *r->p++;
        int type = h & 0x0f;
        if (type == T_STOP) break;
        if (!(h >> 4)) {
            int64_t id;
            if (rd_zigzag(r, &id)) return -1;
        }
        if (rd_skip(r, type)) return -1;
    }
    r->depth--;
    return 0;
}

static int rd_skip(Rd *r, int type) {
    uint64_t u;
    const uint8_t *p;
    size_t n;
    switch (type) {
    case T_TRUE:
    case T_FALSE:
        return 0;
    case T_BYTE:
        if (r->p >= r->end) return bad(r, "a byte runs past the end");
        r->p++;
        return 0;
    case T_I16:
    case T_I32:
    case T_I64:
        return rd_varint(r, &u);
    case T_DOUBLE:
        if (r->end - r->p < 8) return bad(r, "a double runs past the end");
        r->p += 8;
        return 0;
    case T_BINARY:
        return rd_binary(r, &p, &n);
    case T_LIST:
    case T_SET: {
        int64_t count;
        int et;
        if (rd_list_header(r, &count, &et)) return -1;
        /* A list's booleans take a byte each. */
        int bools = et == T_TRUE || et == T_FALSE;
        if (bools && count > r->end - r->p) return bad(r, "a list runs past the end");
        if (bools) {
            r->p += count;
            return 0;
        }
        for (int64_t i = 0; i < count; i++)
            if (rd_skip(r, et)) return -1;
        return 0;
    }
    case T_MAP: {
        uint64_t count;
        if (rd_varint(r, &count)) return -1;
        if (count == 0) return 0;
        if (count > (uint64_t)(r->end - r->p)) return bad(r, "a map longer than its bytes");
        if (r->p >= r->end) return bad(r, "a map header runs past the end");
        uint8_t kv = *r->p++;
        for (uint64_t i = 0; i < count; i++)
            if (rd_skip(r, kv >> 4) || rd_skip(r, kv & 0x0f)) return -1;
        return 0;
    }
    case T_STRUCT:
        return rd_skip_struct(r);
    default:
        return bad(r, "an unknown field type");
    }
}

/* The next field of a structure: *id and *type, or *type = T_STOP at its end. */
static int rd_field(Rd *r, int16_t *last, int *id, int *type) {
    *id = 0;
    *type = T_STOP;
    if (r->p >= r->end) return bad(r, "a structure runs past the end");
    uint8_t h = *r->p++;
    *type = h & 0x0f;
    if (*type == T_STOP) return 0;
    if (h >> 4) {
        *id = *last + (h >> 4);
    } else {
        int64_t v;
        if (rd_zigzag(r, &v)) return -1;
        *id = (int)v;
    }
    *last = (int16_t)*id;
    return 0;
}

/* An integer field of any integer type. */
static int rd_int(Rd *r, int type, int64_t *out) {
    if (type == T_I16 || type == T_I32 || type == T_I64) return rd_zigzag(r, out);
    if (type == T_BYTE) {
        if (r->p >= r->end) return bad(r, "a byte runs past the end");
        *out = (int8_t)*r->p++;
        return 0;
    }
    return bad(r, "an integer field of another type");
}

/* ---- the footer ---------------------------------------------------------------------------- */

typedef struct Chunk {
    int64_t codec, type, num_values, data_off, dict_off, size;
    int has_dict, external, found;
} Chunk;

typedef struct SchemaEl {
    const uint8_t *name;
    size_t name_len;
    int64_t type, repetition, num_children;
} SchemaEl;

struct Parquet {
    const uint8_t *data;
    size_t size;
    char *name;
    char *column; /* the path joined with dots, for sentences */
    char **path;  /* the leaf's names from the top level down */
    int depth;
    int max_rep, max_def; /* of the leaf: its REPEATED ancestors, its non-REQUIRED ones */
    int keep_levels;      /* store every level (parquet_read_group_levels) */
    SchemaEl *els;        /* the schema in preorder (names point into data) */
    int64_t n_els;
    Chunk *chunks; /* one a row group: the column's */
    int n_groups;
    /* The current group's values, levels and the buffers they point into. */
    ParquetStr *vals;
    int64_t n_vals, cap_vals;
    uint8_t *rep, *def;
    int64_t n_levels, cap_levels;
    uint8_t **bufs;
    int n_bufs, cap_bufs;
    int n_keep; /* bufs[0 .. n_keep) hold the dictionary: kept until the group ends */
};

static int read_schema_el(Rd *r, SchemaEl *e) {
    memset(e, 0, sizeof *e);
    e->type = -1;
    int16_t last = 0;
    for (;;) {
        int id, type;
        if (rd_field(r, &last, &id, &type)) return -1;
        if (type == T_STOP) return 0;
        if (id == 1 && type != T_BINARY) {
            if (rd_int(r, type, &e->type)) return -1;
        } else if (id == 3 && type != T_BINARY) {
            if (rd_int(r, type, &e->repetition)) return -1;
        } else if (id == 4 && type == T_BINARY) {
            if (rd_binary(r, &e->name, &e->name_len)) return -1;
        } else if (id == 5 && type != T_BINARY) {
            if (rd_int(r, type, &e->num_children)) return -1;
        } else if (rd_skip(r, type)) {
            return -1;
        }
    }
}

static int name_is(const uint8_t *s, size_t len, const char *want) {
    return len == strlen(want) && !memcmp(s, want, len);
}

/* ColumnMetaData: the column's path must be path[0 .. depth). */
static int read_column_meta(Rd *r, char *const *path, int depth, Chunk *c) {
    int16_t last = 0;
    int path_ok = 0;
    for (;;) {
        int id, type;
        if (rd_field(r, &last, &id, &type)) return -1;
        if (type == T_STOP) break;
        if (id == 3 && type == T_LIST) {
            int64_t n;
            int et;
            if (rd_list_header(r, &n, &et)) return -1;
            path_ok = n == depth && et == T_BINARY;
            for (int64_t i = 0; i < n; i++) {
                const uint8_t *s;
                size_t len;
                if (et != T_BINARY) {
                    if (rd_skip(r, et)) return -1;
                    continue;
                }
                if (rd_binary(r, &s, &len)) return -1;
                if (i < depth && !name_is(s, len, path[i])) path_ok = 0;
            }
            continue;
        }
        int64_t v = 0;
        int want = id == 1 || id == 4 || id == 5 || id == 7 || id == 9 || id == 11;
        if (!want || type == T_BINARY || type == T_LIST || type == T_STRUCT || type == T_MAP) {
            if (rd_skip(r, type)) return -1;
            continue;
        }
        if (rd_int(r, type, &v)) return -1;
        switch (id) {
        case 1:
            c->type = v;
            break;
        case 4:
            c->codec = v;
            break;
        case 5:
            c->num_values = v;
            break;
        case 7:
            c->size = v;
            break;
        case 9:
            c->data_off = v;
            break;
        case 11:
            c->dict_off = v;
            c->has_dict = 1;
            break;
        }
    }
    return path_ok ? 1 : 0;
}

static int read_column_chunk(Rd *r, char *const *path, int depth, Chunk *out) {
    int16_t last = 0;
    Chunk c = {0};
    int external = 0, mine = 0;
    for (;;) {
        int id, type;
        if (rd_field(r, &last, &id, &type)) return -1;
        if (type == T_STOP) break;
        if (id == 1 && type == T_BINARY) {
            const uint8_t *s;
            size_t n;
            if (rd_binary(r, &s, &n)) return -1;
            external = n > 0;
        } else if (id == 3 && type == T_STRUCT) {
            if (++r->depth > PQ_MAX_DEPTH) return bad(r, "structures nested too deep");
            mine = read_column_meta(r, path, depth, &c);
            r->depth--;
            if (mine < 0) return -1;
        } else if (rd_skip(r, type)) {
            return -1;
        }
    }
    if (mine) {
        if (out->found) return bad(r, "a row group holds the column twice");
        *out = c;
        out->external = external;
        out->found = 1;
    }
    return 0;
}

static int read_row_group(Rd *r, char *const *path, int depth, Chunk *out) {
    int16_t last = 0;
    memset(out, 0, sizeof *out);
    for (;;) {
        int id, type;
        if (rd_field(r, &last, &id, &type)) return -1;
        if (type == T_STOP) return 0;
        if (id == 1 && type == T_LIST) {
            int64_t n;
            int et;
            if (rd_list_header(r, &n, &et)) return -1;
            for (int64_t i = 0; i < n; i++) {
                if (et != T_STRUCT) {
                    if (rd_skip(r, et)) return -1;
                    continue;
                }
                if (++r->depth > PQ_MAX_DEPTH) return bad(r, "structures nested too deep");
                if (read_column_chunk(r, path, depth, out)) return -1;
                r->depth--;
            }
        } else if (rd_skip(r, type)) {
            return -1;
        }
    }
}

/* The index after element i's subtree (preorder). */
static int64_t subtree_end(const SchemaEl *els, int64_t n, int64_t i) {
    int64_t pending = 1;
    while (pending > 0 && i < n) {
        pending += (els[i].num_children > 0 ? els[i].num_children : 0) - 1;
        i++;
    }
    return i;
}

/* The child of element `parent` named name[0 .. len), or -1. */
static int64_t child_named(const SchemaEl *els, int64_t n, int64_t parent, const char *name) {
    int64_t i = parent + 1;
    for (int64_t k = 0; k < els[parent].num_children && i < n; k++) {
        if (name_is(els[i].name, els[i].name_len, name)) return i;
        i = subtree_end(els, n, i);
    }
    return -1;
}

/* The children of element `parent`, as "a, b, c" for sentences. */
static void list_children(const SchemaEl *els, int64_t n, int64_t parent, char *out, size_t cap) {
    size_t len = 0;
    out[0] = 0;
    int64_t i = parent + 1;
    for (int64_t k = 0; k < els[parent].num_children && i < n; k++) {
        int written =
            snprintf(out + len, cap - len, "%s%.*s", k ? ", " : "",
                     (int)(els[i].name_len > 60 ? 60 : els[i].name_len), (const char *)els[i].name);
        if (written < 0 || (size_t)written >= cap - len) break;
        len += (size_t)written;
        i = subtree_end(els, n, i);
    }
}

/* Finds the leaf pq->path in the schema and its maximum repetition and definition levels; the
 * leaf must hold strings. text_column: the path is one top-level column that must hold one
 * string a row (no list, no repeated field). */
static int resolve_path(Parquet *pq, int text_column, Err *err) {
    const SchemaEl *els = pq->els;
    int64_t n = pq->n_els;
    if (n < 1 || els[0].num_children < 1)
        return err_set(err, "%s: the Parquet schema has no columns", pq->name);
    int64_t at = 0;
    for (int d = 0; d < pq->depth; d++) {
        int64_t next = child_named(els, n, at, pq->path[d]);
        if (next < 0) {
            char cols[400];
            list_children(els, n, at, cols, sizeof cols);
            if (d == 0)
                return err_set(err, "%s: no column \"%s\" in the Parquet file (its columns: %s)",
                               pq->name, pq->path[0], cols);
            return err_set(err, "%s: no field \"%s\" under \"%.*s\" (its fields: %s)", pq->name,
                           pq->path[d], (int)(els[at].name_len > 60 ? 60 : els[at].name_len),
                           (const char *)els[at].name, cols);
        }
        at = next;
        if (els[at].repetition == REP_REPEATED) pq->max_rep++;
        if (els[at].repetition != REP_REQUIRED) pq->max_def++;
    }
    const SchemaEl *e = &els[at];
    if (text_column && (e->num_children > 0 || e->repetition == REP_REPEATED))
        return err_set(err,
                       "%s: column \"%s\" is %s, where qtitan reads a column of one string a row",
                       pq->name, pq->column,
                       e->num_children > 0 ? "a list or a group of fields" : "a repeated field");
    if (e->num_children > 0)
        return err_set(err, "%s: \"%s\" is a group of fields, not strings", pq->name, pq->column);
    if (e->type != TYPE_BYTE_ARRAY)
        return err_set(err, "%s: column \"%s\" holds %s values, not strings (BYTE_ARRAY)", pq->name,
                       pq->column,
                       e->type >= 0 && e->type < 8 ? TYPE_NAMES[e->type]
                                                   : "values of an unknown type");
    if (pq->max_def > 8 || pq->max_rep > 8)
        return err_set(err, "%s: \"%s\" is nested more than 8 levels deep", pq->name, pq->column);
    return 0;
}

static int read_footer(Parquet *pq, const uint8_t *meta, size_t len, Err *err) {
    Rd r = {pq->data, meta, meta + len, pq->name, err, 0};
    int16_t last = 0;
    SchemaEl *els = NULL;
    int64_t n_els = 0;
    int rc = 0, have_schema = 0;
    while (rc == 0) {
        int id, type;
        if ((rc = rd_field(&r, &last, &id, &type))) break;
        if (type == T_STOP) break;
        if (id == 2 && type == T_LIST && !have_schema) {
            int et;
            if ((rc = rd_list_header(&r, &n_els, &et))) break;
            if (et != T_STRUCT) {
                rc = bad(&r, "the schema is not a list of structures");
                break;
            }
            have_schema = 1;
            els = xcalloc((size_t)(n_els ? n_els : 1), sizeof *els);
            for (int64_t i = 0; i < n_els && rc == 0; i++)
                rc = read_schema_el(&r, &els[i]);
        } else if (id == 4 && type == T_LIST && !pq->chunks) {
            int64_t n;
            int et;
            if ((rc = rd_list_header(&r, &n, &et))) break;
            if (et != T_STRUCT) {
                rc = bad(&r, "the row groups are not a list of structures");
                break;
            }
            if (n > INT32_MAX) {
                rc = bad(&r, "too many row groups");
                break;
            }
            pq->chunks = xcalloc((size_t)(n ? n : 1), sizeof *pq->chunks);
            pq->n_groups = (int)n;
            for (int64_t g = 0; g < n && rc == 0; g++)
                rc = read_row_group(&r, pq->path, pq->depth, &pq->chunks[g]);
        } else {
            rc = rd_skip(&r, type);
        }
    }
    if (rc == 0 && !have_schema)
        rc = err_set(err, "%s: the Parquet footer has no schema", pq->name);
    pq->els = els;
    pq->n_els = n_els;
    return rc;
}

int parquet_is_name(const char *path) {
    return str_ends_with(path, ".parquet");
}

/* Opens data for the leaf path[0 .. depth) (see parquet_open). */
static int open_path(Parquet **out, const void *data, size_t size, const char *name,
                     char *const *path, int depth, int text_column, Err *err) {
    *out = NULL;
    const uint8_t *d = data;
    if (size < 12 || memcmp(d, "PAR1", 4) || memcmp(d + size - 4, "PAR1", 4))
        return err_set(err,
                       "%s: not a Parquet file (it must start and end with the bytes PAR1; %zu "
                       "bytes)",
                       name, size);
    uint32_t meta_len = le32(d + size - 8);
    if (meta_len > size - 12)
        return err_set(err, "%s: the Parquet footer length %u exceeds the file (%zu bytes)", name,
                       meta_len, size);
    if (meta_len == 0) return err_set(err, "%s: the Parquet footer is empty", name);
    Parquet *pq = xcalloc(1, sizeof *pq);
    pq->data = d;
    pq->size = size;
    pq->name = xstrdup(name);
    pq->depth = depth;
    pq->path = xcalloc((size_t)depth, sizeof *pq->path);
    size_t joined = 1;
    for (int i = 0; i < depth; i++) {
        pq->path[i] = xstrdup(path[i]);
        joined += strlen(path[i]) + 1;
    }
    pq->column = xcalloc(joined, 1);
    for (int i = 0; i < depth; i++) {
        if (i) strcat(pq->column, ".");
        strcat(pq->column, path[i]);
    }
    const char *column = pq->column;
    int rc = read_footer(pq, d + size - 8 - meta_len, meta_len, err);
    if (rc == 0 && depth > 0) rc = resolve_path(pq, text_column, err);
    int64_t meta_start = (int64_t)(size - 8 - meta_len);
    for (int g = 0; rc == 0 && depth > 0 && g < pq->n_groups; g++) {
        Chunk *c = &pq->chunks[g];
        if (!c->found)
            rc = err_set(err, "%s: row group %d has no chunk of column \"%s\"", name, g, column);
        else if (c->external)
            rc = err_set(err,
                         "%s: row group %d keeps column \"%s\" in another file, which qtitan "
                         "does not read",
                         name, g, column);
        else if (c->type != TYPE_BYTE_ARRAY)
            rc = err_set(err, "%s: row group %d's chunk of \"%s\" is not of strings", name, g,
                         column);
        else if (c->codec != CODEC_NONE && c->codec != CODEC_SNAPPY && c->codec != CODEC_GZIP &&
                 c->codec != CODEC_ZSTD && c->codec != CODEC_LZ4_RAW && c->codec != CODEC_BROTLI)
            rc = err_set(err,
                         "%s: column \"%s\" is compressed with %s; qtitan reads uncompressed, "
                         "SNAPPY, GZIP, ZSTD, LZ4_RAW and BROTLI Parquet",
                         name, column, codec_name(c->codec));
        if (rc) break;
        if (c->num_values == 0) { /* an empty row group's chunk: no page is read (pyarrow writes
                                     offset 0 for it) */
            c->data_off = 4;
            c->size = 0;
            continue;
        }
        int64_t start =
            c->has_dict && c->dict_off > 0 && c->dict_off < c->data_off ? c->dict_off : c->data_off;
        if (start < 4 || c->size < 0 || start > meta_start || c->size > meta_start - start ||
            c->num_values < 0)
            rc = err_set(err,
                         "%s: row group %d's chunk of \"%s\" (bytes %lld + %lld) lies outside "
                         "the column data (bytes 4 to %lld)",
                         name, g, column, (long long)start, (long long)c->size,
                         (long long)meta_start);
        else if (c->num_values > PQ_MAX_GROUP_VALUES)
            rc = err_set(err,
                         "%s: row group %d holds %lld values of \"%s\"; qtitan reads row groups "
                         "of at most %lld",
                         name, g, (long long)c->num_values, column, (long long)PQ_MAX_GROUP_VALUES);
        c->data_off = start; /* from here on: where the chunk's pages start */
    }
    if (rc) {
        parquet_close(pq);
        return -1;
    }
    *out = pq;
    return 0;
}

int parquet_open(Parquet **out, const void *data, size_t size, const char *name, const char *column,
                 Err *err) {
    char *path[1] = {(char *)column};
    return open_path(out, data, size, name, path, 1, 1, err);
}

static void release_group(Parquet *pq) {
    for (int i = 0; i < pq->n_bufs; i++)
        free(pq->bufs[i]);
    pq->n_bufs = 0;
    pq->n_keep = 0;
    pq->n_vals = 0;
    pq->n_levels = 0;
}

/* Streaming (parquet_stream_group): hands the values so far to fn and releases the pages they
 * point into, all but the dictionary's. */
static int flush_batch(Parquet *pq, ParquetBatchFn fn, void *ctx, Err *err) {
    int rc = pq->n_vals ? fn(ctx, pq->vals, pq->n_vals, err) : 0;
    for (int i = pq->n_keep; i < pq->n_bufs; i++)
        free(pq->bufs[i]);
    pq->n_bufs = pq->n_keep;
    pq->n_vals = 0;
    return rc;
}

void parquet_close(Parquet *pq) {
    if (!pq) return;
    release_group(pq);
    free(pq->bufs);
    free(pq->vals);
    free(pq->chunks);
    free(pq->els);
    free(pq->rep);
    free(pq->def);
    for (int i = 0; i < pq->depth; i++)
        free(pq->path[i]);
    free(pq->path);
    free(pq->name);
    free(pq->column);
    free(pq);
}

int parquet_row_groups(const Parquet *pq) {
    return pq->n_groups;
}

int64_t parquet_group_end(const Parquet *pq, int g) {
    return pq->chunks[g].data_off + pq->chunks[g].size;
}

/* ---- pages --------------------------------------------------------------------------------- */

typedef struct PageHeader {
    int64_t type, uncompressed, compressed;
    int64_t num_values, encoding;        /* data (v1, v2) and dictionary pages */
    int64_t num_nulls, def_len, rep_len; /* v2 */
    int v2_compressed;
} PageHeader;

static int read_page_sub(Rd *r, PageHeader *h, int kind) {
    if (++r->depth > PQ_MAX_DEPTH) return bad(r, "structures nested too deep");
    int16_t last = 0;
    for (;;) {
        int id, type;
        if (rd_field(r, &last, &id, &type)) return -1;
        if (type == T_STOP) break;
        int64_t v;
        int is_int = type == T_I16 || type == T_I32 || type == T_I64 || type == T_BYTE;
        if (kind == 8 && id == 7 && (type == T_TRUE || type == T_FALSE)) {
            h->v2_compressed = type == T_TRUE;
            continue;
        }
        if (!is_int) {
            if (rd_skip(r, type)) return -1;
            continue;
        }
        if (rd_int(r, type, &v)) return -1;
        if (id == 1) h->num_values = v;
        if (kind == 5 && id == 2) h->encoding = v;
        if (kind == 7 && id == 2) h->encoding = v;
        if (kind == 8) {
            if (id == 2) h->num_nulls = v;
            if (id == 4) h->encoding = v;
            if (id == 5) h->def_len = v;
            if (id == 6) h->rep_len = v;
        }
    }
    r->depth--;
    return 0;
}

static int read_page_header(Rd *r, PageHeader *h) {
    memset(h, 0, sizeof *h);
    h->type = -1;
    h->v2_compressed = 1;
    int16_t last = 0;
    for (;;) {
        int id, type;
        if (rd_field(r, &last, &id, &type)) return -1;
        if (type == T_STOP) return 0;
        if ((id == 5 || id == 7 || id == 8) && type == T_STRUCT) {
            if (read_page_sub(r, h, id)) return -1;
        } else if (id >= 1 && id <= 3 && type != T_STRUCT && type != T_BINARY && type != T_LIST) {
            int64_t v;
            if (rd_int(r, type, &v)) return -1;
            if (id == 1) h->type = v;
            if (id == 2) h->uncompressed = v;
            if (id == 3) h->compressed = v;
        } else if (rd_skip(r, type)) {
            return -1;
        }
    }
}

/* Keeps buf (malloc'd, pages' bytes) with the current group: freed when the group is released
 * (or, streaming, with its batch). */
static void keep_buf(Parquet *pq, uint8_t *buf) {
    if (pq->n_bufs == pq->cap_bufs) {
        pq->cap_bufs = pq->cap_bufs ? 2 * pq->cap_bufs : 16;
        pq->bufs = xrealloc(pq->bufs, (size_t)pq->cap_bufs * sizeof *pq->bufs);
    }
    pq->bufs[pq->n_bufs++] = buf;
}

/* Decompresses n bytes at src with codec into a buffer of exactly want bytes, kept with the
 * group; *out points at the bytes (src itself when uncompressed). */
static int decompress(Parquet *pq, int64_t codec, const uint8_t *src, size_t n, size_t want,
                      const uint8_t **out, int64_t at, Err *err) {
    if (codec == CODEC_NONE) {
        if (n != want)
            return err_set(err,
                           "%s: the uncompressed page at byte %lld holds %zu bytes where its "
                           "header says %zu",
                           pq->name, (long long)at, n, want);
        *out = src;
        return 0;
    }
    if (codec == CODEC_SNAPPY) {
        size_t len;
        if (snappy_uncompressed_length((const char *)src, n, &len) != SNAPPY_OK || len != want)
            return err_set(err,
                           "%s: the Snappy page at byte %lld does not hold the %zu bytes its "
                           "header says",
                           pq->name, (long long)at, want);
    }
    uint8_t *buf = xmalloc(want ? want : 1);
    int ok = 0;
    if (codec == CODEC_SNAPPY) {
        size_t len = want;
        ok = snappy_uncompress((const char *)src, n, (char *)buf, &len) == SNAPPY_OK && len == want;
    } else if (codec == CODEC_ZSTD) {
        size_t got = ZSTD_decompress(buf, want, src, n);
        ok = !ZSTD_isError(got) && got == want;
    } else if (codec == CODEC_LZ4_RAW) {
        ok = n <= INT32_MAX && want <= INT32_MAX &&
             LZ4_decompress_safe((const char *)src, (char *)buf, (int)n, (int)want) == (int)want;
    } else if (codec == CODEC_BROTLI) {
        size_t got = want;
        ok = BrotliDecoderDecompress(n, src, &got, buf) == BROTLI_DECODER_RESULT_SUCCESS &&
             got == want;
    } else if (codec == CODEC_GZIP) {
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, 15 + 32) == Z_OK) {
            z.next_in = (Bytef *)src;
            z.avail_in = (uInt)n;
            z.next_out = buf;
            z.avail_out = (uInt)want;
            int zr = inflate(&z, Z_FINISH);
            ok = zr == Z_STREAM_END && z.total_out == want;
            inflateEnd(&z);
        }
    }
    if (!ok) {
        free(buf);
        return err_set(err, "%s: the %s page at byte %lld does not decompress to %zu bytes",
                       pq->name, codec_name(codec), (long long)at, want);
    }
    keep_buf(pq, buf);
    *out = buf;
    return 0;
}

/* PLAIN byte arrays: n values, each a 4-byte little-endian length and its bytes. */
static int plain_values(Parquet *pq, const uint8_t *p, const uint8_t *end, int64_t n,
                        ParquetStr *out, int64_t at, Err *err) {
    for (int64_t i = 0; i < n; i++) {
        if (end - p < 4)
            return err_set(err, "%s: the page at byte %lld ends inside value %lld of %lld",
                           pq->name, (long long)at, (long long)i, (long long)n);
        uint32_t len = le32(p);
        p += 4;
        if (len > (uint64_t)(end - p))
            return err_set(err,
                           "%s: value %lld of the page at byte %lld is %u bytes long, past the "
                           "page's end",
                           pq->name, (long long)i, (long long)at, len);
        out[i] = (ParquetStr){(const char *)p, len};
        p += len;
    }
    return 0;
}

/* DELTA_BINARY_PACKED integers: a header (values per block, miniblocks per block, the count,
 * the first value), then blocks of a minimum delta, one bit width per miniblock and the
 * miniblocks' deltas bit-packed from the least significant bit. Decodes n values into out
 * (wrapping 64-bit sums, as the format defines) and sets *p past the last miniblock it read. */
static int delta_ints(const uint8_t **p, const uint8_t *end, int64_t n, int64_t *out) {
    Rd r = {*p, *p, end, "", NULL, 0};
    Err ignore;
    r.err = &ignore;
    uint64_t block, minis, count;
    int64_t first;
    if (rd_varint(&r, &block) || rd_varint(&r, &minis) || rd_varint(&r, &count) ||
        rd_zigzag(&r, &first))
        return -1;
    if (block == 0 || block % 128 || minis == 0 || block % minis || (block / minis) % 32 ||
        block > (1u << 20) || (int64_t)count != n)
        return -1;
    uint64_t per_mini = block / minis;
    if (n > 0) out[0] = first;
    int64_t got = n > 0;
    uint64_t prev = (uint64_t)first;
    while (got < n) {
        int64_t min_delta;
        if (rd_zigzag(&r, &min_delta)) return -1;
        if ((uint64_t)(r.end - r.p) < minis) return -1;
        const uint8_t *widths = r.p;
        r.p += minis;
        for (uint64_t m = 0; m < minis && got < n; m++) {
            int w = widths[m];
            if (w > 64) return -1;
            uint64_t bytes = per_mini * (uint64_t)w / 8;
            if ((uint64_t)(r.end - r.p) < bytes) return -1;
            uint64_t bit = 0;
            for (uint64_t k = 0; k < per_mini && got < n; k++) {
                uint64_t x = 0;
                for (int b = 0; b < w; b++, bit++)
                    x |= (uint64_t)((r.p[bit / 8] >> (bit % 8)) & 1) << b;
                prev += (uint64_t)min_delta + x;
                out[got++] = (int64_t)prev;
            }
            r.p += bytes;
        }
    }
    *p = r.p;
    return 0;
}

/* DELTA_LENGTH_BYTE_ARRAY (lengths, then the bytes end to end) and DELTA_BYTE_ARRAY (prefix
 * lengths shared with the previous value, then the suffixes as DELTA_LENGTH_BYTE_ARRAY): n values
 * into out; DELTA_BYTE_ARRAY's values are assembled in a buffer kept with the group, at most
 * PQ_MAX_PAGE bytes. */
static int delta_values(Parquet *pq, int enc, const uint8_t *p, const uint8_t *end, int64_t n,
                        ParquetStr *out, int64_t at, Err *err) {
    int64_t *pre = NULL, *len = xmalloc((size_t)(n ? n : 1) * sizeof *len);
    int rc = 0;
    if (enc == ENC_DELTA_BYTE_ARRAY) {
        pre = xmalloc((size_t)(n ? n : 1) * sizeof *pre);
        rc = delta_ints(&p, end, n, pre);
    }
    if (rc == 0) rc = delta_ints(&p, end, n, len);
    uint64_t total = 0;
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        if (len[i] < 0 || (uint64_t)len[i] > (uint64_t)(end - p) - total)
            rc = -1;
        else
            total += (uint64_t)len[i];
    }
    if (rc) {
        free(pre);
        free(len);
        return err_set(err, "%s: the DELTA-encoded strings of the page at byte %lld are damaged",
                       pq->name, (long long)at);
    }
    if (enc == ENC_DELTA_LENGTH_BYTE_ARRAY) {
        for (int64_t i = 0; i < n; i++) {
            out[i] = (ParquetStr){(const char *)p, (size_t)len[i]};
            p += len[i];
        }
        free(len);
        return 0;
    }
    uint64_t size = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        uint64_t prev = i ? out[i - 1].n : 0;
        if (pre[i] < 0 || (uint64_t)pre[i] > prev || size > (uint64_t)PQ_MAX_PAGE) rc = -1;
        out[i].n = rc ? 0 : (size_t)pre[i] + (size_t)len[i];
        size += out[i].n;
    }
    if (rc || size > (uint64_t)PQ_MAX_PAGE) {
        free(pre);
        free(len);
        return err_set(err,
                       "%s: the DELTA_BYTE_ARRAY strings of the page at byte %lld are damaged or "
                       "longer than %lld bytes in all",
                       pq->name, (long long)at, (long long)PQ_MAX_PAGE);
    }
    char *buf = xmalloc(size ? size : 1), *w = buf;
    for (int64_t i = 0; i < n; i++) {
        if (pre[i]) memcpy(w, out[i - 1].p, (size_t)pre[i]);
        memcpy(w + pre[i], p, (size_t)len[i]);
        p += len[i];
        out[i].p = w;
        w += out[i].n;
    }
    keep_buf(pq, (uint8_t *)buf);
    free(pre);
    free(len);
    return 0;
}

/* The RLE / bit-packed hybrid of Parquet: runs of one repeated value, or groups of 8 values of
 * `width` bits packed from the least significant bit. */
typedef struct Hybrid {
    const uint8_t *p, *end;
    int width;
    uint64_t run;   /* values left in the current run */
    int packed;     /* the current run is bit-packed */
    uint32_t value; /* an RLE run's value */
    uint64_t bit;   /* a packed run's next bit, from p */
} Hybrid;

static int hybrid_next(Hybrid *h, uint32_t *v) {
    while (h->run == 0) {
        if (h->p >= h->end) return -1;
        uint64_t head = 0;
        int shift = 0;
        for (;;) {
            if (h->p >= h->end || shift > 56) return -1;
            uint8_t b = *h->p++;
            head |= (uint64_t)(b & 0x7f) << shift;
            shift += 7;
            if (!(b & 0x80)) break;
        }
        if (head & 1) {
            uint64_t groups = head >> 1;
            if (groups == 0 || groups > (uint64_t)(h->end - h->p) * 8 + 8) return -1;
            if (groups * (uint64_t)h->width > (uint64_t)(h->end - h->p)) return -1;
            h->packed = 1;
            h->run = groups * 8;
            h->bit = 0;
        } else {
            h->packed = 0;
            h->run = head >> 1;
            if (h->run == 0) return -1;
            int bytes = (h->width + 7) / 8;
            if (h->end - h->p < bytes) return -1;
            h->value = 0;
            for (int i = 0; i < bytes; i++)
                h->value |= (uint32_t)h->p[i] << (8 * i);
            h->p += bytes;
        }
    }
    if (h->packed) {
        uint32_t x = 0;
        for (int i = 0; i < h->width; i++, h->bit++)
            x |= (uint32_t)((h->p[h->bit / 8] >> (h->bit % 8)) & 1) << i;
        *v = x;
        if (--h->run == 0) h->p += (h->bit + 7) / 8;
    } else {
        *v = h->value;
        h->run--;
    }
    return 0;
}

static void push_value(Parquet *pq, ParquetStr s) {
    if (pq->n_vals == pq->cap_vals) {
        pq->cap_vals = pq->cap_vals ? 2 * pq->cap_vals : 1024;
        pq->vals = xrealloc(pq->vals, (size_t)pq->cap_vals * sizeof *pq->vals);
    }
    pq->vals[pq->n_vals++] = s;
}

static int bit_width(int max) {
    int w = 0;
    while (max >> w)
        w++;
    return w;
}

static void push_levels(Parquet *pq, uint32_t r, uint32_t d) {
    if (pq->n_levels == pq->cap_levels) {
        pq->cap_levels = pq->cap_levels ? 2 * pq->cap_levels : 1024;
        pq->rep = xrealloc(pq->rep, (size_t)pq->cap_levels);
        pq->def = xrealloc(pq->def, (size_t)pq->cap_levels);
    }
    pq->rep[pq->n_levels] = (uint8_t)r;
    pq->def[pq->n_levels++] = (uint8_t)d;
}

/* One data page's values (v1 or v2): its num_values entries each have a repetition level (a
 * column under a list: 0 starts a row) and a definition level (a column with optional or
 * repeated ancestors: max_def when the entry holds a value); the values are PLAIN or dictionary
 * indices. */
static int data_page(Parquet *pq, const PageHeader *h, const uint8_t *reps, size_t reps_len,
                     const uint8_t *defs, size_t defs_len, const uint8_t *vals, size_t vals_len,
                     const ParquetStr *dict, int64_t n_dict, int64_t at, Err *err) {
    int64_t n = h->num_values;
    if (n < 0 || n > PQ_MAX_PAGE_VALUES)
        return err_set(err, "%s: the page at byte %lld declares %lld values (at most %lld)",
                       pq->name, (long long)at, (long long)n, (long long)PQ_MAX_PAGE_VALUES);
    if (pq->n_levels + n > PQ_MAX_GROUP_VALUES)
        return err_set(err, "%s: a row group of more than %lld values", pq->name,
                       (long long)PQ_MAX_GROUP_VALUES);
    int64_t present = n;
    Hybrid rh = {reps, reps + reps_len, bit_width(pq->max_rep), 0, 0, 0, 0};
    Hybrid dh = {defs, defs + defs_len, bit_width(pq->max_def), 0, 0, 0, 0};
    if (pq->max_def > 0 || pq->keep_levels) {
        present = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t r = 0, d = (uint32_t)pq->max_def;
            if ((pq->max_rep > 0 && (hybrid_next(&rh, &r) || r > (uint32_t)pq->max_rep)) ||
                (pq->max_def > 0 && (hybrid_next(&dh, &d) || d > (uint32_t)pq->max_def)))
                return err_set(err,
                               "%s: the levels of the page at byte %lld are damaged (entry %lld "
                               "of %lld)",
                               pq->name, (long long)at, (long long)i, (long long)n);
            present += d == (uint32_t)pq->max_def;
            if (pq->keep_levels) push_levels(pq, r, d);
        }
    } else {
        pq->n_levels += n;
    }
    ParquetStr *v = xmalloc((size_t)(present ? present : 1) * sizeof *v);
    int rc = 0;
    if (h->encoding == ENC_PLAIN) {
        rc = plain_values(pq, vals, vals + vals_len, present, v, at, err);
    } else if (h->encoding == ENC_DELTA_LENGTH_BYTE_ARRAY || h->encoding == ENC_DELTA_BYTE_ARRAY) {
        rc = delta_values(pq, (int)h->encoding, vals, vals + vals_len, present, v, at, err);
    } else if (h->encoding == ENC_PLAIN_DICTIONARY || h->encoding == ENC_RLE_DICTIONARY) {
        if (!dict)
            rc = err_set(err, "%s: the page at byte %lld uses a dictionary the chunk lacks",
                         pq->name, (long long)at);
        else if (present > 0 && (vals_len < 1 || vals[0] > 32))
            rc = err_set(err, "%s: the page at byte %lld has no valid index bit width", pq->name,
                         (long long)at);
        Hybrid idx = {vals + 1, vals + vals_len, rc == 0 && present > 0 ? vals[0] : 0, 0, 0, 0, 0};
        for (int64_t i = 0; rc == 0 && i < present; i++) {
            uint32_t k;
            if (hybrid_next(&idx, &k) || (int64_t)k >= n_dict)
                rc = err_set(err,
                             "%s: dictionary index %lld of the page at byte %lld is damaged or "
                             "past the dictionary's %lld values",
                             pq->name, (long long)i, (long long)at, (long long)n_dict);
            else
                v[i] = dict[k];
        }
    } else {
        rc = err_set(err,
                     "%s: the page at byte %lld is encoded with %s; qtitan reads PLAIN, "
                     "dictionary and DELTA strings",
                     pq->name, (long long)at, encoding_name(h->encoding));
    }
    for (int64_t i = 0; rc == 0 && i < present; i++)
        push_value(pq, v[i]);
    free(v);
    return rc;
}

/* A batch of a streamed group: this many values, or this many bytes of pages. */
#define PQ_BATCH_VALUES 4096
#define PQ_BATCH_BYTES ((int64_t)64 << 20)

/* Reads row group g's pages; with fn, hands their values over in batches (flush_batch). */
static int read_group(Parquet *pq, int g, ParquetBatchFn fn, void *ctx, Err *err) {
    release_group(pq);
    if (g < 0 || g >= pq->n_groups)
        return err_set(err, "%s: no row group %d (it has %d)", pq->name, g, pq->n_groups);
    const Chunk *c = &pq->chunks[g];
    const uint8_t *p = pq->data + c->data_off, *end = p + c->size;
    ParquetStr *dict = NULL;
    int64_t n_dict = 0, rows = 0, batch_bytes = 0;
    int rc = 0;
    while (rc == 0 && rows < c->num_values) {
        if (fn && (pq->n_vals >= PQ_BATCH_VALUES || batch_bytes >= PQ_BATCH_BYTES)) {
            if ((rc = flush_batch(pq, fn, ctx, err))) break;
            batch_bytes = 0;
        }
        int64_t at = p - pq->data;
        if (p >= end) {
            rc = err_set(err,
                         "%s: row group %d's chunk of \"%s\" ends after %lld of its %lld values",
                         pq->name, g, pq->column, (long long)rows, (long long)c->num_values);
            break;
        }
        Rd r = {pq->data, p, end, pq->name, err, 0};
        PageHeader h;
        if ((rc = read_page_header(&r, &h))) break;
        p = r.p;
        if (h.compressed < 0 || h.compressed > end - p || h.uncompressed < 0 ||
            h.uncompressed > PQ_MAX_PAGE) {
            rc = err_set(err,
                         "%s: the page at byte %lld declares %lld bytes (%lld uncompressed), "
                         "past its chunk or over %lld",
                         pq->name, (long long)at, (long long)h.compressed,
                         (long long)h.uncompressed, (long long)PQ_MAX_PAGE);
            break;
        }
        const uint8_t *body = p;
        p += h.compressed;
        if (h.type == PAGE_DICTIONARY) {
            const uint8_t *u;
            if (h.encoding != ENC_PLAIN && h.encoding != ENC_PLAIN_DICTIONARY) {
                rc = err_set(err, "%s: the dictionary page at byte %lld is encoded with %s",
                             pq->name, (long long)at, encoding_name(h.encoding));
                break;
            }
            if (dict || h.num_values < 0 || h.num_values > h.uncompressed / 4) {
                rc = err_set(err,
                             "%s: the dictionary page at byte %lld is a second one or declares "
                             "%lld values in %lld bytes",
                             pq->name, (long long)at, (long long)h.num_values,
                             (long long)h.uncompressed);
                break;
            }
            if ((rc = decompress(pq, c->codec, body, (size_t)h.compressed, (size_t)h.uncompressed,
                                 &u, at, err)))
                break;
            n_dict = h.num_values;
            pq->n_keep = pq->n_bufs;
            dict = xmalloc((size_t)(n_dict ? n_dict : 1) * sizeof *dict);
            rc = plain_values(pq, u, u + h.uncompressed, n_dict, dict, at, err);
        } else if (h.type == PAGE_DATA) {
            const uint8_t *u;
            if ((rc = decompress(pq, c->codec, body, (size_t)h.compressed, (size_t)h.uncompressed,
                                 &u, at, err)))
                break;
            const uint8_t *q = u, *qe = u + h.uncompressed;
            /* v1: repetition then definition levels, each after its 4-byte length. */
            const uint8_t *lv[2] = {q, q};
            size_t lv_len[2] = {0, 0};
            for (int k = 0; k < 2 && rc == 0; k++) {
                if (!(k == 0 ? pq->max_rep : pq->max_def)) continue;
                if (qe - q < 4) {
                    rc = err_set(err, "%s: the page at byte %lld has no %s levels", pq->name,
                                 (long long)at, k ? "definition" : "repetition");
                    break;
                }
                uint32_t L = le32(q);
                if (L > (uint64_t)(qe - q - 4)) {
                    rc = err_set(err, "%s: the %s levels of the page at byte %lld run past it",
                                 pq->name, k ? "definition" : "repetition", (long long)at);
                    break;
                }
                lv[k] = q + 4;
                lv_len[k] = L;
                q += 4 + L;
            }
            if (rc) break;
            rc = data_page(pq, &h, lv[0], lv_len[0], lv[1], lv_len[1], q, (size_t)(qe - q), dict,
                           n_dict, at, err);
            rows += h.num_values;
            batch_bytes += h.uncompressed;
        } else if (h.type == PAGE_DATA_V2) {
            if (h.def_len < 0 || h.rep_len < 0 || h.def_len + h.rep_len > h.compressed ||
                h.def_len + h.rep_len > h.uncompressed) {
                rc = err_set(err, "%s: the level lengths of the page at byte %lld run past it",
                             pq->name, (long long)at);
                break;
            }
            const uint8_t *u;
            size_t skip = (size_t)(h.def_len + h.rep_len);
            int64_t codec = h.v2_compressed ? c->codec : CODEC_NONE;
            if ((rc = decompress(pq, codec, body + skip, (size_t)h.compressed - skip,
                                 (size_t)h.uncompressed - skip, &u, at, err)))
                break;
            rc = data_page(pq, &h, body, (size_t)h.rep_len, body + h.rep_len, (size_t)h.def_len, u,
                           (size_t)h.uncompressed - skip, dict, n_dict, at, err);
            rows += h.num_values;
            batch_bytes += h.uncompressed;
        } else if (h.type != PAGE_INDEX) {
            rc = err_set(err, "%s: the page at byte %lld is of unknown type %lld", pq->name,
                         (long long)at, (long long)h.type);
        }
    }
    free(dict);
    if (rc == 0 && rows != c->num_values)
        rc = err_set(err, "%s: row group %d's pages hold %lld values where its metadata says %lld",
                     pq->name, g, (long long)rows, (long long)c->num_values);
    if (rc == 0 && fn) rc = flush_batch(pq, fn, ctx, err);
    if (rc) {
        release_group(pq);
        return -1;
    }
    return 0;
}

int parquet_read_group(Parquet *pq, int g, const ParquetStr **vals, int64_t *n, Err *err) {
    *vals = NULL;
    *n = 0;
    TRY(read_group(pq, g, NULL, NULL, err));
    *vals = pq->vals;
    *n = pq->n_vals;
    return 0;
}

int parquet_stream_group(Parquet *pq, int g, ParquetBatchFn fn, void *ctx, Err *err) {
    int rc = read_group(pq, g, fn, ctx, err);
    release_group(pq);
    return rc;
}

int parquet_stream_column(const void *data, size_t size, const char *name, const char *column,
                          ParquetBatchFn fn, void (*group_done)(void *ctx, int64_t end), void *ctx,
                          Err *err) {
    Parquet *pq = NULL;
    int rc = parquet_open(&pq, size ? data : "", size, name, column, err);
    for (int g = 0; rc == 0 && g < pq->n_groups; g++) {
        rc = parquet_stream_group(pq, g, fn, ctx, err);
        if (rc == 0 && group_done) group_done(ctx, parquet_group_end(pq, g));
    }
    if (pq) parquet_close(pq);
    return rc;
}

/* ---- conversations ------------------------------------------------------------------------- */

/* The message fields read from Parquet: role and content, then the names an assistant's
 * reasoning may come under (chat_template.h), in their order. */
enum { N_MSG_FIELDS = 2 + CHAT_N_REASONING_KEYS };

static const char *msg_field(int k) {
    return k == 0 ? "role" : k == 1 ? "content" : chat_reasoning_keys[k - 2];
}

/* ShareGPT's names of role and content, which TRL renames to them. */
static const char *msg_alias(int k) {
    return k == 0 ? "from" : k == 1 ? "value" : NULL;
}

/* The name field k goes by in the file: has[k] is 1 for its own name, 2 for its alias. */
static const char *msg_name(int k, const int *has) {
    return has[k] == 2 ? msg_alias(k) : msg_field(k);
}

/* A row's messages as they are collected. */
typedef struct ConvRow {
    ParquetStr *f[3]; /* roles, contents, reasonings */
    json_t **calls;   /* tool calls (owned), NULL where the message has none */
    int64_t n, cap;
} ConvRow;

static void conv_push(ConvRow *c, const ParquetStr *m, json_t *calls) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        for (int k = 0; k < 3; k++)
            c->f[k] = xrealloc(c->f[k], (size_t)c->cap * sizeof *c->f[k]);
        c->calls = xrealloc(c->calls, (size_t)c->cap * sizeof *c->calls);
    }
    for (int k = 0; k < 3; k++)
        c->f[k][c->n] = m[k];
    c->calls[c->n] = calls;
    c->n++;
}

/* Hands a row to fn and releases its tool calls. */
static int conv_flush(ConvRow *c, int64_t row, ParquetConvFn fn, void *ctx, Err *err) {
    int rc = fn(ctx, row, c->f[0], c->f[1], c->f[2], (const json_t *const *)c->calls, c->n, err);
    for (int64_t i = 0; i < c->n; i++)
        json_decref(c->calls[i]);
    c->n = 0;
    return rc;
}

/* A message's tool calls (the "tool_calls" field of the messages): a list of structures with
 * "name" and "arguments" strings, directly or inside a "function" structure (OpenAI's shape).
 * Other fields of a call ("id", "type", ...) are not read, as the JSON Lines reader does not:
 * the template writes only the name and the arguments. */
typedef struct ToolCalls {
    Parquet *leaf[2]; /* name, arguments (NULL when the calls have no arguments field) */
    int wrapped;      /* name and arguments are inside "function" */
    /* The definition levels an entry reaches when tool_calls is not null, when it holds a call,
     * when that call is not null, and when its function is not null (wrapped). */
    int d_field, d_list, d_call, d_fn;
    const ParquetStr *v[2];
    int64_t at[2], t; /* the next value of each leaf; the next level entry */
} ToolCalls;

/* The definition level of the node reached by path[0 .. depth). */
static int def_of(const SchemaEl *els, int64_t n, char *const *path, int depth) {
    int64_t at = 0;
    int d = 0;
    for (int k = 0; k < depth && at >= 0; k++) {
        at = child_named(els, n, at, path[k]);
        if (at >= 0 && els[at].repetition != REP_REQUIRED) d++;
    }
    return d;
}

/* Opens the leaves of the tool calls at schema node tc, whose path is path[0 .. depth). */
static int tool_calls_open(const Parquet *sc, int64_t tc, char **path, int depth, ToolCalls *t,
                           Err *err) {
    const SchemaEl *els = sc->els;
    int64_t n = sc->n_els, rep = tc + 1;
    memset(t, 0, sizeof *t);
    if (els[tc].num_children != 1 || rep >= n || els[rep].repetition != REP_REPEATED ||
        els[rep].num_children < 1)
        return err_set(err,
                       "%s: the messages' \"tool_calls\" is not a list of calls (structures with "
                       "\"name\" and \"arguments\", or a \"function\" holding them)",
                       sc->name);
    int64_t holder = rep;
    if (els[rep].num_children == 1 && rep + 1 < n && els[rep + 1].num_children > 0)
        holder = rep + 1;
    char names[3][128];
    snprintf(names[0], sizeof names[0], "%.*s", (int)els[rep].name_len,
             (const char *)els[rep].name);
    snprintf(names[1], sizeof names[1], "%.*s", (int)els[holder].name_len,
             (const char *)els[holder].name);
    path[depth++] = names[0];
    if (holder != rep) path[depth++] = names[1];
    int64_t fn = child_named(els, n, holder, "function");
    t->wrapped = fn >= 0 && els[fn].num_children > 0;
    if (t->wrapped) path[depth++] = "function";
    int64_t parent = t->wrapped ? fn : holder;
    t->d_field = def_of(els, n, path, depth - 1 - (holder != rep) - t->wrapped);
    t->d_list = t->d_field + 1;
    t->d_call = def_of(els, n, path, depth - t->wrapped);
    t->d_fn = def_of(els, n, path, depth);
    static const char *const leaf_names[2] = {"name", "arguments"};
    for (int k = 0; k < 2; k++) {
        int64_t e = child_named(els, n, parent, leaf_names[k]);
        if (e < 0 && k == 1) continue; /* each call is then refused for it, as in JSON Lines */
        if (e < 0 || els[e].num_children > 0 || els[e].type != TYPE_BYTE_ARRAY)
            return err_set(err,
                           "%s: the tool calls' \"%s\" is %s, where qtitan reads a string (%s)",
                           sc->name, leaf_names[k], e < 0 ? "missing" : "not a string",
                           k ? "the arguments as JSON text" : "the function's name");
        path[depth] = (char *)leaf_names[k];
        TRY(open_path(&t->leaf[k], sc->data, sc->size, sc->name, path, depth + 1, 0, err));
        t->leaf[k]->keep_levels = 1;
    }
    return 0;
}

/* The calls of the message whose first level entry is the next one: JSON as the JSON Lines
 * reader would have it ({"function": {"name", "arguments"}} or {"name", "arguments"}; a null
 * value as JSON null), or NULL when its tool_calls is null. */
static json_t *tool_calls_next(ToolCalls *t) {
    const Parquet *nl = t->leaf[0], *al = t->leaf[1];
    json_t *calls = NULL;
    do {
        int64_t i = t->t++;
        int d = nl->def[i];
        if (d < t->d_field) break;
        if (!calls) calls = json_array();
        if (d < t->d_list) break;
        json_t *call = json_null();
        if (d >= t->d_call) {
            json_t *f = json_object();
            if (d == nl->max_def) {
                const ParquetStr *name = &t->v[0][t->at[0]++];
                json_object_set_new(f, "name", json_stringn_nocheck(name->p, name->n));
            }
            if (al) {
                json_t *a = json_null();
                if (al->def[i] == al->max_def) {
                    const ParquetStr *args = &t->v[1][t->at[1]++];
                    a = json_stringn_nocheck(args->p, args->n);
                }
                json_object_set_new(f, "arguments", a);
            }
            if (!t->wrapped) {
                call = f;
            } else {
                call = json_object();
                if (d < t->d_fn) { /* a null function */
                    json_decref(f);
                    f = json_null();
                }
                json_object_set_new(call, "function", f);
            }
        }
        json_array_append_new(calls, call);
    } while (t->t < nl->n_levels && nl->rep[t->t] == 2);
    return calls;
}

/* The element fields of list column `top`: *holder is the node whose children they are
 * (the element of a 3-level list, else the repeated group itself); has[k] says whether
 * msg_field(k) is one of them. */
static int list_fields(const Parquet *sc, int64_t top, int64_t *rep, int64_t *holder, int *has,
                       int64_t *tool_calls, Err *err) {
    const SchemaEl *els = sc->els;
    int64_t n = sc->n_els;
    *rep = top + 1;
    if (els[top].num_children != 1 || *rep >= n || els[*rep].repetition != REP_REPEATED ||
        els[*rep].num_children < 1)
        return err_set(err,
                       "%s: column \"%.*s\" is not a list of messages (a list of structures "
                       "with \"role\" and \"content\")",
                       sc->name, (int)(els[top].name_len > 60 ? 60 : els[top].name_len),
                       (const char *)els[top].name);
    *holder = *rep;
    if (els[*rep].num_children == 1 && *rep + 1 < n && els[*rep + 1].num_children > 0)
        *holder = *rep + 1;
    int64_t i = *holder + 1;
    *tool_calls = -1;
    for (int64_t k = 0; k < els[*holder].num_children && i < n; k++) {
        int known = 0;
        for (int f = 0; f < N_MSG_FIELDS; f++) {
            int alias = msg_alias(f) && name_is(els[i].name, els[i].name_len, msg_alias(f));
            if (!alias && !name_is(els[i].name, els[i].name_len, msg_field(f))) continue;
            if (has[f])
                return err_set(err, "%s: the messages have both \"%s\" and \"%s\"", sc->name,
                               msg_field(f), msg_alias(f));
            has[f] = 1 + alias;
            known = 1;
        }
        if (name_is(els[i].name, els[i].name_len, "tool_calls")) *tool_calls = i, known = 1;
        if (!known)
            return err_set(err,
                           "%s: the messages have a field \"%.*s\", which qtitan reads from "
                           "JSON Lines only (from Parquet it reads role, content, tool_calls and "
                           "the reasoning fields); write the conversations as JSON Lines "
                           "(datasets' Dataset.to_json does)",
                           sc->name, (int)(els[i].name_len > 60 ? 60 : els[i].name_len),
                           (const char *)els[i].name);
        i = subtree_end(els, n, i);
    }
    if (!has[0] || !has[1])
        return err_set(err, "%s: the messages have no \"%s\" field", sc->name,
                       has[0] ? "content" : "role");
    return 0;
}

static int read_conversations(Parquet *sc, const char *column, ParquetConvFn fn, void *ctx,
                              Err *err) {
    const SchemaEl *els = sc->els;
    int64_t n_els = sc->n_els;
    int64_t top = n_els > 0 ? child_named(els, n_els, 0, column) : -1;
    if (top < 0) {
        char cols[400] = "";
        if (n_els > 0) list_children(els, n_els, 0, cols, sizeof cols);
        return err_set(err, "%s: no column \"%s\" in the Parquet file (its columns: %s)", sc->name,
                       column, cols);
    }
    int64_t rep = 0, holder = 0, tc = -1;
    int has[N_MSG_FIELDS] = {0};
    TRY(list_fields(sc, top, &rep, &holder, has, &tc, err));
    /* The definition level an entry of the list reaches, and the one of a present element. */
    int d_list = (els[top].repetition != REP_REQUIRED) + 1;
    int d_elem = d_list + (holder != rep && els[holder].repetition != REP_REQUIRED);
    char rep_name[128], holder_name[128];
    snprintf(rep_name, sizeof rep_name, "%.*s", (int)els[rep].name_len,
             (const char *)els[rep].name);
    snprintf(holder_name, sizeof holder_name, "%.*s", (int)els[holder].name_len,
             (const char *)els[holder].name);
    Parquet *leaf[N_MSG_FIELDS] = {NULL};
    int rc = 0;
    for (int k = 0; k < N_MSG_FIELDS && rc == 0; k++) {
        if (!has[k]) continue;
        char *path[4] = {(char *)column, rep_name, holder_name, (char *)msg_name(k, has)};
        if (holder == rep) path[2] = (char *)msg_name(k, has);
        rc = open_path(&leaf[k], sc->data, sc->size, sc->name, path, holder == rep ? 3 : 4, 0, err);
        if (rc == 0) leaf[k]->keep_levels = 1;
        if (rc == 0 && leaf[k]->n_groups != leaf[0]->n_groups)
            rc = err_set(err, "%s: the message fields have different row groups", sc->name);
    }
    ToolCalls calls;
    memset(&calls, 0, sizeof calls);
    if (rc == 0 && tc >= 0) {
        char *path[8] = {(char *)column, rep_name, holder_name};
        int depth = holder == rep ? 2 : 3;
        path[depth++] = "tool_calls";
        rc = tool_calls_open(sc, tc, path, depth, &calls, err);
        for (int k = 0; k < 2 && rc == 0; k++)
            if (calls.leaf[k] && calls.leaf[k]->n_groups != leaf[0]->n_groups)
                rc = err_set(err, "%s: the message fields have different row groups", sc->name);
    }
    ConvRow row = {{NULL}, NULL, 0, 0};
    int64_t row_no = -1;
    int pending = 0; /* row_no's messages are collected but not yet handed to fn */
    for (int g = 0; rc == 0 && g < leaf[0]->n_groups; g++) {
        const ParquetStr *v[N_MSG_FIELDS] = {NULL};
        int64_t nv, at[N_MSG_FIELDS] = {0};
        for (int k = 0; k < N_MSG_FIELDS && rc == 0; k++)
            if (leaf[k]) rc = parquet_read_group(leaf[k], g, &v[k], &nv, err);
        for (int k = 0; k < 2 && rc == 0; k++)
            if (calls.leaf[k]) rc = parquet_read_group(calls.leaf[k], g, &calls.v[k], &nv, err);
        if (rc) break;
        calls.at[0] = calls.at[1] = calls.t = 0;
        /* The calls' leaves agree with each other entry by entry up to the call, and hold at
         * least an entry per message. */
        const Parquet *cn = calls.leaf[0], *ca = calls.leaf[1];
        if (cn && (cn->n_levels < leaf[0]->n_levels || (ca && ca->n_levels != cn->n_levels)))
            rc = err_set(err, "%s: row group %d: the tool calls disagree with the messages",
                         sc->name, g);
        for (int64_t i = 0; rc == 0 && ca && i < cn->n_levels; i++) {
            int dn = cn->def[i] < calls.d_fn ? cn->def[i] : calls.d_fn;
            int da = ca->def[i] < calls.d_fn ? ca->def[i] : calls.d_fn;
            if (cn->rep[i] != ca->rep[i] || dn != da)
                rc = err_set(err, "%s: row group %d: the tool calls' fields disagree on entry %lld",
                             sc->name, g, (long long)i);
        }
        if (rc) break;
        const Parquet *r = leaf[0];
        for (int k = 1; k < N_MSG_FIELDS && rc == 0; k++)
            if (leaf[k] && leaf[k]->n_levels != r->n_levels)
                rc = err_set(err, "%s: row group %d: the message fields disagree on the messages",
                             sc->name, g);
        if (rc == 0 && r->n_levels > 0 && r->rep[0] != 0)
            rc = err_set(err, "%s: row group %d starts inside a row", sc->name, g);
        for (int64_t i = 0; rc == 0 && i < r->n_levels; i++) {
            int dr = r->def[i];
            for (int k = 1; k < N_MSG_FIELDS; k++) {
                if (!leaf[k]) continue;
                int dk = leaf[k]->def[i];
                if (leaf[k]->rep[i] != r->rep[i] ||
                    (dk < d_elem ? dk : d_elem) != (dr < d_elem ? dr : d_elem))
                    rc = err_set(err, "%s: row group %d: the message fields disagree on entry %lld",
                                 sc->name, g, (long long)i);
            }
            if (rc) break;
            /* The message's first entry in the calls' leaves begins where its own does. */
            json_t *mc = NULL;
            if (cn) {
                if (calls.t >= cn->n_levels || cn->rep[calls.t] != r->rep[i] ||
                    (cn->def[calls.t] < d_elem ? cn->def[calls.t] : d_elem) !=
                        (dr < d_elem ? dr : d_elem))
                    rc = err_set(err, "%s: row group %d: the tool calls disagree with message %lld",
                                 sc->name, g, (long long)i);
                else
                    mc = tool_calls_next(&calls);
            }
            if (rc) break;
            if (r->rep[i] == 0) {
                if (pending) rc = conv_flush(&row, row_no, fn, ctx, err);
                row_no++;
                pending = 1;
                if (rc) {
                    json_decref(mc);
                    break;
                }
            }
            if (dr < d_list) { /* a null or empty list */
                json_decref(mc);
                continue;
            }
            ParquetStr m[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
            for (int k = 0; k < N_MSG_FIELDS; k++) {
                if (!leaf[k] || leaf[k]->def[i] != leaf[k]->max_def) continue;
                ParquetStr val = v[k][at[k]++];
                int slot = k < 2 ? k : 2;
                if (!m[slot].p) m[slot] = val; /* reasoning: the first field that is not null */
            }
            conv_push(&row, m, mc);
        }
        if (rc == 0 && cn && calls.t != cn->n_levels)
            rc = err_set(err, "%s: row group %d: the tool calls disagree with the messages",
                         sc->name, g);
        /* A row lies inside one row group: its values point into this group's pages, which
         * the next group's read releases. */
        if (rc == 0 && pending) rc = conv_flush(&row, row_no, fn, ctx, err);
        pending = 0;
    }
    for (int64_t i = 0; i < row.n; i++)
        json_decref(row.calls[i]);
    for (int k = 0; k < 3; k++)
        free(row.f[k]);
    free(row.calls);
    for (int k = 0; k < N_MSG_FIELDS; k++)
        parquet_close(leaf[k]);
    for (int k = 0; k < 2; k++)
        parquet_close(calls.leaf[k]);
    return rc;
}

int parquet_read_conversations(const void *data, size_t size, const char *name, const char *column,
                               ParquetConvFn fn, void *ctx, Err *err) {
    Parquet *sc;
    TRY(open_path(&sc, data, size, name, NULL, 0, 0, err));
    int rc = read_conversations(sc, column, fn, ctx, err);
    parquet_close(sc);
    return rc;
}

int parquet_has_column(const void *data, size_t size, const char *name, const char *column,
                       int *has, Err *err) {
    Parquet *sc;
    TRY(open_path(&sc, data, size, name, NULL, 0, 0, err));
    *has = sc->n_els > 0 && child_named(sc->els, sc->n_els, 0, column) >= 0;
    parquet_close(sc);
    return 0;
}

/* ---- rows of string columns ---------------------------------------------------------------- */

#define PQ_MAX_COLS 8

static int read_rows(Parquet *sc, const char *const *cols, const int *required, int ncols,
                     ParquetRowFn fn, void *ctx, Err *err) {
    Parquet *leaf[PQ_MAX_COLS] = {NULL};
    int rc = ncols > PQ_MAX_COLS
                 ? err_set(err, "%s: more than %d columns asked for", sc->name, PQ_MAX_COLS)
                 : 0;
    int groups = -1;
    for (int k = 0; k < ncols && rc == 0; k++) {
        int present = sc->n_els > 0 && child_named(sc->els, sc->n_els, 0, cols[k]) >= 0;
        if (!present && !required[k]) continue;
        char *path[1] = {(char *)cols[k]};
        rc = open_path(&leaf[k], sc->data, sc->size, sc->name, path, 1, 1, err);
        if (rc) break;
        leaf[k]->keep_levels = 1;
        if (groups >= 0 && leaf[k]->n_groups != groups)
            rc = err_set(err, "%s: columns with different row groups", sc->name);
        groups = leaf[k]->n_groups;
    }
    int64_t row0 = 0;
    ParquetStr vals[PQ_MAX_COLS];
    for (int g = 0; rc == 0 && g < groups; g++) {
        const ParquetStr *v[PQ_MAX_COLS] = {NULL};
        int64_t nv, at[PQ_MAX_COLS] = {0}, rows = -1;
        for (int k = 0; k < ncols && rc == 0; k++) {
            if (!leaf[k]) continue;
            rc = parquet_read_group(leaf[k], g, &v[k], &nv, err);
            if (rc == 0 && rows >= 0 && leaf[k]->n_levels != rows)
                rc = err_set(err, "%s: row group %d: the columns hold different numbers of rows",
                             sc->name, g);
            rows = leaf[k]->n_levels;
        }
        for (int64_t i = 0; rc == 0 && i < rows; i++) {
            for (int k = 0; k < ncols; k++) {
                vals[k] = (ParquetStr){NULL, 0};
                if (leaf[k] && leaf[k]->def[i] == leaf[k]->max_def) vals[k] = v[k][at[k]++];
            }
            rc = fn(ctx, row0 + i, vals, err);
        }
        row0 += rows > 0 ? rows : 0;
    }
    for (int k = 0; k < ncols && k < PQ_MAX_COLS; k++)
        parquet_close(leaf[k]);
    return rc;
}

int parquet_read_rows(const void *data, size_t size, const char *name, const char *const *cols,
                      const int *required, int ncols, ParquetRowFn fn, void *ctx, Err *err) {
    Parquet *sc;
    TRY(open_path(&sc, data, size, name, NULL, 0, 0, err));
    int rc = read_rows(sc, cols, required, ncols, fn, ctx, err);
    parquet_close(sc);
    return rc;
}
