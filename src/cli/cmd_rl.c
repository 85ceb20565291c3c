/* loom rl: its own flags (below), and every other flag is loom train's (the model, the
 * optimizer, the seed, the layout, --init-from, --metrics, --save-weights). */
#include "cli/cmd_rl.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "core/cpu_boot.h"
#include "core/fault.h"
#include "core/flags.h"
#include "ft/heartbeat.h"
#include "model/weights.h"
#include "parallel/mesh.h"
#include "rl/rl.h"

static int fail(const char *msg) {
    fprintf(stderr, "loom rl: %s\n", msg);
    return 2;
}

static loom_status set_path(void *dst, const char *name, const char *v, loom_error *err) {
    (void)name, (void)err;
    snprintf((char *)dst, LOOM_PATH_MAX, "%s", v);
    return LOOM_OK;
}

static loom_status set_norm(void *dst, const char *name, const char *v, loom_error *err) {
    if (strcmp(v, "sequence") && strcmp(v, "token"))
        return loom_error_set(err, LOOM_ERR_INPUT, "--%s '%s': expected sequence or token", name,
                              v);
    *(loom_grpo_norm *)dst =
        strcmp(v, "token") == 0 ? LOOM_GRPO_NORM_TOKEN : LOOM_GRPO_NORM_SEQUENCE;
    return LOOM_OK;
}

static const loom_flag_group GROUPS[] = {
    {"Prompts and rewards", "docs/rl.md"}, {"GRPO", "docs/rl.md"}, {"Layouts", "docs/rl.md"}};

enum { RL_N_FLAGS = 18 };

/* The rl flags (every other word is loom train's), with rl's help. */
static loom_flag_spec rl_spec(loom_flag (*flags)[RL_N_FLAGS], loom_rl_config *rc,
                              char *train_layout, char *gen_layout) {
    const loom_flag f[RL_N_FLAGS] = {
        LOOM_FLAG_FN(0, "prompts", rc->prompts, set_path, "FILE",
                     "training prompts, one a line (loom data arith: train_prompts.txt)"),
        LOOM_FLAG_FN(0, "eval-prompts", rc->eval_prompts, set_path, "FILE",
                     "held-out prompts: greedy exact-match accuracy (arithmetic)"),
        LOOM_FLAG_NUMBER(0, "eval-every", &rc->eval_every, "N",
                         "iterations between evaluations (0: before and after; 0)", 0, 1e9,
                         "an integer >= 0"),
        LOOM_FLAG_FN(0, "reward-cmd", rc->reward_cmd, set_path, "CMD",
                     "reward command: JSON lines {\"prompt\", \"completion\"} on stdin,\n"
                     "one number a line on stdout (default: arithmetic exact match)"),
        LOOM_FLAG_NUMBER(1, "iterations", &rc->iterations, "N", "rollout + update iterations (20)",
                         1, 1e9, "an integer >= 1"),
        LOOM_FLAG_NUMBER(1, "prompts-per-iter", &rc->prompts_per_iter, "P",
                         "prompts an iteration (8)", 1, 1e6, "an integer >= 1"),
        LOOM_FLAG_NUMBER(1, "group-size", &rc->group_size, "G",
                         "completions of each prompt, >= 2 (8)", 2, 1e6,
                         "an integer >= 2 (GRPO compares a group)"),
        LOOM_FLAG_NUMBER(1, "temperature", &rc->sampling.temperature, "T",
                         "sampling temperature, > 0 (1)", 1e-6, 1e6, "a number > 0"),
        LOOM_FLAG_NUMBER(1, "top-p", &rc->sampling.top_p, "P", "nucleus sampling (1 = off)", 1e-9,
                         1, "a number in (0, 1]"),
        LOOM_FLAG_NUMBER(1, "max-new-tokens", &rc->max_new, "N",
                         "completion tokens at most; a newline ends one (16)", 1, 1e6,
                         "an integer >= 1"),
        LOOM_FLAG_NUMBER(1, "clip-eps", &rc->grpo.clip_eps, "E",
                         "the ratio's clip range [1-E, 1+E] (0.2)", 0, 1, "a number in [0, 1]"),
        LOOM_FLAG_NUMBER(1, "kl-coef", &rc->grpo.kl_coef, "B",
                         "k3 KL to the initial model (0: no reference kept; 0)", 0, 1e6,
                         "a number >= 0"),
        LOOM_FLAG_FN(1, "loss-norm", &rc->norm, set_norm, "sequence|token",
                     "GRPO's per-sequence mean, or DAPO's per-token (sequence)"),
        LOOM_FLAG_NUMBER(1, "ppo-epochs", &rc->ppo_epochs, "N",
                         "optimizer steps on each iteration's samples (1)", 1, 1e6,
                         "an integer >= 1"),
        LOOM_FLAG_NUMBER(1, "ppo-micro-batch", &rc->ppo_micro_batch, "M",
                         "sequences per forward/backward (8)", 1, 1e6, "an integer >= 1"),
        LOOM_FLAG_NUMBER(1, "time-limit", &rc->time_limit_min, "MIN",
                         "start no iteration after MIN minutes of RL; the held-out\n"
                         "evaluation and --save-weights follow (0: none; 0)",
                         0, 1e9, "minutes >= 0"),
        LOOM_FLAG_FN(2, "train-layout", train_layout, set_path, "\"FLAGS\"",
                     "loom train's layout flags for the update (--tp, --dp, --pp,\n"
                     "--zero, --cp, --sequence-parallel, --ep with --n-experts)"),
        LOOM_FLAG_FN(2, "gen-layout", gen_layout, set_path, "\"--dp N\"",
                     "the generation layout: N = the world, each rank whole weights\n"
                     "(the default), or \"--tp T\": world / T replicas of T tensor-\n"
                     "parallel ranks; with --tp, --pp > 1 or --zero 3 in training or\n"
                     "--tp in generation the weights are resharded to it in memory\n"
                     "after every update"),
    };
    memcpy(*flags, f, sizeof f);
    return (loom_flag_spec){
        .usage = "usage: loom rl --prompts FILE [rl flags] [loom train flags]",
        .about = "  GRPO post-training. Every other flag is loom train's (the model, the\n"
                 "  optimizer, the seed, the layout, --init-from, --metrics, --save-weights).",
        .footer = "  With --init-from W.safetensors the model's configuration is the file's. The\n"
                  "  iteration's P x G sequences are split over --dp ranks; --micro-batch,\n"
                  "  --global-batch and --steps are set from the rl flags. --ckpt-dir DIR\n"
                  "  [--ckpt-every N iterations] and --resume (or loom run -n N -- rl ...) resume\n"
                  "  between iterations; --trace FILE shows rollout, reward, logprob, reference,\n"
                  "  update and reshard spans.\n",
        LOOM_FLAGS_TABLE(*flags, GROUPS)};
}

