/* Chat training data with the real Qwen3 tokenizer (needs ../shared; exits 77 without it):
 * the three line shapes, targets -100 outside assistant output (checked against transformers'
 * ids and mask in tests/fixtures/chat/qwen3_chat.jsonl), packing and padding, truncation and
 * dropping with their counts, one error sentence per malformed line, and chat rows through the
 * trainer's data feed (train/data_feed.h): the step's labels as the loss denominator, ranks and
 * micro-batches reading the step's rows, and the {row, conversations, tokens} position. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/log.h"
#include "ops/cross_entropy.h"
#include "text/chat_data.h"
#include "train/data_feed.h"

static Tokenizer *qwen;
static ChatFormat *fmt;
static char tmpdir[] = "/tmp/qt_chatdata_XXXXXX";

/* transformers' render of [user "Hello", assistant "Hi there!"] and its assistant mask
 * (the "single_turn" line of qwen3_chat.jsonl). */
static const uint32_t SINGLE[] = {151644, 872, 198,    9707, 151645, 198,  151644, 77091,  198,
                                  151667, 271, 151668, 271,  13048,  1052, 0,      151645, 198};
static const char SINGLE_MASK[] = "000000000111111110";
#define NSINGLE 18

static char *write_file(const char *name, const char *text) {
    char *p = fs_join(tmpdir, name);
    Err err;
    assert_int_equal(fs_write_atomic(p, text, strlen(text), &err), 0);
    return p;
}

static ChatDataOptions opts(const char *path, DataFormat f, int T) {
    return (ChatDataOptions){.path = path,
                             .format = f,
                             .seq_len = T,
                             .seed = 7,
                             .shuffle = 1,
                             .packing = 1,
                             .train_on_all_tokens = 0,
                             .too_long = TOO_LONG_TRUNCATE};
}

/* The one conversation of `text` must be SINGLE with targets at the assistant tokens. */
static void expect_single(const char *text, DataFormat f) {
    char *p = write_file("single.jsonl", text);
    ChatData cd;
    Err err;
    ChatDataOptions o = opts(p, f, 32);
    if (chat_data_open(&cd, &o, fmt, 151643, &err)) fail_msg("%s", err.msg);
    assert_int_equal(cd.n_conv, 1);
    assert_int_equal(cd.n_tokens, NSINGLE);
    int labels = 0;
    for (int i = 0; i < NSINGLE; i++) {
        assert_int_equal(cd.ids[i], SINGLE[i]);
        int counts = i + 1 < NSINGLE && SINGLE_MASK[i + 1] == '1';
        assert_int_equal(cd.targets[i], counts ? (int32_t)SINGLE[i + 1] : CE_IGNORE);
        labels += counts;
    }
    assert_int_equal(labels, 8);
    assert_int_equal(cd.n_labels, 8);
    chat_data_close(&cd);
    free(p);
}

