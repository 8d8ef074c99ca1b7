/* Samples during training (see samples.h). */
#include "train/samples.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/log.h"
#include "text/chat_template.h"

static int read_prompts(Samples *s, const JobConfig *cfg, Err *err) {
    const char *where = cfg->sample.prompt_file[0] ? cfg->sample.prompt_file : "sample.prompts";
    if (cfg->sample.prompt_file[0] && cfg->sample.prompts[0])
        return err_set(err, "set one of sample.prompts and sample.prompt_file, not both");
    int rc;
    if (cfg->sample.prompt_file[0]) {
        char *data;
        size_t len;
        TRY(fs_read_all(cfg->sample.prompt_file, &data, &len, err));
        rc = prompt_lines_split(&s->pr, data, len, where, err);
        free(data);
    } else {
        rc = prompt_lines_split(&s->pr, cfg->sample.prompts, strlen(cfg->sample.prompts), where,
                                err);
    }
    return rc ? err_wrap(err, "sample.freq = %d", cfg->sample.freq) : 0;
}

int samples_check_gather(const JobConfig *cfg, int world, Err *err) {
    if (cfg->sample.gather == SAMPLE_GATHER_UNITS && world == 1)
        return err_set(err,
                       "sample.gather = \"units\" gathers the model from its shards one unit at "
                       "a time, which needs more than one process; use \"auto\" or \"whole\"");
    return 0;
}

static const char *const gather_names[] = {"auto", "whole", "units"};

/* The way the job samples (SampleWay): its own model on one process without LoRA; else the
 * way the plan chose for rank 0 (sample.gather; on auto the whole copy when the plan's total
 * with it fits this process's memory), sent to all, since the two ways run different
 * collectives. */
static int choose_way(Samples *s, const JobConfig *cfg, SampleWay planned, Err *err) {
    const Mesh *mesh = train_qwen3_mesh(s->q);
    TRY(samples_check_gather(cfg, train_qwen3_sharded(s->q) ? mesh->dims.world : 1, err));
    if (!train_qwen3_sharded(s->q) && !cfg->lora.rank) {
        s->way = SAMPLE_OWN;
        return 0;
    }
    int32_t way = planned;
    if (way != SAMPLE_WHOLE && way != SAMPLE_UNITWISE) /* no plan */
        way = cfg->sample.gather == SAMPLE_GATHER_UNITS ? SAMPLE_UNITWISE : SAMPLE_WHOLE;
    TRY(comm_broadcast(mesh->world, &way, sizeof way, 0, err));
    s->way = (SampleWay)way;
    if (mesh->dims.rank == 0)
        log_info("samples: %s on rank 0 (sample.gather = %s)",
                 s->way == SAMPLE_WHOLE ? "a whole copy of the model gathered"
                                        : "the model gathered one FSDP unit at a time",
                 gather_names[cfg->sample.gather]);
    return 0;
}

/* Decoder fetch on rank 0 (SAMPLE_UNITWISE): tells the other ranks which unit comes next, then
 * all gather it. */
static void fetch_unit(void *ctx, int unit) {
    Samples *s = ctx;
    int32_t u = unit;
    Err err;
    if (comm_broadcast(train_qwen3_mesh(s->q)->world, &u, sizeof u, 0, &err)) {
        char msg[sizeof err.msg + 32];
        snprintf(msg, sizeof msg, "samples: %s", err.msg);
        comm_abort(1, msg);
    }
    if (unit >= 0) train_qwen3_gather_unit(s->q, s->m, unit);
}

/* The other ranks while rank 0 generates unit by unit: each unit it names gathered, until -1. */
static int serve_units(Samples *s, Err *err) {
    for (;;) {
        int32_t u;
        TRY(comm_broadcast(train_qwen3_mesh(s->q)->world, &u, sizeof u, 0, err));
        if (u < 0) return 0;
        train_qwen3_gather_unit(s->q, NULL, u);
    }
}

