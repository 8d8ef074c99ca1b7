/* Multiple-choice evaluation (see choices.h). */
#include "infer/choices.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "infer/decode.h"
#include "infer/sample.h"
#include "text/jsonl.h"
#include "text/utf8.h"

static void item_free(ChoiceItem *it) {
    free(it->context);
    for (int j = 0; j < it->n; j++)
        free(it->choice[j]);
    free(it->choice), free(it->choice_len);
}

void choice_set_free(ChoiceSet *cs) {
    for (int i = 0; i < cs->n; i++)
        item_free(&cs->item[i]);
    free(cs->item);
    memset(cs, 0, sizeof *cs);
}

static char *copy_string(const json_t *s, size_t *len) {
    *len = json_string_length(s);
    char *out = xmalloc(*len + 1);
    memcpy(out, json_string_value(s), *len + 1);
    return out;
}

/* One line's question into it (zeroed on entry). */
static int parse_item(const json_t *o, const char *file, int64_t line, ChoiceItem *it, Err *err) {
    it->line = line;
    it->label = -1;
    if (!json_is_object(o))
        return err_set(err,
                       "%s:%lld: expected a JSON object with \"context\" and \"choices\", found %s",
                       file, (long long)line, json_kind(o));
    const json_t *c = json_object_get(o, "context"), *ch = json_object_get(o, "choices");
    const json_t *lb = json_object_get(o, "label");
    if (!json_is_string(c))
        return err_set(err, "%s:%lld: \"context\" must be a string, found %s", file,
                       (long long)line, c ? json_kind(c) : "none");
    if (!json_is_array(ch) || json_array_size(ch) == 0)
        return err_set(err, "%s:%lld: \"choices\" must be a non-empty array of strings, found %s",
                       file, (long long)line,
                       ch ? (json_is_array(ch) ? "an empty array" : json_kind(ch)) : "none");
    if (json_array_size(ch) > 65536)
        return err_set(err, "%s:%lld: \"choices\" holds %zu strings, more than 65536", file,
                       (long long)line, json_array_size(ch));
    it->context = copy_string(c, &it->context_len);
    int n = (int)json_array_size(ch);
    it->choice = xcalloc((size_t)n, sizeof *it->choice);
    it->choice_len = xcalloc((size_t)n, sizeof *it->choice_len);
    for (int j = 0; j < n; j++) {
        const json_t *s = json_array_get(ch, (size_t)j);
        if (!json_is_string(s))
            return err_set(err, "%s:%lld: choice %d must be a string, found %s", file,
                           (long long)line, j, json_kind(s));
        it->choice[j] = copy_string(s, &it->choice_len[j]);
        it->n = j + 1;
    }
    if (lb && !json_is_null(lb)) {
        if (!json_is_integer(lb) || json_integer_value(lb) < 0 || json_integer_value(lb) >= n)
            return err_set(err,
                           "%s:%lld: \"label\" must be the index of the right choice (0 to %d) or "
                           "null, found %s",
                           file, (long long)line, n - 1,
                           json_is_integer(lb) ? "an index out of range" : json_kind(lb));
        it->label = (int)json_integer_value(lb);
    }
    return 0;
}

int choice_set_parse(ChoiceSet *cs, const char *text, size_t len, const char *file, Err *err) {
    memset(cs, 0, sizeof *cs);
    size_t pos = jsonl_bom_len(text, len), line_len;
    const char *line;
    int64_t ln = 0;
    int cap = 0, rc = 0;
    while (rc == 0 && jsonl_next_line(text, len, &pos, &line, &line_len) == 0) {
        ln++;
        if (jsonl_is_blank(line, line_len)) continue;
        json_error_t je;
        json_t *o = json_loadb(line, line_len, JSON_ALLOW_NUL, &je);
        if (!o) {
            rc = err_set(err, "%s:%lld: not valid JSON: %s", file, (long long)ln, je.text);
            break;
        }
        if (cs->n == cap) {
            cap = cap ? 2 * cap : 16;
            cs->item = xrealloc(cs->item, (size_t)cap * sizeof *cs->item);
        }
        ChoiceItem *it = &cs->item[cs->n];
        memset(it, 0, sizeof *it);
        rc = parse_item(o, file, ln, it, err);
        json_decref(o);
        cs->n++; /* freed with the set, whole or not */
        if (rc == 0) cs->n_choices += it->n;
    }
    if (rc == 0 && cs->n == 0) rc = err_set(err, "%s holds no question", file);
    if (rc) choice_set_free(cs);
    return rc;
}

