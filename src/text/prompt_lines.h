/* The prompts of a prompt file (`qtitan generate --prompt-file`, [sample] prompts and
 * prompt_file): one prompt a line, a trailing CR dropped (CRLF files), lines of only spaces
 * and tabs skipped. One splitter, so the command and the training samples read a file the
 * same way. */
#ifndef QT_PROMPT_LINES_H
#define QT_PROMPT_LINES_H

#include <stddef.h>

#include "core/err.h"

typedef struct PromptLines {
    char *data;  /* the text, its line ends overwritten with NUL; owned */
    char **text; /* (n) the prompts, pointers into data */
    int n;
} PromptLines;

/* Splits data[0..len) (copied) into p. where names the source in errors (a path or a config
 * key). Fails with one sentence on a NUL byte (naming its offset) or when no line holds a
 * prompt; p is then empty. */
int prompt_lines_split(PromptLines *p, const char *data, size_t len, const char *where, Err *err);
/* One prompt given whole (`--prompt TEXT`: its newlines are part of it). */
int prompt_lines_one(PromptLines *p, const char *text, Err *err);
void prompt_lines_free(PromptLines *p);

#endif
