/* qtitan: the command-line entry point. Dispatches `qtitan <command> [options]`. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "dist/comm.h"

typedef struct Command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} Command;

static const Command COMMANDS[] = {
    {"train", cmd_train, "train a model from a TOML job config"},
    {"eval", cmd_eval, "loss (and logits) of an HF model directory on token id lines"},
    {"generate", cmd_generate, "text from an HF model directory or a training checkpoint"},
    {"tokenize", cmd_tokenize, "encode JSONL text to token ids, or decode ids back"},
    {"tokenizer-train", cmd_tokenizer_train, "train a byte-level BPE tokenizer"},
    {"inspect", cmd_inspect, "list a safetensors file or check an HF model directory"},
    {"export", cmd_export, "write a training checkpoint as an HF model directory"},
    {"verify-kernels", cmd_verify_kernels, "check every kernel against its reference"},
    {"plan", cmd_plan, "memory and FLOPs of a config without running it"},
    {"plot", cmd_plot, "draw runs' metrics.jsonl curves as an SVG"},
};
#define NCOMMANDS (sizeof COMMANDS / sizeof COMMANDS[0])

/* Every write to stdout is checked here, once for all commands: what a command printed is
 * flushed and the stream's error flag read, so stdout on a full disk or a closed pipe ends in
 * a sentence and a non-zero exit, not an exit 0 with the output lost. */
static int finish_stdout(const char *command, int rc) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    const char *why = errno ? strerror(errno) : "write error";
    if (rc == 0)
        fprintf(stderr, "error: qtitan %s could not write its output to stdout: %s\n", command,
                why);
    return rc ? rc : 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: qtitan <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-16s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f, "\n`qtitan <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return finish_stdout("--help", 0);
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("qtitan %s\n", QTITAN_VERSION);
        return finish_stdout("--version", 0);
    }
    for (size_t i = 0; i < NCOMMANDS; i++) {
        if (strcmp(argv[1], COMMANDS[i].name) != 0) continue;
        /* Only train is one of many processes; N copies of another command would write the
         * same files (under the same temporary names) at once. */
        int n = comm_launcher_size();
        if (n > 1 && COMMANDS[i].run != cmd_train) {
            fprintf(stderr,
                    "error: qtitan %s runs on one process, but mpirun started %d; run it without "
                    "mpirun (only `qtitan train` runs on many)\n",
                    argv[1], n);
            return 2;
        }
        return finish_stdout(argv[1], COMMANDS[i].run(argc - 1, argv + 1));
    }
    fprintf(stderr, "error: unknown command '%s'; run `qtitan --help` for the list\n", argv[1]);
    return 2;
}
