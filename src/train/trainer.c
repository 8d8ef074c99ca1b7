/* The training loop: per step, zero gradients; forward + backward over the micro-batches with
 * the loss normalised by the step's valid-label count; clip by global norm; AdamW with the
 * scheduled lr; metrics; checkpoint. */
#include "train/trainer.h"

#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/log.h"
#include "core/peak_record.h"
#include "core/progress.h"
#include "core/timer.h"
#include "core/trace.h"
#include "dist/comm.h"
#include "kernels/cpu_simd.h"
#include "ops/gemm.h"
#include "ops/op_profile.h"
#include "train/ckpt_async.h"
#include "train/ckpt_config.h"
#include "train/ckpt_dist.h"
#include "train/clip.h"
#include "train/lr_schedule.h"

typedef struct Trainer {
    const TrainerOptions *o;
    TrainModel *model;
    TrainData *data;
    AdamW opt;
    LrSchedule sched;
    GradRef *grads;    /* (nparams) */
    CkptTensor *optim; /* (2 * nparams) views of the AdamW state */
    char *ckpt_root;
    Rng rng;
    int64_t step, tokens_seen;
    int64_t lr_step0; /* the schedule's step 0 (a resume that excluded lr_scheduler) */
    double lr;
    MetricsExtra extra[TRAIN_MAX_EXTRA]; /* the model's metrics of the last step */
    int nextra;
    CkptAsync *async; /* checkpoint.async_mode's writer, made by the first such save */
} Trainer;

/* The first parameter holding a NaN or an infinity, or NULL. */
static const char *nonfinite_param(const TrainModel *md) {
    for (int i = 0; i < md->nparams; i++) {
        const float *p = md->params[i].data;
        for (int64_t k = 0, n = ckpt_tensor_numel(&md->params[i]); k < n; k++)
            if (!isfinite(p[k])) return md->params[i].name;
    }
    return NULL;
}

/* The mesh hooks when the job has several processes, else NULL: sharded checkpoints,
 * agreement across ranks and the comm_s metric are theirs. A world of one writes the
 * one-process checkpoint, which `qtitan export` and `inspect` read as it is. */
static const TrainParallel *many_ranks(const TrainerOptions *o) {
    return o->par && o->par->world->size > 1 ? o->par : NULL;
}

/* A background save that has finished on every rank is committed (sharded: collectively)
 * and reported; with block, it is waited for first. Every rank calls it at the same points, so
 * one with a write in flight is one where every rank has one. */
static int finish_async(Trainer *t, int block, Err *err) {
    if (!t->async || !ckpt_async_pending(t->async)) return 0;
    const TrainParallel *par = many_ranks(t->o);
    if (!block) {
        double done = !ckpt_async_busy(t->async);
        if (par) TRY(comm_all_reduce_sum(par->world, &done, 1, COMM_F64, err));
        if (done < (par ? par->world->size : 1)) return 0;
    }
    int64_t step;
    double seconds;
    int rc = ckpt_async_wait(t->async, &step, &seconds, err);
    if (par)
        rc = ckpt_dist_commit(par->world, par->mesh, t->ckpt_root, step, rc, t->o->keep_latest_k,
                              err);
    if (rc == 0)
        log_info("[checkpoint] saved step %" PRId64 " in %.2f s, in the background", step, seconds);
    return rc;
}

