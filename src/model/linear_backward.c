/* One linear layer's backward (model/linear_backward.h). */
#include "model/linear_backward.h"

#include "kernels/backend_bf16.h"

void loom_linear_backward(const loom_backend *be, float *dx, loom_dx_mode mode, const float *dy,
                          const float *w, float *dw, float *db, const float *x, int N, int IC,
                          int OC) {
    if (dx) {
        if (mode == LOOM_DX_SET) loom_backend_memset(be, dx, 0, (size_t)N * IC * sizeof(float));
        loom_backend_linear_backward_input(be, dx, dy, w, N, IC, OC);
    }
    if (dw) loom_backend_linear_backward_weight(be, dw, db, dy, x, N, IC, OC);
}

void loom_linear_backward_act(const loom_backend *be, float *dx, loom_dx_mode mode, const float *dy,
                              const float *w, float *dw, float *db, loom_act x, int N, int IC,
                              int OC) {
    if (!x.bf16) {
        loom_linear_backward(be, dx, mode, dy, w, dw, db, x.f32, N, IC, OC);
        return;
    }
    loom_linear_backward(be, dx, mode, dy, w, NULL, NULL, NULL, N, IC, OC);
    if (dw) loom_backend_linear_backward_weight_bf16(be, dw, db, dy, x.bf16, N, IC, OC);
}
