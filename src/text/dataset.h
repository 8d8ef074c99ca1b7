/* Training data: JSONL / plain-text sources (paths, globs, directories) tokenized once into a
 * memory-mapped cache file, shuffled by document with a seed per epoch, and packed into rows of
 * seq_len tokens for next-token prediction. docs/data.md describes the format and the rules.
 *
 * Legend: T seq_len (tokens per row), B rows asked for, L tokens per epoch (documents + one EOS
 * each).
 *
 * The packed stream is infinite: epoch 0's documents in their shuffled order, each followed by
 * EOS, then epoch 1's (a new order), and so on. Global row g is the window of T+1 tokens that
 * starts at stream position g*T: its first T tokens are the inputs, its last T the targets, so
 * consecutive rows share one token and every stream token is a target exactly once. Global batch
 * `step` of a run that takes R rows per step is rows [step*R, (step+1)*R): it depends only on the
 * data, the seed and the step, and a data-parallel rank or a microbatch reads a slice of it. */
#ifndef QT_DATASET_H
#define QT_DATASET_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "text/tokenizer.h"

/* How documents become ids. dataset_encoder_for_tokenizer fills one from a Tokenizer; tests can
 * inject their own. */
typedef struct DatasetEncoder {
    /* Appends the ids of text[0..len) to out (a zeroed or growing IdVec whose ids the caller
     * frees with free()). Called concurrently from several threads. */
    int (*encode)(const void *ctx, const char *text, size_t len, IdVec *out, Err *err);
    const void *ctx;
    uint64_t hash;       /* caches are reused only for the same hash */
    uint32_t eos_id;     /* appended after every document (<|endoftext|> for Qwen3) */
    uint32_t vocab_size; /* every id must be below this */
} DatasetEncoder;

/* Fills enc for tok, with EOS = <|endoftext|>. Defined in dataset_tokenizer.c. */
int dataset_encoder_for_tokenizer(DatasetEncoder *enc, const Tokenizer *tok, Err *err);

typedef struct DatasetOptions {
    /* One or more comma-separated entries; each is a file, a directory (its *.jsonl, *.json
     * and *.txt files) or a glob. Files ending in .jsonl or .json are JSON Lines with a "text"
     * field; any other file is plain text and one document. */
    const char *path;
    /* Where cache files live. NULL or "": $QT_CACHE_DIR, else $XDG_CACHE_HOME/qtitan/datasets,
     * else $HOME/.cache/qtitan/datasets. */
    const char *cache_dir;
    int seq_len;        /* T, >= 1 */
    uint64_t seed;      /* document order of every epoch */
    int shuffle;        /* 0: documents in source order every epoch */
    int document_mask;  /* 1: positions and doc ids restart after each EOS; 0: 0..T-1, one id */
    int skip_bad_lines; /* 1: a bad JSONL line is counted and skipped instead of an error */
    int threads;        /* tokenization threads; <= 0: OpenMP's default */
    /* The JSON Lines field and Parquet column that hold a document's text; NULL or "": "text"
     * (training.dataset_text_field, TRL's dataset_text_field). */
    const char *text_field;
} DatasetOptions;

/* Defaults: shuffle on, document_mask on, skip_bad_lines off, threads 0. The caller still sets
 * path, seq_len and seed. */
void dataset_options_default(DatasetOptions *o);

typedef struct EpochOrder EpochOrder;

typedef struct Dataset {
    DatasetOptions opt;    /* path, cache_dir and text_field point at copies owned here */
    char *cache_path;      /* the .qtds file in use */
    int cache_reused;      /* 1: opened an existing cache; 0: tokenized the sources this time */
    uint64_t key;          /* hash of sources, tokenizer and format: the cache file's name */
    uint64_t content_hash; /* hash of every id and document offset: what the dataset holds */
    uint32_t eos_id, vocab_size;
    int64_t n_files;
    int64_t n_docs;          /* documents (each is followed by one EOS in the stream) */
    int64_t n_tokens;        /* ids of all documents, EOS not counted */
    int64_t n_skipped;       /* bad JSONL lines skipped (skip_bad_lines) */
    int64_t epoch_len;       /* L = n_tokens + n_docs */
    const uint32_t *ids;     /* (n_tokens,) all documents' ids in source order, mmapped */
    const uint64_t *offsets; /* (n_docs + 1,) document d is ids[offsets[d] .. offsets[d+1]) */
    void *map;
    size_t map_len;
    EpochOrder *orders[2]; /* the two most recently used epochs' shuffled orders */
    int64_t next_row;      /* the row dataset_state_save records (set by train/data_feed.c) */
} Dataset;

/* Opens the dataset: reuses the cache when the sources (paths, sizes, mtimes), the encoder hash
 * and the format version are unchanged, otherwise tokenizes (in parallel, the same bytes for any
 * thread count) and writes the cache atomically. A damaged cache is logged and rebuilt. */
int dataset_open(Dataset *ds, const DatasetOptions *opt, const DatasetEncoder *enc, Err *err);
void dataset_close(Dataset *ds);

/* One packed row per b in [0, B). */
typedef struct Batch {
    int B, T;
    uint32_t *tokens;   /* (B, T) input ids */
    int32_t *targets;   /* (B, T) next ids; -100 would mean "no loss here" (packing needs none) */
    int32_t *positions; /* (B, T) RoPE positions */
    int32_t *doc_ids;   /* (B, T) segment of each token within its row; attention stays inside */
} Batch;
void batch_alloc(Batch *b, int B, int T);
void batch_free(Batch *b);

/* Global rows [row, row + nrows) of the packed stream into out (out->B >= nrows, out->T ==
 * seq_len). Pure in (data, seed, seq_len, document_mask, row). Fails only on a damaged cache
 * (an id >= vocab_size). Not thread-safe: it keeps the last epochs' orders. */
int dataset_rows(Dataset *ds, int64_t row, int nrows, Batch *out, Err *err);
/* The stream's ids [pos, pos + n) (epochs in their orders, each document followed by EOS), as
 * dataset_rows reads them; fails on a damaged cache as it does. */
int dataset_read_stream(Dataset *ds, int64_t pos, int64_t n, uint32_t *ids, Err *err);

/* The data position for checkpoints: row is the truth; epoch and offset (token offset of that
 * row in its epoch) are there to read and to check that the data did not change. */
typedef struct DatasetState {
    int64_t row;
    int64_t epoch;
    int64_t offset;
} DatasetState;
void dataset_state_save(const Dataset *ds, DatasetState *st);
/* Fails when the state does not fit this dataset (a different seq_len or different data). */
int dataset_state_restore(Dataset *ds, const DatasetState *st, Err *err);
/* {"row": ..., "epoch": ..., "offset": ...} */
json_t *dataset_state_to_json(const DatasetState *st);
int dataset_state_from_json(const json_t *j, DatasetState *st, const char *what, Err *err);

#endif
