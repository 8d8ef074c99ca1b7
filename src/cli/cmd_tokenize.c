/* qtitan tokenize. */
#include "cli/commands.h"

#include <stdio.h>

int cmd_tokenize(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: qtitan tokenize [options]\n\nNot built yet.\n");
        return 0;
    }
    return cmd_not_built("tokenize");
}
