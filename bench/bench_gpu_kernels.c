/* GPU kernel timings for bench/bench_gpu.py (CUDA builds only): loom's bf16 GEMM (the
 * linear forward through cuBLASLt) at M = N = K = --gemm, with a bf16 output and with the
 * fp32 output of --precision bf16's backend table (gemm_f32out_*), and loom's fused attention
 * forward and forward + backward at (B, T, H, hd). CUDA events, after warm-up; prints one
 * JSON line. Exit 77 without a CUDA device. Inputs are random (their values do not
 * change the timing), buffers come from one device arena. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kernels_cuda.h"

static int arg(int argc, char **argv, const char *name, int def) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return atoi(argv[i + 1]);
    return def;
}

static void *carve(loom_cuda_arena *a, size_t bytes) {
    loom_error err = {0};
    void *p = loom_cuda_arena_alloc(a, bytes, "bench", &err);
    if (!p) {
        fprintf(stderr, "bench_gpu_kernels: %s\n", err.msg);
        exit(1);
    }
    cudaMemset(p, 0x3c, bytes); /* bf16 0x3c3c ~ 0.0115, fp32 ~0.0115: finite values */
    return p;
}

int main(int argc, char **argv) {
    int G = arg(argc, argv, "--gemm", 8192), reps = arg(argc, argv, "--reps", 20);
    int B = arg(argc, argv, "--batch", 4), T = arg(argc, argv, "--seq", 1024);
    int H = arg(argc, argv, "--heads", 12), hd = arg(argc, argv, "--head-dim", 64);
    loom_error err = {0};
    loom_cuda_device dev[4];
    int n = 0;
    if (loom_cuda_devices(dev, 4, &n, &err) != LOOM_OK) {
        printf("{\"skipped\": \"%s\"}\n", err.msg);
        return 77;
    }
    loom_cuda_ctx ctx;
    loom_cuda_arena arena;
    size_t gemm_bytes = 3 * (size_t)G * G * 2 + (size_t)G * G * 4 + 256;
    size_t attn = (size_t)B * T * 3 * H * hd * 2 * 2 + (size_t)B * T * H * hd * 2 * 2 +
                  (size_t)B * H * T * 4 * 2;
    /* the fp32 cuBLAS path (attention_gemm.cu): its own fp32 buffers and T x T scratch */
    const size_t scr = loom_cuda_attention_gemm_scratch_floats(B, T, H, H);
    size_t attn32 = ((size_t)B * T * 3 * H * hd * 2 + (size_t)B * T * H * hd * 2 + scr) * 4 + 4096;
    if (loom_cuda_ctx_create(&ctx, 0, &err) != LOOM_OK ||
        loom_cuda_arena_create(&arena, gemm_bytes + attn + attn32 + ((size_t)64 << 20), &err) !=
            LOOM_OK) {
        fprintf(stderr, "bench_gpu_kernels: %s\n", err.msg);
        return 1;
    }
    loom_bf16 *A = carve(&arena, (size_t)G * G * 2), *W = carve(&arena, (size_t)G * G * 2);
    loom_bf16 *C = carve(&arena, (size_t)G * G * 2);
    float *C32 = carve(&arena, (size_t)G * G * 4);
    loom_bf16 *qkv = carve(&arena, (size_t)B * T * 3 * H * hd * 2);
    loom_bf16 *dqkv = carve(&arena, (size_t)B * T * 3 * H * hd * 2);
    loom_bf16 *out = carve(&arena, (size_t)B * T * H * hd * 2);
    loom_bf16 *dout = carve(&arena, (size_t)B * T * H * hd * 2);
    float *lse = carve(&arena, (size_t)B * H * T * 4), *D = carve(&arena, (size_t)B * H * T * 4);
    float *qkv32 = carve(&arena, (size_t)B * T * 3 * H * hd * 4);
    float *dqkv32 = carve(&arena, (size_t)B * T * 3 * H * hd * 4);
    float *out32 = carve(&arena, (size_t)B * T * H * hd * 4);
    float *dout32 = carve(&arena, (size_t)B * T * H * hd * 4);
    float *scratch32 = carve(&arena, scr * 4);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ms_gemm = 0, ms_fwd = 0, ms_fb = 0, ms_gfwd = 0, ms_gfb = 0, ms_gemm32 = 0;
    for (int phase = 0; phase < 6; phase++) {
        for (int warm = 0; warm < 2; warm++) {
            cudaEventRecord(e0, ctx.stream);
            for (int r = 0; r < (warm ? reps : 2); r++) {
                if (phase == 0 || phase == 5) {
                    if (phase == 0)
                        loom_cuda_linear_forward_bf16(&ctx, C, A, W, NULL, G, G, G);
                    else
                        loom_cuda_linear_forward_bf16_f32(&ctx, C32, A, W, NULL, G, G, G);
                    if (loom_cuda_ctx_status(&ctx, 0, &err) != LOOM_OK) {
                        fprintf(stderr, "bench_gpu_kernels: %s\n", err.msg);
                        return 1;
                    }
                } else if (phase >= 3) { /* 3, 4 */
                    loom_cuda_attention_gemm_forward(&ctx, out32, lse, qkv32, scratch32, B, T, H, H,
                                                     hd, 1);
                    if (phase == 4)
                        loom_cuda_attention_gemm_backward(&ctx, dqkv32, scratch32, dout32, qkv32,
                                                          out32, lse, B, T, H, H, hd, 1);
                } else {
                    loom_cuda_attention_forward_bf16(out, lse, qkv, B, T, H, H, hd, ctx.stream);
                    if (phase == 2)
                        loom_cuda_attention_backward_bf16(dqkv, D, dout, qkv, out, lse, B, T, H, H,
                                                          hd, ctx.stream);
                }
            }
            cudaEventRecord(e1, ctx.stream);
            cudaEventSynchronize(e1);
        }
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        ms /= reps;
        if (phase == 0) ms_gemm = ms;
        if (phase == 1) ms_fwd = ms;
        if (phase == 2) ms_fb = ms;
        if (phase == 3) ms_gfwd = ms;
        if (phase == 4) ms_gfb = ms;
        if (phase == 5) ms_gemm32 = ms;
    }
    if (loom_cuda_check("bench", 1, &err) != LOOM_OK) {
        fprintf(stderr, "bench_gpu_kernels: %s\n", err.msg);
        return 1;
    }
    /* Causal attention FLOPs: forward 2 GEMMs of B*H*T*T*hd/2 MACs; backward 2.5x. */
    double attn_fwd_flop = 2.0 * 2.0 * B * H * (double)T * T * hd / 2.0;
    printf(
        "{\"device\": \"%s\", \"gemm\": %d, \"gemm_ms\": %.4f, \"gemm_tflops\": %.2f, "
        "\"attn\": [%d, %d, %d, %d], \"attn_fwd_ms\": %.4f, \"attn_fwd_tflops\": %.2f, "
        "\"attn_fwdbwd_ms\": %.4f, \"attn_fwdbwd_tflops\": %.2f, \"attn_gemm_fp32_fwd_ms\": %.4f, "
        "\"attn_gemm_fp32_fwdbwd_ms\": %.4f, \"gemm_f32out_ms\": %.4f, "
        "\"gemm_f32out_tflops\": %.2f}\n",
        dev[0].name, G, ms_gemm, 2.0 * G * G * (double)G / (ms_gemm * 1e9), B, T, H, hd, ms_fwd,
        attn_fwd_flop / (ms_fwd * 1e9), ms_fb, 3.5 * attn_fwd_flop / (ms_fb * 1e9), ms_gfwd, ms_gfb,
        ms_gemm32, 2.0 * G * G * (double)G / (ms_gemm32 * 1e9));
    loom_cuda_arena_destroy(&arena);
    loom_cuda_ctx_destroy(&ctx);
    return 0;
}
