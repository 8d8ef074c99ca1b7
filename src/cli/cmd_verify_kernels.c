/* qtitan verify-kernels. */
#include "cli/commands.h"

#include <stdio.h>

int cmd_verify_kernels(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: qtitan verify-kernels [options]\n\nNot built yet.\n");
        return 0;
    }
    return cmd_not_built("verify-kernels");
}
