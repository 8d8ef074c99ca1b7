/* Activation checkpointing modes: one enum for the job config ([activation_checkpoint] mode)
 * and the model build, so a file can include both core/config.h and model/qwen3.h. */
#ifndef QT_AC_MODE_H
#define QT_AC_MODE_H

typedef enum AcMode {
    AC_NONE = 0,  /* keep every activation */
    AC_FULL,      /* keep each layer's input only; recompute the layer in backward */
    AC_SELECTIVE, /* keep matmul and attention outputs; recompute norms and rope in backward */
} AcMode;

#endif
