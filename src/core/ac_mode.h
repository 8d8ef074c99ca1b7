/* Activation checkpointing modes: one enum for the job config ([activation_checkpoint] mode)
 * and the model build, so a file can include both core/config.h and model/qwen3.h. */
#ifndef QT_AC_MODE_H
#define QT_AC_MODE_H

typedef enum AcMode {
    AC_NONE = 0,  /* keep every activation */
    AC_FULL,      /* keep each layer's input only; recompute the layer in backward */
    AC_SELECTIVE, /* keep matmul and attention outputs; recompute norms and rope in backward */
    /* AC_EVERY + n, n >= 2 (ac_every): torchtitan's layer-wise selective checkpointing,
     * selective_ac_option = "n". Counting the layers from 1, every n-th is checkpointed whole
     * as under AC_FULL; the others keep every activation as under AC_NONE. */
    AC_EVERY = 16,
} AcMode;

/* The most layers an n can tell apart; a larger n checkpoints no layer, as this one does. */
#define AC_EVERY_MAX 65536

/* The mode of torchtitan's selective_ac_option = "n": 0 and 1 checkpoint every layer. */
static inline AcMode ac_every(long n) {
    if (n <= 1) return AC_FULL;
    return (AcMode)(AC_EVERY + (n < AC_EVERY_MAX ? n : AC_EVERY_MAX));
}

/* n of a layer-wise mode; 0 for the others. */
static inline int ac_every_n(AcMode m) {
    return m > AC_EVERY ? (int)m - AC_EVERY : 0;
}

/* What layer i (from 0) does under m: AC_NONE, AC_FULL or AC_SELECTIVE. */
static inline AcMode ac_layer_mode(AcMode m, int i) {
    int n = ac_every_n(m);
    if (!n) return m;
    return (i + 1) % n == 0 ? AC_FULL : AC_NONE;
}

/* Layers of L whose forward backward runs again: every AC_FULL layer but the last of them,
 * whose activations the shared buffers still hold when backward reaches it. */
static inline int ac_recomputed_layers(AcMode m, int L) {
    int full = 0;
    for (int i = 0; i < L; i++)
        full += ac_layer_mode(m, i) == AC_FULL;
    return full > 0 ? full - 1 : 0;
}

#endif
