/* libFuzzer target: arbitrary bytes as the questions of `qtitan eval --choices`
 * (infer/choices.h). An accepted file holds at least one question, each with at least one
 * choice, a label in range or none, a choice count that adds up, and metrics that are shares in
 * [0, 1] for any log-likelihoods; a refused one is a sentence naming the file. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "infer/choices.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ChoiceSet cs;
    Err err;
    if (choice_set_parse(&cs, (const char *)data, size, "fuzz.jsonl", &err) != 0) {
        if (strncmp(err.msg, "fuzz.jsonl", 10) != 0) abort();
        return 0;
    }
    long total = 0;
    if (cs.n < 1) abort();
    for (int i = 0; i < cs.n; i++) {
        const ChoiceItem *it = &cs.item[i];
        if (it->n < 1 || it->label < -1 || it->label >= it->n || it->line < 1) abort();
        if (it->context[it->context_len] != '\0') abort();
        for (int j = 0; j < it->n; j++)
            if (it->choice[j][it->choice_len[j]] != '\0') abort();
        total += it->n;
    }
    if (total != cs.n_choices) abort();
    double *ll = malloc((size_t)total * sizeof *ll);
    for (long k = 0; k < total; k++)
        ll[k] = -(double)(k % 7) - 0.5;
    ChoiceMetrics m;
    choice_metrics(&cs, ll, &m, NULL);
    if (m.n < 0 || m.n > cs.n || !(m.acc >= 0 && m.acc <= 1) ||
        !(m.acc_norm >= 0 && m.acc_norm <= 1) || !(m.acc_bytes >= 0 && m.acc_bytes <= 1) ||
        !isfinite(m.acc_se))
        abort();
    free(ll);
    choice_set_free(&cs);
    return 0;
}
