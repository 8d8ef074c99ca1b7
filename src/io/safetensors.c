/* safetensors reader (mmap, every header field checked before any data is touched), writer
 * (byte-compatible with the Python package, streamed and atomic), HF shard sets and the HF
 * sharded export layout. */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/strbuf.h"
#include "core/strutil.h"

/* ---- reader ---- */

typedef struct Span {
    uint64_t begin, end;
    int idx;
} Span;

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const StTensor *)a)->name, ((const StTensor *)b)->name);
}

static int cmp_span(const void *a, const void *b) {
    const Span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

void st_shape_str(char *out, size_t cap, const int64_t *shape, int ndim) {
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

static int parse_metadata(const json_t *v, const char *path, Err *err) {
    if (!json_is_object(v))
        return err_set(err, "%s: header key \"__metadata__\" must be an object of strings", path);
    const char *k;
    json_t *s;
    json_object_foreach((json_t *)v, k, s) {
        if (!json_is_string(s))
            return err_set(err, "%s: header \"__metadata__\" entry \"%s\" must be a string", path,
                           k);
    }
    return 0;
}

static int parse_tensor(StTensor *t, Span *span, const char *path, const char *name,
                        const json_t *v, uint64_t data_len, Err *err) {
    if (!json_is_object(v))
        return err_set(err,
                       "%s: tensor \"%s\": expected an object with dtype, shape and "
                       "data_offsets",
                       path, name);
    const json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd))
        return err_set(err, "%s: tensor \"%s\": \"dtype\" must be a string", path, name);
    if (dtype_parse(json_string_value(jd), &t->dtype) != 0)
        return err_set(err,
                       "%s: tensor \"%s\": unknown dtype \"%s\" (supported: F32, BF16, F16, "
                       "F8_E4M3, I32, I64, U8)",
                       path, name, json_string_value(jd));
    const json_t *js = json_object_get(v, "shape");
    if (!json_is_array(js))
        return err_set(err, "%s: tensor \"%s\": \"shape\" must be an array of integers", path,
                       name);
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return err_set(err, "%s: tensor \"%s\": shape has %zu dimensions, at most %d allowed", path,
                       name, nd, ST_MAX_DIMS);
    t->ndim = (int)nd;
    size_t esize = dtype_size(t->dtype);
    int64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        const json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return err_set(err,
                           "%s: tensor \"%s\": shape dimension %zu must be a non-negative "
                           "integer",
                           path, name, i);
        int64_t dim = json_integer_value(d);
        t->shape[i] = dim;
        if (dim > 0 && numel > INT64_MAX / (int64_t)esize / dim)
            return err_set(err, "%s: tensor \"%s\": shape overflows a 64-bit byte count", path,
                           name);
        numel *= dim;
    }
    t->numel = numel;
    const json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)) || json_integer_value(json_array_get(jo, 0)) < 0 ||
        json_integer_value(json_array_get(jo, 1)) < 0)
        return err_set(err,
                       "%s: tensor \"%s\": \"data_offsets\" must be [begin, end] with "
                       "non-negative integers",
                       path, name);
    uint64_t b = (uint64_t)json_integer_value(json_array_get(jo, 0));
    uint64_t e = (uint64_t)json_integer_value(json_array_get(jo, 1));
    if (b > e)
        return err_set(err,
                       "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] begin after end",
                       path, name, b, e);
    if (e > data_len)
        return err_set(err,
                       "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                       "] end past the data section of %" PRIu64 " bytes",
                       path, name, b, e, data_len);
    uint64_t need = (uint64_t)numel * esize;
    if (e - b != need) {
        char sh[256];
        st_shape_str(sh, sizeof sh, t->shape, t->ndim);
        return err_set(err,
                       "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64
                       " bytes but shape %s of %s needs %" PRIu64,
                       path, name, b, e, e - b, sh, dtype_name(t->dtype), need);
    }
    t->nbytes = (size_t)need;
    span->begin = b;
    span->end = e;
    return 0;
}

