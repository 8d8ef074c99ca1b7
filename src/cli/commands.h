/* One entry point per `qtitan <command>`; each parses its own options and returns the process
 * exit status (0 success, 1 failure, 2 usage error or command not built). */
#ifndef QT_COMMANDS_H
#define QT_COMMANDS_H

#include "core/err.h"
#include "infer/infer_model.h"

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_tokenizer_train(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_verify_kernels(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_plot(int argc, char **argv);

/* The folder of the checkpoint a --checkpoint argument names, which holds its config.json and
 * tokenizer files: ckpt itself when it is a step (has train_state.json), the newest complete
 * step of a one-process checkpoint folder, or the folder of a many-process checkpoint (given
 * as the folder or one of its FOLDER/rank-K/step-N); *step_dir is malloc'd. */
int cli_checkpoint_step(const char *ckpt, char **step_dir, Err *err);
/* The model generate and eval run: --model's HF directory or --checkpoint's (a many-process
 * checkpoint's pieces joined while they are read, no export needed), with infer_model_open's
 * other arguments. */
int cli_open_model(InferModel *im, const char *model, const char *checkpoint, const char *adapter,
                   int B, int T, int bf16, Err *err);
/* Where generate and eval read the chat template (chat_format_load_at): --chat-template when
 * given, else the adapter folder when it holds one (as TRL saves the tokenizer beside a LoRA
 * run's adapters and peft users load it from there), else NULL (the model's). */
const char *cli_chat_template(const char *given, const char *adapter);

/* The value of option opt as a finite number (the whole of s), or a sentence naming both. */
int cli_number(const char *opt, const char *s, double *out, Err *err);

/* 1 when argv holds -h or --help. */
int cmd_wants_help(int argc, char **argv);

#endif