int choice_set_read(ChoiceSet *cs, const char *path, Err *err) {
    char *text;
    size_t len;
    memset(cs, 0, sizeof *cs);
    TRY(fs_read_all(path, &text, &len, err));
    int rc = choice_set_parse(cs, text, len, path, err);
    free(text);
    return rc;
}

/* Python's str.isspace(): the White_Space property and the separators U+001C..U+001F. */
static int py_space(uint32_t cp) {
    return utf8_is_space(cp) || (cp >= 0x1C && cp <= 0x1F);
}

/* Bytes of s[0..len) (valid UTF-8) before its trailing whitespace, as str.rstrip() cuts. */
static size_t rstrip_len(const char *s, size_t len) {
    size_t keep = 0;
    for (size_t i = 0; i < len;) {
        int w;
        uint32_t cp = utf8_decode((const uint8_t *)s, i, &w);
        i += (size_t)w;
        if (!py_space(cp)) keep = i;
    }
    return keep;
}

int choice_encode(const Tokenizer *tok, const char *context, size_t context_len,
                  const char *continuation, size_t continuation_len, int32_t prefix, IdVec *ctx,
                  IdVec *cont, Err *err) {
    ctx->n = cont->n = 0;
    int rc = 0;
    if (context_len == 0) {
        TRY(tokenizer_encode(tok, continuation, continuation_len, cont, err));
        if (cont->n > 0 && cont->ids[0] == (uint32_t)prefix) { /* it is the context */
            idvec_push(ctx, cont->ids[0]);
            memmove(cont->ids, cont->ids + 1, (cont->n - 1) * sizeof *cont->ids);
            cont->n--;
        } else {
            idvec_push(ctx, (uint32_t)prefix);
        }
    } else {
        size_t keep = rstrip_len(context, context_len);
        char *whole = xmalloc(context_len + continuation_len + 1);
        memcpy(whole, context, context_len);
        memcpy(whole + context_len, continuation, continuation_len);
        IdVec all = {0};
        rc = tokenizer_encode(tok, whole, context_len + continuation_len, &all, err);
        if (rc == 0 && keep == 0)
            rc = err_set(err, "the context is only whitespace, which leaves no token before the "
                              "choice (\"\" stands for the prefix token)");
        if (rc == 0) rc = tokenizer_encode(tok, context, keep, ctx, err);
        for (size_t i = ctx->n; rc == 0 && i < all.n; i++)
            idvec_push(cont, all.ids[i]);
        idvec_free(&all);
        free(whole);
    }
    if (rc == 0 && cont->n == 0) rc = err_set(err, "the choice adds no token after the context's");
    return rc;
}

/* One request: its ids (context + continuation, cut to T + 1 from the left) and how many of
 * the last are the continuation's. */
typedef struct Request {
    IdVec ids;
    long n_cont;
} Request;

/* Continuation rows checked a pass at most (the logits of a pass are this many rows). */
#define CHOICE_PASS 16

/* The log-likelihood of request rq's continuation X (m ids) after its prefix P, the request's
 * other ids: P runs through the decoder (sequence 0) unless the cache holds exactly P already
 * (the request before it had the same context: logits0 then holds P's last logits), then X but
 * its last id runs after it, CHOICE_PASS rows a pass, and the cache goes back to P. */
static double score_request(Decoder *d, const Request *rq, const Request *prev, float *logits0,
                            float *vlog, ChoiceStats *st) {
    static const int zeros[CHOICE_PASS] = {0}; /* every row is sequence 0's */
    int V = d->m->spec.vocab_size;
    long n = (long)rq->ids.n, m = rq->n_cont, np = n - m;
    const int32_t *ids = (const int32_t *)rq->ids.ids;
    int same = prev && (long)prev->ids.n - prev->n_cont == np &&
               memcmp(prev->ids.ids, rq->ids.ids, (size_t)np * sizeof *rq->ids.ids) == 0;
    if (!same) {
        decoder_reset(d);
        decoder_prefill(d, 0, ids, (int)np, logits0);
        st->tokens += np, st->rows++;
    }
    double ll = sample_logprob(logits0, V, ids[np]);
    for (long a = 0; a < m - 1; a += CHOICE_PASS) {
        int rows = (int)(m - 1 - a < CHOICE_PASS ? m - 1 - a : CHOICE_PASS);
        decoder_step(d, zeros, ids + np + a, rows, vlog);
        for (int r = 0; r < rows; r++)
            ll += sample_logprob(vlog + (long)r * V, V, ids[np + a + r + 1]);
        st->tokens += rows, st->rows++;
    }
    decoder_truncate(d, 0, (int)np);
    return ll;
}

