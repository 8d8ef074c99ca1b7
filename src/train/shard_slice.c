/* Slices of tensors and the copy between any two sets of them (shard_slice.h). */
#include "train/shard_slice.h"

#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/log.h"

/* A tensor of more elements than this is not one this program could hold; the bound keeps
 * every product and sum below well inside int64_t. */
#define MAX_NUMEL ((int64_t)1 << 48)

void shard_slice_whole(ShardSlice *s, int ndim, const int64_t *shape) {
    memset(s, 0, sizeof *s);
    s->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        s->shape[d] = shape[d];
        s->box_len[d] = shape[d];
    }
    s->numel = shard_slice_box_numel(s);
}

int64_t shard_slice_box_numel(const ShardSlice *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++)
        n *= s->box_len[d];
    return n;
}

int shard_slice_equal(const ShardSlice *a, const ShardSlice *b) {
    if (a->ndim != b->ndim || a->start != b->start || a->numel != b->numel) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->box_off[d] != b->box_off[d] ||
            a->box_len[d] != b->box_len[d])
            return 0;
    return 1;
}

static json_t *ints(const int64_t *v, int n) {
    json_t *a = json_array();
    for (int d = 0; d < n; d++)
        json_array_append_new(a, json_integer(v[d]));
    return a;
}

json_t *shard_slice_to_json(const ShardSlice *s) {
    json_t *o = json_object();
    json_object_set_new(o, "shape", ints(s->shape, s->ndim));
    json_object_set_new(o, "box_offset", ints(s->box_off, s->ndim));
    json_object_set_new(o, "box_shape", ints(s->box_len, s->ndim));
    json_object_set_new(o, "start", json_integer(s->start));
    json_object_set_new(o, "numel", json_integer(s->numel));
    return o;
}

/* out[0..*n) = the integer array o[key] of 1..CKPT_MAX_DIMS entries, each >= min. */
static int get_ints(const json_t *o, const char *key, int64_t *out, int *n, int64_t min,
                    const char *what, const char *name, Err *err) {
    const json_t *a = json_object_get(o, key);
    size_t len = json_array_size(a);
    int ok = json_is_array(a) && len >= 1 && len <= CKPT_MAX_DIMS;
    for (size_t d = 0; ok && d < len; d++) {
        const json_t *v = json_array_get(a, d);
        ok = json_is_integer(v) && json_integer_value(v) >= min &&
             json_integer_value(v) <= MAX_NUMEL;
        if (ok) out[d] = json_integer_value(v);
    }
    if (!ok)
        return err_set(err, "%s: %s.%s must be a list of 1 to %d integers >= %lld", what, name, key,
                       CKPT_MAX_DIMS, (long long)min);
    *n = (int)len;
    return 0;
}

int shard_slice_from_json(const json_t *j, ShardSlice *s, const char *what, const char *name,
                          Err *err) {
    memset(s, 0, sizeof *s);
    if (!json_is_object(j)) return err_set(err, "%s: %s is not an object", what, name);
    int n0, n1, n2;
    TRY(get_ints(j, "shape", s->shape, &n0, 1, what, name, err));
    TRY(get_ints(j, "box_offset", s->box_off, &n1, 0, what, name, err));
    TRY(get_ints(j, "box_shape", s->box_len, &n2, 1, what, name, err));
    if (n1 != n0 || n2 != n0)
        return err_set(err, "%s: %s: shape, box_offset and box_shape must have as many entries",
                       what, name);
    s->ndim = n0;
    int64_t total = 1, box = 1;
    for (int d = 0; d < n0; d++) {
        if (s->box_off[d] + s->box_len[d] > s->shape[d])
            return err_set(err, "%s: %s: the box ends at %lld in dimension %d, past its size %lld",
                           what, name, (long long)(s->box_off[d] + s->box_len[d]), d,
                           (long long)s->shape[d]);
        if (__builtin_mul_overflow(total, s->shape[d], &total) || total > MAX_NUMEL)
            return err_set(err, "%s: %s: the shape has too many elements", what, name);
        box *= s->box_len[d]; /* <= total */
    }
    TRY(json_req_int(j, "start", &s->start, what, err));
    TRY(json_req_int(j, "numel", &s->numel, what, err));
    if (s->start < 0 || s->numel < 1 || s->start > box || s->numel > box - s->start)
        return err_set(err, "%s: %s: elements [%lld, +%lld) are not inside its box of %lld", what,
                       name, (long long)s->start, (long long)s->numel, (long long)box);
    return 0;
}

