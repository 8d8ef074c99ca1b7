/* qtitan train: reads the job config (file plus --section.key=value overrides) and runs it. */
#include "cli/commands.h"

#include <stdio.h>

#include "core/config.h"
#include "core/log.h"
#include "train/train_job.h"

int cmd_train(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: qtitan train --config FILE.toml [--section.key=value ...]\n\n"
               "Trains a Qwen3 model as the job config describes (DESIGN.md section 6).\n");
        return 0;
    }
    JobConfig cfg;
    Err err;
    if (config_load(&cfg, NULL, argc - 1, argv + 1, &err) != 0) {
        log_error("%s", err.msg);
        return 2;
    }
    int rc = train_job_run(&cfg, &err);
    if (rc != 0) log_error("%s", err.msg);
    config_free(&cfg);
    return rc == 0 ? 0 : 1;
}
