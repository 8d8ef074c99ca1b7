/* Choosing the next token from a row of logits: first transformers' repetition penalty (a logits
 * processor, so greedy decoding gets it too), then greedy, or a draw after temperature, top-k,
 * top-p and min-p, applied in that order as transformers' generate applies its warpers
 * (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper), each on
 * what the previous ones kept:
 *   top-k  keeps the tokens whose logit is >= the k-th largest (ties at the k-th all stay);
 *   top-p  keeps the smallest set of most probable tokens whose probabilities sum to >= p
 *          (a token stays when the tokens more probable than it sum to < p: at least one);
 *   min-p  keeps the tokens whose probability is >= min_p times the largest probability;
 *   typical-p  keeps the tokens closest to the distribution's entropy H in surprise
 *          (|-log p - H|, ascending) until their probabilities sum to >= typical_p
 *          (TypicalLogitsWarper; those as close as the last one kept stay too);
 *   epsilon  keeps the tokens of probability >= epsilon_cutoff (and the most likely);
 *   eta    keeps the tokens of probability >= min(eta, sqrt(eta) exp(-H)) (and the most
 *          likely), eta_cutoff.
 * V vocabulary size. */
#ifndef QT_SAMPLE_H
#define QT_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"

typedef struct SampleParams {
    float temperature; /* 0: greedy (argmax, the first of equal maxima) */
    int top_k;         /* 0: off */
    float top_p;       /* 1: off; in (0, 1] */
    float min_p;       /* 0: off; in [0, 1] */
    float typical_p;   /* 1 or 0: off; in (0, 1) */
    float epsilon;     /* epsilon_cutoff, 0: off; in (0, 1) */
    float eta;         /* eta_cutoff, 0: off; in (0, 1) */
    /* transformers' repetition_penalty, 0 or 1: off; > 0: every id of the prompt and of the
     * completion so far has its logit divided by it where positive, multiplied where negative
     * (RepetitionPenaltyLogitsProcessor; each id once however often it occurs). */
    float repetition_penalty;
    /* transformers' no_repeat_ngram_size, 0: off; n > 0: a token that would complete an n-gram
     * the prompt and completion already hold is never chosen (NoRepeatNGramLogitsProcessor). */
    int no_repeat_ngram_size;
} SampleParams;

/* What p does, for a log line: "temperature 0.6, top-k 20, top-p 0.95, min-p 0" or "greedy",
 * then ", repetition-penalty R" and ", no-repeat-ngram-size N" where they are on. */
void sample_describe(char *out, size_t cap, const SampleParams *p);
/* Whether p's repetition penalty or n-gram ban changes any logit. */
int sample_penalizes(const SampleParams *p);
/* out[v] = logits[v], penalised where seen[v] (sample_penalizes(p) assumed). */
void sample_penalize(float *out, const float *logits, int V, const uint8_t *seen,
                     const SampleParams *p);
/* With p->no_repeat_ngram_size = n > 0: sets scores[t] = -inf for every t that follows, in
 * hist[0..len), an occurrence of its last n - 1 ids (nothing while len < n). */
void sample_ban_ngrams(float *scores, int V, const int32_t *hist, long len, const SampleParams *p);

/* The rest of transformers' logits processors, from a model's generation_config.json (or
 * --min-new-tokens), applied as generate() builds its list (_get_logits_processor), in its order:
 *   sequence_bias     a bias added to a one-id sequence's id always, to a longer sequence's last
 *                     id where the ids before it end the ids so far (SequenceBiasLogitsProcessor;
 *                     the biases that meet on one id sum);
 *   encoder_repetition_penalty  R: every id of the prompt has its score multiplied by R where
 *                     positive, divided by R where negative (EncoderRepetitionPenaltyLogits-
 *                     Processor, which a decoder-only model gets with its prompt as the
 *                     "encoder" ids);
 *   (the repetition penalty and n-gram ban of SampleParams)
 *   encoder_no_repeat_ngram_size  n: an id that would complete an n-gram of the prompt is
 *                     forbidden (EncoderNoRepeatNGramLogitsProcessor);
 *   bad_words_ids, min_length, min_new_tokens  forbidden ids (NoBadWordsLogitsProcessor,
 *                     MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor): each bad
 *                     word's last id where the ids before it end the ids so far (a one-id word
 *                     always; one longer than the ids so far never; a one-id word that is an
 *                     EOS id is dropped); the EOS ids while the completion has fewer than
 *                     min_new_tokens ids or prompt and completion fewer than min_length;
 *   forced_bos_token_id  the only id allowed where the ids so far are one
 *                     (ForcedBOSTokenLogitsProcessor);
 *   forced_eos_token_id  the only ids allowed for the completion's last id
 *                     (ForcedEOSTokenLogitsProcessor: score 0, all others -inf);
 *   exponential_decay_length_penalty (start, factor): once the completion has more than start
 *                     ids, each EOS id's finite score s gets |s| (factor^(new ids - start) - 1)
 *                     added (ExponentialDecayLengthPenalty);
 *   suppress_tokens   forbidden always (SuppressTokensLogitsProcessor);
 *   begin_suppress_tokens  forbidden for the first new id, the second when forced_bos_token_id
 *                     is set and the prompt is one id (SuppressTokensAtBeginLogitsProcessor).
 * "Forbidden" sets the score to -inf. */
