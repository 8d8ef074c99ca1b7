/* Unit tests for src/io/hf_config: configs resolved the way transformers resolves them
 * (fixture from tools/make_hf_config_fixture.py and configs saved by transformers), errors
 * for unsupported features, and writer output read back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka.h needs the four headers above first. */
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "io/hf_config.h"
#include "ops/rope.h"

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/qt_hfc_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    Err err;
    return fs_remove_tree(g_dir, &err);
}

static char *fixture(const char *rel) {
    const char *src = getenv("QT_SOURCE_DIR");
    char buf[1024];
    snprintf(buf, sizeof buf, "%s/tests/fixtures/%s", src ? src : ".", rel);
    return xstrdup(buf);
}

/* Compares one `key=value` of the fixture with the parsed spec. */
static void check_field(const ModelSpec *s, const char *kv, int case_no) {
    char key[64];
    const char *eq = strchr(kv, '=');
    assert_non_null(eq);
    snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
    const char *v = eq + 1;
    struct {
        const char *name;
        const int *field;
    } ints[] = {
        {"dim", &s->dim},
        {"n_layers", &s->n_layers},
        {"n_heads", &s->n_heads},
        {"n_kv_heads", &s->n_kv_heads},
        {"head_dim", &s->head_dim},
        {"hidden_dim", &s->hidden_dim},
        {"vocab_size", &s->vocab_size},
        {"max_seq_len", &s->max_seq_len},
        {"tie_embeddings", &s->tie_embeddings},
        {"num_experts", &s->num_experts},
        {"top_k", &s->top_k},
        {"moe_hidden_dim", &s->moe_hidden_dim},
        {"norm_topk_prob", &s->norm_topk_prob},
        {"decoder_sparse_step", &s->decoder_sparse_step},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (strcmp(key, ints[i].name) == 0) {
            if (*ints[i].field != atoi(v))
                fail_msg("case %d: %s is %d, transformers says %s", case_no, key, *ints[i].field,
                         v);
            return;
        }
    const double *d = strcmp(key, "norm_eps") == 0               ? &s->norm_eps
                      : strcmp(key, "rope_theta") == 0           ? &s->rope_theta
                      : strcmp(key, "router_aux_loss_coef") == 0 ? &s->router_aux_loss_coef
                                                                 : NULL;
    if (d) {
        if (*d != strtod(v, NULL))
            fail_msg("case %d: %s is %.17g, transformers says %s", case_no, key, *d, v);
        return;
    }
    if (strcmp(key, "rope_scale") == 0 || strcmp(key, "inv_freq") == 0) {
        /* ops/rope.c's frequencies from the parsed spec, against the model's rotary embedding
         * (fp32 values; a last-bit difference of pow is allowed). */
        RopeFreqs *f = malloc(sizeof *f);
        rope_freqs(f, s);
        if (key[5] == 's') {
            if (fabs(f->scale - strtod(v, NULL)) > 1e-6)
                fail_msg("case %d: rope scale %.9g, transformers %s", case_no, f->scale, v);
        } else {
            int i = 0;
            for (const char *p = v; *p; i++) {
                char *end;
                double want = strtod(p, &end);
                if (i >= s->head_dim / 2 || fabs(f->inv_freq[i] - want) > 1e-6 * fabs(want))
                    fail_msg("case %d: inv_freq[%d] %.9g, transformers %.9g", case_no, i,
                             f->inv_freq[i], want);
                p = *end == ',' ? end + 1 : end;
            }
            assert_int_equal(i, s->head_dim / 2);
        }
        free(f);
        return;
    }
    assert_string_equal(key, "mlp_only_layers");
    uint8_t want[QT_MAX_LAYERS] = {0};
    for (const char *p = v; *p && *p != '-';) {
        want[atoi(p)] = 1;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    if (memcmp(want, s->mlp_only_layers, sizeof want) != 0)
        fail_msg("case %d: mlp_only_layers differ from %s", case_no, v);
}

static void test_transformers_cases(void **state) {
    (void)state;
    char *p = fixture("hf_config/cases.txt"), *text;
    size_t len;
    Err err;
    assert_int_equal(fs_read_all(p, &text, &len, &err), 0);
    free(p);
    int ncases = 0;
    ModelSpec s;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "json ", 5) == 0) {
            ncases++;
            if (model_spec_from_hf_config_text(&s, NULL, line + 5, strlen(line + 5), "case",
                                               &err) != 0)
                fail_msg("case %d: %s", ncases, err.msg);
            assert_string_equal(s.flavor, "hf");
        } else {
            assert_true(strncmp(line, "want ", 5) == 0);
            char *s2 = NULL;
            for (char *kv = strtok_r(line + 5, " ", &s2); kv; kv = strtok_r(NULL, " ", &s2))
                check_field(&s, kv, ncases);
        }
    }
    assert_int_equal(ncases, 11);
    free(text);
}

