/* Rotary position embedding, Hugging Face Llama "rotate_half" convention: dims i and
 * i + hd/2 form a pair rotated by angle t * theta^(-2i/hd). Applied in place to the H
 * query and KV key heads of each qkv row; value heads are untouched. */
#include "kernels/kernels.h"

#include <math.h>

/* Pairs whose cos/sin are computed per chunk (stack tables, no allocation). */
#define LOOM_ROPE_CHUNK 64

/* sign = +1 rotates by +angle (forward); sign = -1 applies the transpose (backward). */
static void rope_apply(float *x, int B, int T, int H, int KV, int hd, float theta, float sign,
                       int pos0) {
    int half = hd / 2;
    int row = (H + 2 * KV) * hd;
    int heads = H + KV; /* query heads then key heads are contiguous */
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        for (int i0 = 0; i0 < half; i0 += LOOM_ROPE_CHUNK) {
            int ni = half - i0 < LOOM_ROPE_CHUNK ? half - i0 : LOOM_ROPE_CHUNK;
            float cs[LOOM_ROPE_CHUNK], sn[LOOM_ROPE_CHUNK];
            for (int k = 0; k < ni; k++) {
                /* Angles in double: t * inv_freq reaches ~T radians. */
                double inv_freq = pow((double)theta, -2.0 * (i0 + k) / hd);
                double ang = (double)(pos0 + t) * inv_freq;
                cs[k] = (float)cos(ang);
                sn[k] = sign * (float)sin(ang);
            }
            for (int b = 0; b < B; b++) {
                float *xr = x + ((size_t)b * T + t) * row;
                for (int h = 0; h < heads; h++) {
                    float *restrict lo = xr + (size_t)h * hd + i0;
                    float *restrict hi = lo + half;
                    for (int k = 0; k < ni; k++) {
                        float a = lo[k], c = hi[k];
                        lo[k] = a * cs[k] - c * sn[k];
                        hi[k] = c * cs[k] + a * sn[k];
                    }
                }
            }
        }
    }
}

void loom_rope_forward(float *qkv, int B, int T, int H, int KV, int hd, float theta) {
    rope_apply(qkv, B, T, H, KV, hd, theta, 1.0f, 0);
}

void loom_rope_backward(float *dqkv, int B, int T, int H, int KV, int hd, float theta) {
    /* The rotation is orthogonal, so its transpose is the rotation by -angle. */
    rope_apply(dqkv, B, T, H, KV, hd, theta, -1.0f, 0);
}

void loom_rope_forward_at(float *qkv, int B, int T, int H, int KV, int hd, float theta, int pos0) {
    rope_apply(qkv, B, T, H, KV, hd, theta, 1.0f, pos0);
}

void loom_rope_backward_at(float *dqkv, int B, int T, int H, int KV, int hd, float theta,
                           int pos0) {
    rope_apply(dqkv, B, T, H, KV, hd, theta, -1.0f, pos0);
}
