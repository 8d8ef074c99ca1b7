/* The step-time model of `qtitan plan --cluster` (train/steptime.h). Collectives are costed as
 * rings: an all-gather or reduce-scatter over P ranks of a B-byte buffer takes
 * (P - 1) x latency + (P - 1) / P x B / bandwidth, an all-reduce twice that, an all-to-all
 * (P - 1) x latency + the larger of its traffic inside the host and its traffic through the
 * host's link. */
#include "train/steptime.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

int steptime_parse_cluster(const char *text, int *hosts, int *per_host, Err *err) {
    const char *x = text ? strchr(text, 'x') : NULL;
    long v[2] = {0, 0};
    const char *part[2] = {text, x ? x + 1 : NULL};
    for (int i = 0; x && i < 2; i++) {
        char *end;
        errno = 0;
        if (*part[i] < '0' || *part[i] > '9') break;
        v[i] = strtol(part[i], &end, 10);
        if (errno || v[i] < 1 || v[i] > 65536 || end != (i == 0 ? x : part[1] + strlen(part[1])))
            v[i] = 0;
    }
    if (!x || v[0] == 0 || v[1] == 0)
        return err_set(err,
                       "--cluster %s: expected HOSTSxGPUS, two integers from 1 to 65536 joined by "
                       "'x' (e.g. 2x8: two hosts of eight ranks each)",
                       text ? text : "(none)");
    /* The meshes are counted in int, and enumerating a larger world would take minutes. */
    if (v[0] * v[1] > STEPTIME_MAX_RANKS)
        return err_set(err,
                       "--cluster %s: %ld x %ld = %ld ranks, more than the %d the step-time model "
                       "counts",
                       text, v[0], v[1], v[0] * v[1], STEPTIME_MAX_RANKS);
    *hosts = (int)v[0];
    *per_host = (int)v[1];
    return 0;
}

int steptime_check_cluster(const Cluster *c, Err *err) {
    struct {
        const char *opt;
        double v, lo, hi;
    } f[] = {{"--flops", c->peak_tflops, 1e-9, 1e9},  {"--eff", c->compute_eff, 1e-6, 1},
             {"--intra-bw", c->intra_gbs, 1e-9, 1e9}, {"--inter-bw", c->inter_gbs, 1e-9, 1e9},
             {"--latency-us", c->latency_us, 0, 1e9}, {"--overlap", c->overlap, 0, 1},
             {"--mem", c->mem_gib, 1e-9, 1e9}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!(f[i].v >= f[i].lo && f[i].v <= f[i].hi))
            return err_set(err, "%s %g: expected a number from %g to %g", f[i].opt, f[i].v, f[i].lo,
                           f[i].hi);
    if (c->gather_bytes != 0 && c->gather_bytes != 2 && c->gather_bytes != 4)
        return err_set(err, "--gather-dtype: expected fp32 or bf16");
    return 0;
}

int steptime_job_mesh(StepMesh *m, const JobConfig *cfg, const Cluster *c, Err *err) {
    long world = (long)c->hosts * c->per_host;
    int rep = cfg->parallelism.data_parallel_replicate_degree;
    int tp = cfg->parallelism.tensor_parallel_degree;
    int shard = cfg->parallelism.data_parallel_shard_degree;
    if (shard < 0) {
        if (world % ((long)rep * tp) != 0)
            return err_set(err,
                           "data_parallel_shard_degree = -1 needs the cluster's %ld ranks to be a "
                           "multiple of data_parallel_replicate_degree x tensor_parallel_degree = "
                           "%d",
                           world, rep * tp);
        shard = (int)(world / ((long)rep * tp));
    }
    *m = (StepMesh){.rep = rep,
                    .shard = shard,
                    .tp = tp,
                    .ep = cfg->parallelism.expert_parallel_degree > 1
                              ? cfg->parallelism.expert_parallel_degree
                              : 1,
                    .sp = cfg->parallelism.enable_sequence_parallel && tp > 1,
                    .ac = config_ac(cfg)};
    if ((long)rep * shard * tp != world)
        return err_set(err,
                       "the mesh data_parallel_replicate_degree x data_parallel_shard_degree x "
                       "tensor_parallel_degree = %d x %d x %d = %ld does not match the cluster's "
                       "%ld ranks (--cluster %dx%d)",
                       rep, shard, tp, (long)rep * shard * tp, world, c->hosts, c->per_host);
    return 0;
}