/* config.json files written by transformers 5 (rope_parameters, num_local_experts, dtype). */
static void test_saved_by_transformers(void **state) {
    (void)state;
    ModelSpec s;
    HfConfigExtra x;
    Err err;
    char *p = fixture("hf_keys/moe.config.json");
    assert_int_equal(model_spec_from_hf_config_ex(&s, &x, p, &err), 0);
    free(p);
    assert_int_equal(s.dim, 16);
    assert_int_equal(s.n_layers, 3);
    assert_int_equal(s.head_dim, 8);
    assert_int_equal(s.num_experts, 4);
    assert_int_equal(s.top_k, 2);
    assert_int_equal(s.moe_hidden_dim, 12);
    assert_int_equal(s.hidden_dim, 24);
    assert_true(s.mlp_only_layers[1] && !s.mlp_only_layers[0] && !s.mlp_only_layers[2]);
    assert_true(s.norm_topk_prob);
    assert_true(s.rope_theta == 1e6);
    assert_int_equal(x.n_bos, 0);
    assert_int_equal(x.n_eos, 0);
    p = fixture("hf_keys/dense_tied.config.json");
    assert_int_equal(model_spec_from_hf_config(&s, p, &err), 0);
    free(p);
    assert_int_equal(s.num_experts, 0);
    assert_true(s.tie_embeddings);
    assert_int_equal(s.vocab_size, 40);
}

static void expect_error(const char *json, const char *w1, const char *w2) {
    ModelSpec s;
    Err err;
    err.msg[0] = 0;
    if (model_spec_from_hf_config_text(&s, NULL, json, strlen(json), "config.json", &err) == 0)
        fail_msg("accepted %s", json);
    if (!strstr(err.msg, "config.json") || !strstr(err.msg, w1) || (w2 && !strstr(err.msg, w2)))
        fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", err.msg, w1, w2 ? w2 : "");
    assert_null(strchr(err.msg, '\n'));
}

