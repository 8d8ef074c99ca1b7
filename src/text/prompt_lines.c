/* The prompt-file splitter (see prompt_lines.h). */
#include "text/prompt_lines.h"

#include <stdlib.h>
#include <string.h>

int prompt_lines_split(PromptLines *p, const char *data, size_t len, const char *where, Err *err) {
    memset(p, 0, sizeof *p);
    const char *nul = memchr(data, '\0', len);
    if (nul)
        return err_set(err, "%s: byte %zu is NUL; a prompt file is text, one prompt a line", where,
                       (size_t)(nul - data));
    p->data = xmalloc(len + 1);
    memcpy(p->data, data, len);
    p->data[len] = '\0';
    /* A prompt takes at least one non-blank byte and its line end. */
    p->text = xcalloc(len / 2 + 1, sizeof *p->text);
    for (char *line = p->data; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        size_t l = strlen(line);
        if (l && line[l - 1] == '\r') line[--l] = '\0';
        if (strspn(line, " \t") < l) p->text[p->n++] = line;
        line = nl ? nl + 1 : NULL;
    }
    if (p->n == 0) {
        prompt_lines_free(p);
        return err_set(err, "%s holds no prompt (one prompt a line; blank lines are skipped)",
                       where);
    }
    return 0;
}

int prompt_lines_one(PromptLines *p, const char *text, Err *err) {
    (void)err; /* every text is one prompt; an empty one is refused where it is encoded */
    p->data = xstrdup(text);
    p->text = xcalloc(1, sizeof *p->text);
    p->text[0] = p->data;
    p->n = 1;
    return 0;
}

void prompt_lines_free(PromptLines *p) {
    free(p->data);
    free(p->text);
    memset(p, 0, sizeof *p);
}