static int parse_header(StFile *f, const char *hdr, size_t hlen, uint64_t data_off, Err *err) {
    json_error_t je;
    json_t *root = json_parse(hdr, hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return err_set(err, "%s: header is not valid JSON at byte %" PRIu64 ": %s", f->path,
                       (uint64_t)je.position + 8, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return err_set(err, "%s: header is JSON but not an object", f->path);
    }
    uint64_t data_len = f->map_len - data_off;
    size_t cap = json_object_size(root);
    f->tensors = xcalloc(cap ? cap : 1, sizeof *f->tensors);
    Span *spans = xcalloc(cap ? cap : 1, sizeof *spans);
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((rc = parse_metadata(v, f->path, err)) != 0) break;
            continue;
        }
        StTensor *t = &f->tensors[f->n];
        if ((rc = parse_tensor(t, &spans[f->n], f->path, key, v, data_len, err)) != 0) break;
        t->name = xstrdup(key);
        t->data = (const char *)f->map + data_off + spans[f->n].begin;
        spans[f->n].idx = f->n;
        f->n++;
    }
    if (rc == 0) {
        qsort(spans, (size_t)f->n, sizeof *spans, cmp_span);
        /* Zero-byte tensors own no bytes, so only non-empty ones can collide. */
        int prev = -1;
        for (int i = 0; i < f->n && rc == 0; i++) {
            if (spans[i].begin == spans[i].end) continue;
            if (prev >= 0 && spans[i].begin < spans[prev].end)
                rc = err_set(err,
                             "%s: tensors \"%s\" (data_offsets [%" PRIu64 ", %" PRIu64
                             "]) and \"%s\" (data_offsets [%" PRIu64 ", %" PRIu64 "]) overlap",
                             f->path, f->tensors[spans[prev].idx].name, spans[prev].begin,
                             spans[prev].end, f->tensors[spans[i].idx].name, spans[i].begin,
                             spans[i].end);
            prev = i;
        }
    }
    free(spans);
    json_decref(root);
    if (rc == 0) qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_tensor_name);
    return rc;
}