static void test_errors(void **state) {
    (void)state;
    expect_error("{\"architectures\":[\"LlamaForCausalLM\"]}",
                 "\"LlamaForCausalLM\" is not "
                 "supported",
                 "Qwen3MoeForCausalLM");
    expect_error("{\"model_type\":\"llama\"}", "model_type \"llama\"", "Qwen3ForCausalLM");
    expect_error("{}", "neither", "Qwen3ForCausalLM");
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3_moe\"}",
                 "does not match", NULL);
    expect_error("{\"architectures\":\"Qwen3ForCausalLM\"}", "list of strings", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"rope_scaling\":{\"type\":\"dynamic\","
                 "\"factor\":4.0}}",
                 "rope_scaling type \"dynamic\" is not supported", "\"linear\" and \"yarn\"");
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"rope_parameters\":{\"rope_type\":"
                 "\"llama3\",\"factor\":2.0,\"rope_theta\":10000.0}}",
                 "rope_parameters type \"llama3\"", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"rope_scaling\":{\"rope_type\":"
                 "\"yarn\",\"original_max_position_embeddings\":4096}}",
                 "rope_scaling: key \"factor\" is missing", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"rope_scaling\":{\"rope_type\":"
                 "\"linear\",\"factor\":0}}",
                 "rope_scaling: key \"factor\" is 0, expected a finite number > 0", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"rope_scaling\":{\"rope_type\":"
                 "\"yarn\",\"factor\":2,\"attention_factor\":0}}",
                 "\"attention_factor\" is 0, expected a finite number > 0", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"rope_scaling\":{\"rope_type\":"
                 "\"yarn\",\"factor\":2,\"truncate\":1}}",
                 "\"truncate\" must be true or false", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"rope_scaling\":{\"rope_type\":"
                 "\"yarn\",\"factor\":2,\"beta_fast\":\"x\"}}",
                 "\"beta_fast\" must be a number", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"rope_parameters\":{"
                 "\"full_attention\":{\"rope_type\":\"default\"}}}",
                 "per-layer-type", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"rope_scaling\":3}", "rope_scaling",
                 "object or null");
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":true}",
                 "attention_bias", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"use_sliding_window\":true}",
                 "use_sliding_window", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"layer_types\":[\"full_attention\","
                 "\"sliding_attention\"]}",
                 "layer_types[1]", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_act\":\"gelu\"}", "gelu",
                 NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":\"16\"}",
                 "\"hidden_size\" must be an integer", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":0}", "hidden_size",
                 "[1,");
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"num_hidden_layers\":100000}",
                 "num_hidden_layers", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"num_attention_heads\":6,"
                 "\"num_key_value_heads\":4}",
                 "not a multiple", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"rms_norm_eps\":-1}", "rms_norm_eps",
                 NULL);
    expect_error("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"num_hidden_layers\":4,"
                 "\"mlp_only_layers\":[4]}",
                 "mlp_only_layers[0]", "[0, 4)");
    expect_error("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"num_experts\":4,"
                 "\"num_experts_per_tok\":8}",
                 "exceeds", NULL);
    expect_error("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"num_experts\":4,"
                 "\"num_local_experts\":8}",
                 "disagree", NULL);
    expect_error("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"decoder_sparse_step\":0}",
                 "decoder_sparse_step", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"eos_token_id\":\"x\"}",
                 "eos_token_id", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":16000000,"
                 "\"vocab_size\":16000000}",
                 "over the", "element limit");
    expect_error("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"num_experts\":100000}",
                 "num_experts", "1024");
    expect_error("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":2,"
                 "\"num_attention_heads\":4,\"num_key_value_heads\":4}",
                 "head_dim is absent", NULL);
    expect_error("{\"architectures\":[\"Qwen3ForCausalLM\"],\"head_dim\":7}", "head_dim = 7",
                 "even");
    expect_error("[1]", "expected a JSON object", NULL);
    expect_error("{\"architectures\":", "invalid JSON", NULL);
    Err err;
    ModelSpec s;
    assert_int_equal(model_spec_from_hf_config(&s, "/nonexistent/config.json", &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/config.json"));
}

/* quantization_config: fp8 block quantization read with its block (Qwen3-*-FP8's config, and
 * transformers' [128, 128] when weight_block_size is absent); what qtitan does not read is one
 * sentence naming the key. */
static void test_quantization_config(void **state) {
    (void)state;
    static const struct {
        const char *q;
        int64_t b0, b1;
    } ok[] = {{"null", 0, 0},
              {"{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\",\"quant_method\":\"fp8\","
               "\"weight_block_size\":[128,128]}",
               128, 128},
              {"{\"quant_method\":\"fp8\",\"weight_block_size\":[16,32],"
               "\"modules_to_not_convert\":[\"lm_head\"]}",
               16, 32},
              {"{\"quant_method\":\"fp8\"}", 128, 128}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "{\"architectures\":[\"Qwen3ForCausalLM\"],\"quantization_config\":%s}", ok[i].q);
        ModelSpec s;
        HfConfigExtra x;
        Err err;
        if (model_spec_from_hf_config_text(&s, &x, text, strlen(text), "c.json", &err))
            fail_msg("%s: %s", text, err.msg);
        assert_int_equal(x.fp8_block[0], ok[i].b0);
        assert_int_equal(x.fp8_block[1], ok[i].b1);
    }
#define QC "{\"architectures\":[\"Qwen3ForCausalLM\"],\"quantization_config\":"
    expect_error(QC "3}", "\"quantization_config\" must be an object or null", NULL);
    expect_error(QC "{\"quant_method\":\"awq\",\"bits\":4}}",
                 "quantization_config.quant_method \"awq\" is not read", "quant_method \"fp8\"");
    expect_error(QC "{\"bits\":4}}", "quant_method (absent) is not read", NULL);
    expect_error(QC "{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\"}}", "fmt \"e5m2\"", NULL);
    expect_error(QC "{\"quant_method\":\"fp8\",\"activation_scheme\":\"static\"}}",
                 "activation_scheme \"static\"", NULL);
    expect_error(QC "{\"quant_method\":\"fp8\",\"scale_fmt\":\"ue8m0\"}}", "scale_fmt \"ue8m0\"",
                 NULL);
    const char *blocks[] = {"[128]",   "[128,128,1]", "[0,128]",  "[128,-1]",
                            "\"128\"", "null",        "[128,1.5]"};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, QC "{\"quant_method\":\"fp8\",\"weight_block_size\":%s}}",
                 blocks[i]);
        expect_error(text, "weight_block_size must be a list of two positive integers", NULL);
    }