/* A source's contribution to one run: out[at, at + n). */
typedef struct Span {
    int64_t at, n;
} Span;

/* The global flat index of element j of s's box (for messages). */
static int64_t global_index(const ShardSlice *s, int64_t j) {
    int64_t idx[CKPT_MAX_DIMS], g = 0;
    for (int d = s->ndim - 1; d >= 0; d--) {
        idx[d] = j % s->box_len[d];
        j /= s->box_len[d];
    }
    for (int d = 0; d < s->ndim; d++)
        g = g * s->shape[d] + s->box_off[d] + idx[d];
    return g;
}

int shard_copy(const ShardSlice *want, float *out, const ShardSource *src, int nsrc,
               const char *name, Err *err) {
    int nd = want->ndim, last = nd - 1, rc = 0;
    int *use = xcalloc((size_t)nsrc + 1, sizeof *use);
    int nuse = 0;
    for (int k = 0; k < nsrc && rc == 0; k++) {
        const ShardSlice *q = &src[k].slice;
        int same_shape = q->ndim == nd;
        for (int d = 0; same_shape && d < nd; d++)
            same_shape = q->shape[d] == want->shape[d];
        if (!same_shape) {
            rc = err_set(err, "%s: the slice of %s in its layout has another shape than %s's",
                         src[k].file, name, name);
            break;
        }
        int dup = 0;
        for (int i = 0; i < nuse && !dup; i++)
            dup = shard_slice_equal(&src[use[i]].slice, q);
        if (!dup) use[nuse++] = k;
    }
    Span *sp = xmalloc(((size_t)nuse + 1) * sizeof *sp);
    int64_t j = want->start, end = want->start + want->numel;
    while (rc == 0 && j < end) {
        /* The run of want's box that lies in one row (last dimension): global coordinates g of
         * its leading dimensions, columns [c, c + m). */
        int64_t idx[CKPT_MAX_DIMS], g[CKPT_MAX_DIMS], r = j;
        for (int d = last; d >= 0; d--) {
            idx[d] = r % want->box_len[d];
            r /= want->box_len[d];
        }
        for (int d = 0; d < last; d++)
            g[d] = want->box_off[d] + idx[d];
        int64_t c = want->box_off[last] + idx[last], m = want->box_len[last] - idx[last];
        if (m > end - j) m = end - j;
        float *o = out + (j - want->start);
        int ns = 0;
        for (int u = 0; u < nuse; u++) {
            const ShardSlice *q = &src[use[u]].slice;
            int in = 1;
            for (int d = 0; in && d < last; d++)
                in = g[d] >= q->box_off[d] && g[d] < q->box_off[d] + q->box_len[d];
            if (!in) continue;
            int64_t qc = q->box_off[last], qe = qc + q->box_len[last];
            int64_t c0 = c > qc ? c : qc, c1 = c + m < qe ? c + m : qe;
            if (c0 >= c1) continue;
            int64_t b = 0; /* c0's flat index in q's box */
            for (int d = 0; d < last; d++)
                b = b * q->box_len[d] + (g[d] - q->box_off[d]);
            b = b * q->box_len[last] + (c0 - qc);
            int64_t lo = b > q->start ? b : q->start;
            int64_t hi = b + (c1 - c0) < q->start + q->numel ? b + (c1 - c0) : q->start + q->numel;
            if (lo >= hi) continue;
            int64_t at = c0 - c + (lo - b);
            memcpy(o + at,
                   (const char *)src[use[u]].data + (lo - q->start) * (int64_t)sizeof(float),
                   (size_t)(hi - lo) * sizeof(float));
            /* Insertion by position: a run meets few sources. */
            int i = ns++;
            while (i > 0 && sp[i - 1].at > at) {
                sp[i] = sp[i - 1];
                i--;
            }
            sp[i] = (Span){at, hi - lo};
        }
        int64_t pos = 0;
        int i = 0;
        for (; i < ns && sp[i].at == pos; i++)
            pos += sp[i].n;
        if (i != ns || pos != m) {
            int twice = i < ns && sp[i].at < pos;
            int64_t total = 1;
            for (int d = 0; d < nd; d++)
                total *= want->shape[d];
            rc = err_set(err,
                         "the checkpoint's slices of %s %s element %lld of its %lld elements "
                         "(flat): a piece is missing, or the recorded layout disagrees with the "
                         "files",
                         name, twice ? "hold twice" : "do not hold",
                         (long long)global_index(want, j + (twice ? sp[i].at : pos)),
                         (long long)total);
        }
        j += m;
    }
    free(sp);
    free(use);
    return rc;
}
