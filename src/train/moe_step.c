/* Per-step MoE bookkeeping: all-reduce of routing counts, expert_bias update, load metrics. */
#include "train/moe_step.h"

#include "model/moe.h"

int moe_train_step(Qwen3 *m, Comm *comm, int update, MetricsExtra *extra, int *nextra, int cap,
                   Err *err) {
    if (!m->n_moe_layers) return 0;
    const ModelSpec *s = &m->spec;
    size_t n = (size_t)s->n_layers * s->num_experts;
    if (comm && comm->size > 1) TRY(comm_all_reduce_sum(comm, m->moe_counts, n, COMM_F64, err));
    if (update) qwen3_moe_update_bias(m, m->moe_counts);
    MoeLoadStats st;
    moe_load_stats(&st, m->moe_counts, s->n_layers, s->num_experts);
    qwen3_moe_reset_counts(m);
    if (extra && nextra && *nextra + MOE_STEP_NEXTRA <= cap) {
        extra[(*nextra)++] = (MetricsExtra){"moe_tokens_min", st.min_tokens};
        extra[(*nextra)++] = (MetricsExtra){"moe_tokens_max", st.max_tokens};
        extra[(*nextra)++] = (MetricsExtra){"moe_imbalance", st.imbalance};
    }
    return 0;
}