static int st_open_in(StFile *f, const char *path, Err *err) {
    memset(f, 0, sizeof *f);
    struct stat st;
    int fd = fs_open_read(path, &st, err);
    if (fd < 0) return -1;
    size_t size = (size_t)st.st_size;
    if (size < 8) {
        close(fd);
        return err_set(err,
                       "%s: file is %zu bytes, too short for the 8-byte header length of a "
                       "safetensors file",
                       path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);
    if (map == MAP_FAILED) {
        errno = saved;
        return err_sys(err, "cannot map %s", path);
    }
    f->path = xstrdup(path);
    f->map = map;
    f->map_len = size;
    const unsigned char *p = map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | p[i];
    if (n > ST_MAX_HEADER) {
        err_set(err, "%s: header length %" PRIu64 " at byte 0 is over the %u-byte limit", path, n,
                ST_MAX_HEADER);
        st_close(f);
        return -1;
    }
    if (8 + n > size) {
        err_set(err,
                "%s: header length %" PRIu64 " at byte 0 runs past the end of the %zu-byte "
                "file",
                path, n, size);
        st_close(f);
        return -1;
    }
    if (parse_header(f, (const char *)p + 8, (size_t)n, 8 + n, err) != 0) {
        st_close(f);
        return -1;
    }
    return 0;
}

int st_open(StFile *f, const char *path, Err *err) {
    size_t scope = err_oom_push("reading the safetensors header of %s", path);
    int r = st_open_in(f, path, err);
    err_oom_pop(scope);
    return r;
}

void st_close(StFile *f) {
    if (f->map) munmap(f->map, f->map_len);
    for (int i = 0; i < f->n; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const StTensor *st_find(const StFile *f, const char *name) {
    StTensor key = {.name = (char *)name};
    return f->n ? bsearch(&key, f->tensors, (size_t)f->n, sizeof key, cmp_tensor_name) : NULL;
}

void st_release_range(const StTensor *t, int64_t lo, int64_t n) {
    size_t es = dtype_size(t->dtype), page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)t->data + (size_t)lo * es, b = a + (size_t)n * es;
    a = (a + page - 1) / page * page;
    b = b / page * page;
    if (a < b) madvise((void *)a, b - a, MADV_DONTNEED);
}

int64_t st_to_f32(const StTensor *t, float *dst) {
    return st_convert_range(t, DT_F32, dst, 0, t->numel);
}

/* Element i of a block-scale tensor (F32, BF16 or F16, st_set_pair_fp8 checked), read in
 * place: st_convert_range would open a parallel region per block. */
static float scale_at(const StTensor *s, int64_t i) {
    if (s->dtype == DT_F32) {
        float f;
        memcpy(&f, (const char *)s->data + (size_t)i * 4, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)s->data + (size_t)i * 2, 2);
    return s->dtype == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* One block-quantized row piece: columns [c0, c1) of row r into dst (F32 or BF16). Returns
 * the column of its first non-finite value, or -1. */
static int64_t fp8_row(const StTensor *t, DType to, void *dst, int64_t r, int64_t c0, int64_t c1) {
    const int64_t C = t->shape[1], b1 = t->block[1], srow = (r / t->block[0]) * t->scale->shape[1];
    const uint8_t *src = (const uint8_t *)t->data + r * C;
    const float *tab = f8e4m3_table();
    float *d32 = dst;
    uint16_t *d16 = dst;
    for (int64_t c = c0; c < c1;) {
        int64_t end = (c / b1 + 1) * b1 < c1 ? (c / b1 + 1) * b1 : c1;
        float scale = scale_at(t->scale, srow + c / b1);
        unsigned bad = 0;
        for (int64_t j = c; j < end; j++) {
            union {
                float f;
                uint32_t u;
            } v = {.f = tab[src[j]] * scale};
            if (to == DT_F32)
                d32[j - c0] = v.f;
            else
                d16[j - c0] = f32_to_bf16(v.f);
            bad |= (v.u & 0x7f800000u) == 0x7f800000u;
        }
        if (bad)
            for (int64_t j = c; j < end; j++)
                if (!isfinite(tab[src[j]] * scale)) return j;
        c = end;
    }
    return -1;
}

/* st_convert_range for a block-quantized weight, row by row on all threads. */
static int64_t convert_fp8_blocks(const StTensor *t, DType to, void *dst, int64_t lo, int64_t n) {
    const int64_t C = t->shape[1], r0 = lo / C, r1 = n > 0 ? (lo + n - 1) / C + 1 : r0;
    const size_t os = dtype_size(to);
    int64_t first = INT64_MAX;
#pragma omp parallel for schedule(static) reduction(min : first) if (n > 65536)
    for (int64_t r = r0; r < r1; r++) {
        int64_t a = r * C > lo ? r * C : lo, b = (r + 1) * C < lo + n ? (r + 1) * C : lo + n;
        int64_t bad = fp8_row(t, to, (char *)dst + (size_t)(a - lo) * os, r, a - r * C, b - r * C);
        if (bad >= 0 && r * C + bad - lo < first) first = r * C + bad - lo;
    }
    return first == INT64_MAX ? -1 : first;
}

int64_t st_convert_range(const StTensor *t, DType to, void *dst, int64_t lo, int64_t n) {
    if (t->dtype == DT_F8_E4M3 && t->scale) return convert_fp8_blocks(t, to, dst, lo, n);
    size_t es = dtype_size(t->dtype), os = dtype_size(to);
    const unsigned char *src = (const unsigned char *)t->data + (size_t)lo * es;
    int is_float =
        t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16 || t->dtype == DT_F8_E4M3;
    if (is_float && (uintptr_t)src % es == 0)
        return dtype_convert(dst, to, src, t->dtype, (size_t)n);
    /* Otherwise convert through an aligned bounce buffer: files from other writers may put
     * data at any byte offset. */
    enum { CHUNK = 4096 };
    uint64_t buf[CHUNK];
    float wide[CHUNK];
    unsigned char *out = dst;
    int64_t first = -1;
    for (int64_t i = 0; i < n; i += CHUNK) {
        size_t m = (size_t)(n - i < CHUNK ? n - i : CHUNK);
        memcpy(buf, src + (size_t)i * es, m * es);
        if (is_float) {
            int64_t bad = dtype_convert(out + (size_t)i * os, to, buf, t->dtype, m);
            if (bad >= 0 && first < 0) first = i + bad;
            continue;
        }
        /* Integer types by value: always finite. */
        for (size_t j = 0; j < m; j++)
            wide[j] = t->dtype == DT_I32   ? (float)((const int32_t *)buf)[j]
                      : t->dtype == DT_I64 ? (float)((const int64_t *)buf)[j]
                      : t->dtype == DT_U8  ? (float)((const uint8_t *)buf)[j]
                                           : 0.0f;
        dtype_convert(out + (size_t)i * os, to, wide, DT_F32, m);
    }
    return first;
}

/* ---- writer ---- */

void st_writer_init(StWriter *w) {
    memset(w, 0, sizeof *w);
}

static StWriteItem *push_item(StWriter *w, const char *name, DType dtype, int ndim,
                              const int64_t *shape, const void *data) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->items = xrealloc(w->items, (size_t)w->cap * sizeof *w->items);
    }
    StWriteItem *it = &w->items[w->n++];
    memset(it, 0, sizeof *it);
    it->name = xstrdup(name);
    it->dtype = dtype;
    it->ndim = ndim;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        it->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    it->data = data;
    it->nbytes = numel * dtype_size(dtype);
    it->device = &device_cpu;
    return it;
}

void st_writer_add(StWriter *w, const char *name, DType dtype, int ndim, const int64_t *shape,
                   const void *data) {
    push_item(w, name, dtype, ndim, shape, data);
}

void st_writer_add_f32(StWriter *w, const char *name, DType dtype, int ndim, const int64_t *shape,
                       const float *data) {
    st_writer_add_f32_on(w, &device_cpu, name, dtype, ndim, shape, data);
}

void st_writer_add_f32_on(StWriter *w, const Device *dev, const char *name, DType dtype, int ndim,
                          const int64_t *shape, const float *data) {
    StWriteItem *it = push_item(w, name, dtype, ndim, shape, data);
    it->from_f32 = 1;
    it->device = dev;
}

void st_writer_add_f32_source(StWriter *w, const char *name, DType dtype, int ndim,
                              const int64_t *shape, StF32Source source, void *ctx, size_t first) {
    StWriteItem *it = push_item(w, name, dtype, ndim, shape, NULL);
    it->from_f32 = 1;
    it->source = source;
    it->source_ctx = ctx;
    it->source_first = first;
}

void st_writer_set_metadata(StWriter *w, const char *key, const char *value) {
    for (int i = 0; i < w->nmeta; i++)
        if (strcmp(w->meta[2 * i], key) == 0) {
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = xstrdup(value);
            return;
        }
    w->meta = xrealloc(w->meta, (size_t)(w->nmeta + 1) * 2 * sizeof *w->meta);
    w->meta[2 * w->nmeta] = xstrdup(key);
    w->meta[2 * w->nmeta + 1] = xstrdup(value);
    w->nmeta++;
}

void st_writer_free(StWriter *w) {
    for (int i = 0; i < w->n; i++)
        free(w->items[i].name);
    for (int i = 0; i < 2 * w->nmeta; i++)
        free(w->meta[i]);
    free(w->items);
    free(w->meta);
    memset(w, 0, sizeof *w);
}

/* The Python package orders tensors by dtype, widest alignment first, then by name. */
static int dtype_rank(DType t) {
    switch (t) {
    case DT_I64:
        return 0;
    case DT_F32:
        return 1;
    case DT_I32:
        return 2;
    case DT_BF16:
        return 3;
    case DT_F16:
        return 4;
    default:
        return 5;
    }
}

static int cmp_item_ptr(const void *a, const void *b) {
    const StWriteItem *x = *(StWriteItem *const *)a, *y = *(StWriteItem *const *)b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry) return rx - ry;
    return strcmp(x->name, y->name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Buffered writes to one fd with the path kept for error sentences. */
typedef struct Out {
    int fd;
    const char *path;
    char *buf;
    size_t n;
} Out;

enum { OUT_BUF = ST_WRITE_BUFFER_BYTES };

static int out_raw(Out *o, const void *p, size_t n, Err *err) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(o->fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        SYS_CHECK(w > 0, err, "cannot write %s", o->path);
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int out_flush(Out *o, Err *err) {
    TRY(out_raw(o, o->buf, o->n, err));
    o->n = 0;
    return 0;
}

static int out_put(Out *o, const void *p, size_t n, Err *err) {
    if (n == 0) return 0;
    if (o->n + n > OUT_BUF) TRY(out_flush(o, err));
    if (n >= OUT_BUF) return out_raw(o, p, n, err);
    memcpy(o->buf + o->n, p, n);
    o->n += n;
    return 0;
}

static int out_item(Out *o, const StWriteItem *it, Err *err) {
    int in_place = it->device->host_visible;
    if (!it->source && (!it->from_f32 || it->dtype == DT_F32) && in_place)
        return out_put(o, it->data, it->nbytes, err);
    size_t es = dtype_size(it->dtype), n = it->nbytes / es;
    enum { CHUNK = ST_WRITE_CHUNK };
    /* The staging buffer: values pulled from a source, or device memory copied out. */
    float *pulled = it->source || !in_place ? xmalloc(CHUNK * sizeof *pulled) : NULL;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        const float *src = pulled;
        if (it->source)
            rc = it->source(it->source_ctx, pulled, it->source_first + i, m, err);
        else
            src = device_host_view(it->device, pulled, (const float *)it->data + i,
                                   m * sizeof(float));
        if (rc == 0 && o->n + m * es > OUT_BUF) rc = out_flush(o, err);
        if (rc == 0) {
            dtype_from_f32(o->buf + o->n, src, it->dtype, m);
            o->n += m * es;
        }
    }
    free(pulled);
    return rc;
}

static void build_header(StrBuf *h, StWriteItem **order, int n, char **meta, int nmeta) {
    strbuf_add(h, "{", 1);
    int first = 1;
    if (nmeta > 0) {
        char **keys = xmalloc((size_t)nmeta * sizeof *keys);
        for (int i = 0; i < nmeta; i++)
            keys[i] = meta[2 * i];
        qsort(keys, (size_t)nmeta, sizeof *keys, cmp_str_ptr);
        strbuf_add(h, "\"__metadata__\":{", 16);
        for (int i = 0; i < nmeta; i++) {
            int j = 0;
            while (meta[2 * j] != keys[i])
                j++;
            if (i) strbuf_add(h, ",", 1);
            strbuf_json_string(h, keys[i], strlen(keys[i]));
            strbuf_add(h, ":", 1);
            strbuf_json_string(h, meta[2 * j + 1], strlen(meta[2 * j + 1]));
        }
        strbuf_add(h, "}", 1);
        free(keys);
        first = 0;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const StWriteItem *it = order[i];
        if (!first) strbuf_add(h, ",", 1);
        first = 0;
        strbuf_json_string(h, it->name, strlen(it->name));
        strbuf_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", dtype_name(it->dtype));
        for (int d = 0; d < it->ndim; d++)
            strbuf_printf(h, "%s%" PRId64, d ? "," : "", it->shape[d]);
        strbuf_printf(h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + it->nbytes);
        off += it->nbytes;
    }
    strbuf_add(h, "}", 1);
    while (h->n % 8)
        strbuf_add(h, " ", 1);
}

static int check_items(StWriteItem **order, int n, const char *path, Err *err) {
    for (int i = 0; i < n; i++) {
        const StWriteItem *it = order[i];
        if (it->ndim < 0 || it->ndim > ST_MAX_DIMS)
            return err_set(err, "%s: tensor \"%s\" has %d dimensions, at most %d allowed", path,
                           it->name, it->ndim, ST_MAX_DIMS);
        for (int d = 0; d < it->ndim; d++)
            if (it->shape[d] < 0)
                return err_set(err, "%s: tensor \"%s\" has negative dimension %" PRId64, path,
                               it->name, it->shape[d]);
        if (strcmp(it->name, "__metadata__") == 0)
            return err_set(err, "%s: \"__metadata__\" is reserved and cannot name a tensor", path);
        if (it->from_f32 && it->dtype != DT_F32 && it->dtype != DT_BF16 && it->dtype != DT_F16)
            return err_set(err,
                           "%s: tensor \"%s\": fp32 data can be stored as F32, BF16 or "
                           "F16, not %s",
                           path, it->name, dtype_name(it->dtype));
        if (i > 0 && strcmp(order[i - 1]->name, it->name) == 0)
            return err_set(err, "%s: tensor \"%s\" added twice", path, it->name);
    }
    return 0;
}

static int cmp_item_name(const void *a, const void *b) {
    return strcmp((*(StWriteItem *const *)a)->name, (*(StWriteItem *const *)b)->name);
}

/* Writes items to path atomically; the caller's items are not reordered. */
/* prog (may be NULL) counts the bytes written. */
static int write_items(StWriteItem *items, int n, char **meta, int nmeta, const char *path,
                       Progress *prog, Err *err) {
    StWriteItem **order = xmalloc((size_t)(n ? n : 1) * sizeof *order);
    for (int i = 0; i < n; i++)
        order[i] = &items[i];
    qsort(order, (size_t)n, sizeof *order, cmp_item_name);
    if (check_items(order, n, path, err) != 0) {
        free(order);
        return -1;
    }
    qsort(order, (size_t)n, sizeof *order, cmp_item_ptr);
    StrBuf h = {0};
    build_header(&h, order, n, meta, nmeta);

    char *tmp = fs_tmp_name(path);
    Out o = {.fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644), .path = tmp};
    int rc = 0;
    if (o.fd < 0) {
        rc = err_sys(err, "cannot create %s", tmp);
    } else {
        o.buf = xmalloc(OUT_BUF);
        unsigned char len8[8];
        for (int i = 0; i < 8; i++)
            len8[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
        rc = out_put(&o, len8, 8, err);
        if (rc == 0) rc = out_put(&o, h.p, h.n, err);
        for (int i = 0; i < n && rc == 0; i++) {
            rc = out_item(&o, order[i], err);
            if (prog) progress_add(prog, (double)order[i]->nbytes);
        }
        if (rc == 0) rc = out_flush(&o, err);
        if (rc == 0 && fsync(o.fd) != 0) rc = err_sys(err, "cannot flush %s", tmp);
        if (close(o.fd) != 0 && rc == 0) rc = err_sys(err, "cannot close %s", tmp);
        if (rc == 0 && rename(tmp, path) != 0)
            rc = err_sys(err, "cannot rename %s to %s", tmp, path);
        if (rc != 0) unlink(tmp);
        free(o.buf);
    }
    if (rc == 0) {
        char *dir = fs_dir_of(path);
        rc = fs_sync_dir(dir, err);
        free(dir);
    }
    free(tmp);
    free(h.p);
    free(order);
    return rc;
}

int st_write_finish(StWriter *w, const char *path, Err *err) {
    return write_items(w->items, w->n, w->meta, w->nmeta, path, NULL, err);
}

int st_write_hf_shards(StWriter *w, const char *dir, size_t max_shard_bytes, Err *err) {
    /* Shard boundaries and numbering follow huggingface_hub's split_state_dict_into_shards:
     * greedy in insertion order; an oversized tensor is numbered when met, the open shard
     * when it is closed. */
    int *shard_of = xmalloc((size_t)(w->n ? w->n : 1) * sizeof *shard_of);
    int nshards = 0, open_from = 0;
    size_t cur = 0;
    uint64_t total = 0, nparams = 0;
    for (int i = 0; i < w->n; i++) {
        size_t b = w->items[i].nbytes;
        total += b;
        nparams += b / dtype_size(w->items[i].dtype);
        if (b > max_shard_bytes) {
            shard_of[i] = nshards++;
            continue;
        }
        if (cur > 0 && cur + b > max_shard_bytes) {
            for (int j = open_from; j < i; j++)
                if (shard_of[j] < 0) shard_of[j] = nshards;
            nshards++;
            cur = 0;
            open_from = i;
        }
        shard_of[i] = -1;
        cur += b;
    }
    int open_used = 0;
    for (int j = open_from; j < w->n; j++)
        if (shard_of[j] < 0) shard_of[j] = nshards, open_used = 1;
    nshards += open_used;
    if (nshards == 0) nshards = 1;
    char *meta[2] = {"format", "pt"};
    Progress prog;
    char what[160];
    snprintf(what, sizeof what, "exporting %s", dir);
    progress_start(&prog, what, (double)total, "MB", 1e6);
    char *index_path = fs_join(dir, "model.safetensors.index.json");
    char *single_path = fs_join(dir, "model.safetensors");
    int rc = 0;
    if (nshards == 1) {
        rc = write_items(w->items, w->n, meta, 1, single_path, &prog, err);
        /* A stale index from an earlier, larger export would shadow the new file. */
        if (rc == 0 && fs_exists(index_path) && unlink(index_path) != 0)
            rc = err_sys(err, "cannot remove stale %s", index_path);
    } else {
        StWriteItem *sub = xmalloc((size_t)w->n * sizeof *sub);
        json_t *wm = json_object();
        for (int s = 0; s < nshards && rc == 0; s++) {
            char fname[64];
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, nshards);
            int m = 0;
            for (int i = 0; i < w->n; i++)
                if (shard_of[i] == s) {
                    sub[m++] = w->items[i];
                    json_object_set_new(wm, w->items[i].name, json_string(fname));
                }
            char *p = fs_join(dir, fname);
            rc = write_items(sub, m, meta, 1, p, &prog, err);
            free(p);
        }
        if (rc == 0) {
            json_t *root =
                json_pack("{s:{s:I,s:I},s:o}", "metadata", "total_parameters", (json_int_t)nparams,
                          "total_size", (json_int_t)total, "weight_map", wm);
            wm = NULL;
            char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
            size_t tl = strlen(text);
            char *with_nl = xmalloc(tl + 2);
            memcpy(with_nl, text, tl);
            with_nl[tl] = '\n';
            rc = fs_write_atomic(index_path, with_nl, tl + 1, err);
            free(with_nl);
            free(text);
            json_decref(root);
        }
        json_decref(wm);
        free(sub);
        if (rc == 0 && fs_exists(single_path) && unlink(single_path) != 0)
            rc = err_sys(err, "cannot remove stale %s", single_path);
    }
    progress_finish(&prog);
    free(index_path);
    free(single_path);
    free(shard_of);
    return rc;
}

/* ---- sets of files ---- */

static int set_add(StSet *s, const char *path, Err *err) {
    s->files = xrealloc(s->files, (size_t)(s->nfiles + 1) * sizeof *s->files);
    TRY(st_open(&s->files[s->nfiles], path, err));
    s->nfiles++;
    return 0;
}

static int open_index(StSet *s, const char *dir, const char *index_path, Err *err) {
    json_t *root = json_load_path(index_path, err);
    if (!root) return -1;
    int rc = 0;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        json_decref(root);
        return err_set(err, "%s: expected an object with a \"weight_map\" object", index_path);
    }
    /* Open each distinct shard once, in sorted order, so file order is deterministic. Sorting
     * before removing duplicates keeps this O(n log n): a pairwise check took minutes on an
     * index naming 200000 shards. */
    size_t nw = json_object_size(wm), nshard = 0;
    const char **shards = xcalloc(nw ? nw : 1, sizeof *shards);
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            rc = err_set(err, "%s: weight_map entry \"%s\" must be a file name string", index_path,
                         name);
            break;
        }
        const char *fn = json_string_value(v);
        if (fn[0] == 0 || strchr(fn, '/') || strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0) {
            rc = err_set(err,
                         "%s: weight_map entry \"%s\" names shard \"%s\", which is not a plain "
                         "file name in the same directory",
                         index_path, name, fn);
            break;
        }
        shards[nshard++] = fn;
    }
    if (rc == 0) {
        qsort(shards, nshard, sizeof *shards, cmp_str_ptr);
        size_t u = 0;
        for (size_t k = 0; k < nshard; k++)
            if (u == 0 || strcmp(shards[u - 1], shards[k]) != 0) shards[u++] = shards[k];
        nshard = u;
    }
    for (size_t k = 0; k < nshard && rc == 0; k++) {
        char *p = fs_join(dir, shards[k]);
        if (!fs_exists(p))
            rc = err_set(err, "%s: weight_map names shard \"%s\", but %s does not exist",
                         index_path, shards[k], p);
        else
            rc = set_add(s, p, err);
        free(p);
    }
    json_object_foreach(wm, name, v) {
        if (rc != 0) break;
        const char *fn = json_string_value(v);
        const char **hit = bsearch(&fn, shards, nshard, sizeof *shards, cmp_str_ptr);
        size_t k = (size_t)(hit - shards);
        if (!st_find(&s->files[k], name))
            rc = err_set(err,
                         "%s: tensor \"%s\" is listed in weight_map under %s, but %s has "
                         "no such tensor",
                         index_path, name, fn, s->files[k].path);
    }
    /* A tensor in two shards would make lookups depend on file order. */
    for (int a = 0; a < s->nfiles && rc == 0; a++)
        for (int i = 0; i < s->files[a].n && rc == 0; i++)
            for (int b = a + 1; b < s->nfiles && rc == 0; b++)
                if (st_find(&s->files[b], s->files[a].tensors[i].name))
                    rc = err_set(err, "%s: tensor \"%s\" appears in both %s and %s", index_path,
                                 s->files[a].tensors[i].name, s->files[a].path, s->files[b].path);
    free(shards);
    json_decref(root);
    return rc;
}

