/* qtitan plan: reads a job config like `qtitan train` and prints, without training, the memory
 * per rank by part and the FLOPs per step (train/train_plan.h). */
#include "cli/commands.h"

#include <stdio.h>

#include "core/config.h"
#include "core/log.h"
#include "train/train_plan.h"

int cmd_plan(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: qtitan plan --config FILE.toml [--section.key=value ...]\n\n"
               "Prints what `qtitan train` with the same arguments will need per rank, without\n"
               "running it: parameters, gradients, optimizer state, activations (with the\n"
               "configured activation checkpointing), workspace, tokenizer, dataset and the\n"
               "process baseline, their total (the expected peak RSS), and FLOPs per step.\n"
               "The last line is machine-readable: plan: total_gib=X flops_per_step=Y\n");
        return 0;
    }
    JobConfig cfg;
    Err err;
    if (config_load(&cfg, NULL, argc - 1, argv + 1, &err) != 0) {
        log_error("%s", err.msg);
        return 2;
    }
    config_log_notices(&cfg);
    TrainPlan p;
    int rc = train_plan_compute(&p, &cfg, &err);
    if (rc != 0)
        log_error("%s", err.msg);
    else
        train_plan_print(&p, stdout);
    config_free(&cfg);
    return rc == 0 ? 0 : 1;
}
