/* qtitan train: reads the job config (file plus --section.key=value overrides) and runs it. */
#include "cli/commands.h"

#include <stdio.h>
#include <string.h>

#include "core/config.h"
#include "core/log.h"
#include "dist/comm.h"
#include "train/train_job.h"
#include "train/train_plan.h"

int cmd_train(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: qtitan train --config FILE.toml [--section.key=value ...]\n"
               "       mpirun -np N qtitan train --config FILE.toml [...]\n\n"
               "Trains a Qwen3 model as the job config describes (keys and defaults:\n"
               "docs/config.md); under mpirun on the device mesh of [parallelism]\n"
               "(docs/distributed.md).\n");
        return 0;
    }
    Comm *world;
    Err err;
    /* MPI_Init runs before the config is read, under comm.init_timeout_seconds's default or
     * its command-line override (a value in the TOML file applies from the config on). */
    JobConfig early;
    config_init(&early);
    for (int i = 1; i < argc; i++) /* a bad value stays the default; config_load reports it */
        if (strncmp(argv[i], "--comm.init_timeout_seconds=", 28) == 0)
            (void)config_apply_override(&early, "comm.init_timeout_seconds", argv[i] + 28,
                                        "the command line", &err);
    comm_set_timeouts(early.comm.init_timeout_seconds, early.comm.train_timeout_seconds);
    config_free(&early);
    /* MPI starts only when mpirun started this process; from here every rank logs with its
     * rank and only rank 0 prints info lines. */
    if (comm_init(&world, &argc, &argv, &err) != 0) {
        log_error("%s", err.msg);
        return 1;
    }
    JobConfig cfg;
    int rc = config_load(&cfg, NULL, argc - 1, argv + 1, &err) != 0 ? 2 : 0;
    if (rc == 0) comm_set_timeouts(cfg.comm.init_timeout_seconds, cfg.comm.train_timeout_seconds);
    /* A config that fails on one rank alone (a file missing on one host) stops the others,
     * which would otherwise wait for it forever in the job's first collective. */
    int agreed = comm_agree_own(world, rc, &err);
    if (rc == 0) {
        config_log_notices(&cfg);
        if (cfg.job.print_config && log_rank() == 0) config_dump(&cfg, stdout);
        rc = agreed == 0 && train_job_run(&cfg, world, train_plan_check_memory, &err) == 0 ? 0 : 1;
        config_free(&cfg);
    }
    if (rc != 0) log_error("%s", err.msg);
    comm_destroy(world);
    return rc;
}
