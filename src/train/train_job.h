/* `qtitan train`: builds everything a job config describes (model spec, tokenizer, dataset,
 * model, optimizer, schedule, metrics, checkpoints) and runs the trainer. */
#ifndef QT_TRAIN_JOB_H
#define QT_TRAIN_JOB_H

#include "core/config.h"
#include "core/device.h"
#include "core/err.h"
#include "core/model_spec.h"
#include "dist/comm.h"
#include "dist/mesh.h"
#include "io/hf_config.h"
#include "model/lora.h"
#include "text/tokenizer.h"
#include "train/samples.h"

/* The plan of a job of `world` processes whose tokenizer is tok against physical memory, which
 * also says how [sample] generates (train_plan_check_memory; train_plan sits above this file,
 * so the command passes it in). */
typedef int (*TrainMemoryCheck)(const JobConfig *cfg, int world, const Tokenizer *tok,
                                SampleWay *sample_way, Err *err);
/* world: the job's communicator (comm_init), or NULL for one process without MPI.
 * check_memory (NULL: none) runs after every cheaper check, before any memory is sized. */
int train_job_run(const JobConfig *cfg, Comm *world, TrainMemoryCheck check_memory, Err *err);
/* The device training.device names among those linked into this build ("auto" is the CPU);
 * one that is not linked in is an error sentence naming training.device. */
int train_job_device(const JobConfig *cfg, const Device **out, Err *err);

/* The model a config describes, the one way from a config to a ModelSpec (train, plan and
 * verify-kernels call it): a native flavor, or model.hf_assets_path/config.json for
 * flavor = "hf" (with its token ids in extra), then the [model] field replacements (an error
 * names the file:line or the command line that set the field), validated. */
int train_job_spec(const JobConfig *cfg, ModelSpec *spec, HfConfigExtra *extra, Err *err);
/* Values that are each valid alone but not together (seq_len beyond the model's positions, a
 * global batch that is not a multiple, ...), checked before
 * anything large is allocated. spec may be NULL (the checks that need it are skipped). */
int train_job_check(const JobConfig *cfg, const ModelSpec *spec, Err *err);
/* The adapters [lora] describes (rank, alpha, comma-separated targets), made on spec's linears
 * (lora_create, whose warnings print when warn is 1: training's creation warns, its repeats
 * (the checkpoint's tensor list, plan's memory check) do not). */
int train_job_lora(const JobConfig *cfg, const ModelSpec *spec, Lora *lo, long max_tokens, int warn,
                   Err *err);
/* The mesh a config asks for on `world` processes, with the model shapes its checks need
 * (mesh_create / mesh_resolve take it). */
void train_job_mesh_config(MeshConfig *out, const JobConfig *cfg, const ModelSpec *spec, int world);

#endif
