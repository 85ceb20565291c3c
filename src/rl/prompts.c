#include "rl/prompts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

void loom_prompts_free(loom_prompt_set *p) {
    for (int i = 0; i < p->n; i++) free(p->text[i]), free(p->ids[i]);
    free(p->text), free(p->ids), free(p->len);
    memset(p, 0, sizeof *p);
}

loom_status loom_prompts_load(loom_prompt_set *p, const char *flag, const char *path, int max_len,
                              loom_error *err) {
    memset(p, 0, sizeof *p);
    FILE *f = fopen(path, "r");
    if (!f) return loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': cannot open", flag, path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int alloc = 0;
    loom_status st = LOOM_OK;
    while (!st && (len = getline(&line, &cap, f)) >= 0) {
        if (len > 0 && line[len - 1] == '\n') line[--len] = 0;
        if (len == 0 || len > max_len) {
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s %s:%d: %s (expected one prompt a line of 1 to %d bytes)", flag,
                                path, p->n + 1, len ? "too long" : "empty line", max_len);
            break;
        }
        if (p->n == alloc) {
            alloc = alloc ? 2 * alloc : 256;
            char **t = realloc(p->text, (size_t)alloc * sizeof *t);
            if (t) p->text = t;
            int32_t **ids = realloc(p->ids, (size_t)alloc * sizeof *ids);
            if (ids) p->ids = ids;
            int *l = realloc(p->len, (size_t)alloc * sizeof *l);
            if (l) p->len = l;
            if (!t || !ids || !l) {
                st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", flag);
                break;
            }
        }
        p->text[p->n] = strdup(line);
        p->ids[p->n] = malloc((size_t)len * sizeof(int32_t));
        p->len[p->n] = (int)len;
        if (!p->text[p->n] || !p->ids[p->n]) {
            free(p->text[p->n]), free(p->ids[p->n]);
            st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", flag);
            break;
        }
        for (ssize_t i = 0; i < len; i++) p->ids[p->n][i] = (unsigned char)line[i];
        p->n++;
    }
    free(line);
    fclose(f);
    if (!st && p->n == 0)
        st = loom_error_set(err, LOOM_ERR_INPUT, "%s '%s': no prompt (expected one a line)", flag,
                            path);
    if (st) loom_prompts_free(p);
    return st;
}
