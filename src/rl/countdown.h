/* Countdown: reach a target from given numbers (loom data arith --op countdown). The
 * prompt is the numbers and the target, "N1 N2 ... Nk>T=", the answer an expression over
 * some of the numbers, each used at most once, with + - * / and parentheses, followed by a
 * newline: "(25-7)*3+1\n". The verifier evaluates it exactly (rationals). */
#ifndef LOOM_RL_COUNTDOWN_H
#define LOOM_RL_COUNTDOWN_H

#include <stddef.h>
#include <stdint.h>

#define LOOM_COUNTDOWN_MAX_NUMBERS 6
#define LOOM_COUNTDOWN_MAX_TARGET 999

/* Example k of a split (val: 1 the held-out one): `count` numbers uniform in [1, max]
 * (2 <= count <= LOOM_COUNTDOWN_MAX_NUMBERS, max <= 99) and a target in
 * [1, LOOM_COUNTDOWN_MAX_TARGET] made by a random expression over all of them (exact
 * divisions only), which is the worked answer. The instance (numbers, target) is held out
 * when a hash of (seed, numbers, target) falls in a tenth of its range, so no held-out
 * instance is a training example. prompt ("N1 ... Nk>T=") and answer ("EXPR\n") are NUL
 * terminated; 96 bytes each suffice. */
void loom_countdown_draw(uint64_t seed, int val, uint64_t k, int count, int max, char *prompt,
                         char *answer);

/* 1 when prompt is "N1 ... Nk>T=" and completion is an expression over the numbers (each
 * at most once) whose exact value is T, followed by one newline; else 0. -1 when the prompt
 * is not a Countdown prompt. */
float loom_reward_countdown(const char *prompt, size_t prompt_len, const char *completion,
                            size_t completion_len);

#endif