static int save(Trainer *t, Err *err) {
    const TrainParallel *par = many_ranks(t->o);
    TRY(finish_async(t, 1, err)); /* one write at a time, in step order */
    int model_only = t->o->last_save_model_only && t->step == t->o->steps;
    int noptim = model_only ? 0 : 2 * t->model->nparams;
    const char *bad = nonfinite_param(t->model);
    int ok = bad ? err_set(err,
                           "step %" PRId64 ": parameter %s holds a non-finite value, so no "
                           "checkpoint is written (try a lower optimizer.lr)",
                           t->step, bad)
                 : 0;
    /* Every rank checks its own shard; all skip the collective save when one fails. */
    if (par) ok = comm_agree(par->world, ok, err);
    TRY(ok);
    CkptState st = {.step = t->step,
                    .tokens_seen = t->tokens_seen,
                    .optim_step = t->opt.step,
                    .lr = t->lr,
                    .data_position = t->data->position ? t->data->position(t->data->ctx) : NULL,
                    .config_hash = t->o->config_hash,
                    .config = t->o->config,
                    .files = t->o->ckpt_files,
                    .nfiles = t->o->n_ckpt_files,
                    .model_only = model_only,
                    .gemm_bf16 = t->o->gemm_bf16};
    memcpy(st.rng, t->rng.s, sizeof st.rng);
    double t0 = now_seconds();
    /* The last step's save is written at once: nothing is left to overlap it with. */
    if (t->o->ckpt_async && t->step != t->o->steps) {
        if (!t->async) t->async = ckpt_async_new();
        CkptAsyncTarget to = {.root = t->ckpt_root,
                              .keep_latest_k = t->o->keep_latest_k,
                              .rank = par ? par->world->rank : 0,
                              .ranks = par ? par->world->size : 0,
                              .mesh = par ? par->mesh : NULL,
                              .slices = t->model->slices};
        int rc = ckpt_async_start(t->async, &to, &st, t->model->params, t->model->nparams, t->optim,
                                  noptim, err);
        json_decref(st.data_position);
        if (par) rc = comm_agree(par->world, rc, err);
        if (rc == 0)
            log_info("[checkpoint] staged step %" PRId64 " in %.2f s (%.2f GiB); writing it in "
                     "the background",
                     t->step, now_seconds() - t0,
                     (double)ckpt_async_staging_bytes(t->async) / 1073741824.0);
        return rc;
    }
    int rc = par ? ckpt_dist_save(par->world, par->mesh, t->ckpt_root, &st, t->model->params,
                                  t->model->slices, t->model->nparams, t->optim, noptim,
                                  t->o->keep_latest_k, err)
                 : ckpt_save(t->ckpt_root, &st, t->model->params, t->model->nparams, t->optim,
                             noptim, t->o->keep_latest_k, err);
    json_decref(st.data_position);
    if (rc == 0)
        log_info("[checkpoint] saved step %" PRId64 "%s in %.2f s", t->step,
                 model_only ? " (model only)" : "", now_seconds() - t0);
    return rc;
}

/* Resharding (or a resume that leaves some state fresh): every rank copies what its tensors
 * hold out of the slices the checkpoint's files hold, model and optimizer state unless
 * excluded, with progress on rank 0. */
static int load_slices(Trainer *t, const char *root, const CkptDistFound *f, int noptim, Err *err) {
    const TrainParallel *par = many_ranks(t->o);
    Comm *world = par ? par->world : NULL;
    const TrainModel *md = t->model;
    int model = !(t->o->exclude & CKPT_EXCLUDE_MODEL);
    if (t->o->exclude & CKPT_EXCLUDE_OPTIMIZER) noptim = 0;
    CkptDistReader r;
    TRY(ckpt_dist_reader_open_found(&r, world, root, f, noptim > 0, err));
    char what[96];
    snprintf(what, sizeof what, "loading checkpoint step %" PRId64, f->step);
    double bytes = 0;
    for (int i = 0; i < md->nparams; i++)
        bytes += (double)ckpt_tensor_numel(&md->params[i]) * sizeof(float) *
                 (model + (noptim > 0 ? 2 : 0));
    Progress p;
    progress_start(&p, what, bytes, "MB", 1e6);
    int rc = ckpt_dist_reader_check_names(&r, world, md->params, md->nparams, err);
    if (rc == 0 && model)
        rc = ckpt_dist_read_into(&r, md->params, md->nparams, md->slices, 1, 0, &p, err);
    if (rc == 0 && noptim > 0)
        rc = ckpt_dist_read_into(&r, t->optim, noptim, md->slices, 2, 1, &p, err);
    progress_finish(&p);
    ckpt_dist_reader_close(&r);
    return rc;
}

/* What changed in the config since the checkpoint was written, said once (rank 0): the mesh
 * keys in an info line (a reshard), any other key in a warning naming it. A checkpoint from
 * before the config was saved key by key has only its hash to compare. */
static void report_config(const char *path, const CkptState *st, const TrainerOptions *o) {
    if (!st->config || !o->config) {
        if (st->config_hash != o->config_hash)
            log_warn("[checkpoint] %s was written under another config (hash %016" PRIx64
                     ", now %016" PRIx64 ")",
                     path, st->config_hash, o->config_hash);
        return;
    }
    char *mesh = ckpt_config_changes(st->config, o->config, 1);
    char *other = ckpt_config_changes(st->config, o->config, 0);
    if (mesh)
        log_info("[checkpoint] step %" PRId64 " was written on another mesh: %s", st->step, mesh);
    if (other) log_warn("[checkpoint] %s was written under another config: %s", path, other);
    free(mesh);
    free(other);
}

