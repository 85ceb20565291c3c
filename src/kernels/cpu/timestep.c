/* DiT's sinusoidal timestep embedding (TimestepEmbedder.timestep_embedding) of t * 1000
 * (flow-matching t in [0, 1] on DiT's 0..1000 scale), max period 10000, in double. B *
 * dim values: too few for threads to pay. */
#include "kernels/kernels.h"

#include <math.h>

void loom_timestep_embedding(float *out, const float *t, int B, int dim) {
    const int half = dim / 2;
    const double lp = log(10000.0);
    for (int b = 0; b < B; b++) {
        float *o = out + (size_t)b * dim;
        double tb = (double)t[b] * 1000.0;
        for (int j = 0; j < half; j++) {
            double a = tb * exp(-lp * j / half);
            o[j] = (float)cos(a);
            o[half + j] = (float)sin(a);
        }
        if (dim % 2) o[dim - 1] = 0.0f;
    }
}