/* Takes the rl flags out of argv; the rest (argv[0] = "train") goes to loom train's parser. */
static loom_flags_outcome parse(int argc, char **argv, const loom_flag_spec *spec,
                                char *train_layout, char **rest, int *n_rest) {
    *n_rest = 0;
    rest[(*n_rest)++] = "train";
    loom_error err = {0};
    int help = 0;
    loom_status st = loom_flags_take(spec, argc, argv, rest, n_rest, &help, &err);
    loom_flags_outcome fo = loom_flags_end(spec, "loom rl", st, help, &err);
    if (fo != LOOM_FLAGS_GO) return fo;
    /* --train-layout's words are loom train flags, after the others (they win). */
    for (char *w = strtok(train_layout, " \t"); w; w = strtok(NULL, " \t")) rest[(*n_rest)++] = w;
    return LOOM_FLAGS_GO;
}

/* --gen-layout "--dp N", "--tp T" or both (either order): *dp = N (0: not given), *tp =
 * T (1: not given). Returns -1 when it is not of that form. */
static int gen_layout_parse(const char *g, int *dp, int *tp) {
    *dp = 0, *tp = 1;
    int seen_dp = 0, seen_tp = 0;
    while (*g) {
        char flag[8];
        int v = 0, used = 0;
        if (sscanf(g, " %7s %d %n", flag, &v, &used) != 2 || v < 1) return -1;
        if (!strcmp(flag, "--dp") && !seen_dp++)
            *dp = v;
        else if (!strcmp(flag, "--tp") && !seen_tp++)
            *tp = v;
        else
            return -1;
        g += used;
    }
    return 0;
}