static void test_shapes(void **state) {
    (void)state;
    expect_single("{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}, {\"role\": "
                  "\"assistant\", \"content\": \"Hi there!\"}]}\n",
                  DATA_MESSAGES);
    expect_single("{\"prompt\": \"Hello\", \"completion\": \"Hi there!\"}\n",
                  DATA_PROMPT_COMPLETION);
    expect_single("\n{\"prompt\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"completion\": "
                  "[{\"role\": \"assistant\", \"content\": \"Hi there!\"}]}\n",
                  DATA_PROMPT_COMPLETION);
    /* ShareGPT's names, which TRL's maybe_convert_to_chatml renames: "conversations" for
     * "messages", "from" and "value" for "role" and "content"; "human" and "gpt" are read as
     * user and assistant. */
    expect_single("{\"conversations\": [{\"from\": \"user\", \"value\": \"Hello\"}, {\"from\": "
                  "\"assistant\", \"value\": \"Hi there!\"}]}\n",
                  DATA_MESSAGES);
    expect_single("{\"conversations\": [{\"from\": \"human\", \"value\": \"Hello\"}, {\"from\": "
                  "\"gpt\", \"value\": \"Hi there!\"}], \"id\": 7}\n",
                  DATA_MESSAGES);
    expect_single("{\"prompt\": [{\"from\": \"human\", \"value\": \"Hello\"}], \"completion\": "
                  "[{\"from\": \"gpt\", \"value\": \"Hi there!\"}]}\n",
                  DATA_PROMPT_COMPLETION);
    expect_single("{\"instruction\": \"Hello\", \"output\": \"Hi there!\"}", DATA_INSTRUCTION);
    expect_single("{\"instruction\": \"Hello\", \"input\": \"\", \"output\": \"Hi there!\"}",
                  DATA_INSTRUCTION);

    /* An input joins the instruction after a blank line. */
    char *a = write_file("a.jsonl", "{\"instruction\": \"Sum:\", \"input\": \"1 2\", \"output\": "
                                    "\"3\"}\n"),
         *b = write_file("b.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": "
                                    "\"Sum:\\n\\n1 2\"}, {\"role\": \"assistant\", \"content\": "
                                    "\"3\"}]}\n");
    ChatData ca, cb;
    Err err;
    ChatDataOptions oa = opts(a, DATA_INSTRUCTION, 64), ob = opts(b, DATA_MESSAGES, 64);
    assert_int_equal(chat_data_open(&ca, &oa, fmt, 151643, &err), 0);
    assert_int_equal(chat_data_open(&cb, &ob, fmt, 151643, &err), 0);
    assert_int_equal(ca.n_tokens, cb.n_tokens);
    assert_memory_equal(ca.ids, cb.ids, (size_t)ca.n_tokens * sizeof *ca.ids);
    chat_data_close(&ca);
    chat_data_close(&cb);
    free(a);
    free(b);
}

/* Five conversations of different lengths, the third one long. */
static const char *FIVE =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"one\"}, {\"role\": \"assistant\", "
    "\"content\": \"1\"}]}\n"
    "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", "
    "\"content\": \"two\"}, {\"role\": \"assistant\", \"content\": \"2\"}, {\"role\": \"user\", "
    "\"content\": \"again\"}, {\"role\": \"assistant\", \"content\": \"2 2\"}]}\n"
    "{\"messages\": [{\"role\": \"user\", \"content\": \"three three three three three three three "
    "three three three three three three three three three three three three three\"}, "
    "{\"role\": \"assistant\", \"content\": \"3\"}]}\n"
    "{\"messages\": [{\"role\": \"user\", \"content\": \"four\"}, {\"role\": \"assistant\", "
    "\"content\": \"4 4 4 4\"}]}\n"
    "{\"messages\": [{\"role\": \"user\", \"content\": \"five\"}, {\"role\": \"assistant\", "
    "\"content\": \"<think>\\nhm\\n</think>\\n\\n5\"}]}\n";

/* Checks the rows of one epoch: each conversation once, positions restarting, segments
 * increasing, padding never a target, the label count matching the rows. */
static void check_epoch(ChatData *cd, int packing) {
    int T = cd->opt.seq_len;
    Batch b;
    batch_alloc(&b, 1, T);
    int64_t seen_tokens = 0, seen_labels = 0, rows = 0, conv = 0;
    Err err;
    while (seen_tokens < cd->n_tokens) {
        int64_t labels;
        assert_int_equal(chat_data_rows(cd, rows, 1, &b, &labels, &err), 0);
        assert_int_equal(labels, chat_data_labels(cd, rows, 1));
        int64_t counted = 0, in_row = 0;
        for (int t = 0; t < T; t++) {
            if (b.targets[t] != CE_IGNORE) counted++;
            int pad = b.tokens[t] == 151643;
            if (pad) {
                assert_int_equal(b.targets[t], CE_IGNORE);
                continue;
            }
            if (b.positions[t] == 0) {
                conv++;
                in_row++;
                if (t > 0) assert_int_equal(b.doc_ids[t], b.doc_ids[t - 1] + 1);
            } else {
                assert_int_equal(b.positions[t], b.positions[t - 1] + 1);
                assert_int_equal(b.doc_ids[t], b.doc_ids[t - 1]);
            }
            seen_tokens++;
        }
        assert_int_equal(counted, labels);
        if (!packing) assert_int_equal(in_row, 1);
        seen_labels += labels;
        rows++;
    }
    assert_int_equal(seen_tokens, cd->n_tokens);
    assert_int_equal(seen_labels, cd->n_labels);
    assert_int_equal(conv, cd->n_conv);
    if (packing)
        assert_true(rows < cd->n_conv);
    else
        assert_int_equal(rows, cd->n_conv);
    batch_free(&b);
}

