/* Rewards of completions: the built-in verifier of loom's arithmetic tasks (loom data
 * arith) and a user's command. */
#ifndef LOOM_RL_REWARD_H
#define LOOM_RL_REWARD_H

#include <stddef.h>

#include "core/error.h"

/* 1 when the prompt is "A+B=" or "A*B=" (decimal A, B) and the completion is the
 * decimal result followed by a newline, or the prompt is a Countdown prompt
 * "N1 ... Nk>T=" and the completion an expression over the numbers worth T and a newline
 * (rl/countdown.h); else 0. */
float loom_reward_arith(const char *prompt, size_t prompt_len, const char *completion,
                        size_t completion_len);

/* Runs `sh -c CMD` with the JSON lines {"prompt": ..., "completion": ...} of the n pairs on
 * its stdin (bytes that are not UTF-8, and NUL, as U+FFFD) and reads one number a line from its
 * stdout into reward[0..n). A command that fails (exit status not 0, or killed), prints fewer or
 * more lines, or a line that is not a number: LOOM_ERR_INPUT naming --reward-cmd and the line. */
loom_status loom_reward_cmd(const char *cmd, int n, const char *const *prompt,
                            const size_t *prompt_len, const char *const *completion,
                            const size_t *completion_len, float *reward, loom_error *err);

#endif