int samples_open(Samples *s, const JobConfig *cfg, TrainQwen3 *q, const Tokenizer *tok,
                 SampleWay planned, Err *err) {
    memset(s, 0, sizeof *s);
    TRY(read_prompts(s, cfg, err));
    const char *where = cfg->sample.prompt_file[0] ? cfg->sample.prompt_file : "sample.prompts";
    s->q = q;
    s->tok = tok;
    s->freq = cfg->sample.freq;
    /* Every rank checks the prompts against the model (whose spec is the whole one's but for
     * tensor-parallel heads), so a bad prompt stops all alike. */
    Qwen3 *local = train_qwen3_qwen3(q);
    int n = s->pr.n, longest = 0, rc = 0;
    s->ids = xcalloc((size_t)n, sizeof *s->ids);
    ChatFormat *cf = NULL;
    if (!cfg->sample.chat && (cfg->sample.system[0] || !cfg->sample.enable_thinking))
        rc = err_set(err, "sample.system and sample.enable_thinking = false need sample.chat = "
                          "true (prompts as user turns in the chat format)");
    if (rc == 0 && cfg->sample.chat &&
        !(cf = chat_format_load_at(tok, cfg->training.chat_template_path, err)))
        rc = err_wrap(err, "sample.chat = true");
    for (int i = 0; i < n && rc == 0; i++) {
        rc = cf ? chat_render_prompt(cf, cfg->sample.system, s->pr.text[i],
                                     cfg->sample.enable_thinking, NULL, &s->ids[i], err)
                : tokenizer_encode(tok, s->pr.text[i], strlen(s->pr.text[i]), &s->ids[i], err);
        if (rc == 0 && (int)s->ids[i].n > longest) longest = (int)s->ids[i].n;
        if (rc == 0)
            rc = qwen3_check_tokens(local, (const int32_t *)s->ids[i].ids, (long)s->ids[i].n, 0,
                                    where, err);
    }
    chat_format_free(cf);
    if (rc == 0 && longest + cfg->sample.max_new_tokens > local->spec.max_seq_len)
        rc = err_set(err,
                     "%s: a prompt of %d tokens with sample.max_new_tokens = %d exceeds the "
                     "model's context of %d positions",
                     where, longest, cfg->sample.max_new_tokens, local->spec.max_seq_len);
    /* The decoder runs plain weights: sharded or with adapters, it runs a merged whole copy,
     * or the whole model one unit at a time. */
    if (rc == 0) rc = choose_way(s, cfg, planned, err);
    int rank0 = train_qwen3_mesh(q)->dims.rank == 0;
    if (rc == 0 && s->way == SAMPLE_OWN) {
        s->m = local;
    } else if (rc == 0 && rank0) {
        rc = s->way == SAMPLE_WHOLE ? train_qwen3_whole_create(q, &s->whole, err)
                                    : train_qwen3_unitwise_create(q, &s->whole, err);
        if (rc == 0) s->m = &s->whole;
    }
    if (rc == 0 && s->m)
        rc = decoder_create(&s->d, s->m, n, longest + cfg->sample.max_new_tokens, err);
    if (rc == 0 && s->m && s->way == SAMPLE_UNITWISE) {
        s->d.fetch = fetch_unit;
        s->d.fetch_ctx = s;
    }
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
                        .sample = samples_params(cfg),
                        .seed = (uint64_t)cfg->sample.seed,
                        .eos = s->eos,
                        .n_eos = neos};
    s->path = fs_resolve(cfg->job.dump_folder, "samples.jsonl");
    return 0;
}

SampleParams samples_params(const JobConfig *cfg) {
    return (SampleParams){.temperature = (float)cfg->sample.temperature,
                          .top_k = cfg->sample.top_k,
                          .top_p = (float)cfg->sample.top_p,
                          .min_p = (float)cfg->sample.min_p,
                          .repetition_penalty = (float)cfg->sample.repetition_penalty,
                          .no_repeat_ngram_size = cfg->sample.no_repeat_ngram_size};
}

void samples_close(Samples *s) {
    if (s->d.m) decoder_free(&s->d);
    if (s->m == &s->whole) qwen3_free(&s->whole);
    for (int i = 0; s->ids && i < s->pr.n; i++)
        idvec_free(&s->ids[i]);
    free(s->ids), free(s->path);
    prompt_lines_free(&s->pr);
    memset(s, 0, sizeof *s);
}

/* Generates and writes the samples of step (where s->m is). */
static int write_samples(Samples *s, int64_t step, Err *err) {
    int n = s->pr.n;
    const int32_t **ptr = xcalloc((size_t)n, sizeof *ptr);
    int *lens = xcalloc((size_t)n, sizeof *lens);
    for (int i = 0; i < n; i++) {
        ptr[i] = (const int32_t *)s->ids[i].ids;
        lens[i] = (int)s->ids[i].n;
    }
    GenOutput *out = xcalloc((size_t)n, sizeof *out);
    int rc = generate(&s->d, s->tok, ptr, lens, n, &s->o, out, NULL, NULL, NULL, err);
    FILE *f = rc == 0 ? fopen(s->path, "a") : NULL;
    if (rc == 0 && !f) rc = err_sys(err, "cannot open %s", s->path);
    for (int i = 0; i < n && rc == 0; i++) {
        log_info("sample step %lld [%d]: %s|%.*s", (long long)step, i + 1, s->pr.text[i],
                 (int)out[i].text_len, out[i].text);
        json_t *o = json_object(), *ids = json_array(), *pids = json_array();
        for (int t = 0; t < out[i].n; t++)
            json_array_append_new(ids, json_integer(out[i].ids[t]));
        for (size_t t = 0; t < s->ids[i].n; t++)
            json_array_append_new(pids, json_integer(s->ids[i].ids[t]));
        json_object_set_new(o, "step", json_integer(step));
        json_object_set_new(o, "prompt", json_string(s->pr.text[i]));
        json_object_set_new(o, "prompt_ids", pids);
        json_object_set_new(o, "text", json_stringn(out[i].text, out[i].text_len));
        json_object_set_new(o, "ids", ids);
        char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(o);
        if (!line || fprintf(f, "%s\n", line) < 0) rc = err_sys(err, "cannot write to %s", s->path);
        free(line);
    }
    if (f && fclose(f) != 0 && rc == 0) rc = err_sys(err, "cannot write to %s", s->path);
    for (int i = 0; i < n; i++)
        gen_output_free(&out[i]);
    free(out), free(ptr), free(lens);
    return rc;
}

int samples_after_step(Samples *s, int64_t step, int last, Err *err) {
    if (!last && step % s->freq != 0) return 0;
    if (s->m == train_qwen3_qwen3(s->q)) {
        qwen3_refresh_bf16(s->m);
        return write_samples(s, step, err);
    }
    int rc;
    if (s->way == SAMPLE_UNITWISE) {
        if (s->m) {
            rc = write_samples(s, step, err);
            fetch_unit(s, -1); /* the others stop serving */
        } else {
            rc = serve_units(s, err);
        }
    } else {
        rc = train_qwen3_gather_whole(s->q, s->m, err);
        if (rc == 0 && s->m) rc = write_samples(s, step, err);
    }
    /* The other ranks wait here for rank 0's generation, and learn if it failed. */
    return comm_agree(train_qwen3_mesh(s->q)->world, rc, err);
}
