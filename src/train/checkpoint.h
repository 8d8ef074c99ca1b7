/* Training checkpoints: {root}/step-N/ with model.safetensors (fp32 parameters under qtitan
 * names), optim.safetensors (AdamW state plus its step) and train_state.json (step, tokens,
 * LR schedule, data position, RNG, config hash, and each file's size and 64-bit checksum).
 *
 * Commit protocol: everything is written into step-N.tmp-<pid>/, each file fsynced, the
 * directory fsynced, then renamed to step-N and the parent fsynced. The rename is the commit
 * point; loading still verifies sizes and checksums, so a torn or corrupted step is skipped. */
#ifndef QT_CHECKPOINT_H
#define QT_CHECKPOINT_H

#include <jansson.h>
#include <stdint.h>

#include "core/device.h"
#include "core/err.h"
#include "core/param_table.h"
#include "train/adamw.h"

#define CKPT_FORMAT_VERSION 2
/* The files of a step directory. */
#define CKPT_STATE_FILE "train_state.json"
#define CKPT_MODEL_FILE "model.safetensors"
#define CKPT_OPTIM_FILE "optim.safetensors"
#define CKPT_MAX_DIMS 8

/* One named fp32 buffer of the caller's (a parameter, an exp_avg, ...). */
typedef struct CkptTensor {
    const char *name;
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    float *data; /* (prod(shape)); read on save, written on load */
    /* The device data lives on (the arena's, Arena.device); NULL = host memory. Saves read it
     * through device_host_view, loads write it with Device.from_host (ckpt_tensor_device). */
    const Device *device;
} CkptTensor;

/* t's device: t->device, or the CPU when that is NULL. */
const Device *ckpt_tensor_device(const CkptTensor *t);
/* Elements of t: the product of its shape. */
int64_t ckpt_tensor_numel(const CkptTensor *t);

/* A small file saved alongside the tensors (the model's config.json, the job config, the
 * tokenizer files), so that a checkpoint alone can be exported; checksummed like the rest. */
typedef struct CkptFile {
    const char *name; /* a plain file name (no '/'), not one of the checkpoint's own files */
    const void *data; /* (len) bytes */
    size_t len;
} CkptFile;

/* Everything besides tensors that a resumed run needs. */
typedef struct CkptState {
    int64_t step;          /* training steps completed */
    int64_t tokens_seen;   /* global tokens consumed */
    int64_t optim_step;    /* AdamW's step count */
    double lr;             /* learning rate of the last step (the schedule itself is a function of
                              the step, so this is informative and checked, not needed) */
    json_t *data_position; /* opaque object from the data loader; save borrows it, load returns a
                              new reference the caller owns (NULL when the file had none) */
    uint64_t rng[4];       /* xoshiro256** state */
    uint64_t config_hash;  /* the job config's hash; resuming under another config warns */
    json_t *config;        /* the job config key by key (train/ckpt_config.h), or NULL; save
                              borrows it, load returns a new reference the caller owns (NULL
                              when the file has none: written before it was saved) */
    const CkptFile *files; /* (nfiles) extra files written by save; load leaves them NULL */
    int nfiles;
    /* The model's weights without the optimizer state (checkpoint.last_save_model_only): save
     * needs noptim = 0 then; such a step loads as weights (noptim = 0) but is no place to
     * resume training from, and loading it with optimizer tensors fails with a sentence. */
    int model_only;
    /* How the run's bf16 products were multiplied (ops/gemm.h), so a resume multiplies alike:
     * CKPT_GEMM_BF16_NONE (an fp32 job, or a checkpoint from before it was recorded), or the
     * path's GEMM_BF16_* value (ops/gemm.h), written by its name there. */
    int gemm_bf16;
} CkptState;

enum { CKPT_GEMM_BF16_NONE };

/* 64-bit checksum of a byte range (a streaming-free, word-at-a-time mix; not cryptographic). */
uint64_t ckpt_checksum(const void *data, size_t n);

/* A JSON state file's own checksum (train_state.json, a sharded checkpoint's latest.json): its
 * member "state_checksum" holds 16 hex digits, the checksum of the file's bytes with those
 * digits as zeros, so a flipped byte, a truncation or a hand edit anywhere is caught before any
 * field is trusted. */
#define CKPT_SUM_KEY "state_checksum"
/* Fills in the digits of text (len bytes, written with "state_checksum": and 16 zeros). */
void ckpt_sum_seal(char *text, size_t len);
/* 0 when text (len bytes read from path) matches its state_checksum; else -1 with a sentence
 * naming path (no checksum, not 16 hex digits, or "edited or corrupted"). text is unchanged. */
