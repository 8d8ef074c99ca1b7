/* qtitan inspect. */
#include "cli/commands.h"

#include <stdio.h>

int cmd_inspect(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: qtitan inspect [options]\n\nNot built yet.\n");
        return 0;
    }
    return cmd_not_built("inspect");
}
