/* The dataset's encoder backed by the real tokenizer (kept apart from dataset.c so tests can
 * link the dataset with a stand-in encoder). */
#include "text/dataset.h"

static int encode_with_tokenizer(const void *ctx, const char *text, size_t len, IdVec *out,
                                 Err *err) {
    return tokenizer_encode(ctx, text, len, out, err);
}

int dataset_encoder_for_tokenizer(DatasetEncoder *enc, const Tokenizer *tok, Err *err) {
    int64_t eos = tokenizer_token_id(tok, "<|endoftext|>");
    if (eos < 0)
        return err_set(err, "tokenizer %s has no <|endoftext|> token to end documents with",
                       tokenizer_path(tok));
    enc->encode = encode_with_tokenizer;
    enc->ctx = tok;
    enc->hash = tokenizer_hash(tok);
    enc->eos_id = (uint32_t)eos;
    enc->vocab_size = tokenizer_vocab_size(tok);
    return 0;
}