/* ---- collectives ---- */

/* A group of `ranks` ranks `stride` apart, in blocks of stride x ranks consecutive ranks
 * (how mesh.h lays out every group); a host holds per_host consecutive ranks. */
static int crosses_hosts(const Cluster *c, int stride, int ranks) {
    long span = (long)stride * ranks;
    return span > c->per_host || c->per_host % span != 0;
}

/* Bytes per second of one rank's ring. Across hosts, each ring sends one stream through each
 * host's link, and every group of the host runs the same collective at the same time. */
static double ring_bw(const Cluster *c, int stride, int ranks) {
    double intra = c->intra_gbs * 1e9;
    if (!crosses_hosts(c, stride, ranks)) return intra;
    int members = stride < c->per_host ? c->per_host / stride : 1; /* of a group, per host */
    if (members > ranks) members = ranks;
    double groups = (double)c->per_host / members;
    double inter = c->inter_gbs * 1e9 / groups;
    return inter < intra ? inter : intra;
}

/* `calls` calls moving `bytes` in all (each call's full buffer, summed): factor 1 for
 * all-gather and reduce-scatter, 2 for all-reduce. */
static double ring_seconds(const Cluster *c, int stride, int ranks, double calls, double bytes,
                           double factor) {
    if (ranks <= 1) return 0;
    double p = ranks;
    return factor * (calls * (p - 1) * c->latency_us * 1e-6 +
                     (p - 1) / p * bytes / ring_bw(c, stride, ranks));
}

/* One all-to-all in which every rank sends `bytes`, spread evenly over the group. */
static double a2a_seconds(const Cluster *c, int stride, int ranks, double bytes) {
    if (ranks <= 1) return 0;
    double p = ranks, t = (p - 1) * c->latency_us * 1e-6;
    if (!crosses_hosts(c, stride, ranks)) return t + (p - 1) / p * bytes / (c->intra_gbs * 1e9);
    double m = stride < c->per_host ? c->per_host / stride : 1;
    if (m > p) m = p;
    double inside = (m - 1) / p * bytes / (c->intra_gbs * 1e9);
    double through = c->per_host * (p - m) / p * bytes / (c->inter_gbs * 1e9);
    return t + (inside > through ? inside : through);
}

static void add(StepTime *s, const char *what, const char *group, const Cluster *c, int stride,
                int ranks, double count, double bytes, double seconds, int overlapped) {
    if (ranks <= 1 || count <= 0 || s->ncoll >= STEP_MAX_COLL) return;
    s->coll[s->ncoll++] = (StepCollective){what,  group, ranks,   crosses_hosts(c, stride, ranks),
                                           count, bytes, seconds, overlapped};
}

/* ---- the estimate ---- */

/* Bytes all-gathered for unit i's n elements (its dense part, or with experts its experts): the
 * cluster's element type when given, else what qtitan moves for the job (train_qwen3.c): a
 * LoRA bf16 base its matmul weights and embedding in bf16 and the rest in fp32; bf16 mixed
 * precision each unit with matmul weights and no embedding or experts in bf16 whole, plus its
 * other parameters (norms, router) in fp32; everything else fp32. */
static double gather_bytes(const Cluster *c, const JobConfig *cfg, const PlanUnits *u, int i,
                           double n, int experts, int ep) {
    if (c->gather_bytes > 0) return n * c->gather_bytes;
    double b16 = experts ? 0 : u->in_bf16[i];
    if (cfg->lora.rank > 0 && cfg->lora.base_dtype == DT_BF16) return 2.0 * b16 + 4.0 * (n - b16);
    int whole_b16 = cfg->lora.rank == 0 && cfg->training.mixed_precision_param == DT_BF16 &&
                    !experts && b16 > 0 && i > 0 && (ep > 1 || u->experts[i] == 0);
    return whole_b16 ? 2.0 * n + 4.0 * (n - b16) : 4.0 * n;
}

