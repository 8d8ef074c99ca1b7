/* Sharded checkpoints for a run on many processes. Rank K writes its own checkpoint, in
 * ckpt_save's format and with its commit protocol (its slices of the parameters and the
 * optimizer state, and the train state), to {root}/rank-K/step-N/; no rank ever holds the
 * whole model. Once every rank has committed step N (a collective agreement), rank 0
 * atomically rewrites {root}/latest.json: {"format", "ranks", "mesh": [dp_replicate,
 * dp_shard, tp, ep], "step": N, "steps": [...]}, the steps every rank holds, newest last. Each
 * rank's step directory also holds layout.json: for every parameter the slice of the whole
 * tensor that rank's files hold (train/shard_slice.h; its optimizer state has the same), so
 * that a job on any mesh, or on one process, can resume from it (resharding), and a job on many
 * processes can resume from one process's root/step-N. That file is the commit point of the job's
 * checkpoint: a crash before it leaves the previous step current; only after it do ranks
 * remove their steps that fell out of keep_latest_k. */
#ifndef QT_CKPT_DIST_H
#define QT_CKPT_DIST_H

#include "core/model_spec.h"
#include "core/progress.h"
#include "dist/comm.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/shard_slice.h"

#define CKPT_DIST_MARKER "latest.json"
#define CKPT_DIST_LAYOUT "layout.json"
/* Steps the marker lists (the newest ones when keep_latest_k is 0); a larger keep_latest_k is
 * refused at start-up, since the steps past it would be pruned. */
#define CKPT_DIST_MAX_KEPT 64

/* checkpoint.keep_latest_k for a job of `ranks` processes that writes checkpoints (enable):
 * sharded ones (ranks > 1) keep at most CKPT_DIST_MAX_KEPT steps, so a larger value is refused
 * at start-up with a sentence. */
int ckpt_dist_check_keep(int ranks, int enable, int keep_latest_k, Err *err);

/* Collective over world: every rank passes its own tensors, what each holds of its whole
 * tensor (slices[i] for model[i]; NULL writes no layout.json, and then only the same mesh can
 * resume) and the job's mesh [dp_replicate, dp_shard, tp, ep]; the same result on every rank. */
int ckpt_dist_save(Comm *world, const int mesh[4], const char *root, const CkptState *st,
                   const CkptTensor *model, const ShardSlice *slices, int nmodel,
                   const CkptTensor *optim, int noptim, int keep_latest_k, Err *err);
/* ckpt_dist_save in its two halves, for a write that runs beside training
 * (train/ckpt_async.h): this rank's files, no collective (rank of ranks); then the collective
 * commit, every rank passing its write's status (written: 0, or -1 with *err filled). */
int ckpt_dist_write(int rank, int ranks, const int mesh[4], const char *root, const CkptState *st,
                    const CkptTensor *model, const ShardSlice *slices, int nmodel,
                    const CkptTensor *optim, int noptim, Err *err);
int ckpt_dist_commit(Comm *world, const int mesh[4], const char *root, int64_t step, int written,
                     int keep_latest_k, Err *err);

/* Where a resume starts: a step of root in either format. */
typedef struct CkptDistFound {
    int64_t step;
    int ranks;   /* that wrote it; 0 for one process's root/step-N */
    int mesh[4]; /* [dp_replicate, dp_shard, tp, ep] of a sharded one */
} CkptDistFound;

/* Collective over world (NULL: this process alone): 1 with *found for the newest complete step
 * under root, whichever wrote it (sharded: listed in latest.json; one process's: root/step-N,
 * checksums verified; the sharded one on a tie when world has several processes), or for step
 * load_step when it is >= 0; 0 when root holds none (load_step < 0); -1 with the same sentence
 * on every rank (load_step >= 0 and no such step, a broken latest.json). Removes leftovers of
 * interrupted saves first (this rank's folder; root on rank 0). */
int ckpt_dist_locate(Comm *world, const char *root, int64_t load_step, CkptDistFound *found,
                     Err *err);
/* Before the model is allocated, the check ckpt_check_step_shapes makes, on the step
 * ckpt_dist_locate would choose under root (load_step when >= 0), without reading weights: a
 * one process's step from its model.safetensors header; a sharded one (FSDP, TP, EP) from the
 * whole shapes its ranks' layout.json files record. -1 with one sentence naming the file, the
 * tensor and both shapes; 0 when every parameter fits or there is nothing to check this way
 * (no step, a broken marker or layout, a checkpoint written before layouts: the load reports
 * those). */
int ckpt_dist_check_shapes(const char *root, int64_t load_step, const ParamInfo *params, int n,
                           int initial, Err *err);
