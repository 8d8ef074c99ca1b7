/* qtitan eval. */
#include "cli/commands.h"

#include <stdio.h>

int cmd_eval(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: qtitan eval [options]\n\nNot built yet.\n");
        return 0;
    }
    return cmd_not_built("eval");
}