/* How CkptState.gemm_bf16 multiplied, in words. */
static const char *bf16_way(int gemm_bf16) {
    return gemm_bf16 == GEMM_BF16_WIDEN ? "on widened operands"
           : gemm_bf16 == GEMM_BF16_AMX ? "with qtitan's AMX tiles"
                                        : "with oneDNN's bf16 matmul";
}

static int resume(Trainer *t, Err *err) {
    const TrainParallel *par = many_ranks(t->o);
    Comm *world = par ? par->world : NULL;
    int size = world ? world->size : 1, rank = world ? world->rank : 0;
    CkptDistFound f;
    const char *root = t->ckpt_root;
    int found =
        t->o->ckpt_enable
            ? ckpt_dist_locate(world, root, t->o->load_step > 0 ? t->o->load_step : -1, &f, err)
            : 0;
    int initial = found == 0 && t->o->initial_root;
    if (initial) {
        root = t->o->initial_root;
        found = ckpt_dist_find_initial(world, root, t->o->initial_step, &f, err) == 0 ? 1 : -1;
    }
    if (found <= 0) return found;
    /* The mesh that wrote it reads its own files as they are; any other copies slices. */
    int same = f.ranks == 0 ? size == 1
                            : par && f.ranks == size && f.mesh[0] == par->mesh[0] &&
                                  f.mesh[1] == par->mesh[1] && f.mesh[2] == par->mesh[2] &&
                                  f.mesh[3] == par->mesh[3];
    char *path = ckpt_dist_found_dir(root, &f, same ? rank : 0);
    CkptState st;
    /* A model-only step (checkpoint.last_save_model_only) ends a finished run: re-running the
     * job loads its weights and has nothing left to do. Continuing past it needs the optimizer
     * state, which it lacks: loading then fails with a sentence. */
    int noptim = 2 * t->model->nparams;
    int rc = ckpt_read_state(path, &st, err);
    if (rc == 0) {
        if (st.model_only && st.step >= t->o->steps) noptim = 0;
        ckpt_state_release(&st);
    }
    if (rc == 0 && same && f.ranks) rc = ckpt_dist_check_rank(path, rank, err);
    /* ckpt_dist_locate verified the job's own steps; another run's is verified here. */
    if (rc == 0 && same && initial) rc = ckpt_verify(path, 1, err);
    if (rc == 0 && same && t->o->exclude == 0) {
        /* ckpt_find_latest verified a one-process step's checksums already. */
        rc = f.ranks || initial
                 ? ckpt_load(path, &st, t->model->params, t->model->nparams, t->optim, noptim, err)
                 : ckpt_load_found(path, &st, t->model->params, t->model->nparams, t->optim, noptim,
                                   err);
    } else if (rc == 0) {
        if (!same && f.ranks)
            log_info("[checkpoint] step %" PRId64 " was saved on the mesh [dp_replicate %d, "
                     "dp_shard %d, tp %d, ep %d]; resharding it for this job's %d process%s",
                     f.step, f.mesh[0], f.mesh[1], f.mesh[2], f.mesh[3], size,
                     size > 1 ? "es" : "");
        else if (!same)
            log_info("[checkpoint] step %" PRId64 " was saved by one process; resharding it for "
                     "this job's %d processes",
                     f.step, size);
        if (st.model_only && noptim > 0 && !(t->o->exclude & CKPT_EXCLUDE_OPTIMIZER))
            rc = err_set(err,
                         "%s holds the model only (checkpoint.last_save_model_only), not the "
                         "optimizer state training resumes with",
                         path);
        if (rc == 0) rc = ckpt_read_state(path, &st, err);
        if (rc == 0) rc = load_slices(t, root, &f, noptim, err);
        if (rc != 0) ckpt_state_release(&st);
    }
    if (par) rc = comm_agree(par->world, rc, err); /* every rank resumes, or none */
    if (rc == 0 && rank == 0) report_config(path, &st, t->o);
    if (rc == 0 && rank == 0 && st.gemm_bf16 != CKPT_GEMM_BF16_NONE &&
        t->o->gemm_bf16 != CKPT_GEMM_BF16_NONE && st.gemm_bf16 != t->o->gemm_bf16)
        log_warn("[checkpoint] step %" PRId64 " multiplied its bf16 products %s, this run %s "
                 "(QT_GEMM_BF16): the resumed steps may differ from an uninterrupted run's in "
                 "their last bits",
                 st.step, bf16_way(st.gemm_bf16), bf16_way(t->o->gemm_bf16));
    if (rc == 0 && (t->o->exclude & CKPT_EXCLUDE_DATALOADER)) {
        if (t->data->restart) t->data->restart(t->data->ctx);
    } else if (rc == 0 && t->data->restore && st.data_position) {
        rc = t->data->restore(t->data->ctx, st.data_position, err);
    }
    if (rc == 0) {
        t->step = st.step;
        t->tokens_seen = st.tokens_seen;
        if (!(t->o->exclude & CKPT_EXCLUDE_OPTIMIZER)) t->opt.step = st.optim_step;
        if (t->o->exclude & CKPT_EXCLUDE_LR_SCHEDULER) t->lr_step0 = st.step;
        t->lr = st.lr;
        memcpy(t->rng.s, st.rng, sizeof st.rng);
        log_info("[checkpoint] resumed from %s (step %" PRId64 ")%s%s%s%s%s", path, st.step,
                 initial ? ", checkpoint.initial_load_path with initial_load_model_only = false"
                         : "",
                 t->o->exclude & CKPT_EXCLUDE_MODEL ? ", model not loaded" : "",
                 t->o->exclude & CKPT_EXCLUDE_OPTIMIZER ? ", optimizer not loaded" : "",
                 t->o->exclude & CKPT_EXCLUDE_LR_SCHEDULER ? ", lr schedule restarted" : "",
                 t->o->exclude & CKPT_EXCLUDE_DATALOADER ? ", data from its first row" : "");
        if (st.step >= t->o->steps) /* torchtitan also trains nothing then; say so */
            log_warn("[checkpoint] step %" PRId64 " is already at training.steps = %" PRId64
                     "; nothing to train (raise training.steps to continue)",
                     st.step, t->o->steps);
    } else {
        err_wrap(err, "cannot resume from %s", path);
    }
    ckpt_state_release(&st);
    free(path);
    return rc;
}

