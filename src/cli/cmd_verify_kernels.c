/* qtitan verify-kernels: every registered kernel against its op's reference (kernels/verify.h)
 * at several shapes, or, with --config, exactly the kernels that config's [[override]] entries
 * select, at that config's model dims (token count reduced, said in the output). */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "core/config.h"
#include "core/log.h"
#include "kernels/kernels.h"
#include "kernels/verify.h"
#include "model/overrides.h"
#include "train/train_job.h"

/* Tokens per row a --config check uses at most: enough to cross tiles and loss chunks, small
 * enough that a 151,936-token vocabulary or a 4096-token sequence stays a few seconds. */
#define CONFIG_MAX_T 256

static int failures;

static void header(void) {
    printf("%-14s %-13s %-26s %11s %11s %-20s %s\n", "kernel", "op", "shape", "max_abs", "max_rel",
           "tolerance", "ok");
}

static void run_one(const KernelInfo *k, const VerifyShape *sh) {
    VerifyResult r;
    char shape[64], tol[32];
    verify_kernel(&r, k, sh, 1234);
    verify_shape_label(shape, sizeof shape, k->op->kind, sh);
    snprintf(tol, sizeof tol, "abs %.0e | rel %.0e", k->tol_abs, k->tol_rel);
    printf("%-14s %-13s %-26s %11.3e %11.3e %-20s %s\n", k->op->name, op_kind_name(k->op->kind),
           shape, r.max_abs, r.max_rel, tol, r.ok ? "ok" : "FAIL");
    if (!r.ok) {
        printf("  outputs compared: %s\n", r.outputs);
        failures++;
    }
    fflush(stdout);
}

static int verify_all(void) {
    int n;
    const KernelInfo *reg = kernel_registry(&n);
    header();
    for (int i = 0; i < n; i++) {
        if (op_reference(reg[i].op->kind) == reg[i].op) continue;
        int ns;
        const VerifyShape *s = verify_shapes(reg[i].op->kind, &ns);
        for (int j = 0; j < ns; j++)
            run_one(&reg[i], &s[j]);
    }
    return failures ? 1 : 0;
}

static int verify_config(const char *path) {
    JobConfig cfg;
    Err err;
    ModelSpec spec;
    if (config_load(&cfg, path, 0, NULL, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    int rc = 1;
    OverridePlan plan = {0};
    HfConfigExtra extra;
    if (train_job_spec(&cfg, &spec, &extra, &err)) {
        log_error("%s", err.msg);
        goto out;
    }
    OpRun run = {&spec, cfg.training.local_batch_size, cfg.training.seq_len,
                 cfg.training.document_mask, cfg.training.mixed_precision_param == DT_BF16};
    if (overrides_resolve(&plan, &spec, cfg.overrides, cfg.n_overrides, path, "cpu", &run, &err)) {
        log_error("%s", err.msg);
        goto out;
    }
    int T = cfg.training.seq_len < CONFIG_MAX_T ? cfg.training.seq_len : CONFIG_MAX_T;
    if (T >= FLASH_TILE) T -= T % FLASH_TILE; /* stays within what supports() allowed */
    printf("verify-kernels --config %s: model dims of the config (dim %d, heads %d/%d, head_dim "
           "%d, ffn %d, vocab %d); tokens reduced to 1 x %d (config: %d x %d)%s\n",
           path, spec.dim, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.hidden_dim,
           spec.vocab_size, T, cfg.training.local_batch_size, cfg.training.seq_len,
           cfg.training.document_mask ? ", document mask" : "");
    header();
    const OpHeader *done[64];
    int ndone = 0;
    for (int c = 0; c < plan.n; c++) {
        const OpHeader *op = plan.choices[c].impl;
        int seen = op_reference(op->kind) == op;
        for (int d = 0; d < ndone && !seen; d++)
            seen = done[d] == op;
        if (seen || ndone == 64) continue;
        done[ndone++] = op;
        VerifyShape sh = {.B = 1,
                          .T = T,
                          .H = spec.n_heads,
                          .K = spec.n_kv_heads,
                          .E = spec.head_dim,
                          .D = spec.dim,
                          .F = spec.hidden_dim,
                          .V = spec.vocab_size,
                          .doc = cfg.training.document_mask,
                          .theta = spec.rope_theta,
                          .rope = &spec,
                          .X = spec.num_experts,
                          .k = spec.top_k};
        if (op->kind == OP_MOE_EXPERTS) sh.F = spec.moe_hidden_dim;
        if (op->kind == OP_RMSNORM && strstr(plan.choices[c].fqn, "_norm") &&
            strstr(plan.choices[c].fqn, "attention.")) {
            sh.D = spec.head_dim; /* q_norm / k_norm rows are one head */
            sh.T *= spec.n_heads;
        }
        run_one(kernel_info(op), &sh);
    }
    if (ndone == 0) printf("(the config selects no kernel besides the references)\n");
    rc = failures ? 1 : 0;
out:
    overrides_plan_free(&plan);
    config_free(&cfg);
    return rc;
}

int cmd_verify_kernels(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: qtitan verify-kernels [--config FILE]\n\n"
               "Runs every registered kernel against its op's reference on random fp32 inputs\n"
               "(forward and every backward output) and prints max abs / rel differences.\n"
               "With --config, checks the kernels that config's [[override]] entries select,\n"
               "at its model dims with the token count reduced. Exit 1 when one is over its\n"
               "tolerance.\n");
        return 0;
    }
    const char *config = NULL;
    for (int i = 1; i < argc; i++) { /* argv[0] is the command name */
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            config = argv[++i];
        else if (strncmp(argv[i], "--config=", 9) == 0)
            config = argv[i] + 9;
        else {
            log_error("verify-kernels: unknown argument \"%s\" (expected --config FILE)", argv[i]);
            return 2;
        }
    }
    return config ? verify_config(config) : verify_all();
}
