/* qtitan inspect PATH: lists a safetensors file, or lists an HF model directory and checks
 * its tensors against the architecture in its config.json. */
#include "cli/commands.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "infer/gen_config.h"
#include "io/hf_config.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"
#include "model/qwen3_hf.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/ckpt_dist.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: qtitan inspect PATH\n\n"
            "PATH is a .safetensors file, a *.safetensors.index.json, or an HF model directory.\n"
            "  file:      prints each tensor's name, dtype and shape (and shard), then totals.\n"
            "  directory: reads config.json (Qwen3ForCausalLM or Qwen3MoeForCausalLM), prints\n"
            "             the tensors of model.safetensors or of the shards listed in\n"
            "             model.safetensors.index.json, then checks them against the\n"
            "             architecture and lists missing, unexpected and misshaped keys.\n"
            "             A tied lm_head.weight may be absent.\n\n"
            "Exit status: 0 clean, 1 a problem was found or the input is unreadable, 2 usage.\n");
}

typedef struct Row {
    const StTensor *t;
    const char *file;
} Row;

static int cmp_row(const void *a, const void *b) {
    return strcmp(((const Row *)a)->t->name, ((const Row *)b)->t->name);
}

static void print_tensors(const StSet *s, int show_file) {
    int n = 0;
    for (int f = 0; f < s->nfiles; f++)
        n += s->files[f].n;
    Row *rows = xmalloc((size_t)(n ? n : 1) * sizeof *rows);
    int k = 0;
    for (int f = 0; f < s->nfiles; f++) {
        const char *slash = strrchr(s->files[f].path, '/');
        for (int i = 0; i < s->files[f].n; i++)
            rows[k++] = (Row){&s->files[f].tensors[i], slash ? slash + 1 : s->files[f].path};
    }
    qsort(rows, (size_t)n, sizeof *rows, cmp_row);
    int64_t per_dtype[DT_COUNT] = {0};
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        const StTensor *t = rows[i].t;
        char shape[256];
        size_t m = (size_t)snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < t->ndim && m < sizeof shape; d++)
            m += (size_t)snprintf(shape + m, sizeof shape - m, "%s%" PRId64, d ? ", " : "",
                                  t->shape[d]);
        if (m < sizeof shape) snprintf(shape + m, sizeof shape - m, "]");
        printf("  %-60s %-5s %s", t->name, dtype_name(t->dtype), shape);
        if (show_file) printf("  (%s)", rows[i].file);
        printf("\n");
        per_dtype[t->dtype] += t->numel;
        bytes += t->nbytes;
    }
    printf("%d tensors in %d file%s, %" PRIu64 " bytes;", n, s->nfiles, s->nfiles == 1 ? "" : "s",
           bytes);
    int64_t total = 0;
    for (int d = 0; d < DT_COUNT; d++)
        if (per_dtype[d]) {
            printf(" %s %" PRId64, dtype_name((DType)d), per_dtype[d]);
            total += per_dtype[d];
        }
    printf(" (%" PRId64 " elements)\n", total);
    free(rows);
}

static void print_list(const char *what, char **list, int n) {
    if (n == 0) return;
    printf("%s (%d):\n", what, n);
    for (int i = 0; i < n; i++)
        printf("  %s\n", list[i]);
}

/* What generation and chat data will find in an HF directory: the tokenizer, the chat format
 * its template names (or why there is none) and generation_config.json's sampling. Reported,
 * not judged: inspect's verdict is about the weights. */
static void print_tokenizer(const char *dir) {
    Err err;
    if (!fs_exists_in(dir, "tokenizer.json")) {
        printf("tokenizer: none (no tokenizer.json; generate and chat data need one)\n");
        return;
    }
    Tokenizer *tok = tokenizer_load(dir, &err);
    if (!tok) {
        printf("tokenizer: cannot be read: %s\n", err.msg);
        return;
    }
    printf("tokenizer: %u tokens\n", tokenizer_vocab_size(tok));
    ChatFormat *cf = chat_format_load(tok, &err);
    if (cf)
        printf("chat format: %s (%s)\n", chat_format_name(cf),
               chat_format_thinking_switch(cf) ? "enable_thinking switches the think block"
                                               : "no thinking switch");
    else
        printf("chat format: none: %s\n", err.msg);
    chat_format_free(cf);
    tokenizer_free(tok);
    GenConfig gc;
    if (gen_config_read(dir, &gc, &err)) {
        printf("generation_config.json: %s\n", err.msg);
        return;
    }
    char how[192];
    sample_describe(how, sizeof how, &gc.sp);
    if (gc.found)
        printf("generation_config.json: %s%s%s%s%s\n", gc.do_sample ? "sampling with " : "", how,
               gc.do_sample ? "" : " (do_sample is not true)",
               gc.ignored[0] ? "; not applied: " : "", gc.ignored);
}