static void test_packing_and_padding(void **state) {
    (void)state;
    char *p = write_file("five.jsonl", FIVE);
    Err err;
    for (int packing = 0; packing < 2; packing++) {
        ChatData cd;
        ChatDataOptions o = opts(p, DATA_MESSAGES, 64);
        o.packing = packing;
        if (chat_data_open(&cd, &o, fmt, 151643, &err)) fail_msg("%s", err.msg);
        assert_int_equal(cd.n_conv, 5);
        assert_int_equal(cd.n_truncated, 0);
        check_epoch(&cd, packing);
        /* The same rows again for the same seed and row (the layout is a pure function). */
        Batch x, y;
        batch_alloc(&x, 2, 64);
        batch_alloc(&y, 2, 64);
        assert_int_equal(chat_data_rows(&cd, 7, 2, &x, NULL, &err), 0);
        assert_int_equal(chat_data_rows(&cd, 1, 2, &y, NULL, &err), 0);
        assert_int_equal(chat_data_rows(&cd, 7, 2, &y, NULL, &err), 0);
        assert_memory_equal(x.tokens, y.tokens, 2 * 64 * sizeof *x.tokens);
        assert_memory_equal(x.targets, y.targets, 2 * 64 * sizeof *x.targets);
        batch_free(&x);
        batch_free(&y);
        chat_data_close(&cd);
    }
    /* Every next token is a target with train_on_all_tokens. */
    ChatData cd;
    ChatDataOptions o = opts(p, DATA_MESSAGES, 64);
    o.train_on_all_tokens = 1;
    assert_int_equal(chat_data_open(&cd, &o, fmt, 151643, &err), 0);
    assert_int_equal(cd.n_labels, cd.n_tokens - cd.n_conv);
    check_epoch(&cd, 1);
    chat_data_close(&cd);
    free(p);
}