int choice_score(Qwen3 *m, int T, const Tokenizer *tok, int32_t prefix, const ChoiceSet *cs,
                 double *ll, ChoiceStats *st, Err *err) {
    Request *rq = xcalloc((size_t)cs->n_choices, sizeof *rq);
    IdVec ctx = {0}, cont = {0};
    int rc = 0;
    long k = 0;
    for (int i = 0; i < cs->n && rc == 0; i++) {
        const ChoiceItem *it = &cs->item[i];
        for (int j = 0; j < it->n && rc == 0; j++, k++) {
            rc = choice_encode(tok, it->context, it->context_len, it->choice[j], it->choice_len[j],
                               prefix, &ctx, &cont, err);
            if (rc) {
                err_wrap(err, "line %lld, choice %d", (long long)it->line, j);
                break;
            }
            if ((long)cont.n > T) {
                rc = err_set(err,
                             "line %lld, choice %d: its %zu tokens do not fit the %d positions "
                             "of a row (--seq-len)",
                             (long long)it->line, j, cont.n, T);
                break;
            }
            rc = qwen3_check_tokens(m, (const int32_t *)ctx.ids, (long)ctx.n, 0, "context", err);
            if (rc == 0)
                rc = qwen3_check_tokens(m, (const int32_t *)cont.ids, (long)cont.n, 0, "choice",
                                        err);
            /* The last T + 1 tokens of context + continuation. */
            size_t total = ctx.n + cont.n, skip = total > (size_t)T + 1 ? total - (size_t)T - 1 : 0;
            for (size_t t = skip; rc == 0 && t < total; t++)
                idvec_push(&rq[k].ids, t < ctx.n ? ctx.ids[t] : cont.ids[t - ctx.n]);
            rq[k].n_cont = (long)cont.n;
        }
    }
    idvec_free(&ctx), idvec_free(&cont);
    ChoiceStats s = {0};
    Decoder d;
    if (rc == 0) rc = decoder_create(&d, m, 1, T, err);
    if (rc == 0) {
        int V = m->spec.vocab_size;
        float *logits0 = xmalloc((size_t)V * sizeof *logits0);
        float *vlog = xmalloc((size_t)CHOICE_PASS * V * sizeof *vlog);
        for (long r = 0; r < k; r++)
            ll[r] = score_request(&d, &rq[r], r ? &rq[r - 1] : NULL, logits0, vlog, &s);
        free(logits0), free(vlog);
        decoder_free(&d);
    }
    for (long r = 0; r < cs->n_choices; r++)
        idvec_free(&rq[r].ids);
    free(rq);
    if (st) *st = s;
    return rc;
}

/* Unicode code points of valid UTF-8 s[0..len). */
static size_t code_points(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

/* numpy's argmax of v[j] / (div ? div[j] : 1): the first of equal maxima. */
static int argmax(const double *v, const double *div, int n) {
    int best = 0;
    for (int j = 1; j < n; j++) {
        double a = div ? v[j] / div[j] : v[j], b = div ? v[best] / div[best] : v[best];
        if (a > b) best = j;
    }
    return best;
}

static double stderr_of(double hits, int n) {
    if (n < 2) return 0.0;
    double p = hits / n;
    /* sample standard deviation of n values in {0, 1} with mean p, over sqrt(n) */
    return sqrt(p * (1 - p) * n / (n - 1)) / sqrt((double)n);
}

void choice_metrics(const ChoiceSet *cs, const double *ll, ChoiceMetrics *out, int *pred) {
    memset(out, 0, sizeof *out);
    double hit[3] = {0, 0, 0};
    long k = 0;
    for (int i = 0; i < cs->n; i++) {
        const ChoiceItem *it = &cs->item[i];
        double *chars = xmalloc((size_t)it->n * sizeof *chars);
        double *bytes = xmalloc((size_t)it->n * sizeof *bytes);
        for (int j = 0; j < it->n; j++) {
            chars[j] = (double)code_points(it->choice[j], it->choice_len[j]);
            bytes[j] = (double)it->choice_len[j];
        }
        int p[3] = {argmax(ll + k, NULL, it->n), argmax(ll + k, chars, it->n),
                    argmax(ll + k, bytes, it->n)};
        if (pred) memcpy(pred + 3L * i, p, sizeof p);
        if (it->label >= 0) {
            out->n++;
            for (int m = 0; m < 3; m++)
                hit[m] += p[m] == it->label;
        }
        free(chars), free(bytes);
        k += it->n;
    }
    if (out->n == 0) return;
    out->acc = hit[0] / out->n, out->acc_norm = hit[1] / out->n, out->acc_bytes = hit[2] / out->n;
    out->acc_se = stderr_of(hit[0], out->n);
    out->acc_norm_se = stderr_of(hit[1], out->n);
    out->acc_bytes_se = stderr_of(hit[2], out->n);
}