int st_set_open(StSet *s, const char *path, Err *err) {
    memset(s, 0, sizeof *s);
    int rc;
    if (str_ends_with(path, ".safetensors.index.json") && !fs_is_dir(path)) {
        char *dir = fs_dir_of(path);
        rc = open_index(s, dir, path, err);
        free(dir);
    } else if (!fs_is_dir(path)) {
        rc = set_add(s, path, err);
    } else {
        char *index = fs_join(path, "model.safetensors.index.json");
        char *single = fs_join(path, "model.safetensors");
        if (fs_exists(index))
            rc = open_index(s, path, index, err);
        else if (fs_exists(single))
            rc = set_add(s, single, err);
        else
            rc = err_set(err,
                         "%s: directory has neither model.safetensors nor "
                         "model.safetensors.index.json",
                         path);
        free(index);
        free(single);
    }
    if (rc != 0) {
        st_set_close(s);
        return rc;
    }
    double total = 0;
    for (int i = 0; i < s->nfiles; i++)
        total += (double)s->files[i].map_len;
    char what[160];
    snprintf(what, sizeof what, "loading %s", path);
    s->progress = xmalloc(sizeof *s->progress);
    progress_start(s->progress, what, total, "MB", 1e6);
    return 0;
}

void st_set_progress(const StSet *s, size_t bytes) {
    if (s->progress) progress_add(s->progress, (double)bytes);
}