int steptime_estimate(StepTime *out, const JobConfig *cfg, const StepMesh *m, const Cluster *c,
                      Err *err) {
    memset(out, 0, sizeof *out);
    out->mesh = *m;
    long world = (long)c->hosts * c->per_host;
    if ((long)m->rep * m->shard * m->tp != world)
        return err_set(err, "the mesh %d x %d x %d does not have the cluster's %ld ranks", m->rep,
                       m->shard, m->tp, world);
    JobConfig job = *cfg; /* shallow: only the mesh and checkpointing change */
    job.parallelism.data_parallel_replicate_degree = m->rep;
    job.parallelism.data_parallel_shard_degree = m->shard;
    job.parallelism.tensor_parallel_degree = m->tp;
    job.parallelism.expert_parallel_degree = m->ep;
    job.parallelism.enable_sequence_parallel = m->sp;
    char option[CONFIG_AC_OPTION_CAP]; /* the mesh's checkpointing as the config writes it */
    job.activation_checkpoint.mode = config_ac_parts(m->ac, option);
    job.activation_checkpoint.selective_ac_option = option;
    int was = log_set_info(0); /* the plan logs kernel replacements; once is enough */
    int rc = train_plan_compute(&out->plan, &job, err);
    log_set_info(was);
    TRY(rc);
    const TrainPlan *p = &out->plan;
    const ModelSpec *sp = &p->spec;
    PlanUnits u;
    train_plan_units(&u, sp, m->tp, m->ep);
    out->mem_bytes = p->total;

    /* Compute: the plan's FLOPs of one data-parallel rank's tokens as executed (the
     * recomputed forward included; a LoRA run's frozen base without weight gradients), split
     * over tp except lm_head, which each tp rank runs whole unless sequence parallelism gives
     * it 1/tp of the tokens. */
    int frozen = cfg->lora.rank > 0;
    double N = (double)p->B * p->T, M = p->micro, tok = N * M;
    double D = sp->dim, V = sp->vocab_size, L = sp->n_layers;
    double head = (frozen ? 4.0 : 6.0) * V * D * tok;
    out->rank_flops = (p->hw_flops_per_step - head) / m->tp + head / (m->sp ? m->tp : 1);
    out->compute_s = out->rank_flops / (c->peak_tflops * 1e12 * c->compute_eff);

    /* FSDP (dp_shard group, ranks tp apart): per micro-batch every unit is gathered for its
     * forward and again for its backward, except the two layers and the edge unit still in
     * their workspaces when backward starts (with tied embeddings the embedding unit stays
     * gathered throughout; a frozen one has no backward); every unit's gradient is
     * reduce-scattered once (a LoRA run's frozen base has none). A layer's LoRA adapters (a
     * rank's tensor-parallel blocks of them) are gathered with their unit, as often, and their
     * gradients reduce-scattered once, in collectives of their own (train_qwen3.c).
     * Under expert parallelism a layer's experts are a unit of their own
     * (train/train_qwen3.c): the rank's X / ep of them are gathered and reduce-scattered
     * alongside the layer, over the dp_shard x tp / ep ranks of its replica that hold the same
     * experts (ranks ep apart); without it they are part of the layer. */
    double fsdp = 0, first = 0, lgb = 0, lgn = 0, lrb = 0, lrn = 0;
    int ep_rep = m->shard * m->tp / m->ep;
    for (int part = 0; part < (m->ep > 1 ? 2 : 1); part++) {
        int ranks = part ? ep_rep : m->shard, stride = part ? m->ep : m->tp;
        double gb = 0, gn = 0, rb = 0, rn = 0;
        for (int i = 0; i < u.n; i++) {
            double n = part ? u.experts[i] : u.dense[i] + (m->ep > 1 ? 0 : u.experts[i]);
            if (n <= 0) continue;
            int again = (i >= 1 && i <= L - 2) || (i == 0 && !sp->tie_embeddings && !frozen);
            gb += gather_bytes(c, cfg, &u, i, n, part, m->ep) * (again ? 2 : 1);
            gn += again ? 2 : 1;
            double lora = part || i < 1 || i > L ? 0 : 4.0 * p->lora_layer[i - 1];
            lgb += lora * (again ? 2 : 1);
            lgn += lora > 0 ? (again ? 2 : 1) : 0;
            lrb += lora;
            lrn += lora > 0;
            rb += frozen ? 0 : n * 4.0;
            rn += frozen ? 0 : 1;
        }
        double tg = M * ring_seconds(c, stride, ranks, gn, gb, 1);
        double tr = M * ring_seconds(c, stride, ranks, rn, rb, 1);
        const char *g = part ? "ep_shard" : "dp_shard";
        add(out, part ? "FSDP all-gather (experts)" : "FSDP all-gather", g, c, stride, ranks,
            M * gn, gn > 0 ? gb / gn : 0, tg, 1);
        add(out, part ? "FSDP reduce-scatter (experts)" : "FSDP reduce-scatter", g, c, stride,
            ranks, M * rn, rn > 0 ? rb / rn : 0, tr, 1);
        if (ranks > 1) {
            fsdp += tg + tr;
            if (!part)
                first += M * ring_seconds(c, stride, ranks, 1,
                                          gather_bytes(c, cfg, &u, 0, u.dense[0], 0, m->ep), 1);
        }
    }
    if (lgn > 0) {
        double tg = M * ring_seconds(c, m->tp, m->shard, lgn, lgb, 1);
        double tr = M * ring_seconds(c, m->tp, m->shard, lrn, lrb, 1);
        add(out, "LoRA all-gather", "dp_shard", c, m->tp, m->shard, M * lgn, lgb / lgn, tg, 1);
        add(out, "LoRA reduce-scatter", "dp_shard", c, m->tp, m->shard, M * lrn, lrb / lrn, tr, 1);
        fsdp += tg + tr;
    }
    /* Prefetch hides a transfer under the unit before it, as far as the transport progresses
     * it (overlap); the first gather of each micro-batch has nothing to hide under. */
    double hidden = fsdp - first;
    if (hidden > c->overlap * out->compute_s) hidden = c->overlap * out->compute_s;
    if (hidden < 0) hidden = 0;
    out->overlap_s = hidden;
    double exposed = fsdp - hidden;

    /* HSDP: once per step, the gradient slices (the experts' included; a LoRA run's: the
     * adapters') are all-reduced over the replicas. */
    int rstride = m->tp * m->shard;
    double th = ring_seconds(c, rstride, m->rep, 1, p->grads, 2);
    add(out, "HSDP all-reduce", "dp_replicate", c, rstride, m->rep, 1, p->grads, th, 0);
    exposed += m->rep > 1 ? th : 0;

    /* Tensor parallelism (tp group, consecutive ranks), on (N, D) fp32 activations per
     * micro-batch and layer: without sequence parallelism two all-reduces forward and two
     * backward (two more to recompute the forward under full checkpointing); with it each
     * becomes an all-gather and a reduce-scatter, backward gathers the two norm outputs again,
     * and the edge units' gradients (V x D each) are all-reduced once per micro-batch. */
    if (m->tp > 1) {
        double act = N * D * 4.0, recompute = 2.0 * ac_recomputed_layers(m->ac, (int)L) / L;
        if (!m->sp) {
            double n = M * L * (4 + recompute), t = ring_seconds(c, 1, m->tp, n, n * act, 2);
            add(out, "TP all-reduce", "tp", c, 1, m->tp, n, act, t, 0);
            exposed += t;
        } else {
            double ng = M * L * (2 + 4 + recompute), nr = M * L * (2 + 2 + recompute);
            double tg = ring_seconds(c, 1, m->tp, ng, ng * act, 1);
            double tr = ring_seconds(c, 1, m->tp, nr, nr * act, 1);
            double edges = sp->tie_embeddings ? 1 : 2, eb = V * D * 4.0;
            double te = ring_seconds(c, 1, m->tp, M * edges, M * edges * eb, 2);
            add(out, "SP all-gather", "tp", c, 1, m->tp, ng, act, tg, 0);
            add(out, "SP reduce-scatter", "tp", c, 1, m->tp, nr, act, tr, 0);
            add(out, "SP edge all-reduce", "tp", c, 1, m->tp, M * edges, eb, te, 0);
            exposed += tg + tr + te;
        }
    }
    double moe = 0; /* MoE layers */
    for (int i = 1; i + 1 < u.n; i++)
        moe += u.experts[i] > 0;
    /* q_norm and k_norm are shared by every head and each tp rank saw its own heads, so their
     * gradients (head_dim each) are all-reduced over tp per layer and micro-batch; with
     * sequence parallelism so are the two layer norms' (D each), each rank having seen its
     * tokens only. Latency, in practice. A frozen base has none. */
    if (m->tp > 1 && !frozen) {
        double n = M * L * (m->sp ? 4 : 2), b = M * L * 2 * (sp->head_dim + (m->sp ? D : 0)) * 4.0;
        double t = ring_seconds(c, 1, m->tp, n, b, 2);
        add(out, "TP norm all-reduce", "tp", c, 1, m->tp, n, b / n, t, 0);
        exposed += t;
    }
    /* MoE with tensor parallelism: each tp rank runs the router's backward on its block of
     * the tokens, so the router's gradient (X x D) is all-reduced over tp per MoE layer and
     * micro-batch. */
    if (m->tp > 1 && moe > 0 && !frozen) {
        double n = M * moe, b = sp->num_experts * D * 4.0;
        double t = ring_seconds(c, 1, m->tp, n, n * b, 2);
        add(out, "TP router all-reduce", "tp", c, 1, m->tp, n, b, t, 0);
        exposed += t;
    }
    /* Expert parallelism (ep consecutive ranks: ep / tp dp_shard ranks times the tp group,
     * model/moe_ep.h): per MoE layer and micro-batch the routed rows go to their experts'
     * ranks and come back forward (dispatch, combine), and their gradients backward (and the
     * forward again to recompute under full checkpointing); each rank sends its block of
     * N / tp tokens, N / tp x top_k rows of D floats. Before each forward's dispatch the
     * ranks exchange their per-expert row counts (X floats). */
    if (m->ep > 1) {
        double full = (double)ac_recomputed_layers(m->ac, (int)L) / L; /* of the layers */
        double n = M * moe * (4 + 2 * full), b = N / m->tp * sp->top_k * D * 4.0;
        double t = n * a2a_seconds(c, 1, m->ep, b);
        add(out, "EP all-to-all", "ep", c, 1, m->ep, n, b, t, 0);
        double nc = M * moe * (1 + full), bc = sp->num_experts * 4.0;
        double tc = nc * a2a_seconds(c, 1, m->ep, bc);
        add(out, "EP all-to-all (counts)", "ep", c, 1, m->ep, nc, bc, tc, 0);
        exposed += t + tc;
    }

    out->exposed_s = exposed;
    out->step_s = out->compute_s + exposed;
    double dp = (double)m->rep * m->shard;
    out->tokens_per_s = tok * dp / out->step_s;
    out->tokens_per_s_per_rank = out->tokens_per_s / (double)world;
    out->mfu = 100.0 * p->flops_per_token * out->tokens_per_s_per_rank / (c->peak_tflops * 1e12);
    return 0;
}

