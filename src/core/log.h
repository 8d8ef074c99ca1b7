/* Console logging. Messages go to stderr except log_out (stdout, for results a user pipes).
 * In a multi-process run only rank 0 prints info lines; warnings and errors carry the rank. */
#ifndef QT_LOG_H
#define QT_LOG_H

void log_set_rank(int rank, int world);
int log_rank(void);
/* Info lines go to stdout unless this was called: commands whose stdout is their result
 * (generate) send them to stderr. */
void log_info_to_stderr(void);
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Sets whether log_info prints (1, the default) and returns the previous setting: a check that
 * repeats work the job logs itself (the plan's override resolution) runs quietly. */
int log_set_info(int on);
/* The setting log_set_info made: whether such a check is running (0) or not. */
int log_info_on(void);
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
