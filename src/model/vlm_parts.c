/* --freeze's part names (model/vlm_parts.h). */
#include "model/vlm_parts.h"

#include <jansson.h>
#include <string.h>

/* ---- --freeze ---- */

loom_vlm_part loom_vlm_param_part(const char *name) {
    if (strncmp(name, "vision.", 7) == 0) return LOOM_VLM_PART_VISION;
    if (strncmp(name, "projector.", 10) == 0) return LOOM_VLM_PART_PROJECTOR;
    return LOOM_VLM_PART_LLM;
}

loom_status loom_vlm_parse_freeze(const char *list, int *parts, loom_error *err) {
    *parts = 0;
    if (!list[0] || strcmp(list, "none") == 0) return LOOM_OK;
    const char *s = list;
    while (*s) {
        const char *e = strchr(s, ',');
        const size_t n = e ? (size_t)(e - s) : strlen(s);
        static const struct {
            const char *name;
            int bit;
        } names[] = {{"vision", LOOM_VLM_PART_VISION},
                     {"projector", LOOM_VLM_PART_PROJECTOR},
                     {"llm", LOOM_VLM_PART_LLM}};
        int bit = 0;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (strlen(names[i].name) == n && strncmp(s, names[i].name, n) == 0) bit = names[i].bit;
        if (!bit)
            return loom_error_set(err, LOOM_ERR_INPUT,
                                  "--freeze '%s': unknown part '%.*s' (expected a comma-separated "
                                  "subset of vision, projector, llm)",
                                  list, (int)n, s);
        *parts |= bit;
        s = e ? e + 1 : s + n;
    }
    if (*parts == LOOM_VLM_PARTS_ALL)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--freeze '%s': every part frozen leaves nothing to train (expected "
                              "at most two of vision, projector, llm)",
                              list);
    return LOOM_OK;
}

int loom_vlm_parts_absent(const loom_safetensors *f) {
    static const struct {
        const char *name;
        int bit;
    } first[] = {{"vision.patch_embed.weight", LOOM_VLM_PART_VISION},
                 {"projector.fc1.weight", LOOM_VLM_PART_PROJECTOR},
                 {"model.embed_tokens.weight", LOOM_VLM_PART_LLM}};
    int absent = 0;
    for (size_t i = 0; i < sizeof first / sizeof first[0]; i++)
        if (!json_object_get((const json_t *)f->header, first[i].name)) absent |= first[i].bit;
    return absent;
}