/* ---- enumeration ---- */

static int fits(const StepTime *s, const Cluster *c) {
    return s->mem_bytes <= c->mem_gib * 1073741824.0;
}

static int better(const StepTime *a, const StepTime *b, const Cluster *c) {
    if (fits(a, c) != fits(b, c)) return fits(a, c);
    /* equal speed (checkpointing modes whose recompute the model does not count): less memory */
    if (fits(a, c) && a->tokens_per_s != b->tokens_per_s) return a->tokens_per_s > b->tokens_per_s;
    return a->mem_bytes < b->mem_bytes;
}

int steptime_enumerate(StepTime *out, int cap, int *valid, const JobConfig *cfg, const Cluster *c) {
    int world = c->hosts * c->per_host, n = 0;
    *valid = 0;
    /* torchtitan's layer-wise "2" between keeping everything and recomputing every layer */
    const AcMode acs[4] = {AC_NONE, AC_SELECTIVE, ac_every(2), AC_FULL};
    StepTime *s = xcalloc(1, sizeof *s);
    for (int tp = 1; tp <= c->per_host; tp++) {
        if (c->per_host % tp) continue;
        for (int rep = 1; rep <= world / tp; rep++) {
            if ((world / tp) % rep) continue;
            int shard = world / tp / rep;
            /* ep: 1, or tp x a divisor of dp_shard (an EP group is ep / tp dp_shard ranks
             * times the tp group); the estimate drops what the model cannot split. */
            for (int spar = 0; spar <= (tp > 1); spar++)
                for (int e = 0; e <= shard; e++) {
                    int ep = e == 0 ? 1 : tp * e;
                    if ((e > 0 && shard % e) || (e > 0 && ep == 1)) continue;
                    for (int a = 0; a < 4; a++) {
                        StepMesh m = {rep, shard, tp, ep, spar, acs[a]};
                        Err ignored;
                        if (steptime_estimate(s, cfg, &m, c, &ignored) != 0) continue;
                        (*valid)++;
                        /* insertion into the best-first list */
                        int at = n < cap ? n : cap;
                        while (at > 0 && better(s, &out[at - 1], c))
                            at--;
                        if (at >= cap) continue;
                        int last = n < cap ? n : cap - 1;
                        memmove(&out[at + 1], &out[at], (size_t)(last - at) * sizeof *out);
                        out[at] = *s;
                        if (n < cap) n++;
                    }
                }
        }
    }
    free(s);
    return n;
}

