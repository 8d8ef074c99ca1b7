/* How tensor parallelism splits each Qwen3 parameter over the tp ranks (docs/distributed.md):
 * column-parallel linears (wq, wk, wv, w1, w3) keep a block of rows (output features),
 * row-parallel ones (wo, w2) a block of columns (input features), tp rank t the t-th block;
 * everything else (norms, the embedding, lm_head) is replicated. The trainer cuts parameters
 * this way (train_qwen3.c) and the sharded checkpoint reader joins them back (ckpt_dist.c). */
#ifndef QT_TP_SPLIT_H
#define QT_TP_SPLIT_H

typedef enum TpSplit { TP_REPLICATED, TP_ROWS, TP_COLS } TpSplit;

/* The split of the parameter with this qtitan name (layers.0.attention.wq.weight, ...). */
TpSplit tp_split_of(const char *name);

#endif
