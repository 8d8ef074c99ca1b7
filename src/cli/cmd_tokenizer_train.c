/* qtitan tokenizer-train: learns a byte-level BPE (Qwen pre-tokenizer) from text or JSONL
 * files and writes tokenizer.json + tokenizer_config.json into a directory. */
#include "cli/commands.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/strutil.h"
#include "core/timer.h"
#include "core/zread.h"
#include "text/bpe_train.h"
#include "text/jsonl.h"
#include "text/parquet.h"

static void usage(FILE *f) {
    fprintf(f, "usage: qtitan tokenizer-train --input FILES --vocab-size N --output DIR\n"
               "                              [--min-frequency K] [--special TOKEN ...] "
               "[--text-field F]\n\n"
               "  --input FILES      comma-separated (or repeated) files: *.jsonl files give one\n"
               "                     document per line from their \"text\" field, *.parquet files\n"
               "                     one per value of their \"text\" column; any other file is\n"
               "                     one document of plain UTF-8 text\n"
               "  --vocab-size N     total ids: 256 byte tokens + merges + special tokens\n"
               "  --output DIR       gets tokenizer.json and tokenizer_config.json\n"
               "  --min-frequency K  never merge a pair seen fewer than K times (default 2)\n"
               "  --text-field F     the JSON Lines field / Parquet column of the text (default\n"
               "                     text; training.dataset_text_field)\n"
               "  --special TOKEN    special token (repeatable; default <|endoftext|>,\n"
               "                     <|im_start|>, <|im_end|>; the first is eos and pad)\n");
}

static int add_values(void *ctx, const ParquetStr *v, int64_t n, Err *err) {
    (void)err;
    for (int64_t i = 0; i < n; i++)
        bpe_trainer_add(ctx, v[i].p, v[i].n);
    return 0;
}

/* The values of a Parquet file's column `field`. */
static int add_parquet(BpeTrainer *tr, const char *path, const char *field, Err *err) {
    const char *data;
    size_t len;
    TRY(fs_map_read(path, &data, &len, err));
    int rc = parquet_stream_column(data, len, path, field, add_values, NULL, tr, err);
    fs_unmap(data, len);
    return rc;
}

static int add_file(BpeTrainer *tr, const char *path, const char *field, Err *err) {
    char *data;
    size_t len;
    if (parquet_is_name(path)) return add_parquet(tr, path, field, err);
    /* .jsonl.gz / .jsonl.zst are decompressed whole: the trainer counts words in memory. */
    int compressed = zread_is_compressed(path);
    TRY(compressed ? zread_all(path, &data, &len, err) : fs_read_all(path, &data, &len, err));
    char *plain = xmalloc(strlen(path) + 1);
    zread_plain_name(path, plain);
    int jsonl = str_ends_with(plain, ".jsonl") || (compressed && str_ends_with(plain, ".json"));
    free(plain);
    if (!jsonl) {
        bpe_trainer_add(tr, data, len);
        free(data);
        return 0;
    }
    size_t lineno = 0;
    int rc = 0;
    for (char *p = data + jsonl_bom_len(data, len), *end = data + len; p < end && rc == 0;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        lineno++;
        size_t k = 0;
        while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r'))
            k++;
        if (k < n) {
            char *text;
            size_t tl;
            rc = jsonl_parse_text(p, n, field, path, (int64_t)lineno, &text, &tl, err);
            if (rc == 0) bpe_trainer_add(tr, text, tl);
            if (rc == 0) free(text);
        }
        p += n + 1;
    }
    free(data);
    return rc;
}

/* An option's integer in [lo, hi]: the whole text must be the number, so "300x" is not 300. */
static int parse_int_option(const char *opt, const char *text, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno == ERANGE || v < lo || v > hi) {
        fprintf(stderr, "error: %s expects an integer in [%ld, %ld], got \"%s\"\n", opt, lo, hi,
                text);
        return -1;
    }
    *out = v;
    return 0;
}

/* A special token becomes an added token of its own id: an empty one matches nothing (and
 * tokenizer.json loaders reject it), a repeated one would get two ids for one string. */
