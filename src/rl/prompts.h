/* A prompt file of loom rl (--prompts, --eval-prompts): one prompt a line, byte tokens. */
#ifndef LOOM_RL_PROMPTS_H
#define LOOM_RL_PROMPTS_H

#include <stdint.h>

#include "core/error.h"

typedef struct {
    char **text;   /* [n] each line, NUL-terminated */
    int32_t **ids; /* [n] its bytes as tokens */
    int *len;      /* [n] bytes */
    int n;
} loom_prompt_set;

/* Reads path; an empty line or one longer than max_len bytes, or no line: LOOM_ERR_INPUT
 * naming flag and FILE:LINE (nothing kept). */
loom_status loom_prompts_load(loom_prompt_set *p, const char *flag, const char *path, int max_len,
                              loom_error *err);
void loom_prompts_free(loom_prompt_set *p);

#endif
