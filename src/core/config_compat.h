/* torchtitan's job-config keys that qtitan knows without a JobConfig field of its own: each
 * row says which values already mean here what they mean in torchtitan (a pipeline degree of 1,
 * compile disabled), and what any other value gets: a one-line notice saying why it has no
 * effect, or a refusal when it asks for something qtitan cannot do. The keys qtitan implements
 * live in config.c's KEYS table; together the two cover torchtitan's whole job config, so a
 * torchtitan TOML file is never stopped by "unknown key" (docs/config.md, torchtitan keys). */
#ifndef QT_CONFIG_COMPAT_H
#define QT_CONFIG_COMPAT_H

typedef enum CompatAction {
    COMPAT_NOTICE, /* accepted; a notice names the key, the value and why it has no effect */
    COMPAT_REFUSE, /* an error sentence: the value asks for something qtitan cannot do */
    COMPAT_SAME,   /* (a value's settled action only) one qtitan honours: nothing to say */
} CompatAction;

typedef struct CompatKey {
    const char *section; /* "parallelism", "quantize.linear.float8", ... */
    const char *key;
    /* 'b' boolean, 'i' integer, 'n' number, 's' string, 'l' list of strings (on the command
     * line also a comma-separated string, as torchtitan takes it) */
    char type;
    /* Values, as TOML text separated by '|', with which qtitan already does what torchtitan
     * does; "*" = every value; NULL = none. */
    const char *same;
    CompatAction other; /* what any other value gets */
    const char *reason;
} CompatKey;

/* A compat key as last set in a job config: what its value gets, and the line it prints. */
typedef struct CompatSet {
    const CompatKey *key;
    CompatAction action;
    char *line; /* "WHERE: section.key = VALUE is not available: ..." or "... has no effect..." */
} CompatSet;

/* Why float8 and MX keys do nothing here (their rows and model.converters' refusal). */
#define COMPAT_NO_FP8                                                                              \
    "qtitan trains in float32 or bfloat16; float8 and MX training are not available "              \
    "(model.converters)"

extern const CompatKey CONFIG_COMPAT[];
extern const int CONFIG_COMPAT_N;

/* The row for section.key, or NULL. */
const CompatKey *config_compat_find(const char *section, const char *key);

#endif