void st_set_progress_total(const StSet *s, double bytes) {
    if (s->progress) s->progress->total = bytes;
}

void st_set_close(StSet *s) {
    if (s->progress) progress_finish(s->progress);
    free(s->progress);
    for (int i = 0; i < s->nfiles; i++)
        st_close(&s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

const StTensor *st_set_find(const StSet *s, const char *name) {
    for (int i = 0; i < s->nfiles; i++) {
        const StTensor *t = st_find(&s->files[i], name);
        if (t) return t;
    }
    return NULL;
}

int st_set_has_fp8(const StSet *s) {
    for (int f = 0; f < s->nfiles; f++)
        for (int i = 0; i < s->files[f].n; i++)
            if (s->files[f].tensors[i].dtype == DT_F8_E4M3) return 1;
    return 0;
}

int st_set_pair_fp8(StSet *s, const int64_t block[2], Err *err) {
    int paired = 0;
    for (int f = 0; f < s->nfiles; f++)
        for (int i = 0; i < s->files[f].n; i++) {
            StTensor *w = &s->files[f].tensors[i];
            const char *path = s->files[f].path;
            if (w->dtype != DT_F8_E4M3) continue;
            if (w->ndim != 2)
                return err_set(err,
                               "%s: tensor \"%s\" is F8_E4M3 with %d dimensions; block-quantized "
                               "weights are matrices",
                               path, w->name, w->ndim);
            size_t len = strlen(w->name) + sizeof "_scale_inv";
            char *name = xmalloc(len);
            snprintf(name, len, "%s_scale_inv", w->name);
            StTensor *sc = NULL;
            for (int g = 0; g < s->nfiles && !sc; g++)
                sc = (StTensor *)st_find(&s->files[g], name);
            int rc = 0;
            if (!sc)
                rc = err_set(err,
                             "%s: tensor \"%s\" is F8_E4M3 but the checkpoint has no \"%s\" "
                             "(its block scales)",
                             path, w->name, name);
            /* ceil without overflow: a dimension next to a zero one may be near INT64_MAX */
            int64_t want[2] = {w->shape[0] / block[0] + (w->shape[0] % block[0] != 0),
                               w->shape[1] / block[1] + (w->shape[1] % block[1] != 0)};
            char a[256], b[64], c[64];
            if (sc) st_shape_str(a, sizeof a, sc->shape, sc->ndim);
            st_shape_str(b, sizeof b, want, 2);
            st_shape_str(c, sizeof c, w->shape, 2);
            if (rc == 0 && (sc->ndim != 2 || sc->shape[0] != want[0] || sc->shape[1] != want[1]))
                rc = err_set(err,
                             "%s: tensor \"%s\" has shape %s, expected %s: the scales of %s %s in "
                             "%" PRId64 " x %" PRId64 " blocks (weight_block_size)",
                             path, name, a, b, w->name, c, block[0], block[1]);
            if (rc == 0 && sc->dtype != DT_F32 && sc->dtype != DT_BF16 && sc->dtype != DT_F16)
                rc = err_set(err, "%s: tensor \"%s\" has dtype %s, expected F32, BF16 or F16", path,
                             name, dtype_name(sc->dtype));
            free(name);
            if (rc) return rc;
            w->scale = sc;
            w->block[0] = block[0], w->block[1] = block[1];
            sc->is_scale = 1;
            paired++;
        }
    return paired;
}
