/* What a training job adds to its checkpoints so that they can be exported as HF directories
 * (the model's config.json, the job config, the tokenizer files), the export at the end of a
 * run (checkpoint.last_save_in_hf), and the export of any checkpoint (`qtitan export`). A job
 * of one process writes these files into every step folder and exports from its parameters;
 * a job of many writes them once at the checkpoint folder's root and exports from the ranks'
 * files (train/ckpt_dist.h), as the trainer's checkpoint layout for the same world does. */
#ifndef QT_TRAIN_HF_H
#define QT_TRAIN_HF_H

#include "core/config.h"
#include "core/err.h"
#include "core/model_spec.h"
#include "dist/comm.h"
#include "io/hf_config.h"
#include "io/hf_export.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

#define TRAIN_HF_MAX_FILES 12

typedef struct TrainHf {
    CkptFile files[TRAIN_HF_MAX_FILES]; /* config.json, job.toml, tokenizer files */
    int nfiles;
    char *names[TRAIN_HF_MAX_FILES], *data[TRAIN_HF_MAX_FILES];
    ModelSpec spec;
    HfConfigExtra extra;
    const TrainModel *model; /* set before the export hook runs */
    DType dtype;             /* checkpoint.export_dtype */
    const char *tokenizer;   /* the job's tokenizer directory or file */
    Comm *world;             /* the job's processes */
    char *root;              /* the checkpoint folder */
    /* training.chat_template_path's template text (malloc'd; NULL when unset): checkpoints
     * keep it as chat_template.jinja, and exports write it. */
    char *chat_template;
    size_t chat_template_len;
} TrainHf;

/* Collects the checkpoint files for a job on world (one process: each step's; many: the
 * folder's, train_hf_on_resumed): config.json of spec (torch_dtype float32, the token ids of
 * extra), the resolved job config as job.toml, and the tokenizer files found at tok_path (a
 * directory, or a tokenizer.json file), with training.chat_template_path's template as
 * chat_template.jinja when it is set. */
int train_hf_init(TrainHf *h, const JobConfig *cfg, const ModelSpec *spec,
                  const HfConfigExtra *extra, const char *tok_path, Comm *world, Err *err);
void train_hf_free(TrainHf *h);
/* Writes the tokenizer files h collected (chat_template.jinja being training.chat_template_path's
 * template when set) into dir, as TRL saves them beside a LoRA run's adapters. */
int train_hf_write_tokenizer(const TrainHf *h, const char *dir, Err *err);
/* TrainerOptions.on_resumed: with many processes, rank 0 writes the model's config.json, the
 * job config and the tokenizer files into the checkpoint folder, so `qtitan export` can read
 * the folder alone. Only once the trainer
 * has resumed: a job that fails to resume (another model, another number of processes) must
 * not replace the description of the checkpoint that is there. */
int train_hf_on_resumed(void *ctx, Err *err);
/* TrainerOptions.on_last_save: exports the last step to STEP_DIR/hf; collective with many
 * processes (rank 0 joins the ranks' pieces). */
int train_hf_on_last_save(void *ctx, const char *step_dir, Err *err);

/* Exports checkpoint step_dir (verified first) to out_dir: the architecture from the
 * checkpoint's config.json, the tokenizer files the checkpoint holds (o->tokenizer, when set,
 * replaces them). o->extra is ignored: the token ids come from the checkpoint's config.json. */
int train_hf_export_checkpoint(const char *step_dir, const char *out_dir, const HfExportOptions *o,
                               Err *err);

#endif
