/* Runs loom's GRPO loss on inputs from a file and writes the loss, the log-probabilities
 * and d loss / d logits (tests/rl/test_grpo_vs_torch.py compares them with PyTorch).
 * Input (little-endian): int32 N, V, has_ref; float32 clip_eps, kl_coef; float32
 * logits[N*V]; int32 targets[N]; float32 weight[N], adv[N], old_logp[N], ref_logp[N].
 * Output: float64 loss; float32 logp[N]; float32 dlogits[N*V]; float64 tokens, kl,
 * clipped. */
#include <stdio.h>
#include <stdlib.h>

#include "rl/grpo.h"

static int get(void *p, size_t size, size_t n, FILE *f) {
    return fread(p, size, n, f) == n;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: grpo_check IN OUT\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    int32_t hdr[3];
    float cfgv[2];
    if (!f || !get(hdr, 4, 3, f) || !get(cfgv, 4, 2, f)) {
        fprintf(stderr, "grpo_check: %s: cannot read the header\n", argv[1]);
        return 2;
    }
    const int N = hdr[0], V = hdr[1], has_ref = hdr[2];
    float *logits = malloc((size_t)N * V * 4), *dlogits = malloc((size_t)N * V * 4);
    int32_t *targets = malloc((size_t)N * 4);
    float *w = malloc((size_t)N * 4), *adv = malloc((size_t)N * 4), *old = malloc((size_t)N * 4);
    float *ref = malloc((size_t)N * 4), *logp = malloc((size_t)N * 4);
    if (!logits || !dlogits || !targets || !w || !adv || !old || !ref || !logp ||
        !get(logits, 4, (size_t)N * V, f) || !get(targets, 4, N, f) || !get(w, 4, N, f) ||
        !get(adv, 4, N, f) || !get(old, 4, N, f) || !get(ref, 4, N, f)) {
        fprintf(stderr, "grpo_check: %s: short input\n", argv[1]);
        return 2;
    }
    fclose(f);
    loom_grpo_config c = {cfgv[0], cfgv[1]};
    loom_grpo_stats st = {0};
    loom_grpo_logprobs(logits, targets, N, V, logp);
    double loss =
        loom_grpo_loss(&c, logits, targets, w, adv, old, has_ref ? ref : NULL, N, V, dlogits, &st);
    FILE *o = fopen(argv[2], "wb");
    double tail[3] = {st.tokens, st.kl, st.clipped};
    if (!o || fwrite(&loss, 8, 1, o) != 1 || fwrite(logp, 4, N, o) != (size_t)N ||
        fwrite(dlogits, 4, (size_t)N * V, o) != (size_t)N * V || fwrite(tail, 8, 3, o) != 3 ||
        fclose(o)) {
        fprintf(stderr, "grpo_check: %s: cannot write\n", argv[2]);
        return 2;
    }
    free(logits), free(dlogits), free(targets), free(w), free(adv), free(old), free(ref),
        free(logp);
    return 0;
}