#define LOGIT_PROCS_MAX_IDS 1024
#define LOGIT_PROCS_MAX_WORDS 256
#define LOGIT_PROCS_MAX_FORCED 8
typedef struct LogitProcs {
    int min_new_tokens, min_length; /* 0: off */
    int32_t suppress[LOGIT_PROCS_MAX_IDS], begin_suppress[LOGIT_PROCS_MAX_IDS];
    int n_suppress, n_begin_suppress;
    int32_t words[LOGIT_PROCS_MAX_IDS];  /* the bad words' ids end to end */
    int word_end[LOGIT_PROCS_MAX_WORDS]; /* word w is words[word_end[w - 1] (0 for w = 0) ..
                                          * word_end[w]) */
    int n_words;
    /* sequence_bias: the sequences' ids end to end as words are, each's bias. */
    int32_t seq[LOGIT_PROCS_MAX_IDS];
    int seq_end[LOGIT_PROCS_MAX_WORDS];
    float seq_bias[LOGIT_PROCS_MAX_WORDS];
    int n_seqs;
    double encoder_repetition_penalty; /* 0 or 1: off */
    int encoder_no_repeat_ngram_size;  /* 0: off */
    int32_t forced_bos, forced_eos[LOGIT_PROCS_MAX_FORCED];
    int n_forced_bos, n_forced_eos; /* forced_bos: 0 or 1 */
    int decay_start;                /* exponential_decay_length_penalty's start and factor */
    double decay_factor;            /* 0: off */
} LogitProcs;
/* Whether b changes anything (b may be NULL). */
int sample_procs_on(const LogitProcs *b);
/* What b does, for a log line: ", min-new-tokens 4, 2 suppressed ids, 3 bad words" or "". */
void sample_procs_describe(char *out, size_t cap, const LogitProcs *b);
/* Sets scores[t] = -inf for the ids b's bad words, min_length, min_new_tokens,
 * suppress_tokens and begin_suppress_tokens forbid after hist[0..len) (prompt and completion),
 * of which the last n_new are the completion's; eos[0..n_eos) the EOS ids. */
void sample_ban_tokens(float *scores, int V, const LogitProcs *b, const int32_t *hist, long len,
                       long n_new, const int32_t *eos, int n_eos);

/* One sequence as the processors see it. seen[v] has SEEN_ID where v is among the ids so far,
 * and SEEN_PROMPT too where it is in the prompt. */
enum { SEEN_ID = 1, SEEN_PROMPT = 2 };
typedef struct ProcSeq {
    const uint8_t *seen; /* (V) */
    const int32_t *hist; /* (len) the prompt, then the completion so far */
    long len, n_new;     /* of which the last n_new are the completion's */
    long max_new;        /* the most ids the completion may have (forced_eos_token_id) */
    const int32_t *eos;  /* the EOS ids */
    int n_eos;
} ProcSeq;
/* out[v] = logits[v] through every processor of p (repetition penalty, n-gram ban) and b (may
 * be NULL), in transformers' order (above). */
void sample_process(float *out, const float *logits, int V, const SampleParams *p,
                    const LogitProcs *b, const ProcSeq *q);

/* Scratch for V tokens, allocated once. */
typedef struct Sampler {
    int V;
    float *scaled;  /* (V) logits / temperature, -inf where dropped */
    int32_t *order; /* (V) token ids by descending scaled logit */
    double *prob;   /* (V) probabilities in that order */
    double *dev;    /* (V) typical-p: each kept token's |-log p - H| */
    int32_t *by;    /* (V) typical-p: the kept tokens by that, ascending */
} Sampler;

void sampler_init(Sampler *s, int V);
void sampler_free(Sampler *s);

/* Marks keep[v] = 1 for the tokens the filters of p keep (temperature > 0), 0 for the others;
 * returns how many are kept (at least one). */
int sample_filter(Sampler *s, const float *logits, const SampleParams *p, uint8_t *keep);
/* The greedy choice: the largest of logits[0..V), the first of equal maxima. */
int32_t sample_argmax(const float *logits, int V);
/* The next token: argmax when p->temperature is 0, else one draw from the kept tokens'
 * renormalised probabilities using one rng_uniform of r. */
int32_t sample_next(Sampler *s, const float *logits, const SampleParams *p, Rng *r);
/* log sum_v exp(logits[v]), accumulated in double. */
double sample_logsumexp(const float *logits, int V);
/* log softmax(logits)[id], the model's own log-probability of id (before any warper). */
double sample_logprob(const float *logits, int V, int32_t id);

#endif