#undef QC
}

static void test_writer_roundtrip(void **state) {
    (void)state;
    const char *src[] = {
        "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":32,\"num_attention_heads\":"
        "4,\"num_hidden_layers\":6,\"num_experts\":6,\"num_experts_per_tok\":2,"
        "\"decoder_sparse_step\":2,\"mlp_only_layers\":[3,5],\"rope_theta\":1e6,"
        "\"rms_norm_eps\":1e-5,\"router_aux_loss_coef\":0.01,\"norm_topk_prob\":true,"
        "\"eos_token_id\":[1,2],\"bos_token_id\":7,\"head_dim\":12}",
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"tie_word_embeddings\":true,\"rope_theta\":"
        "123456.7,\"eos_token_id\":151645,\"bos_token_id\":151643,\"rms_norm_eps\":1e-6}",
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"max_position_embeddings\":4096,"
        "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":5e5,\"factor\":null,"
        "\"original_max_position_embeddings\":1024,\"mscale\":0.7,\"mscale_all_dim\":0.3,"
        "\"truncate\":false}}",
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"rope_scaling\":{\"type\":\"linear\","
        "\"factor\":2.5}}",
    };
    for (int c = 0; c < 4; c++) {
        ModelSpec a, b;
        HfConfigExtra xa, xb;
        Err err;
        assert_int_equal(
            model_spec_from_hf_config_text(&a, &xa, src[c], strlen(src[c]), "src", &err), 0);
        char *p = fs_join(g_dir, "config.json");
        assert_int_equal(model_spec_write_hf_config_ex(&a, &xa, p, "bfloat16", &err), 0);
        if (model_spec_from_hf_config_ex(&b, &xb, p, &err) != 0) fail_msg("%s", err.msg);
        assert_memory_equal(&a, &b, sizeof a);
        assert_memory_equal(&xa, &xb, sizeof xa);
        /* The file has the published layout: sorted keys, 2-space indent, torch_dtype. */
        json_t *j = json_load_path(p, &err);
        assert_non_null(j);
        assert_string_equal(json_string_value(json_object_get(j, "torch_dtype")), "bfloat16");
        /* RoPE scaling is written back as rope_scaling (null for plain RoPE). */
        json_t *rs = json_object_get(j, "rope_scaling");
        assert_true(c < 2 ? json_is_null(rs) : json_is_object(rs));
        if (c == 2) { /* factor null: the context ratio, written out */
            assert_int_equal(a.rope_scaling.type, ROPE_YARN);
            assert_true(a.rope_scaling.factor == 4.0);
            assert_true(json_real_value(json_object_get(rs, "factor")) == 4.0);
            assert_true(json_is_false(json_object_get(rs, "truncate")));
        }
        assert_int_equal(json_integer_value(json_object_get(j, "max_window_layers")), a.n_layers);
        json_decref(j);
        char *text;
        size_t len;
        assert_int_equal(fs_read_all(p, &text, &len, &err), 0);
        assert_non_null(strstr(text, "{\n  \"architectures\": [\n"));
        assert_true(text[len - 1] == '\n');
        free(text);
        assert_int_equal(model_spec_write_hf_config(&a, p, "float64", &err), -1);
        assert_non_null(strstr(err.msg, "float64"));
        free(p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transformers_cases),
        cmocka_unit_test(test_saved_by_transformers),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_quantization_config),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
