/* loom <command> [options]: the thin entry point that dispatches to each command. */
#include <stdio.h>
#include <string.h>

#include "cli/cmd_calibrate.h"
#include "cli/cmd_ckpt.h"
#include "cli/cmd_data.h"
#include "cli/cmd_generate.h"
#include "cli/cmd_gpu.h"
#include "cli/cmd_plan.h"
#include "cli/cmd_plot.h"
#include "cli/cmd_rl.h"
#include "cli/cmd_pp_schedule.h"
#include "cli/cmd_run.h"
#include "cli/cmd_sample.h"
#include "cli/cmd_tokenizer.h"
#include "cli/cmd_train.h"
#include "core/cpu_boot.h"
#include "core/crash_report.h"
#include "core/malloc_policy.h"
#include "core/suggest.h"
#include "core/version.h"
#include "kernels/backend.h"
#ifdef LOOM_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif

#include "core/version.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "loom %s: train transformer language models and diffusion transformers\n\n"
        "usage: loom <command> [options]   (loom <command> --help for its options)\n"
        "\nTrain (docs/training.md, docs/parallelism.md, docs/dit.md):\n"
        "  train        train a model (loom train --help)\n"
        "  pp-schedule  print a pipeline schedule (loom pp-schedule --pp 4 --micro-batches 8)\n"
        "\nSupervise and recover (docs/fault-tolerance.md, docs/cluster.md):\n"
        "  run          train under the supervisor: restarts on failures (loom run --help)\n"
        "  ckpt         checkpoint tools: inspect, verify, export (docs/checkpoints.md)\n"
        "\nData (docs/data.md):\n"
        "  data         token, image and clip shards (loom data --help)\n"
        "  tokenizer    GPT-2 BPE: encode, decode, train (loom tokenizer --help)\n"
        "\nUse a trained model (docs/training.md, docs/dit.md):\n"
        "  generate     text from a language model (loom generate --help)\n"
        "  sample       images and clips from a dit model (loom sample --help)\n"
        "  plot         loss and tokens/s of runs (loom plot --help)\n"
        "\nPost-train (docs/rl.md):\n"
        "  rl           reinforcement learning with GRPO on verifiable rewards (loom rl --help)\n"
        "\nPlan a layout (docs/PLAN.md, docs/PROFILE.md):\n"
        "  calibrate    measure this machine: a profile for the planner (loom calibrate --help)\n"
        "  plan         the layout to train with, predicted (loom plan --help)\n"
        "\nThis machine (docs/gpu.md):\n"
        "  gpu-info     CUDA devices found, or why there are none\n"
        "  version      print the version\n",
        LOOM_VERSION);
}

int main(int argc, char **argv) {
    loom_cpu_boot(argv);      /* may re-exec once with OPENBLAS_CORETYPE set */
    loom_malloc_keep_pages(); /* before MPI_Init: its collectives' buffers stay mapped */
    loom_crash_report_install(NULL);
#ifdef LOOM_CUDA
    loom_backend_register(LOOM_DEVICE_CUDA, loom_backend_cuda_create, loom_backend_cuda_destroy);
#endif
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "train") == 0) return loom_cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "pp-schedule") == 0) return loom_cmd_pp_schedule(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0) return loom_cmd_run(argc - 1, argv + 1);
    if (strcmp(cmd, "calibrate") == 0) return loom_cmd_calibrate(argc - 1, argv + 1);
    if (strcmp(cmd, "plan") == 0) return loom_cmd_plan(argc - 1, argv + 1);
    if (strcmp(cmd, "ckpt") == 0) return loom_cmd_ckpt(argc - 1, argv + 1);
    if (strcmp(cmd, "data") == 0) return loom_cmd_data(argc - 1, argv + 1);
    if (strcmp(cmd, "generate") == 0) return loom_cmd_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "sample") == 0) return loom_cmd_sample(argc - 1, argv + 1);
    if (strcmp(cmd, "plot") == 0) return loom_cmd_plot(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenizer") == 0) return loom_cmd_tokenizer(argc - 1, argv + 1);
    if (strcmp(cmd, "gpu-info") == 0) return loom_cmd_gpu_info(argc - 1, argv + 1);
    if (strcmp(cmd, "rl") == 0) return loom_cmd_rl(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("loom %s (OpenBLAS kernel %s)\n", LOOM_VERSION, loom_cpu_blas_corename());
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    static const char *const commands[] = {
        "train", "pp-schedule", "run",       "ckpt", "data",     "tokenizer", "generate", "sample",
        "plot",  "rl",          "calibrate", "plan", "gpu-info", "version",   "help"};
    const char *near =
        loom_suggest_nearest(cmd, commands, (int)(sizeof commands / sizeof *commands));
    fprintf(stderr, "loom: unknown command '%s'%s%s%s (see loom --help)\n", cmd,
            near ? ": did you mean " : "", near ? near : "", near ? "?" : "");
    return 2;
}