static int check_special(const char *const *special, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!special[i][0]) {
            fprintf(stderr, "error: --special needs a non-empty token\n");
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(special[i], special[j]) == 0) {
                fprintf(stderr, "error: --special \"%s\" is given twice\n", special[i]);
                return -1;
            }
    }
    return 0;
}

int cmd_tokenizer_train(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *inputs[256], *special[64], *out = NULL;
    size_t n_in = 0, n_special = 0;
    long vocab = 0, minf = 2;
    const char *field = "text";
    char *lists[256];
    size_t n_lists = 0;
    int status = 0;
    for (int i = 1; i < argc && status == 0; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (strcmp(a, "--input") == 0 && has && n_lists < 256) {
            char *copy = lists[n_lists++] = xstrdup(argv[++i]);
            for (char *tok = strtok(copy, ","); tok && n_in < 256; tok = strtok(NULL, ","))
                inputs[n_in++] = tok;
        } else if (strcmp(a, "--vocab-size") == 0 && has) {
            if (parse_int_option(a, argv[++i], 1, 1 << 24, &vocab) != 0) status = 2;
        } else if (strcmp(a, "--min-frequency") == 0 && has) {
            if (parse_int_option(a, argv[++i], 0, UINT32_MAX, &minf) != 0) status = 2;
        } else if (strcmp(a, "--special") == 0 && has && n_special < 64) {
            special[n_special++] = argv[++i];
        } else if (strcmp(a, "--output") == 0 && has) {
            out = argv[++i];
        } else if (strcmp(a, "--text-field") == 0 && has) {
            field = argv[++i];
        } else {
            fprintf(stderr,
                    "error: unknown option or missing value: \"%s\" (see qtitan "
                    "tokenizer-train --help)\n",
                    a);
            for (size_t k = 0; k < n_lists; k++)
                free(lists[k]);
            return 2;
        }
    }
    if (status == 0 && (n_in == 0 || !out || vocab == 0)) {
        fprintf(stderr, "error: --input, --output and --vocab-size (1..2^24) are required (see "
                        "qtitan tokenizer-train --help)\n");
        status = 2;
    }
    if (status == 0 && check_special(special, n_special) != 0) status = 2;
    /* By inode, not by name: --input DIR/tokenizer.json --output DIR would be overwritten. */
    for (size_t k = 0; k < n_in && status == 0; k++)
        for (int f = 0; f < BPE_TRAIN_NFILES && status == 0; f++) {
            char *path = fs_join(out, bpe_train_files[f]);
            if (fs_same_file(path, inputs[k])) {
                fprintf(stderr,
                        "error: --output %s would write %s, which is the --input file %s; "
                        "writing it would destroy that input\n",
                        out, path, inputs[k]);
                status = 2;
            }
            free(path);
        }
    if (n_special == 0) {
        special[n_special++] = "<|endoftext|>";
        special[n_special++] = "<|im_start|>";
        special[n_special++] = "<|im_end|>";
    }
    if (status == 0) {
        BpeTrainOptions opt = {(uint32_t)vocab, (uint32_t)minf, special, n_special};
        BpeTrainer *tr = bpe_trainer_new(&opt);
        Err err;
        double t0 = now_seconds();
        size_t merges = 0;
        for (size_t k = 0; k < n_in && status == 0; k++)
            if (add_file(tr, inputs[k], field, &err) != 0) status = 1;
        double t1 = now_seconds();
        if (status == 0 && bpe_trainer_finish(tr, out, &merges, &err) != 0) status = 1;
        if (status != 0)
            fprintf(stderr, "error: %s\n", err.msg);
        else
            fprintf(stderr,
                    "tokenizer-train: %zu merges, vocab %ld, read %.2f s, trained %.2f s; wrote "
                    "%s/tokenizer.json\n",
                    merges, vocab, t1 - t0, now_seconds() - t1, out);
        bpe_trainer_free(tr);
    }
    for (size_t k = 0; k < n_lists; k++)
        free(lists[k]);
    return status;
}