/* The step directory rank 0 would read of the step ckpt_dist_locate would choose under root
 * (load_step when >= 0), found without collectives or reading weights (malloc'd), or NULL for
 * none: for what its train_state.json says before the model exists. */
char *ckpt_dist_candidate_dir(const char *root, int64_t load_step);
/* The step directory of found that rank `rank` of the same mesh reads (malloc'd): root/step-N
 * for one process's, root/rank-K/step-N for a sharded one. */
char *ckpt_dist_found_dir(const char *root, const CkptDistFound *found, int rank);
/* -1 with a sentence when step_dir's layout.json records the shard of another rank than
 * `rank` (a rank-K folder copied or linked from another would load that rank's slices); 0
 * too for layouts written before they recorded the rank. */
int ckpt_dist_check_rank(const char *step_dir, int rank, Err *err);

/* Reads a committed sharded checkpoint without MPI and without holding the model: every
 * parameter file of replica 0 is mapped, and a full parameter, or any run of its elements, is
 * assembled from the ranks' pieces (HF export, inspection). Rank s * tp + t holds FSDP slice s
 * of tp rank t's part of each parameter: in s order the pieces are consecutive runs of that
 * part; the part is a block of rows or of columns of the whole tensor, or all of it
 * (core/param_table.h; replicated parameters are read from tp rank 0). */
typedef struct CkptDistReader {
    int dp_shard, tp; /* of the mesh that saved the checkpoint (1, 1: one process's) */
    int64_t step;
    int nfiles;      /* dp_shard * tp */
    StFile *files;   /* (nfiles) rank-K/step-N/model.safetensors */
    StFile *optim;   /* (nfiles) their optim.safetensors, when opened for a resume; else NULL */
    json_t **layout; /* (nfiles) the "tensors" of each layout.json; NULL: written before layouts
                        existed, the mesh says which slice a file holds */
} CkptDistReader;

/* Opens the newest committed step under root (latest.json), after verifying each file's size
 * and checksum against its train_state.json. */
int ckpt_dist_reader_open(CkptDistReader *r, const char *root, Err *err);
/* The same for a chosen step (< 0: the newest), which latest.json must list as committed. */
int ckpt_dist_reader_open_step(CkptDistReader *r, const char *root, int64_t step, Err *err);
/* Collective over world (NULL: one process): opens found's step for a resume, optimizer files
 * too with optim; the checksums of its files are verified, each by one rank. */
int ckpt_dist_reader_open_found(CkptDistReader *r, Comm *world, const char *root,
                                const CkptDistFound *found, int optim, Err *err);
void ckpt_dist_reader_close(CkptDistReader *r);
/* Collective over world (NULL: one process): fails with a sentence when r holds a parameter
 * that no rank's model[0..n) has. */
int ckpt_dist_reader_check_names(const CkptDistReader *r, Comm *world, const CkptTensor *model,
                                 int n, Err *err);
/* Resharding: fills each t[i] (host or device data) with the elements slices[i / per] of its
 * whole tensor describes (slices NULL: t[i] is the whole tensor), from whatever slices r's files
 * hold. per = 1 for parameters; per = 2 and optim for their optimizer state (t[2i], t[2i + 1]
 * = "<param>.exp_avg", ".exp_avg_sq"). A shape that differs from the checkpoint's, a tensor it
 * lacks, or slices that do not tile the wanted elements fail with a sentence. Bytes read are
 * added to p when it is not NULL. */
int ckpt_dist_read_into(const CkptDistReader *r, const CkptTensor *t, int n,
                        const ShardSlice *slices, int per, int optim, Progress *p, Err *err);
/* out (numel floats) = parameter `name`, whose rows hold cols elements (its last dimension;
 * only row-parallel parameters need it); fails when the pieces do not add up to numel. */
int ckpt_dist_reader_tensor(const CkptDistReader *r, const char *name, float *out, size_t numel,
                            size_t cols, Err *err);

/* out (n floats) = elements [first, first + n) of the flattened parameter `name` (numel
 * elements in rows of cols), whose pieces must add up to numel: a part of a tensor without
 * assembling the rest. */
int ckpt_dist_reader_range(const CkptDistReader *r, const char *name, size_t numel, size_t cols,
                           size_t first, size_t n, float *out, Err *err);

/* HF export of the reader's step for the model spec: writes into out_dir (which must exist)
 * config.json (torch_dtype = dtype) and the weights exactly as an export of the whole fp32
 * parameters through io/hf_keys and st_write_hf_shards would (model.safetensors, or shards of
 * at most max_shard_bytes, 0 = 5 GB, with model.safetensors.index.json), byte for byte. Each
 * HF tensor is pulled from the ranks' pieces in chunks while its file is written, so neither
 * this process nor any rank ever holds the model, nor even one whole tensor. expert_bias
 * (training state) is not exported; tied embeddings have no lm_head.weight. extra (NULL: none)
 * carries an imported config's token ids and auxiliary-loss settings into config.json, as one
 * process's export does (model_spec_hf_config_text). */
