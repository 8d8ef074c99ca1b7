/* qtitan tokenize: JSONL documents ({"text": ...} per line) or a Parquet file's text column to
 * lines of token ids, or back with --decode. Documents are processed in batches, in parallel
 * over documents with --threads, and written in input order, so the output does not depend on
 * the thread count. */
#include "cli/commands.h"

#include <errno.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/err.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/timer.h"
#include "core/zread.h"
#include "text/jsonl.h"
#include "text/parquet.h"
#include "text/tokenizer.h"

#define BATCH_LINES 4096

/* CPU time of the calling thread: a per-core speed that a busy machine does not distort. */
static double thread_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f, "usage: qtitan tokenize --tokenizer PATH [--input F] [--output F] [--decode]\n"
               "                       [--text-field NAME] [--threads N] [--max-line-bytes N]\n\n"
               "  --tokenizer PATH  tokenizer.json, or a directory holding one\n"
               "  --input F         JSONL with a \"text\" field per line (default stdin),\n"
               "                    plain or compressed (.gz, .zst), or a .parquet file (its\n"
               "                    \"text\" column, null values skipped);\n"
               "                    with --decode: lines of space-separated ids\n"
               "  --output F        one line of space-separated ids per document (default\n"
               "                    stdout); with --decode: JSONL {\"text\": ...}\n"
               "  --text-field NAME the JSON Lines field / Parquet column of the text, and the\n"
               "                    field --decode writes (default \"text\";\n"
               "                    training.dataset_text_field)\n"
               "  --decode          ids to text instead of text to ids\n"
               "  --threads N       documents in parallel (same output for any N; default 1)\n"
               "  --stats           print documents, bytes, tokens and encode speed to stderr\n"
               "  --max-line-bytes N  a longer input line is an error (default 64 MiB)\n"
               "Blank input lines are skipped. Added tokens such as <|endoftext|> in the text\n"
               "become their ids; invalid UTF-8 is replaced by U+FFFD first.\n");
}

typedef struct Job {
    /* A JSON Lines line without its newline (malloc'd), or, with raw, a document's text itself
     * (a Parquet value, not owned). */
    const char *line;
    size_t len;    // bytes in line
    int raw;       // line is the text (Parquet), not a JSON object holding it
    size_t lineno; // its line, or with raw its document number
    char *result;  // malloc'd output line with its newline, or NULL on error
    size_t result_len;
    size_t text_bytes, n_ids; // for --stats
    double encode_s;          // CPU seconds of this thread spent in tokenizer_encode
    Err err;
} Job;

static void append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = xrealloc(*buf, *cap);
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
}

static int encode_job(const Tokenizer *tok, Job *j, const char *in_name, const char *field) {
    char *owned = NULL;
    const char *text = j->line;
    size_t text_len = j->len;
    if (!j->raw) {
        if (jsonl_parse_text(j->line, j->len, field, in_name, (int64_t)j->lineno, &owned, &text_len,
                             &j->err))
            return -1;
        text = owned;
    }
    IdVec ids = {0};
    size_t scope = j->raw ? err_oom_push("tokenizing %s: document %zu (%zu bytes of text)", in_name,
                                         j->lineno, text_len)
                          : err_oom_push("tokenizing %s:%zu (%zu bytes of text)", in_name,
                                         j->lineno, text_len);
    double t0 = thread_cpu_seconds();
    int rc = tokenizer_encode(tok, text, text_len, &ids, &j->err);
    j->encode_s = thread_cpu_seconds() - t0;
    j->text_bytes = text_len;
    j->n_ids = ids.n;
    free(owned);
    if (rc != 0) {
        idvec_free(&ids);
        err_oom_pop(scope);
        return j->raw ? err_wrap(&j->err, "%s: document %zu", in_name, j->lineno)
                      : err_wrap(&j->err, "%s:%zu", in_name, j->lineno);
    }
    size_t cap = ids.n * 7 + 2, len = 0;
    char *out = xmalloc(cap);
    for (size_t i = 0; i < ids.n; i++) {
        char num[16];
        int n = snprintf(num, sizeof num, i ? " %u" : "%u", ids.ids[i]);
        append(&out, &len, &cap, num, (size_t)n);
    }
    append(&out, &len, &cap, "\n", 1);
    idvec_free(&ids);
    err_oom_pop(scope);
    j->result = out;
    j->result_len = len;
    return 0;
}

