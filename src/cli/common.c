/* Helpers shared by the command entry points. */
#include "cli/commands.h"

#include <stdio.h>
#include <string.h>

int cmd_not_built(const char *name) {
    fprintf(stderr, "error: qtitan %s is not built yet in this version\n", name);
    return 2;
}

int cmd_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return 1;
    return 0;
}