/* ---- printing ---- */

void steptime_print(const StepTime *s, const Cluster *c, FILE *f) {
    const StepMesh *m = &s->mesh;
    char ac[32];
    fprintf(f,
            "cluster: %d host(s) x %d ranks; per rank %.4g TFLOP/s peak at %.0f%% efficiency; "
            "%.4g GB/s inside a host, %.4g GB/s per host between hosts; %.4g us per message; "
            "%s all-gathers; overlap %.0f%%; %.4g GiB per rank\n",
            c->hosts, c->per_host, c->peak_tflops, 100 * c->compute_eff, c->intra_gbs, c->inter_gbs,
            c->latency_us,
            c->gather_bytes == 2   ? "bf16"
            : c->gather_bytes == 4 ? "fp32"
                                   : "qtitan's (fp32; bf16 matmul weights under bf16)",
            100 * c->overlap, c->mem_gib);
    fprintf(f,
            "mesh: dp_replicate %d, dp_shard %d, tp %d%s, ep %d; activation checkpointing %s; "
            "%d micro-batch(es) of %d x %d tokens per rank\n",
            m->rep, m->shard, m->tp, m->sp ? " (sequence parallel)" : "", m->ep,
            config_ac_text(m->ac, ac, sizeof ac), s->plan.micro, s->plan.B, s->plan.T);
    fprintf(f, "compute: %.4g FLOPs per rank per step -> %.4f s\n", s->rank_flops, s->compute_s);
    fprintf(f, "collectives per step (%s):\n",
            s->ncoll ? "bytes per call are each rank's full buffer" : "none");
    for (int i = 0; i < s->ncoll; i++) {
        const StepCollective *k = &s->coll[i];
        fprintf(f, "  %-30s %-12s %4d ranks %-10s %8.0f calls %10.3f MiB %9.4f s%s\n", k->what,
                k->group, k->ranks, k->cross_host ? "inter-host" : "intra-host", k->count,
                k->bytes / 1048576.0, k->seconds, k->overlapped ? "  (may overlap)" : "");
    }
    fprintf(f,
            "overlap: %.4f s of FSDP transfers hidden under compute; exposed communication "
            "%.4f s\n",
            s->overlap_s, s->exposed_s);
    fprintf(f, "memory per rank: %.3f GiB (%s)\n", s->mem_bytes / 1073741824.0,
            fits(s, c) ? "fits" : "does NOT fit");
    fprintf(f, "step: %.4f s; %.1f tokens/s (%.1f per rank); MFU %.2f%%\n", s->step_s,
            s->tokens_per_s, s->tokens_per_s_per_rank, s->mfu);
    fprintf(f, "steptime: step_s=%.6g tokens_per_s=%.6g tokens_per_s_per_rank=%.6g mfu=%.4g\n",
            s->step_s, s->tokens_per_s, s->tokens_per_s_per_rank, s->mfu);
}
