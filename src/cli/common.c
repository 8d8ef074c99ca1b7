/* Helpers shared by the command entry points. */
#include "cli/commands.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "text/chat_template.h"
#include "train/checkpoint.h"
#include "train/ckpt_dist.h"

int cmd_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return 1;
    return 0;
}

int cli_checkpoint_step(const char *ckpt, char **step_dir, Err *err) {
    if (!fs_is_dir(ckpt)) return err_set(err, "checkpoint %s does not exist", ckpt);
    if ((*step_dir = ckpt_dist_path_root(ckpt))) return 0;
    char *state = fs_join(ckpt, "train_state.json");
    int is_step = fs_exists(state);
    free(state);
    if (is_step) {
        *step_dir = xstrdup(ckpt);
        return 0;
    }
    int64_t step;
    int found = ckpt_find_latest(ckpt, &step, step_dir, err);
    if (found < 0) return -1;
    if (found == 0)
        return err_set(err,
                       "%s is not a checkpoint step (no train_state.json) and holds no complete "
                       "step-N checkpoint",
                       ckpt);
    return 0;
}

/* InferWeights.load of a many-process checkpoint: each parameter joined from the ranks'
 * pieces (through an fp32 staging copy for a weight held in bf16 only). */
static int load_sharded(void *ctx, Qwen3 *m, Err *err) {
    const CkptDistReader *r = ctx;
    int rc = 0;
    for (int i = 0; i < m->nparams && rc == 0; i++) {
        const Qwen3Param *p = &m->table[i];
        float *dst = p->data ? p->data : xmalloc((size_t)p->numel * sizeof *dst);
        rc = ckpt_dist_reader_range(r, p->name, (size_t)p->numel, (size_t)p->shape[p->ndim - 1], 0,
                                    (size_t)p->numel, dst, err);
        if (rc == 0 && p->data) qwen3_param_store(m, i, p->data);
        if (rc == 0 && !p->data)
            dtype_convert(p->data_bf16, DT_BF16, dst, DT_F32, (size_t)p->numel);
        if (!p->data) free(dst);
    }
    return rc;
}

int cli_open_model(InferModel *im, const char *model, const char *checkpoint, const char *adapter,
                   int B, int T, int bf16, Err *err) {
    if (!checkpoint) return infer_model_open(im, model, NULL, adapter, B, T, bf16, err);
    if (fs_is_dir(checkpoint) && ckpt_dist_is_sharded_path(checkpoint)) {
        CkptDistReader r;
        ModelSpec spec;
        HfConfigExtra extra;
        char *root;
        TRY(ckpt_dist_open_path(&r, checkpoint, &root, &spec, &extra, err));
        InferWeights w = {load_sharded, &r};
        int rc = infer_model_open_from(im, root, &w, adapter, B, T, bf16, err);
        ckpt_dist_reader_close(&r);
        free(root);
        return rc;
    }
    char *step;
    TRY(cli_checkpoint_step(checkpoint, &step, err));
    int rc = infer_model_open(im, NULL, step, adapter, B, T, bf16, err);
    free(step);
    return rc;
}

const char *cli_chat_template(const char *given, const char *adapter) {
    if (given || !adapter) return given;
    char *text = NULL, *file = NULL;
    size_t len;
    Err ignore;
    int has = chat_template_read(adapter, &text, &len, &file, &ignore) == 0;
    free(text);
    free(file);
    return has ? adapter : NULL;
}

int cli_number(const char *opt, const char *s, double *out, Err *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return err_set(err, "%s %s: expected a number", opt, s);
    *out = v;
    return 0;
}