static int inspect_dir(const char *dir) {
    Err err;
    char *cfg = fs_join(dir, "config.json");
    ModelSpec spec;
    HfConfigExtra extra;
    int rc = 1;
    StSet set = {0};
    if (ckpt_dist_is_sharded_path(dir)) {
        fprintf(stderr,
                "error: %s is the checkpoint of a run on many processes (each rank holds a part "
                "of every tensor), not an HF model directory; generate and eval read it as it "
                "is, and inspect checks it after qtitan export\n",
                dir);
        goto out;
    }
    if (!fs_exists(cfg)) {
        fprintf(stderr, "error: %s: no config.json in this directory, so it is not an HF model\n",
                dir);
        goto out;
    }
    /* A checkpoint step has a config.json too, but its tensors have qtitan's names: checked as
     * an HF model it would read as every tensor missing and every one unexpected. */
    if (fs_exists_in(dir, "train_state.json")) {
        fprintf(stderr,
                "error: %s is a training checkpoint, not an HF model directory; inspect its "
                "model.safetensors, or check it as HF after qtitan export\n",
                dir);
        goto out;
    }
    if (model_spec_from_hf_config_ex(&spec, &extra, cfg, &err) != 0 ||
        qwen3_hf_open(&set, dir, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto out;
    }
    printf("%s: %s, dim %d, %d layers, %d heads (%d kv, head_dim %d), ffn %d, vocab %d%s\n", dir,
           spec.num_experts > 0 ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM", spec.dim,
           spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.hidden_dim,
           spec.vocab_size, spec.tie_embeddings ? ", tied embeddings" : "");
    char rope[160];
    rope_describe(rope, sizeof rope, &spec);
    if (rope[0]) printf("  rope: theta %g, %s\n", spec.rope_theta, rope);
    if (spec.num_experts > 0) {
        printf("  experts %d, top_k %d, expert ffn %d, decoder_sparse_step %d, norm_topk_prob %s\n",
               spec.num_experts, spec.top_k, spec.moe_hidden_dim, spec.decoder_sparse_step,
               spec.norm_topk_prob ? "true" : "false");
        /* mlp_only_layers and decoder_sparse_step can leave some layers dense. */
        int ndense = 0;
        for (int i = 0; i < spec.n_layers; i++)
            ndense += !model_spec_layer_is_moe(&spec, i);
        if (ndense) {
            printf("  dense FFN layers (%d):", ndense);
            for (int i = 0; i < spec.n_layers; i++)
                if (!model_spec_layer_is_moe(&spec, i)) printf(" %d", i);
            printf("\n");
        }
    }
    if (extra.fp8_block[0])
        printf("  quantization: fp8 (F8_E4M3 weights, one scale per %" PRId64 " x %" PRId64
               " block), read dequantized\n",
               extra.fp8_block[0], extra.fp8_block[1]);
    print_tensors(&set, set.nfiles > 1);
    print_tokenizer(dir);
    HfKeyTable t;
    hf_keys_build(&t, &spec);
    HfCheck c;
    int problems = hf_keys_check(&c, &t, &set);
    print_list("missing", c.missing, c.nmissing);
    print_list("unexpected", c.unexpected, c.nunexpected);
    print_list("wrong shape or dtype", c.wrong, c.nwrong);
    if (problems == 0) {
        printf("ok: all %d tensors of the architecture are present with the expected shapes\n",
               t.nhf);
        rc = 0;
    } else {
        fprintf(stderr,
                "error: %s does not match its config.json: %d missing, %d unexpected, %d wrong "
                "shape or dtype\n",
                dir, c.nmissing, c.nunexpected, c.nwrong);
    }
    hf_check_free(&c);
    hf_keys_free(&t);
out:
    st_set_close(&set);
    free(cfg);
    return rc;
}

int cmd_inspect(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1] != 0) {
            fprintf(stderr,
                    "error: qtitan inspect: unknown option '%s' (see qtitan inspect --help)\n",
                    argv[i]);
            return 2;
        }
        if (path) {
            fprintf(stderr, "error: qtitan inspect takes one PATH, got '%s' and '%s'\n", path,
                    argv[i]);
            return 2;
        }
        path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "error: qtitan inspect needs a PATH (see qtitan inspect --help)\n");
        return 2;
    }
    if (fs_is_dir(path)) return inspect_dir(path);
    StSet set;
    Err err;
    if (st_set_open(&set, path, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    printf("%s:\n", path);
    print_tensors(&set, set.nfiles > 1);
    st_set_close(&set);
    return 0;
}