static int decode_job(const Tokenizer *tok, Job *j, const char *in_name, const char *field) {
    IdVec ids = {0};
    const char *p = j->line, *end = j->line + j->len;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\r'))
            p++;
        if (p == end) break;
        char *q;
        errno = 0;
        unsigned long v = strtoul(p, &q, 10);
        if (q == p || errno || v > UINT32_MAX ||
            (q < end && *q != ' ' && *q != '\t' && *q != '\r')) {
            idvec_free(&ids);
            return err_set(&j->err, "%s:%zu: expected space-separated token ids at byte %zu",
                           in_name, j->lineno, (size_t)(p - j->line));
        }
        idvec_push(&ids, (uint32_t)v);
        p = q;
    }
    char *text;
    size_t len;
    int rc = tokenizer_decode(tok, ids.ids, ids.n, &text, &len, &j->err);
    idvec_free(&ids);
    if (rc != 0) return err_wrap(&j->err, "%s:%zu", in_name, j->lineno);
    json_t *obj = json_object();
    json_object_set_new(obj, field, json_stringn(text, len));
    free(text);
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    size_t n = strlen(s);
    j->result = xmalloc(n + 2);
    memcpy(j->result, s, n);
    j->result[n] = '\n';
    j->result[n + 1] = 0;
    j->result_len = n + 1;
    free(s);
    return 0;
}

/* One run's output and counts: batches of jobs are encoded (or decoded) in parallel and
 * written in order by flush. */
typedef struct Run {
    const Tokenizer *tok;
    const char *in_name, *out_name, *field;
    FILE *out;
    int decode, threads, status;
    Job *jobs;
    size_t n, docs, bytes, tokens;
    double busy;
} Run;

static void flush(Run *r) {
#pragma omp parallel for schedule(dynamic, 8) num_threads(r->threads)
    for (size_t i = 0; i < r->n; i++) {
        if (r->decode)
            decode_job(r->tok, &r->jobs[i], r->in_name, r->field);
        else
            encode_job(r->tok, &r->jobs[i], r->in_name, r->field);
    }
    for (size_t i = 0; i < r->n; i++) {
        Job *j = &r->jobs[i];
        if (r->status == 0 && !j->result) {
            fprintf(stderr, "error: %s\n", j->err.msg);
            r->status = 1;
        }
        if (r->status == 0 && fwrite(j->result, 1, j->result_len, r->out) != j->result_len) {
            fprintf(stderr, "error: cannot write %s: %s\n", r->out_name, strerror(errno));
            r->status = 1;
        }
        r->docs++;
        r->bytes += j->text_bytes;
        r->tokens += j->n_ids;
        r->busy += j->encode_s;
        if (!j->raw) free((char *)j->line);
        free(j->result);
    }
    r->n = 0;
}

/* A batch of a Parquet column's values (parquet_stream_group): each a document, numbered
 * from 1 over the file. */
static int parquet_docs(void *ctx, const ParquetStr *v, int64_t n, Err *err) {
    (void)err;
    Run *r = ctx;
    for (int64_t i = 0; i < n && r->status == 0; i++) {
        Job *j = &r->jobs[r->n++];
        *j = (Job){.line = v[i].p, .len = v[i].n, .raw = 1, .lineno = r->docs + r->n};
        if (r->n == BATCH_LINES) flush(r);
    }
    if (r->n) flush(r);
    return r->status ? -1 : 0;
}

