/* The user's image-text folder for loom data vlm (data/vlm_folder.h). */
#include "data/vlm_folder.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "data/png_folder.h"

void loom_vlm_folder_free(loom_vlm_folder *f) {
    for (int i = 0; i < f->n; i++) {
        if (f->names) free(f->names[i]);
        if (f->texts) free(f->texts[i]);
    }
    free(f->names);
    free(f->texts);
    free(f->pixels);
    free(f->prompt_len);
    memset(f, 0, sizeof *f);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The PNG paths of dir in bytewise order into f->names, f->n. */
static loom_status list_pngs(const char *dir, loom_vlm_folder *f, loom_error *err) {
    DIR *d = opendir(dir);
    if (!d)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: cannot open the folder: %s", dir,
                              strerror(errno));
    int cap = 0;
    loom_status st = LOOM_OK;
    for (struct dirent *e; !st && (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < 5 || strcasecmp(e->d_name + len - 4, ".png") != 0)
            continue;
        if (f->n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(f->names, (size_t)cap * sizeof *grown);
            if (!grown) {
                st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
                break;
            }
            f->names = grown;
        }
        const size_t bytes = strlen(dir) + len + 2;
        if (!(f->names[f->n] = malloc(bytes))) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
            break;
        }
        snprintf(f->names[f->n++], bytes, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (!st && f->n == 0)
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "%s: no .png files (expected NAME.png with NAME.txt beside each)", dir);
    if (!st) qsort(f->names, (size_t)f->n, sizeof *f->names, by_name);
    return st;
}

/* NAME.txt beside png into *text (malloc'd, the trailing line break dropped). */
static loom_status read_text(const char *png, char **text, int *prompt_len, loom_error *err) {
    char path[4096];
    const size_t stem = strlen(png) - 4;
    snprintf(path, sizeof path, "%.*s.txt", (int)stem, png);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: no %s beside it (expected its text there): %s", png, path,
                              strerror(errno));
    char *buf = malloc(LOOM_VLM_FOLDER_MAX_TEXT + 2);
    size_t n = buf ? fread(buf, 1, LOOM_VLM_FOLDER_MAX_TEXT + 1, fp) : 0;
    fclose(fp);
    if (!buf) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    if (n > LOOM_VLM_FOLDER_MAX_TEXT) {
        free(buf);
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: longer than %d bytes", path,
                              LOOM_VLM_FOLDER_MAX_TEXT);
    }
    if (n > 0 && buf[n - 1] == '\n') n--;
    if (n > 0 && buf[n - 1] == '\r') n--;
    buf[n] = '\0';
    if (memchr(buf, '\0', n)) {
        free(buf);
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: holds a NUL byte (expected text)", path);
    }
    const char *nl = strchr(buf, '\n');
    *prompt_len = nl ? (int)(nl - buf) + 1 : 0;
    if ((size_t)*prompt_len == n) {
        free(buf);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "%s: %s (expected a caption, or a prompt line and its answer)", path,
                              n ? "a prompt line and no answer after it" : "empty");
    }
    *text = buf;
    return LOOM_OK;
}

loom_status loom_vlm_folder_read(const char *dir, loom_vlm_folder *f, loom_error *err) {
    memset(f, 0, sizeof *f);
    loom_status st = list_pngs(dir, f, err);
    if (!st) {
        f->texts = calloc((size_t)f->n, sizeof *f->texts);
        f->prompt_len = calloc((size_t)f->n, sizeof *f->prompt_len);
        if (!f->texts || !f->prompt_len)
            st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", dir);
    }
    size_t S = 0;
    int all_gray = 1;
    for (int i = 0; i < f->n && !st; i++) {
        uint8_t *px = NULL;
        int h = 0, w = 0;
        if ((st = loom_png_read(f->names[i], 3, &px, &h, &w, err))) break;
        if (i == 0) {
            f->height = h;
            f->width = w;
            S = (size_t)3 * h * w;
            if (!(f->pixels = malloc(S * (size_t)f->n)))
                st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory for %d images", dir,
                                    f->n);
        } else if (h != f->height || w != f->width) {
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "%s: %d x %d pixels, expected %d x %d (the size of %s, the first)",
                                f->names[i], w, h, f->width, f->height, f->names[0]);
        }
        if (!st) {
            memcpy(f->pixels + S * i, px, S);
            const size_t plane = (size_t)h * w;
            for (size_t k = 0; k < plane && all_gray; k++)
                all_gray = px[k] == px[plane + k] && px[k] == px[2 * plane + k];
            st = read_text(f->names[i], &f->texts[i], &f->prompt_len[i], err);
        }
        free(px);
    }
    if (st) {
        loom_vlm_folder_free(f);
        return st;
    }
    f->channels = 3;
    if (all_gray) { /* keep each image's first plane, packed */
        const size_t plane = (size_t)f->height * f->width;
        for (int i = 0; i < f->n; i++) memmove(f->pixels + plane * i, f->pixels + S * i, plane);
        f->channels = 1;
    }
    return LOOM_OK;
}
