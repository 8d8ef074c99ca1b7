/* qtitan tokenizer-train. */
#include "cli/commands.h"

#include <stdio.h>

int cmd_tokenizer_train(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: qtitan tokenizer-train [options]\n\nNot built yet.\n");
        return 0;
    }
    return cmd_not_built("tokenizer-train");
}