int ckpt_dist_export_hf(const char *out_dir, const CkptDistReader *r, const ModelSpec *spec,
                        const HfConfigExtra *extra, DType dtype, size_t max_shard_bytes, Err *err);

/* checkpoint.last_save_in_hf on many processes. Collective over world, after the run's last
 * sharded checkpoint is committed: rank 0 exports the newest committed step N under root to
 * {root}/step-N/hf (written as hf.tmp and renamed into place: the same path as one process's
 * export) with ckpt_dist_export_hf, while the other ranks wait; every rank returns rank 0's
 * result and sentence. */
int ckpt_dist_last_save_hf(Comm *world, const char *root, const ModelSpec *spec,
                           const HfConfigExtra *extra, DType dtype, Err *err);

/* Collective: rank 0 writes {root}/config.json (the model and extra, torch_dtype float32) and
 * files[0..nfiles) (the job config and the tokenizer files, as one process's steps hold them;
 * one named config.json is left out), and removes a tokenizer file (HF_TOKENIZER_FILES) of an
 * earlier job that files does not hold, so that a sharded checkpoint folder can be exported
 * on its own, tokenizer included (ckpt_dist_export_path, ckpt_dist_last_save_hf). */
int ckpt_dist_write_config(Comm *world, const char *root, const ModelSpec *spec,
                           const HfConfigExtra *extra, const CkptFile *files, int nfiles, Err *err);

/* `qtitan export` of a sharded checkpoint, without MPI: path is the checkpoint folder (its
 * newest committed step) or one of its FOLDER/rank-K/step-N directories (that step); the
 * model comes from FOLDER/config.json. Writes out_dir (through out_dir.tmp-<pid>, renamed into
 * place; an existing out_dir is replaced only when it is an HF directory or empty) and sets
 * *step to the step exported. The tokenizer files are those of tokenizer (a folder or a
 * tokenizer.json) when not NULL, else those the folder holds (ckpt_dist_write_config). */
/* A training checkpoint as a run's initial weights (checkpoint.initial_load_path with
 * initial_load_in_hf = false: torchtitan's initial load, model only): path is a checkpoint
 * folder (its newest complete step, one process's or sharded), one process's FOLDER/step-N or
 * a sharded FOLDER/rank-K/step-N. Sets *root (malloc'd) and *step (-1: the newest) as
 * ckpt_dist_check_shapes and ckpt_dist_open_initial take them, or fails with a sentence when
 * path holds no complete step. Writes nothing there (unlike ckpt_dist_locate, which cleans). */
int ckpt_dist_initial_path(const char *path, char **root, int64_t *step, Err *err);
/* Collective over world (NULL: one process): *found for that step, as ckpt_dist_locate finds
 * one but writing nothing there; a LoRA run's checkpoint (adapters only) is refused. */
int ckpt_dist_find_initial(Comm *world, const char *root, int64_t step, CkptDistFound *found,
                           Err *err);
/* Collective: ckpt_dist_find_initial, then opens that step's model files for reading
 * (ckpt_dist_read_into). */
int ckpt_dist_open_initial(CkptDistReader *r, Comm *world, const char *root, int64_t step,
                           Err *err);
/* Opens the sharded checkpoint that path names as ckpt_dist_export_path takes it: *root
 * (malloc'd) is its folder, spec and extra the model of {root}/config.json, r the step's
 * pieces; a LoRA run's checkpoint (adapters only) is refused. Close r and free *root. */
int ckpt_dist_open_path(CkptDistReader *r, const char *path, char **root, ModelSpec *spec,
                        HfConfigExtra *extra, Err *err);
int ckpt_dist_export_path(const char *path, const char *out_dir, DType dtype,
                          size_t max_shard_bytes, const char *tokenizer, int64_t *step, Err *err);
/* 1 when path is what ckpt_dist_export_path takes (by its shape: a folder with latest.json or,
 * the marker lost, rank-0/, or a FOLDER/rank-K/step-N path), so `qtitan export` can tell
 * sharded checkpoints apart. */
int ckpt_dist_is_sharded_path(const char *path);
/* The checkpoint folder of such a path (malloc'd; NULL when it is not one). */
char *ckpt_dist_path_root(const char *path);

/* This rank's folder under root (malloc'd). */
char *ckpt_dist_rank_dir(const char *root, int rank);

#endif