static void test_too_long(void **state) {
    (void)state;
    char *p = write_file("five.jsonl", FIVE);
    Err err;
    ChatData cd;
    /* seq_len 20 against conversations of 16, 37, 35, 22 and 18 tokens (transformers' counts). */
    ChatDataOptions o = opts(p, DATA_MESSAGES, 20);
    assert_int_equal(chat_data_open(&cd, &o, fmt, 151643, &err), 0);
    int64_t trunc = cd.n_truncated, dropped = cd.n_dropped;
    /* The third one is cut inside its user turn: no assistant token is left, so it is dropped
     * and counted; the second keeps its first answer, the fourth the start of its own. */
    assert_int_equal(trunc, 2);
    assert_int_equal(dropped, 1);
    assert_int_equal(cd.n_conv, 4);
    check_epoch(&cd, 0); /* no two of them fit one row */
    chat_data_close(&cd);
    o.too_long = TOO_LONG_DROP;
    assert_int_equal(chat_data_open(&cd, &o, fmt, 151643, &err), 0);
    assert_int_equal(cd.n_truncated, 0);
    assert_int_equal(cd.n_dropped, 3);
    assert_int_equal(cd.n_conv, 2);
    chat_data_close(&cd);
    o.seq_len = 8;
    assert_int_not_equal(chat_data_open(&cd, &o, fmt, 151643, &err), 0);
    fprintf(stderr, "expected error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "no conversation to train on (5 line(s), 5 longer"));
    free(p);
}

static void expect_bad(DataFormat f, const char *line2, const char *what) {
    char text[4096];
    const char *good = f == DATA_MESSAGES ? "{\"messages\": [{\"role\": \"user\", \"content\": "
                                            "\"a\"}, {\"role\": \"assistant\", \"content\": "
                                            "\"b\"}]}"
                       : f == DATA_INSTRUCTION ? "{\"instruction\": \"a\", \"output\": \"b\"}"
                                               : "{\"prompt\": \"a\", \"completion\": \"b\"}";
    snprintf(text, sizeof text, "%s\n%s\n", good, line2);
    char *p = write_file("bad.jsonl", text);
    ChatData cd;
    Err err;
    ChatDataOptions o = opts(p, f, 64);
    assert_int_not_equal(chat_data_open(&cd, &o, fmt, 151643, &err), 0);
    fprintf(stderr, "expected error: %s\n", err.msg);
    char where[4200];
    snprintf(where, sizeof where, "%s:2: ", p);
    assert_non_null(strstr(err.msg, where));
    assert_non_null(strstr(err.msg, what));
    free(p);
}

static void test_bad_lines(void **state) {
    (void)state;
    expect_bad(DATA_MESSAGES, "{\"messages\": [{\"role\": \"function\", \"content\": \"x\"}]}",
               "messages[0].role \"function\" is not \"system\", \"user\", \"assistant\" or "
               "\"tool\"");
    /* Tool calls and definitions: what the template cannot write is named. */
#define QA "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
    expect_bad(DATA_MESSAGES,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"q\", \"tool_calls\": []}]}",
               "messages[0] is a user message with tool_calls, which only an assistant message "
               "makes");
    expect_bad(DATA_MESSAGES, QA "\"content\": \"\", \"tool_calls\": {}}]}",
               "messages[1]: tool_calls must be an array of calls, found an object");
    expect_bad(DATA_MESSAGES, QA "\"content\": \"\", \"tool_calls\": [7]}]}",
               "messages[1]: tool_calls[0] must be an object, found a number");
    expect_bad(DATA_MESSAGES,
               QA "\"content\": \"\", \"tool_calls\": [{\"function\": {\"arguments\": {}}}]}]}",
               "messages[1]: tool_calls[0].function.name must be a string, found nothing");
    expect_bad(DATA_MESSAGES,
               QA "\"content\": \"\", \"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}, "
                  "{\"name\": 3, \"arguments\": {}}]}]}",
               "messages[1]: tool_calls[1].name must be a string, found a number");
    expect_bad(DATA_MESSAGES, QA "\"content\": \"\", \"tool_calls\": [{\"name\": \"f\"}]}]}",
               "messages[1]: tool_calls[0] has no \"arguments\"");
    expect_bad(DATA_MESSAGES, QA "\"content\": \"\", \"tool_calls\": [{\"function\": \"f(1)\"}]}]}",
               "messages[1]: tool_calls[0].function must be an object, found a string");
    expect_bad(DATA_MESSAGES, QA "\"content\": \"a\"}], \"tools\": {\"name\": \"f\"}}",
               "tools must be an array of tool definitions, found an object");
    expect_bad(DATA_MESSAGES, QA "\"content\": \"a\"}], \"tools\": [\"f\"]}",
               "tools[0] must be an object (a JSON schema), found a string");
    expect_bad(DATA_MESSAGES, QA "\"content\": \"a\", \"thinking\": 5}]}",
               "messages[1].thinking must be a string, found a number");
#undef QA
    expect_bad(DATA_MESSAGES, "{\"messages\": [{\"role\": \"user\"}]}",
               "messages[0] has no \"content\"");
    expect_bad(DATA_MESSAGES,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
               "\"assistant\", \"content\": [1]}]}",
               "messages[1].content must be a string or null, found an array");
    /* Null content: the first Qwen3 template (this folder's) cannot render it. */
    expect_bad(DATA_MESSAGES,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
               "\"assistant\", \"content\": null, \"tool_calls\": [{\"name\": \"f\", "
               "\"arguments\": {}}]}]}",
               "messages[1].content is null, which Qwen3's hybrid-thinking template as first "
               "released (");
    expect_bad(DATA_MESSAGES, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}",
               "no assistant turn, so there is nothing to learn");
    expect_bad(DATA_MESSAGES, "{\"messages\": [{\"role\": 3, \"content\": \"q\"}]}",
               "messages[0].role must be a string");
    expect_bad(DATA_MESSAGES, "{\"messages\": [\"hi\"]}", "messages[0] must be an object");
    expect_bad(DATA_MESSAGES, "{\"messages\": []}", "the conversation has no messages");
    expect_bad(DATA_MESSAGES, "{\"messages\": {}}", "\"messages\" must be an array");
    expect_bad(DATA_MESSAGES, "{\"text\": \"plain\"}",
               "has no \"messages\" (or \"conversations\") field");
    /* ShareGPT's names: a role under "from" that is none of the known ones, a non-string value. */
    expect_bad(DATA_MESSAGES,
               "{\"conversations\": [{\"from\": \"observation\", \"value\": \"x\"}]}",
               "conversations[0].from \"observation\" is not \"system\", \"user\", \"assistant\", "
               "\"human\", \"gpt\" or \"tool\"");
    expect_bad(DATA_MESSAGES, "{\"conversations\": [{\"from\": \"human\", \"value\": 3}]}",
               "conversations[0].value must be a string or null, found a number");
    expect_bad(DATA_MESSAGES, "{\"conversations\": {}}", "\"conversations\" must be an array");
    expect_bad(DATA_MESSAGES, "[1, 2]", "expected a JSON object");
    expect_bad(DATA_MESSAGES, "{\"messages\": [", "not valid JSON at column");
    expect_bad(DATA_MESSAGES,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
               "\"assistant\", \"content\": \"a\", \"reasoning_content\": 5}]}",
               "messages[1].reasoning_content must be a string");
    expect_bad(DATA_PROMPT_COMPLETION, "{\"prompt\": \"a\"}", "no \"completion\" field");
    expect_bad(DATA_PROMPT_COMPLETION, "{\"prompt\": 1, \"completion\": \"b\"}",
               "\"prompt\" must be a string or an array of messages, found a number");
    expect_bad(DATA_INSTRUCTION, "{\"instruction\": \"a\"}", "no \"output\" field");
    expect_bad(DATA_INSTRUCTION, "{\"instruction\": \"a\", \"input\": null, \"output\": \"b\"}",
               "\"input\" must be a string, found null");
}

/* Counts the targets of global rows [row, row + n) from the rows themselves. */
static int64_t labels_of(ChatData *cd, int64_t row, int n) {
    Batch b;
    Err err;
    batch_alloc(&b, n, cd->opt.seq_len);
    assert_int_equal(chat_data_rows(cd, row, n, &b, NULL, &err), 0);
    int64_t k = 0;
    for (long i = 0; i < (long)n * cd->opt.seq_len; i++)
        k += b.targets[i] != CE_IGNORE;
    batch_free(&b);
    return k;
}

/* The feed of rank r of N data-parallel ranks with M micro-batches, G rows a step. */
static void chat_feed(DataFeed *f, ChatData *cd, int G, int r, int N, int M) {
    MeshConfig c = {.world = N,
                    .dp_replicate = 1,
                    .dp_shard = N,
                    .tp = 1,
                    .local_batch = G / N / M,
                    .global_batch = G};
    MeshDims d;
    Err err;
    if (mesh_resolve(&d, &c, r, &err)) fail_msg("%s", err.msg);
    data_feed_init_chat(f, cd, &d);
}

static void test_feed(void **state) {
    (void)state;
    char *p = write_file("five_feed.jsonl", FIVE);
    Err err;
    ChatData cd;
    ChatDataOptions o = opts(p, DATA_MESSAGES, 32);
    o.packing = 0; /* one conversation a row: rows differ in their label counts */
    if (chat_data_open(&cd, &o, fmt, 151643, &err)) fail_msg("%s", err.msg);
    enum { G = 4, N = 2, M = 2 };
    for (int r = 0; r < N; r++) {
        DataFeed f;
        TrainData td;
        chat_feed(&f, &cd, G, r, N, M);
        data_feed_bind(&f, &td);
        for (int64_t step = 1; step <= 3; step++) {
            int64_t tokens, valid;
            assert_int_equal(td.count(td.ctx, step, &tokens, &valid, &err), 0);
            assert_int_equal(tokens, G / N * 32);
            /* The loss denominator: the targets of all G rows of the step, not G x seq_len. */
            assert_int_equal(valid, labels_of(&cd, (step - 1) * G, G));
            assert_true(valid < G * 32);
            for (int k = 0; k < M; k++) {
                const void *b;
                assert_int_equal(td.next(td.ctx, step, k, &b, &err), 0);
                const TrainQwen3Batch *mb = b;
                Batch want;
                batch_alloc(&want, 1, 32);
                assert_int_equal(
                    chat_data_rows(&cd, (step - 1) * G + (k * N + r), 1, &want, NULL, &err), 0);
                assert_memory_equal(mb->targets, want.targets, 32 * sizeof *want.targets);
                for (int i = 0; i < 32; i++)
                    assert_int_equal(mb->tokens[i], (int32_t)want.tokens[i]);
                batch_free(&want);
            }
        }
        json_t *pos = td.position(td.ctx);
        assert_int_equal(json_integer_value(json_object_get(pos, "row")), 3 * G);
        assert_int_equal(json_integer_value(json_object_get(pos, "conversations")), cd.n_conv);
        assert_int_equal(json_integer_value(json_object_get(pos, "tokens")), cd.n_tokens);
        data_feed_free(&f);
        /* Resumed at step 4: the rows a run without a stop reads. */
        chat_feed(&f, &cd, G, r, N, M);
        data_feed_bind(&f, &td);
        assert_int_equal(td.restore(td.ctx, pos, &err), 0);
        int64_t tokens, valid;
        assert_int_equal(td.count(td.ctx, 4, &tokens, &valid, &err), 0);
        assert_int_equal(valid, labels_of(&cd, 3 * G, G));
        data_feed_free(&f);
        /* A position from other data is refused with a sentence. */
        json_object_set_new(pos, "tokens", json_integer(cd.n_tokens + 1));
        chat_feed(&f, &cd, G, r, N, M);
        data_feed_bind(&f, &td);
        assert_int_equal(td.restore(td.ctx, pos, &err), -1);
        assert_non_null(strstr(err.msg, "the chat data changed since the checkpoint"));
        json_object_set_new(pos, "tokens", json_integer(cd.n_tokens));
        json_object_del(pos, "row");
        assert_int_equal(td.restore(td.ctx, pos, &err), -1);
        assert_non_null(strstr(err.msg, "row"));
        data_feed_free(&f);
        json_decref(pos);
    }
    chat_data_close(&cd);
    free(p);
}

/* The data of o, opened on 1 thread and on 2: n conversations, the same ids and targets. */
static void same_on_1_and_2_threads(const ChatDataOptions *o, int64_t n) {
    ChatData one, two;
    Err err;
    omp_set_num_threads(1);
    if (chat_data_open(&one, o, fmt, 151643, &err)) fail_msg("%s", err.msg);
    omp_set_num_threads(2);
    if (chat_data_open(&two, o, fmt, 151643, &err)) fail_msg("%s", err.msg);
    assert_int_equal(one.n_conv, n);
    assert_int_equal(one.n_tokens, two.n_tokens);
    assert_memory_equal(one.ids, two.ids, (size_t)one.n_tokens * sizeof *one.ids);
    assert_memory_equal(one.targets, two.targets, (size_t)one.n_tokens * sizeof *one.targets);
    chat_data_close(&one);
    chat_data_close(&two);
}

/* Lines and Parquet rows are rendered in parallel batches: the data does not depend on the
 * thread count, and of two bad lines in one batch the first is the one reported. */
static void test_threads(void **state) {
    (void)state;
    size_t flen = strlen(FIVE), n = 3000 / 5;
    char *text = xmalloc(flen * n + 1), *bad = xmalloc(flen * n + 200);
    for (size_t i = 0; i < n; i++)
        memcpy(text + i * flen, FIVE, flen);
    text[flen * n] = 0;
    char *p = write_file("many.jsonl", text);
    ChatData one;
    Err err;
    ChatDataOptions o = opts(p, DATA_MESSAGES, 64);
    same_on_1_and_2_threads(&o, 3000);
    free(p);
    /* Lines 1500 and 1600 bad (the same batch): line 1500 is named. */
    size_t at = 0, line = 0;
    for (const char *q = text; *q; q++) {
        if (q == text || q[-1] == '\n') {
            line++;
            if (line == 1500 || line == 1600) {
                const char *b = line == 1500 ? "{\"messages\": 1}\n" : "not json\n";
                memcpy(bad + at, b, strlen(b));
                at += strlen(b);
            }
        }
        bad[at++] = *q;
    }
    bad[at] = 0;
    p = write_file("bad_many.jsonl", bad);
    o = opts(p, DATA_MESSAGES, 64);
    assert_int_not_equal(chat_data_open(&one, &o, fmt, 151643, &err), 0);
    assert_non_null(strstr(err.msg, "bad_many.jsonl:1500: \"messages\" must be an array"));
    free(p);
    free(text);
    free(bad);

    /* The same for Parquet rows (chat_many.parquet: 3,000 rows in groups of 700); in
     * chat_many_bad.parquet row 1500 fails to render (a null content, which this folder's
     * template cannot render) and row 1600 as it is read (a null role): 1500 is named. */
    char *pq = fs_join(getenv("QT_SOURCE_DIR"), "tests/fixtures/parquet/chat_many.parquet");
    o = opts(pq, DATA_MESSAGES, 64);
    same_on_1_and_2_threads(&o, 3000);
    free(pq);
    pq = fs_join(getenv("QT_SOURCE_DIR"), "tests/fixtures/parquet/chat_many_bad.parquet");
    o = opts(pq, DATA_MESSAGES, 64);
    assert_int_not_equal(chat_data_open(&one, &o, fmt, 151643, &err), 0);
    fprintf(stderr, "expected error: %s\n", err.msg);
    assert_non_null(
        strstr(err.msg, "chat_many_bad.parquet: row 1500: messages[0].content is null"));
    omp_set_num_threads(1);
    free(pq);
}

int main(void) {
    const char *sd = getenv("QT_SHARED_DIR");
    /* Skipped only without ../shared (a user's clone); CI has it, so a missing file fails. */
    if (!sd || !fs_exists(sd)) {
        fprintf(stderr, "skipped: no ../shared (QT_SHARED_DIR)\n");
        return 77;
    }
    char *p = fs_join(sd, "tokenizers/qwen3");
    Err err;
    qwen = tokenizer_load(p, &err);
    free(p);
    fmt = qwen ? chat_format_load(qwen, &err) : NULL;
    if (!fmt || !mkdtemp(tmpdir)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),   cmocka_unit_test(test_packing_and_padding),
        cmocka_unit_test(test_too_long), cmocka_unit_test(test_bad_lines),
        cmocka_unit_test(test_feed),     cmocka_unit_test(test_threads),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fs_remove_tree(tmpdir, &err);
    chat_format_free(fmt);
    tokenizer_free(qwen);
    return rc;
}