int loom_cmd_rl_options(int argc, char **argv, loom_rl_config *rc, loom_train_options *o) {
    loom_rl_config_defaults(rc);
    static char train_layout[LOOM_PATH_MAX], gen_layout[LOOM_PATH_MAX];
    train_layout[0] = gen_layout[0] = 0;
    char **rest = malloc(((size_t)argc + LOOM_PATH_MAX) * sizeof *rest);
    if (!rest) return fail("out of memory");
    loom_flag flags[RL_N_FLAGS];
    const loom_flag_spec spec = rl_spec(&flags, rc, train_layout, gen_layout);
    int n_rest;
    loom_flags_outcome fo = parse(argc, argv, &spec, train_layout, rest, &n_rest);
    if (fo != LOOM_FLAGS_GO) {
        free(rest);
        return fo;
    }
    loom_error err = {0};
    loom_status st = loom_train_options_parse_within(o, n_rest, rest, &spec, &err);
    free(rest);
    if (st) return fail(err.msg);
    if (!rc->prompts[0]) return fail("--prompts: required (one prompt a line)");
    loom_train_config *tc = &o->train;
    if (tc->init_from[0]) { /* the policy's architecture is the file's */
        loom_param_table table = {0};
        float *params = NULL;
        st = loom_weights_load(tc->init_from, &o->model, &table, &params, &err);
        free(params);
        loom_params_free(&table);
        if (st) return fail(err.msg);
    }
    const loom_layout *l = &tc->layout;
    char msg[512];
    const int moe = o->model.n_experts > 0;
    if (l->ep > 1 && !moe)
        return fail("--train-layout: --ep needs a mixture-of-experts model (--n-experts)");
    /* --dump-dir: rl's own (the rollouts' draws and the MoE router decisions of the updates,
     * rl/state.h), not loom train's reference dumps */
    snprintf(rc->dump_dir, sizeof rc->dump_dir, "%s", tc->dump_dir);
    tc->dump_dir[0] = 0;
    const struct {
        const char *flag, *value;
    } unsupported[] = {{"--val-data", tc->val_data},
                       {"--tensorboard", tc->tensorboard},
                       {"--ckpt-fast-dir", tc->ckpt_fast_dir},
                       {"--ckpt-peer", tc->ckpt_peer ? "on" : ""}};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (unsupported[i].value[0]) {
            snprintf(msg, sizeof msg, "%s: not supported by loom rl (docs/rl.md, limits)",
                     unsupported[i].flag);
            return fail(msg);
        }
    int gdp, gtp;
    if (gen_layout_parse(gen_layout, &gdp, &gtp) < 0) {
        snprintf(msg, sizeof msg,
                 "--gen-layout '%s': expected \"--dp N\", \"--tp T\" or \"--tp T --dp N\" (N "
                 "replicas of T tensor-parallel ranks)",
                 gen_layout);
        return fail(msg);
    }
    const loom_model_config *mc = &o->model;
    if (gtp > 1 &&
        (mc->n_head % gtp || mc->n_kv_head % gtp || mc->d_ff % gtp || mc->vocab_size % gtp)) {
        snprintf(msg, sizeof msg,
                 "--gen-layout '--tp %d': T must divide the model's heads (%d), KV heads (%d), "
                 "d_ff (%d) and vocabulary (%d)",
                 gtp, mc->n_head, mc->n_kv_head, mc->d_ff, mc->vocab_size);
        return fail(msg);
    }
    rc->gen_tp = gtp;
    if (moe && gtp > 1)
        return fail("--gen-layout: a mixture-of-experts model generates on whole replicas "
                    "(\"--dp N\"), not --tp");
    if (o->model.family == LOOM_FAMILY_DIT || o->model.vocab_size != 256)
        return fail("model: loom rl trains language models on byte tokens (--vocab-size "
                    "256, as loom data arith writes)");
    /* MoE routes dropless: generation routes one token at a time and never drops, so the
     * update's forward must not either (its log-probabilities are then the sampler's) */
    rc->capacity_ignored = moe ? o->model.capacity_factor : 0.0f;
    o->model.capacity_factor = 0.0f;
    if (strcmp(tc->device, "cpu") != 0 && tc->device[0])
        return fail("--device: loom rl runs on the CPU");
    const int n = rc->prompts_per_iter * rc->group_size, dp = l->dp > 0 ? l->dp : 1;
    const int world_n =
        dp * (l->tp > 0 ? l->tp : 1) * (l->pp > 0 ? l->pp : 1) * (l->cp > 0 ? l->cp : 1);
    if ((gdp > 0 && gdp * gtp != world_n) || world_n % gtp != 0) {
        if (gtp > 1)
            snprintf(msg, sizeof msg,
                     "--gen-layout '%s': the generation layout must hold every rank of the "
                     "training layout's %d (pp x dp x cp x tp = %d)",
                     gen_layout, world_n, world_n);
        else
            snprintf(msg, sizeof msg,
                     "--gen-layout '--dp %d': the generation layout must hold every rank of the "
                     "training layout's %d (pp x dp x cp x tp = %d)",
                     gdp, world_n, world_n);
        return fail(msg);
    }
    const int gen_replicas = world_n / gtp;
    if (n % gen_replicas != 0) {
        snprintf(msg, sizeof msg,
                 "--prompts-per-iter x --group-size = %d sequences must split over the %d "
                 "replicas of the generation layout",
                 n, gen_replicas);
        return fail(msg);
    }
    if (n % (dp * rc->ppo_micro_batch) != 0) {
        snprintf(msg, sizeof msg,
                 "--ppo-micro-batch %d: the %d sequences of an iteration (--prompts-per-iter x "
                 "--group-size) must split into --dp %d ranks of whole micro-batches",
                 rc->ppo_micro_batch, n, dp);
        return fail(msg);
    }
    tc->global_batch = n;
    tc->micro_batch = rc->ppo_micro_batch;
    tc->steps = rc->iterations * rc->ppo_epochs;
    /* --ckpt-every counts iterations: a checkpoint is always between two iterations */
    tc->ckpt_every *= rc->ppo_epochs;
    /* Validation asks for --data; rl draws no token batches, so the check gets a name and
     * the run none. --init-from stays beside --resume (loom run adds --resume auto): the
     * initial weights, then the newest checkpoint's when there is one. */
    const int had_data = tc->data[0] != 0;
    char init_from[LOOM_PATH_MAX];
    snprintf(init_from, sizeof init_from, "%s", tc->init_from);
    if (!had_data) snprintf(tc->data, sizeof tc->data, "(rl)");
    if (tc->resume[0]) tc->init_from[0] = 0;
    st = loom_train_config_validate_all(tc, &o->model, &err);
    if (!had_data) tc->data[0] = 0;
    snprintf(tc->init_from, sizeof tc->init_from, "%s", init_from);
    if (st) return fail(err.msg);
    return -1;
}

