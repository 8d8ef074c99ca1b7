/* Helpers shared by the command entry points. */
#include "cli/commands.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "train/checkpoint.h"
#include "train/ckpt_dist.h"

int cmd_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return 1;
    return 0;
}

int cli_checkpoint_step(const char *ckpt, char **step_dir, Err *err) {
    if (!fs_is_dir(ckpt)) return err_set(err, "checkpoint %s does not exist", ckpt);
    if (ckpt_dist_is_sharded_path(ckpt))
        return err_set(err,
                       "%s is a checkpoint of a run on many processes, whose every rank holds a "
                       "part of each tensor; join the parts with `qtitan export --checkpoint %s "
                       "--out DIR` (tokenizer included) and give --model DIR",
                       ckpt, ckpt);
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

int cli_number(const char *opt, const char *s, double *out, Err *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return err_set(err, "%s %s: expected a number", opt, s);
    *out = v;
    return 0;
}
