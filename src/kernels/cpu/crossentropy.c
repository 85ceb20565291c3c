/* Fused softmax + cross-entropy over V classes, numerically stable (row max
 * subtracted), sums in double. */
#include "kernels/kernels.h"

#include <math.h>

static float row_max(const float *x, int V) {
    float m = x[0];
    for (int j = 1; j < V; j++) m = x[j] > m ? x[j] : m;
    return m;
}

void loom_crossentropy_forward(float *losses, const float *logits, const int32_t *targets, int N,
                               int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *restrict x = logits + (size_t)n * V;
        float m = row_max(x, V);
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += expf(x[j] - m);
        losses[n] = (float)((double)m + log(sum) - (double)x[targets[n]]);
    }
}

void loom_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets, int N,
                                        int V, float dloss) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *restrict x = logits + (size_t)n * V;
        int tgt = targets[n];
        float xt = x[tgt];
        float m = row_max(x, V);
        double sum = 0.0;
        for (int j = 0; j < V; j++) { /* store exp in place; normalised below */
            float e = expf(x[j] - m);
            x[j] = e;
            sum += e;
        }
        losses[n] = (float)((double)m + log(sum) - (double)xt);
        float s = (float)(dloss / sum);
        for (int j = 0; j < V; j++) x[j] *= s;
        x[tgt] -= dloss;
    }
}