int loom_cmd_rl(int argc, char **argv) {
    loom_rl_config rc;
    loom_train_options o;
    int code = loom_cmd_rl_options(argc, argv, &rc, &o);
    if (code >= 0) return code;
    loom_train_config *tc = &o.train;
    loom_error err = {0};
    loom_fault_list faults = {0};
    loom_status st;
    if ((st = loom_fault_parse(&faults, tc->inject, "--inject", &err)) ||
        (st = loom_fault_parse(&faults, getenv("LOOM_INJECT"), "LOOM_INJECT", &err)))
        return fail(err.msg);
    loom_world world;
    if ((st = loom_world_init(&world, &argc, &argv, &err))) return fail(err.msg);
    loom_fault_arm(&faults, loom_fault_slot_of(world.rank), loom_fault_attempt_from_env());
    if ((st = loom_heartbeat_start(world.rank, world.size, &err))) /* under loom run */
        fprintf(stderr, "loom rl: rank %d: no heartbeats: %s\n", world.rank, err.msg);
    loom_mesh mesh;
    if (rc.capacity_ignored > 0 && world.rank == 0)
        fprintf(stderr,
                "loom rl: the MoE routes dropless (capacity factor %g not applied: generation "
                "routes one token at a time and drops none, so the update drops none)\n",
                (double)rc.capacity_ignored);
    if ((st = loom_mesh_create(&mesh, &world, tc->layout, &err))) {
        if (world.rank == 0) fprintf(stderr, "loom rl: %s\n", err.msg);
        loom_heartbeat_stop(1, err.msg);
        loom_world_finalize(&world);
        return st == LOOM_ERR_INPUT ? 2 : 1;
    }
    if (tc->threads == 0) tc->threads = loom_cpu_default_threads();
    loom_cpu_set_threads(tc->threads);
    st = loom_rl_run(&o.model, tc, &rc, &mesh, &err);
    loom_heartbeat_stop(st != LOOM_OK, err.msg);
    if (st) {
        fprintf(stderr, "loom rl: %s\n", err.msg);
        if (world.size > 1) MPI_Abort(MPI_COMM_WORLD, st == LOOM_ERR_INPUT ? 2 : 1);
    }
    loom_mesh_free(&mesh);
    loom_world_finalize(&world);
    return st == LOOM_OK ? 0 : st == LOOM_ERR_INPUT ? 2 : 1;
}
