/* Helpers shared by the command entry points. */
#include "cli/commands.h"

#include <string.h>

int cmd_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return 1;
    return 0;
}
