/* qtitan parameters <-> HF Qwen3 / Qwen3-MoE keys, from the parameter table; see hf_keys.h. */
#include "io/hf_keys.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_hf(HfKeyTable *t, int *cap, int param, int expert, const ParamInfo *p,
                   const char *name) {
    if (t->nhf == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        t->hf = xrealloc(t->hf, (size_t)*cap * sizeof *t->hf);
    }
    HfTensor *h = &t->hf[t->nhf++];
    memset(h, 0, sizeof *h);
    snprintf(h->name, sizeof h->name, "%s", name);
    /* An expert's tensor is its slice of the stacked parameter: the shape without X. */
    int skip = expert >= 0;
    h->ndim = p->ndim - skip;
    h->numel = 1;
    for (int d = 0; d < h->ndim; d++) {
        h->shape[d] = p->shape[d + skip];
        h->numel *= h->shape[d];
    }
    h->param = param;
    h->expert = expert;
}

typedef struct NameIdx {
    const char *name;
    int idx;
} NameIdx;

static int cmp_name_idx(const void *a, const void *b) {
    return strcmp(((const NameIdx *)a)->name, ((const NameIdx *)b)->name);
}

/* Indices of n names (each at base + i * stride) in name order. */
static int *sorted_indices(const char *base, size_t stride, int n) {
    NameIdx *v = xmalloc((size_t)(n ? n : 1) * sizeof *v);
    for (int i = 0; i < n; i++)
        v[i] = (NameIdx){base + (size_t)i * stride, i};
    qsort(v, (size_t)n, sizeof *v, cmp_name_idx);
    int *out = xmalloc((size_t)(n ? n : 1) * sizeof *out);
    for (int i = 0; i < n; i++)
        out[i] = v[i].idx;
    free(v);
    return out;
}

/* The HF tensors of parameters [lo, hi) (one layer, or one model-scope parameter) in
 * transformers' order: by hf_order, the experts' slices interleaved expert by expert (gate,
 * up, down of expert 0, then of expert 1, ...). */
static void add_hf_block(HfKeyTable *t, int *cap, int lo, int hi, int experts) {
    int idx[PK_COUNT], n = 0;
    for (int p = lo; p < hi; p++)
        if (t->params[p].kind->hf) idx[n++] = p;
    for (int i = 1; i < n; i++)
        for (int j = i;
             j > 0 && t->params[idx[j - 1]].kind->hf_order > t->params[idx[j]].kind->hf_order;
             j--) {
            int tmp = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = tmp;
        }
    char name[HF_KEY_MAX];
    int experts_done = 0;
    for (int i = 0; i < n; i++) {
        const ParamInfo *q = &t->params[idx[i]];
        if (q->kind->role != ROLE_EXPERTS) {
            snprintf(name, sizeof name, q->kind->hf, q->layer);
            add_hf(t, cap, idx[i], -1, q, name);
            continue;
        }
        if (experts_done) continue;
        experts_done = 1;
        for (int e = 0; e < experts; e++)
            for (int j = i; j < n; j++) {
                const ParamInfo *x = &t->params[idx[j]];
                if (x->kind->role != ROLE_EXPERTS) continue;
                snprintf(name, sizeof name, x->kind->hf, x->layer, e);
                add_hf(t, cap, idx[j], e, x, name);
            }
    }
}

void hf_keys_build(HfKeyTable *t, const ModelSpec *s) {
    memset(t, 0, sizeof *t);
    t->tied = s->tie_embeddings;
    t->vocab = s->vocab_size;
    t->dim = s->dim;
    t->nparams = param_list(s, NULL);
    t->params = xmalloc((size_t)t->nparams * sizeof *t->params);
    param_list(s, t->params);
    int cap = 0;
    for (int lo = 0, hi; lo < t->nparams; lo = hi) {
        hi = lo + 1;
        while (t->params[lo].layer >= 0 && hi < t->nparams &&
               t->params[hi].layer == t->params[lo].layer)
            hi++;
        add_hf_block(t, &cap, lo, hi, s->num_experts);
    }
    t->param_by_name = sorted_indices(t->params[0].name, sizeof *t->params, t->nparams);
    t->hf_by_name = sorted_indices(t->hf[0].name, sizeof *t->hf, t->nhf);
}

void hf_keys_free(HfKeyTable *t) {
    free(t->params);
    free(t->hf);
    free(t->param_by_name);
    free(t->hf_by_name);
    memset(t, 0, sizeof *t);
}

