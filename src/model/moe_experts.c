/* MoE experts: one feed-forward expert (GPT-2 GELU MLP or Llama SwiGLU) over the rows
 * dispatched to it, its backward and its weight gradients (split backward's W). */
#include "kernels/backend_bf16.h"
#include "model/moe_impl.h"

static const float *cp(const float *flat, size_t off) {
    return off == LOOM_NO_PARAM ? NULL : flat + off;
}

static float *gp(float *flat, size_t off) {
    return off == LOOM_NO_PARAM ? NULL : flat + off;
}

/* One feed-forward expert over n rows: h = x @ fc^T (+b), act, y = act @ proj^T (+b). */
void loom_moe_ffn_forward(const loom_moe *m, const loom_expert_params *e, const float *p,
                          loom_act x, float *h, float *act, loom_bf16 *act16, float *y, int n) {
    if (n == 0) return;
    float *a = act ? act : m->dact; /* kept in bf16: through the scratch, rounded */
    if (x.bf16)
        loom_backend_linear_forward_in_bf16(m->be, h, x.bf16, p + e->fc_w, cp(p, e->fc_b), n, m->C,
                                            m->FC);
    else
        loom_backend_linear_forward(m->be, h, x.f32, p + e->fc_w, cp(p, e->fc_b), n, m->C, m->FC);
    if (m->gpt2)
        loom_backend_gelu_forward(m->be, a, h, (size_t)n * m->F);
    else
        loom_backend_swiglu_forward(m->be, a, h, n, m->F);
    if (act) {
        loom_backend_linear_forward(m->be, y, act, p + e->proj_w, cp(p, e->proj_b), n, m->F, m->C);
        return;
    }
    loom_backend_round_bf16(m->be, act16, a, (size_t)n * m->F);
    loom_backend_linear_forward_in_bf16(m->be, y, act16, p + e->proj_w, cp(p, e->proj_b), n, m->F,
                                        m->C);
}

/* The weight gradients of ffn_forward from its output gradient dy and hidden one dh. */
void loom_moe_ffn_weight(const loom_moe *m, const loom_expert_params *e, float *g, loom_act x,
                         loom_act act, const float *dy, const float *dh, int n) {
    if (n == 0) return;
    loom_linear_backward_act(m->be, NULL, LOOM_DX_SET, dy, NULL, g + e->proj_w, gp(g, e->proj_b),
                             act, n, m->F, m->C);
    loom_linear_backward_act(m->be, NULL, LOOM_DX_SET, dh, NULL, g + e->fc_w, gp(g, e->fc_b), x, n,
                             m->C, m->FC);
}

/* Backward of ffn_forward: dx += d/dx; weight gradients accumulate, or with keep_dy /
 * keep_dh (split backward) dy and the hidden gradient are kept there for W. */
void loom_moe_ffn_backward(loom_moe *m, const loom_expert_params *e, const float *p, float *g,
                           loom_act x, const float *h, loom_act act, const float *dy, float *dx,
                           int n, float *keep_dy, float *keep_dh) {
    if (n == 0) return;
    const int keep = keep_dy != NULL;
    loom_linear_backward_act(m->be, m->dact, LOOM_DX_SET, dy, p + e->proj_w,
                             keep ? NULL : g + e->proj_w, gp(g, e->proj_b), act, n, m->F, m->C);
    float *dh = keep_dh ? keep_dh : m->dh;
    loom_backend_memset(m->be, dh, 0, (size_t)n * m->FC * sizeof(float));
    if (m->gpt2)
        loom_backend_gelu_backward(m->be, dh, h, m->dact, (size_t)n * m->F);
    else
        loom_backend_swiglu_backward(m->be, dh, m->dact, h, n, m->F);
    if (keep) loom_backend_copy(m->be, keep_dy, dy, (size_t)n * m->C * sizeof(float));
    loom_linear_backward_act(m->be, dx, LOOM_DX_ADD, dh, p + e->fc_w, keep ? NULL : g + e->fc_w,
                             gp(g, e->fc_b), x, n, m->C, m->FC);
}

loom_expert_params loom_moe_local_expert(const loom_block_params *k, int j) {
    const size_t d = (size_t)j * k->expert_stride;
    loom_expert_params e = k->expert0;
    e.fc_w += d;
    e.proj_w += d;
    if (e.fc_b != LOOM_NO_PARAM) e.fc_b += d;
    if (e.proj_b != LOOM_NO_PARAM) e.proj_b += d;
    return e;
}
