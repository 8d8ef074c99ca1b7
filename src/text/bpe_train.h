/* Byte-level BPE trainer for small demo vocabularies: the Qwen pre-tokenizer (NFC, Qwen split
 * pattern, bytes), merges chosen by pair frequency, special tokens appended at the end. The
 * output directory gets a tokenizer.json that HF `tokenizers` and qtitan both load and encode
 * identically, plus a tokenizer_config.json for transformers. */
#ifndef QT_BPE_TRAIN_H
#define QT_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef struct BpeTrainOptions {
    uint32_t vocab_size;        // total ids: 256 bytes + merges + special tokens
    uint32_t min_frequency;     // a pair seen fewer times is never merged
    const char *const *special; // special tokens, given ids after the learned ones
    size_t n_special;
} BpeTrainOptions;

typedef struct BpeTrainer BpeTrainer;

BpeTrainer *bpe_trainer_new(const BpeTrainOptions *opt);
void bpe_trainer_free(BpeTrainer *tr);
/* Counts the pre-tokens of one document (special tokens in it are skipped). */
void bpe_trainer_add(BpeTrainer *tr, const char *text, size_t len);
/* The files bpe_trainer_finish writes into its DIR (a command checks them against its inputs). */
#define BPE_TRAIN_NFILES 2
extern const char *const bpe_train_files[BPE_TRAIN_NFILES];
/* Learns the merges and writes DIR/tokenizer.json and DIR/tokenizer_config.json. *n_merges
 * receives how many merges were learned (fewer than asked when the text runs out of pairs). */
int bpe_trainer_finish(BpeTrainer *tr, const char *dir, size_t *n_merges, Err *err);

#endif