static int train_step(Trainer *t, StepMetrics *m, Err *err) {
    const TrainerOptions *o = t->o;
    TrainModel *md = t->model;
    int64_t step = t->step + 1;
    double t0 = now_seconds();
    int64_t tokens, valid;
    TRY(t->data->count(t->data->ctx, step, &tokens, &valid, err));
    if (valid <= 0) return err_set(err, "step %" PRId64 " has no label that counts", step);
    int tok = prof_begin("zero_grads", "", 0);
    /* Each thread zeroes its slice of every gradient: one thread reaches a fraction of the
     * memory bandwidth, the gradients are as large as the model, and slices balance the
     * threads whatever the parameters' sizes (no per-step allocation, one barrier), with
     * stores that do not read the lines first where a slice is large (0.6B-2layers bf16 on
     * the AMX host: 38 -> 17 ms; bench/README.md "AMX tiles"). */
#pragma omp parallel
    {
        size_t nt = (size_t)omp_get_num_threads(), me = (size_t)omp_get_thread_num();
        for (int i = 0; i < md->nparams; i++) {
            size_t n = t->grads[i].n, per = (n + nt - 1) / nt, lo = me * per;
            size_t hi = lo + per < n ? lo + per : n;
            if (lo < hi) simd_zero_stream(md->grads[i] + lo, (long)(hi - lo));
        }
    }
    prof_end(tok);
    double loss_sum = 0;
    for (int micro = 0; micro < o->micro_batches; micro++) {
        const void *batch;
        double part;
        TRY(t->data->next(t->data->ctx, step, micro, &batch, err));
        TRY(md->forward_backward(md->ctx, batch, (double)valid, &part, err));
        loss_sum += part;
    }
    double norm;
    if (o->par) {
        /* This rank's gradient and loss are its share; complete them across ranks. */
        TRY(o->par->finish_grads(o->par->ctx, &loss_sum, err));
        double ss;
        PROF_STEP("grad_norm", ss = grad_sum_squares(t->grads, md->nparams));
        TRY(o->par->grad_norm(o->par->ctx, ss, &norm, err));
    } else {
        PROF_STEP("grad_norm", norm = grad_global_norm(t->grads, md->nparams));
    }
    /* Clipping is applied inside AdamW (adamw_step_scaled): one pass over the gradients fewer,
     * bitwise the same update. */
    float clip = grad_clip_coef(norm, o->max_norm);
    int finite = isfinite(norm) != 0;
    double loss = loss_sum / (double)valid;
    /* A NaN's sign bit means nothing, but printf shows it ("-nan"); log "nan" as torch does. */
    if (isnan(loss)) loss = NAN;
    if (isnan(norm)) norm = NAN;
    int update = isfinite(loss) && finite;
    /* Before the stop on a non-finite step, so that the model's per-step state (MoE routing
     * counts) restarts even when the update is skipped; the model's own update (expert_bias)
     * is skipped with the parameters'. */
    t->nextra = 0;
    if (md->before_optimizer_step)
        TRY(md->before_optimizer_step(md->ctx, update, t->extra, &t->nextra, err));
    t->lr = lr_schedule_lr(&t->sched, step - t->lr_step0);
    if (!update) {
        if (!o->skip_nonfinite)
            return err_set(err,
                           "step %" PRId64 ": loss %g, grad_norm %g: training diverged (try a "
                           "lower optimizer.lr or training.max_norm, or training.skip_nonfinite)",
                           step, loss, norm);
        log_warn("step %" PRId64 ": loss %g, grad_norm %g: update skipped", step, loss, norm);
    } else {
        PROF_STEP("adamw", adamw_step_scaled(&t->opt, t->lr, clip));
    }
    t->step = step;
    t->tokens_seen += tokens;
    memset(m, 0, sizeof *m);
    m->step = step;
    m->loss = loss;
    m->grad_norm = norm;
    m->lr = t->lr;
    metrics_fill(m, (double)tokens, now_seconds() - t0, o->flops_per_token, o->peak_tflops);
    return 0;
}

