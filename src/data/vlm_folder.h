/* A folder of the user's own image-text pairs for loom data vlm (docs/vlm.md): every
 * NAME.png (hidden files skipped, the suffix in any case) with NAME.txt beside it, read in
 * bytewise name order. The images are read with data/png_folder.h's conversions: kept gray
 * (1 channel) when every pixel of every image has R == G == B, else RGB; every image must
 * have the first one's height and width. A text is bytes (a trailing line break dropped):
 * with a line break inside, the part up to and including the first one is the prompt and
 * the rest the answer; without one, all of it is the answer (a caption). Errors name the
 * file and what was expected (LOOM_ERR_INPUT). */
#ifndef LOOM_DATA_VLM_FOLDER_H
#define LOOM_DATA_VLM_FOLDER_H

#include <stdint.h>

#include "core/error.h"

#define LOOM_VLM_FOLDER_MAX_TEXT 4000 /* bytes of one text */

typedef struct {
    int n, channels, height, width;
    char **names;    /* [n] the PNG files' paths */
    uint8_t *pixels; /* [n][channels][height][width] */
    char **texts;    /* [n] NUL-terminated, the trailing line break dropped */
    int *prompt_len; /* [n] bytes of the prompt (0: a caption) */
} loom_vlm_folder;

loom_status loom_vlm_folder_read(const char *dir, loom_vlm_folder *out, loom_error *err);
void loom_vlm_folder_free(loom_vlm_folder *f);

#endif