int ckpt_sum_check(char *text, size_t len, const char *path, Err *err);

/* Step numbers of the step-N directories under root, newest first (malloc'd); *n = 0 when
 * root is missing. */
int ckpt_list_steps(const char *root, int64_t **steps, int *n, Err *err);

/* Writes {root}/step-{st->step}/ as described above, replacing an existing step of the same
 * number, then keeps only the keep_latest_k newest complete steps (0 = keep all). On failure the
 * temporary directory is removed and earlier checkpoints are untouched. */
int ckpt_save(const char *root, const CkptState *st, const CkptTensor *model, int nmodel,
              const CkptTensor *optim, int noptim, int keep_latest_k, Err *err);

/* Checks that step_dir is a complete checkpoint: train_state.json parses with the right format
 * and version, every file it lists (the tensor files and the extra files) is present with the
 * recorded size and, when full is 1, the recorded checksum. */
int ckpt_verify(const char *step_dir, int full, Err *err);

/* Finds the newest complete step under root (fully verified; broken steps are skipped with a
 * warning). Returns 1 and sets *step and *path (malloc'd) when found, 0 when there is none (or
 * root does not exist), -1 on an error reading root. */
int ckpt_find_latest(const char *root, int64_t *step, char **path, Err *err);

/* The step under root (root/step-N) a resume would take, without reading its weights: step
 * load_step when >= 0, else the newest; only one whose train_state.json passes its checksum
 * (resume skips the others, with a warning). -1 when there is none. */
int64_t ckpt_resume_candidate(const char *root, int64_t load_step);
/* Before the model is allocated: the step directory dir must hold every parameter of params
 * with its shape, read from its model.safetensors header alone. -1 with a sentence naming the
 * file, the tensor and both shapes, so a resume into another model costs a sentence, not the
 * model's memory first; 0 when it fits or when its weights cannot be read (the resume reports
 * that). Sharded checkpoints: ckpt_dist_check_shapes. */
int ckpt_check_step_shapes(const char *dir, const ParamInfo *params, int n, int initial, Err *err);
/* The sentence of those checks: `where` (a file) holds p with shape got[0..got_ndim), or not
 * at all (got NULL); initial: the checkpoint is the run's initial weights, not one to resume.
 * Returns -1. */
int ckpt_shape_mismatch(const char *where, const ParamInfo *p, const int64_t *got, int got_ndim,
                        int initial, Err *err);

/* Removes leftover step-N.tmp-<pid> directories of interrupted saves whose process is gone
 * (fs_tmp_owner_alive). */
int ckpt_clean_stale(const char *root, Err *err);

/* Drops the references load gave *st (data_position, config) and sets them to NULL. */
void ckpt_state_release(CkptState *st);

/* Reads train_state.json of step_dir into *st (data_position and config as new references) without
 * touching the tensor files or verifying them (for inspection; ckpt_load verifies). */
int ckpt_read_state(const char *step_dir, CkptState *st, Err *err);

/* -1 with a sentence when step_dir was written by a LoRA run (its train_state.json's config has
 * lora.rank > 0): it holds the adapters, not the model, so an HF export of it is refused with
 * what gives the adapters and the merged model instead; 0 otherwise (or when its state cannot
 * be read: the export reports that). */
int ckpt_refuse_lora(const char *step_dir, Err *err);

/* Loads a verified checkpoint into the caller's buffers: every tensor named in model / optim
 * must exist with exactly that shape (fp32), and the files must hold no other tensors. Fills
 * *st (data_position and config as new references). */
int ckpt_load(const char *step_dir, CkptState *st, const CkptTensor *model, int nmodel,
              const CkptTensor *optim, int noptim, Err *err);
/* The same for a step ckpt_find_latest has just returned: it checked the checksums already, so
 * only the sizes are checked again (saves a full read of a large checkpoint). */
int ckpt_load_found(const char *step_dir, CkptState *st, const CkptTensor *model, int nmodel,
                    const CkptTensor *optim, int noptim, Err *err);

/* The optimizer state of opt as checkpoint tensors, named "<param>.exp_avg" and
 * "<param>.exp_avg_sq" and shaped like model[i], which must list opt's parameters in the same
 * order with the same element counts. Returns 2 * nmodel tensors (free with
 * ckpt_tensors_free), or NULL after an error naming the first mismatch. */
CkptTensor *ckpt_adamw_tensors(const AdamW *opt, const CkptTensor *model, int nmodel, Err *err);
void ckpt_tensors_free(CkptTensor *t, int n);

#endif