static int run(Trainer *t, Err *err) {
    const TrainerOptions *o = t->o;
    TrainModel *md = t->model;
    TRY(lr_schedule_init(&t->sched, o->lr, o->steps, o->schedule_steps, o->warmup_steps,
                         o->decay_ratio, o->decay_type, o->min_lr_factor, err));
    AdamWParam *ap = xcalloc((size_t)md->nparams + 1, sizeof *ap);
    t->grads = xcalloc((size_t)md->nparams + 1, sizeof *t->grads);
    for (int i = 0; i < md->nparams; i++) {
        size_t n = (size_t)ckpt_tensor_numel(&md->params[i]);
        ap[i] = (AdamWParam){md->params[i].name, md->params[i].data, md->grads[i], n,
                             md->decay ? md->decay[i] : 1};
        t->grads[i] = (GradRef){md->grads[i], n, md->params[i].device};
    }
    int rc = adamw_init(&t->opt, &o->adamw, ap, md->nparams, err);
    free(ap);
    TRY(rc);
    if (md->copies) adamw_set_copies(&t->opt, md->copies);
    t->optim = ckpt_adamw_tensors(&t->opt, md->params, md->nparams, err);
    if (!t->optim) return -1;
    if (o->ckpt_enable || o->initial_root) TRY(resume(t, err));
    if (o->ckpt_enable && !o->ckpt_load_only && o->on_resumed)
        TRY(o->on_resumed(o->on_resumed_ctx, err));
    /* On many processes rank 0 writes metrics.jsonl; all ranks hold the same step values. */
    int writer = !o->par || o->par->world->rank == 0;
    MetricsWriter mw = {0};
    if (writer) TRY(metrics_writer_open(&mw, o->dump_folder, t->step, err));
    if (o->tb_dir && (writer || o->tb_all_ranks) &&
        metrics_writer_open_tensorboard(&mw, o->tb_dir, err) != 0) {
        metrics_writer_close(&mw);
        return -1;
    }
    if (md->keep_copies) md->keep_copies(md->ctx, 1);
    MetricsSummary summary = {0};
    double time_sum = 0; /* of the steps after the first this process ran, for the eta */
    rc = 0;
    while (rc == 0 && t->step < o->steps) {
        StepMetrics m;
        int64_t next = t->step + 1;
        int traced = o->trace_dir && o->trace_freq > 0 && next % o->trace_freq == 0;
        if (traced) trace_start();
        rc = train_step(t, &m, err);
        if (rc != 0) break;
        metrics_summary_add(&summary, &m);
        if (summary.seen > 1) time_sum += m.step_time_s;
        m.total_steps = o->steps;
        m.eta_s = (double)(o->steps - t->step) *
                  (summary.seen > 1 ? time_sum / (double)(summary.seen - 1) : m.step_time_s);
        if (summary.seen == 1) {
            prof_reset();           /* the profile, too, leaves out the first step */
            comm_first_step_done(); /* collectives now wait comm.train_timeout_seconds */
        }
        int last = t->step == o->steps;
        double comm_s = o->par ? o->par->comm_seconds(o->par->ctx) : 0;
        if (m.step == 1 || last || (o->log_freq > 0 && m.step % o->log_freq == 0)) {
            char line[512];
            metrics_format_line(line, sizeof line, &m);
            log_info("%s", line);
            MetricsExtra extra[TRAIN_MAX_EXTRA + 1];
            memcpy(extra, t->extra, (size_t)t->nextra * sizeof *extra);
            int nextra = t->nextra;
            if (many_ranks(o)) extra[nextra++] = (MetricsExtra){"comm_s", comm_s};
            if (writer || mw.tb) rc = metrics_writer_write(&mw, &m, extra, nextra, err);
        }
        if (o->on_step) o->on_step(o->on_step_ctx, &m);
        if (rc == 0 && o->after_step)
            rc = o->after_step(o->after_step_ctx, t->step, last, writer ? &mw : NULL, err);
        if (rc == 0) rc = finish_async(t, 0, err); /* an earlier step's, once written */
        if (rc == 0 && o->ckpt_enable && !o->ckpt_load_only &&
            (last || (o->ckpt_interval > 0 && t->step % o->ckpt_interval == 0) ||
             (o->ckpt_first_step && t->step == 1))) {
            double ts = trace_now();
            rc = save(t, err);
            trace_span("checkpoint_save", NULL, "checkpoint", ts, NULL);
        }
        if (rc == 0 && o->ckpt_enable && !o->ckpt_load_only && last && o->on_last_save) {
            char name[48];
            snprintf(name, sizeof name, "step-%" PRId64, t->step);
            char *dir = fs_join(t->ckpt_root, name);
            rc = o->on_last_save(o->on_last_save_ctx, dir, err);
            free(dir);
        }
        if (traced) {
            int wrc = trace_write(o->trace_dir, next, o->par ? o->par->world->rank : 0, err);
            if (rc == 0) rc = wrc;
        }
    }
    if (t->async) { /* a write still in flight: committed after a clean run, else awaited */
        Err ignore;
        int wrc =
            rc == 0 ? finish_async(t, 1, err) : ckpt_async_wait(t->async, NULL, NULL, &ignore);
        if (rc == 0) rc = wrc;
    }
    if (md->keep_copies) md->keep_copies(md->ctx, 0);
    metrics_writer_close(&mw);
    if (rc == 0) {
        char line[512];
        metrics_summary_format(line, sizeof line, &summary);
        log_info("%s", line);
        prof_report(stderr, (long)summary.n);
    }
    return rc;
}