/* The text column (--text-field) of a Parquet file, row group by row group; 0 or 1 (reported). */
static int tokenize_parquet(Run *r, const char *path) {
    Err err;
    const char *data = NULL;
    size_t len = 0;
    int rc = fs_map_read(path, &data, &len, &err);
    if (rc == 0) rc = parquet_stream_column(data, len, path, r->field, parquet_docs, NULL, r, &err);
    /* A failed batch has said why; a reader's failure has not. */
    if (rc != 0 && r->status == 0) fprintf(stderr, "error: %s\n", err.msg);
    fs_unmap(data, len);
    return rc != 0;
}

int cmd_tokenize(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *tok_path = NULL, *in_path = NULL, *out_path = NULL, *field = "text";
    int decode = 0, threads = 1, stats = 0;
    size_t max_line = FS_LINE_MAX_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (strcmp(a, "--tokenizer") == 0 && has_val)
            tok_path = argv[++i];
        else if (strcmp(a, "--input") == 0 && has_val)
            in_path = argv[++i];
        else if (strcmp(a, "--output") == 0 && has_val)
            out_path = argv[++i];
        else if (strcmp(a, "--text-field") == 0 && has_val)
            field = argv[++i];
        else if (strcmp(a, "--decode") == 0)
            decode = 1;
        else if (strcmp(a, "--stats") == 0)
            stats = 1;
        else if (strcmp(a, "--threads") == 0 && has_val) {
            char *e;
            long v = strtol(argv[++i], &e, 10);
            if (*e || v < 1 || v > 1024) {
                fprintf(stderr, "error: --threads expects an integer in [1, 1024], got \"%s\"\n",
                        argv[i]);
                return 2;
            }
            threads = (int)v;
        } else if (strcmp(a, "--max-line-bytes") == 0 && has_val) {
            char *e;
            errno = 0;
            long long v = strtoll(argv[++i], &e, 10);
            if (*e || errno || v < 1 || (unsigned long long)v > SIZE_MAX / 4) {
                fprintf(stderr, "error: --max-line-bytes expects a positive integer, got \"%s\"\n",
                        argv[i]);
                return 2;
            }
            max_line = (size_t)v;
        } else {
            fprintf(stderr,
                    "error: unknown option or missing value: \"%s\" (see qtitan tokenize "
                    "--help)\n",
                    a);
            return 2;
        }
    }
    if (!tok_path) {
        fprintf(stderr, "error: --tokenizer PATH is required (see qtitan tokenize --help)\n");
        return 2;
    }
    Err err;
    Tokenizer *tok = tokenizer_load(tok_path, &err);
    if (!tok) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    /* Opening the output truncates it: were it one of the inputs (the same file under any
     * name, or the file standard input was redirected from), the input would be read empty
     * or the tokenizer lost, with a success status. */
    char *tok_file = fs_join(tok_path, "tokenizer.json");
    struct stat stdin_st, out_st;
    int stdin_is_out = !in_path && out_path && fstat(STDIN_FILENO, &stdin_st) == 0 &&
                       S_ISREG(stdin_st.st_mode) && stat(out_path, &out_st) == 0 &&
                       stdin_st.st_dev == out_st.st_dev && stdin_st.st_ino == out_st.st_ino;
    const char *clobbered = !out_path                                    ? NULL
                            : stdin_is_out                               ? "standard input"
                            : in_path && fs_same_file(out_path, in_path) ? "--input"
                            : fs_same_file(out_path, tok_path) || fs_same_file(out_path, tok_file)
                                ? "--tokenizer"
                                : NULL;
    free(tok_file);
    if (clobbered) {
        fprintf(stderr, "error: --output %s is the %s file; writing it would destroy that input\n",
                out_path, clobbered);
        tokenizer_free(tok);
        return 2;
    }
    /* A .gz / .zst input is decompressed as it is read (core/zread.h); zerr keeps the sentence
     * of a corrupt or truncated stream for the read-error report below. */
    Err zerr = {{0}};
    FILE *in = stdin;
    int parquet = in_path && parquet_is_name(in_path);
    if (parquet && decode) {
        fprintf(stderr, "error: %s: --decode reads lines of token ids, not a Parquet file\n",
                in_path);
        tokenizer_free(tok);
        return 2;
    }
    if (parquet) {
        /* Mapped by tokenize_parquet. */
    } else if (in_path && zread_is_compressed(in_path)) {
        in = zread_fopen(in_path, &zerr);
        if (!in) {
            fprintf(stderr, "error: %s\n", zerr.msg);
            tokenizer_free(tok);
            return 1;
        }
    } else if (in_path) {
        struct stat in_st;
        int fd = fs_open_read(in_path, &in_st, &err);
        in = fd >= 0 ? fdopen(fd, "rb") : NULL;
        if (!in) {
            if (fd >= 0) {
                err_sys(&err, "cannot open %s", in_path);
                close(fd);
            }
            fprintf(stderr, "error: %s\n", err.msg);
            tokenizer_free(tok);
            return 1;
        }
    }
    FILE *out = out_path ? fopen(out_path, "wb") : stdout;
    if (!out) {
        fprintf(stderr, "error: cannot create %s: %s\n", out_path, strerror(errno));
        if (in != stdin) fclose(in);
        tokenizer_free(tok);
        return 1;
    }
    json_object_seed(0); /* before any thread parses JSON */
    Run r = {.tok = tok,
             .in_name = in_path ? in_path : "<stdin>",
             .out_name = out_path ? out_path : "<stdout>",
             .field = field,
             .out = out,
             .decode = decode,
             .threads = threads,
             .jobs = xcalloc(BATCH_LINES, sizeof(Job))};
    double wall0 = now_seconds();
    size_t lineno = 0;
    char *line = NULL;
    size_t line_cap = 0;
    if (parquet) r.status = tokenize_parquet(&r, in_path);
    for (int eof = parquet; !eof && r.status == 0;) {
        while (r.n < BATCH_LINES) {
            size_t len;
            int rd =
                fs_read_line(in, &line, &line_cap, &len, max_line, r.in_name, lineno + 1, &err);
            if (rd < 0) {
                fprintf(stderr, "error: %s\n", zerr.msg[0] ? zerr.msg : err.msg);
                r.status = 1;
            }
            if (rd <= 0) {
                eof = 1;
                break;
            }
            lineno++;
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
                len--;
            size_t bom = lineno == 1 ? jsonl_bom_len(line, len) : 0;
            size_t k = bom;
            while (k < len && (line[k] == ' ' || line[k] == '\t'))
                k++;
            if (k == len && !decode) continue;
            Job *j = &r.jobs[r.n++];
            memset(j, 0, sizeof *j);
            j->len = len - bom;
            size_t scope = err_oom_push("reading %s:%zu (%zu bytes)", r.in_name, lineno, j->len);
            char *copy = xmalloc(j->len + 1);
            err_oom_pop(scope);
            memcpy(copy, line + bom, j->len);
            copy[j->len] = 0;
            j->line = copy;
            j->lineno = lineno;
        }
        flush(&r);
    }
    int status = r.status;
    if (stats && status == 0 && !decode)
        fprintf(stderr,
                "tokenize: %zu documents, %zu bytes, %zu tokens; encode %.3f s CPU over %d "
                "thread(s) = %.1f MB/s per thread; wall %.3f s\n",
                r.docs, r.bytes, r.tokens, r.busy, threads,
                r.busy > 0 ? r.bytes / r.busy / 1e6 : 0.0, now_seconds() - wall0);
    free(line);
    free(r.jobs);
    if (in != stdin) fclose(in);
    /* stdout is checked by main, as for every command. */
    if (out != stdout && fclose(out) != 0 && status == 0) {
        fprintf(stderr, "error: cannot write %s: %s\n", out_path, strerror(errno));
        status = 1;
    }
    tokenizer_free(tok);
    return status;
}
