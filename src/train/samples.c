/* Samples during training (see samples.h). */
#include "train/samples.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/log.h"

int samples_open(Samples *s, const JobConfig *cfg, Qwen3 *m, const Tokenizer *tok, Err *err) {
    memset(s, 0, sizeof *s);
    const char *where = cfg->sample.prompt_file[0] ? cfg->sample.prompt_file : "sample.prompts";
    if (cfg->sample.prompt_file[0] && cfg->sample.prompts[0])
        return err_set(err, "set one of sample.prompts and sample.prompt_file, not both");
    if (cfg->sample.prompt_file[0]) {
        size_t len;
        TRY(fs_read_all(cfg->sample.prompt_file, &s->data, &len, err));
    } else {
        s->data = xstrdup(cfg->sample.prompts);
    }
    s->prompts = xcalloc(strlen(s->data) / 2 + 1, sizeof *s->prompts);
    for (char *line = s->data; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (strspn(line, " \t\r") < strlen(line)) s->prompts[s->n++] = line;
        line = nl ? nl + 1 : NULL;
    }
    s->m = m;
    s->tok = tok;
    s->freq = cfg->sample.freq;
    if (s->n == 0) {
        err_set(err, "sample.freq = %d but %s holds no prompt (one prompt a line)", s->freq, where);
        samples_close(s);
        return -1;
    }
    s->ids = xcalloc((size_t)s->n, sizeof *s->ids);
    int longest = 0, rc = 0;
    for (int i = 0; i < s->n && rc == 0; i++) {
        rc = tokenizer_encode(tok, s->prompts[i], strlen(s->prompts[i]), &s->ids[i], err);
        if (rc == 0 && (int)s->ids[i].n > longest) longest = (int)s->ids[i].n;
        if (rc == 0)
            rc = qwen3_check_tokens(m, (const int32_t *)s->ids[i].ids, (long)s->ids[i].n, 0, where,
                                    err);
    }
    if (rc == 0 && longest + cfg->sample.max_new_tokens > m->spec.max_seq_len)
        rc = err_set(err,
                     "%s: a prompt of %d tokens with sample.max_new_tokens = %d exceeds the "
                     "model's context of %d positions",
                     where, longest, cfg->sample.max_new_tokens, m->spec.max_seq_len);
    if (rc == 0) rc = decoder_create(&s->d, m, s->n, longest + cfg->sample.max_new_tokens, err);
    if (rc != 0) {
        samples_close(s);
        return -1;
    }
    int neos = 0;
    int64_t e = tokenizer_token_id(tok, "<|endoftext|>");
    if (e >= 0) s->eos[neos++] = (int32_t)e;
    e = tokenizer_token_id(tok, "<|im_end|>");
    if (e >= 0) s->eos[neos++] = (int32_t)e;
    s->o = (GenOptions){.max_new_tokens = cfg->sample.max_new_tokens,
                        .sample = {.temperature = (float)cfg->sample.temperature, .top_p = 1.0f},
                        .seed = (uint64_t)cfg->sample.seed,
                        .eos = s->eos,
                        .n_eos = neos};
    s->path = fs_resolve(cfg->job.dump_folder, "samples.jsonl");
    return 0;
}

void samples_close(Samples *s) {
    if (s->d.m) decoder_free(&s->d);
    for (int i = 0; s->ids && i < s->n; i++)
        idvec_free(&s->ids[i]);
    free(s->ids), free(s->prompts), free(s->data), free(s->path);
    memset(s, 0, sizeof *s);
}

int samples_after_step(Samples *s, int64_t step, int last, Err *err) {
    if (!last && step % s->freq != 0) return 0;
    qwen3_refresh_bf16(s->m);
    const int32_t **ptr = xcalloc((size_t)s->n, sizeof *ptr);
    int *lens = xcalloc((size_t)s->n, sizeof *lens);
    for (int i = 0; i < s->n; i++) {
        ptr[i] = (const int32_t *)s->ids[i].ids;
        lens[i] = (int)s->ids[i].n;
    }
    GenOutput *out = xcalloc((size_t)s->n, sizeof *out);
    int rc = generate(&s->d, s->tok, ptr, lens, s->n, &s->o, out, NULL, NULL, NULL, err);
    FILE *f = rc == 0 ? fopen(s->path, "a") : NULL;
    if (rc == 0 && !f) rc = err_sys(err, "cannot open %s", s->path);
    for (int i = 0; i < s->n && rc == 0; i++) {
        log_info("sample step %lld [%d]: %s|%.*s", (long long)step, i + 1, s->prompts[i],
                 (int)out[i].text_len, out[i].text);
        json_t *o = json_object(), *ids = json_array();
        for (int t = 0; t < out[i].n; t++)
            json_array_append_new(ids, json_integer(out[i].ids[t]));
        json_object_set_new(o, "step", json_integer(step));
        json_object_set_new(o, "prompt", json_string(s->prompts[i]));
        json_object_set_new(o, "text", json_stringn(out[i].text, out[i].text_len));
        json_object_set_new(o, "ids", ids);
        char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(o);
        if (!line || fprintf(f, "%s\n", line) < 0) rc = err_sys(err, "cannot write to %s", s->path);
        free(line);
    }
    if (f && fclose(f) != 0 && rc == 0) rc = err_sys(err, "cannot write to %s", s->path);
    for (int i = 0; i < s->n; i++)
        gen_output_free(&out[i]);
    free(out), free(ptr), free(lens);
    return rc;
}