int trainer_run(const TrainerOptions *opts, TrainModel *model, TrainData *data, Err *err) {
    if (opts->steps < 1) return err_set(err, "training.steps must be >= 1");
    if (opts->micro_batches < 1) return err_set(err, "gradient accumulation steps must be >= 1");
    Trainer t;
    memset(&t, 0, sizeof t);
    t.o = opts;
    t.model = model;
    t.data = data;
    rng_seed(&t.rng, opts->seed, 0);
    TrainerOptions local = *opts;
    if (local.peak_tflops <= 0) { /* the MFU denominator: the machine's best (peak_record.h) */
        const char *unit = "fp32 fma";
        double measured = opts->bf16_matmuls ? metrics_measure_peak_tflops_bf16(0.3, &unit)
                                             : metrics_measure_peak_tflops(0.3);
        PeakRecord self;
        peak_record_this_machine(&self, unit, omp_get_max_threads());
        char *dir = fs_cache_dir("peaks"), *path = peak_record_path(dir, &self);
        long runs = 1;
        local.peak_tflops = peak_record_update(path, &self, measured, &runs);
        log_info("measured peak: %.2f TFLOP/s %s (%s; the best of %ld run(s) on this machine, this "
                 "run %.2f, kept in %s; set metrics.peak_tflops to override)",
                 local.peak_tflops, opts->bf16_matmuls ? "bf16" : "fp32", unit, runs, measured,
                 path);
        free(path);
        free(dir);
    }
    t.o = &local;
    t.ckpt_root =
        fs_resolve(opts->dump_folder, opts->ckpt_folder ? opts->ckpt_folder : "checkpoint");
    int rc = run(&t, err);
    ckpt_async_free(t.async);
    ckpt_tensors_free(t.optim, 2 * model->nparams);
    adamw_free(&t.opt);
    free(t.grads);
    free(t.ckpt_root);
    return rc;
}