int hf_keys_find_param(const HfKeyTable *t, const char *name) {
    int lo = 0, hi = t->nparams - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(t->params[t->param_by_name[mid]].name, name);
        if (c == 0) return t->param_by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

int hf_keys_find_hf(const HfKeyTable *t, const char *name) {
    int lo = 0, hi = t->nhf - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(t->hf[t->hf_by_name[mid]].name, name);
        if (c == 0) return t->hf_by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static void shape_str(char *out, size_t cap, const int64_t *shape, int ndim) {
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

static int same_shape(const HfTensor *h, const StTensor *st) {
    if (st->ndim != h->ndim) return 0;
    for (int i = 0; i < h->ndim; i++)
        if (st->shape[i] != h->shape[i]) return 0;
    return 1;
}

/* A dtype the loaders convert: F32, BF16, F16, or F8_E4M3 paired with block scales. */
static int float_dtype(const StTensor *st) {
    return st->dtype == DT_F32 || st->dtype == DT_BF16 || st->dtype == DT_F16 ||
           (st->dtype == DT_F8_E4M3 && st->scale);
}

/* The sentence's tail for a tensor float_dtype refuses. */
static const char *DTYPE_EXPECTED = "expected F32, BF16, F16 or F8_E4M3 with block scales";

static void push(char ***list, int *n, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void push(char ***list, int *n, const char *f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    *list = xrealloc(*list, (size_t)(*n + 1) * sizeof **list);
    (*list)[(*n)++] = xstrdup(buf);
}

int hf_keys_check(HfCheck *out, const HfKeyTable *t, const StSet *set) {
    memset(out, 0, sizeof *out);
    char a[128], b[128];
    for (int i = 0; i < t->nhf; i++) {
        const HfTensor *h = &t->hf[i];
        const StTensor *st = st_set_find(set, h->name);
        shape_str(a, sizeof a, h->shape, h->ndim);
        if (!st) {
            push(&out->missing, &out->nmissing, "%s (expected %s)", h->name, a);
        } else if (!same_shape(h, st)) {
            shape_str(b, sizeof b, st->shape, st->ndim);
            push(&out->wrong, &out->nwrong, "%s: shape %s, expected %s", h->name, b, a);
        } else if (!float_dtype(st)) {
            push(&out->wrong, &out->nwrong, "%s: dtype %s, %s", h->name, dtype_name(st->dtype),
                 DTYPE_EXPECTED);
        }
    }
    for (int f = 0; f < set->nfiles; f++)
        for (int i = 0; i < set->files[f].n; i++) {
            const StTensor *st = &set->files[f].tensors[i];
            if (st->is_scale || hf_keys_find_hf(t, st->name) >= 0) continue;
            shape_str(b, sizeof b, st->shape, st->ndim);
            if (t->tied && strcmp(st->name, PARAM_KINDS[PK_OUTPUT].hf) == 0) {
                int64_t want[2] = {t->vocab, t->dim};
                if (st->ndim != 2 || st->shape[0] != want[0] || st->shape[1] != want[1]) {
                    shape_str(a, sizeof a, want, 2);
                    push(&out->wrong, &out->nwrong,
                         "%s: shape %s, expected %s (ignored when embeddings are tied)", st->name,
                         b, a);
                }
                continue;
            }
            push(&out->unexpected, &out->nunexpected, "%s %s", st->name, b);
        }
    return out->nmissing + out->nunexpected + out->nwrong;
}

void hf_check_free(HfCheck *c) {
    for (int i = 0; i < c->nmissing; i++)
        free(c->missing[i]);
    for (int i = 0; i < c->nunexpected; i++)
        free(c->unexpected[i]);
    for (int i = 0; i < c->nwrong; i++)
        free(c->wrong[i]);
    free(c->missing);
    free(c->unexpected);
    free(c->wrong);
    memset(c, 0, sizeof *c);
}

/* Elements converted between drops of the file's pages (st_release_range): 4 MiB of fp32. */
#define LOAD_PIECE ((int64_t)1 << 20)

/* Elements [lo, lo + n) of parameter p into dst as dtype to (F32 or BF16). */
static int load_range(void *dst, DType to, const HfKeyTable *t, int p, const StSet *set, int64_t lo,
                      int64_t n, Err *err) {
    const ParamInfo *qp = &t->params[p];
    if (!qp->kind->hf)
        return err_set(err, "parameter %s is not stored in HF checkpoints", qp->name);
    int found = 0;
    for (int i = 0; i < t->nhf; i++) {
        const HfTensor *h = &t->hf[i];
        if (h->param != p) continue;
        const StTensor *st = st_set_find(set, h->name);
        char a[128], b[128];
        if (!st)
            return err_set(err, "HF checkpoint has no tensor \"%s\" (for %s)", h->name, qp->name);
        shape_str(a, sizeof a, h->shape, h->ndim);
        if (!same_shape(h, st)) {
            shape_str(b, sizeof b, st->shape, st->ndim);
            return err_set(err, "HF tensor \"%s\" has shape %s, expected %s", h->name, b, a);
        }
        if (!float_dtype(st))
            return err_set(err, "HF tensor \"%s\" has dtype %s, %s", h->name, dtype_name(st->dtype),
                           DTYPE_EXPECTED);
        found++;
        /* The part of [lo, lo + n) this HF tensor holds (experts are stacked one after
         * another in the parameter). */
        int64_t off = h->expert < 0 ? 0 : (int64_t)h->expert * h->numel;
        int64_t a0 = lo > off ? lo : off, a1 = lo + n < off + h->numel ? lo + n : off + h->numel;
        /* A piece at a time, each piece's pages of the file dropped once converted, so the
         * mapping adds at most a piece to the resident memory. */
        for (int64_t c0 = a0, c1; c0 < a1; c0 = c1) {
            c1 = a1 - c0 < LOAD_PIECE ? a1 : c0 + LOAD_PIECE;
            int64_t bad = st_convert_range(st, to, (char *)dst + (size_t)(c0 - lo) * dtype_size(to),
                                           c0 - off, c1 - c0);
            st_set_progress(set, (size_t)(c1 - c0) * dtype_size(st->dtype));
            /* A NaN or an infinity would make every loss and gradient NaN from the first step,
             * and the run would then blame the learning rate; name the tensor instead. */
            if (bad >= 0) {
                float v;
                st_convert_range(st, DT_F32, &v, c0 - off + bad, 1);
                return err_set(
                    err, "HF tensor \"%s\" holds %s at element %" PRId64 "; weights must be finite",
                    h->name, isnan(v) ? "a NaN" : "an infinity", c0 - off + bad);
            }
            st_release_range(st, c0 - off, c1 - c0);
        }
    }
    return found ? 0 : err_set(err, "parameter %s has no HF tensors", qp->name);
}

size_t hf_keys_file_elem_size(const HfKeyTable *t, int p, const StSet *set) {
    for (int i = 0; i < t->nhf; i++)
        if (t->hf[i].param == p) {
            const StTensor *st = st_set_find(set, t->hf[i].name);
            return st ? dtype_size(st->dtype) : 0;
        }
    return 0;
}

int hf_keys_load_param(float *dst, const HfKeyTable *t, int p, const StSet *set, Err *err) {
    return load_range(dst, DT_F32, t, p, set, 0, t->params[p].numel, err);
}

int hf_keys_load_param_range(float *dst, const HfKeyTable *t, int p, const StSet *set, int64_t lo,
                             int64_t n, Err *err) {
    return load_range(dst, DT_F32, t, p, set, lo, n, err);
}

int hf_keys_load_param_bf16(uint16_t *dst, const HfKeyTable *t, int p, const StSet *set, Err *err) {
    return load_range(dst, DT_BF16, t, p, set, 0, t->params[p].numel, err);
}

void hf_keys_add_to_writer(StWriter *w, const HfKeyTable *t, const float *const *params,
                           DType dtype) {
    hf_keys_add_to_writer_on(w, t, params, NULL, NULL, dtype);
}

void hf_keys_add_to_writer_on(StWriter *w, const HfKeyTable *t, const float *const *params,
                              const Device *const *devices, const HfKeySource *sources,
                              DType dtype) {
    for (int i = 0; i < t->nhf; i++) {
        const HfTensor *h = &t->hf[i];
        const HfKeySource *src = sources && sources[h->param].pull ? &sources[h->param] : NULL;
        int64_t off = h->expert < 0 ? 0 : (int64_t)h->expert * h->numel;
        if (src) {
            st_writer_add_f32_source(w, h->name, dtype, h->ndim, h->shape, src->pull, src->ctx,
                                     (size_t)off);
            continue;
        }
        const Device *d = devices && devices[h->param] ? devices[h->param] : &device_cpu;
        st_writer_add_f32_on(w, d, h->name, dtype, h->ndim, h->shape, params[h->param] + off);
    }
}
