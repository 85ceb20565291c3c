#include "cli/plan_report.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/plan_html.h"
#include "model/params.h"
#include "train/run.h"

static const double MiB = 1 << 20, GiB = 1 << 30;

static int world_of(const loom_train_config *tc) {
    const loom_layout l = tc->layout;
    return l.dp * l.cp * l.tp * l.pp;
}

loom_plan_placement loom_plan_placement_of(const loom_profile *p, const loom_train_config *tc,
                                           int world, int ranks_per_node, double moe_load_max) {
    loom_plan_placement pl = {ranks_per_node, tc->threads, moe_load_max};
    /* a CPU node (its ranks share its memory and cores; without a profile: this machine)
     * holds the whole world; a GPU node its devices */
    const int cpu = !p || loom_profile_memory_bytes(p, 2) < loom_profile_memory_bytes(p, 1);
    const long here = sysconf(_SC_NPROCESSORS_ONLN);
    const int cores = p ? loom_profile_devices_per_node(p) : (int)(here > 0 ? here : 1);
    if (pl.ranks_per_node <= 0) pl.ranks_per_node = cpu || world < cores ? world : cores;
    /* loom train's --threads 0: the node's cores shared by its ranks */
    if (pl.threads <= 0)
        pl.threads = cpu && cores > pl.ranks_per_node ? cores / pl.ranks_per_node : 1;
    return pl;
}

static size_t parameters_of(const loom_model_config *mc) {
    loom_param_table t;
    loom_error err = {0};
    if (loom_params_build(&t, mc, NULL, &err)) return 0;
    const size_t n = t.total;
    loom_params_free(&t);
    return n;
}

static json_t *memory_json(const loom_plan_memory *m, int stage) {
    json_t *o = json_object();
    json_object_set_new(o, "stage", json_integer(stage));
#define B(k) json_object_set_new(o, #k "_bytes", json_real((double)m->k))
    B(params);
    B(gathered);
    B(grads_local);
    B(grads_shard);
    B(optimizer);
    B(ema);
    B(activations);
    B(act_sp);
    B(act_nosp);
    B(act_whole);
    B(cp_buffers);
    B(moe_buffers);
    B(pp_messages);
    B(tp_messages);
    if (m->vision) B(vision);
    B(mpi_temp);
    B(dp_buffers);
    B(total);
#undef B
    json_object_set_new(o, "pp_slots", json_integer(m->pp_slots));
    json_object_set_new(o, "total_gib", json_real(m->total / GiB));
    return o;
}

static json_t *time_json(const loom_plan_time *t) {
    json_t *o = json_object(), *terms = json_array();
    for (int i = 0; i < t->n_terms; i++) {
        json_t *x = json_object();
        json_object_set_new(x, "name", json_string(t->terms[i].name));
        json_object_set_new(x, "metric",
                            t->terms[i].metric ? json_string(t->terms[i].metric) : json_null());
        json_object_set_new(x, "ms", json_real(t->terms[i].ms));
        json_array_append_new(terms, x);
    }
    json_object_set_new(o, "step_ms", json_real(t->step_ms));
    json_object_set_new(o, "tokens_per_s", json_real(t->tokens_per_s));
    json_object_set_new(o, "model_flops", json_real(t->model_flops));
    json_object_set_new(o, "mfu", json_real(t->mfu));
    json_object_set_new(o, "dominant",
                        t->n_terms ? json_string(t->terms[t->dominant].name) : json_null());
    json_object_set_new(o, "grad_accum", json_string(t->grad_sharded ? "sharded" : "local"));
    json_object_set_new(o, "grad_reductions", json_integer(t->grad_reductions));
    json_object_set_new(o, "grad_bytes", json_real(t->grad_bytes));
    json_object_set_new(o, "terms", terms);
    if (t->pp_action_ms[0][0] > 0) { /* pp > 1 */
        json_t *stages = json_array();
        for (int r = 0; r < LOOM_PP_MAX_STAGES && t->pp_action_ms[r][0] > 0; r++)
            json_array_append_new(stages, json_pack("[f, f, f]", t->pp_action_ms[r][0],
                                                    t->pp_action_ms[r][1], t->pp_action_ms[r][2]));
        json_object_set_new(o, "pp_actions_ms", stages);
    }
    return o;
}

void *loom_plan_candidate_json(const loom_model_config *mc, const loom_plan_candidate *c,
                               int with_time) {
    char flags[512], line[512];
    loom_plan_layout_flags(&c->tc, flags, sizeof flags);
    loom_run_memory_line(&c->mem, c->tc.micro_batch, mc->seq_len, line, sizeof line);
    json_t *o = json_object();
    json_object_set_new(o, "layout", json_string(flags));
    json_object_set_new(o, "world", json_integer(world_of(&c->tc)));
    json_t *m = memory_json(&c->mem, c->mem_stage);
    json_object_set_new(m, "line", json_string(line));
    json_object_set_new(o, "memory", m);
    if (with_time) json_object_set_new(o, "time", time_json(&c->time));
    return o;
}

static void print_memory(const loom_model_config *mc, const loom_train_config *tc,
                         const loom_plan_memory *m, int stage, FILE *f) {
    char line[512];
    loom_run_memory_line(m, tc->micro_batch, mc->seq_len, line, sizeof line);
    if (tc->layout.pp > 1)
        fprintf(f, "pipeline stage %d holds the most (world rank %d):\n", stage,
                stage * tc->layout.tp * loom_layout_replicas(tc->layout));
    fprintf(f, "loom: %s\n", line);
    if (m->mpi_temp)
        fprintf(f,
                "loom: MPI all-reduce temporary: %.3f MiB (OpenMPI's buffers of the all-reduces "
                "in flight, %zu floats: the largest gradient partition, or up to 4 MiB of "
                "smaller ones)\n",
                m->mpi_temp / MiB, m->mpi_temp / sizeof(float));
    if (m->dp_buffers)
        fprintf(f,
                "loom: data-parallel buffers: %.3f MiB (the embedding gradient's rows gathered "
                "from every rank; --ep ZeRO's pack and receive buffers)\n",
                m->dp_buffers / MiB);
    fprintf(f, "loom: memory per rank in all: %.3f MiB\n", m->total / MiB);
    if (m->pp_slots)
        fprintf(f,
                "  pipeline: %d micro-batch(es) in flight (activations %d x %.3f MiB = %.3f "
                "MiB; message buffers %.1f MiB)\n",
                m->pp_slots, m->pp_slots, m->activations / MiB, m->pp_slots * m->activations / MiB,
                m->pp_messages / MiB);
    if (tc->layout.tp > 1)
        fprintf(f,
                "  tensor parallel: activations per rank %.1f MiB with sequence parallelism, "
                "%.1f MiB without\n",
                m->act_sp / MiB, m->act_nosp / MiB);
    if (m->tp_messages)
        fprintf(f, "  tensor-parallel bf16 message buffers: %.3f MiB\n", m->tp_messages / MiB);
    if (tc->layout.cp > 1)
        fprintf(f,
                "  context parallel: %.3f MiB holding whole sequences; attention buffers %.3f "
                "MiB\n",
                m->act_whole / MiB, m->cp_buffers / MiB);
    if (m->moe_buffers > 0) fprintf(f, "  MoE buffers %.1f MiB\n", m->moe_buffers / MiB);
    if (m->vision > 0)
        fprintf(f,
                "  --vision-schedule bubbles: encoder replicas, their weights and gradients, image "
                "rows %.3f MiB\n",
                m->vision / MiB);
}

/* A vlm with --pp: the step with each placement of the encoder (--vision-schedule first
 * and bubbles); t is tc's own. Returns the JSON object, and prints when text. */
static json_t *vision_placements(const loom_model_config *mc, const loom_train_config *tc,
                                 const loom_profile *p, const loom_plan_placement *place,
                                 const loom_plan_time *t, int text) {
    const int bubbles = strcmp(tc->vision_schedule, "bubbles") == 0;
    loom_train_config o = *tc;
    snprintf(o.vision_schedule, sizeof o.vision_schedule, "%s", bubbles ? "first" : "bubbles");
    loom_plan_time other;
    loom_error quiet = {0};
    const int ok = !loom_plan_validate(mc, &o, &quiet) &&
                   !loom_plan_step_time(mc, &o, p, place, &other, &quiet);
    const loom_plan_time *theirs = ok ? &other : NULL;
    const loom_plan_time *tf = bubbles ? theirs : t, *tb = bubbles ? t : theirs;
    json_t *v = json_object(), *pieces = json_array();
    json_object_set_new(v, "first_ms", tf ? json_real(tf->step_ms) : json_null());
    json_object_set_new(v, "bubbles_ms", tb ? json_real(tb->step_ms) : json_null());
    for (int r = 0; tb && r < tc->layout.pp; r++)
        json_array_append_new(pieces, json_integer(tb->vision_pieces[r]));
    json_object_set_new(v, "pieces", pieces);
    json_object_set_new(v, "pipeline_ratio", tb ? json_real(tb->vision_ratio) : json_null());
    json_object_set_new(v, "messages_ms", tb ? json_real(tb->vision_messages_ms) : json_null());
    if (!ok) json_object_set_new(v, "refused", json_string(quiet.msg));
    const char *better = !tf || (tb && tb->step_ms < tf->step_ms) ? "bubbles" : "first";
    json_object_set_new(v, "shorter", json_string(better));
    if (!text) return v;
    printf("encoder placement (--vision-schedule, docs/vlm.md):\n");
    if (tf) printf("  first    %10.3f ms  (the encoder on pipeline stage 0)\n", tf->step_ms);
    if (tb) {
        printf("  bubbles  %10.3f ms  (micro-batches encoded per stage", tb->step_ms);
        for (int r = 0; r < tc->layout.pp; r++) printf("%s%d", r ? "," : " ", tb->vision_pieces[r]);
        printf("; simulated pipeline %.3f x first's; vision messages %.3f ms)\n", tb->vision_ratio,
               tb->vision_messages_ms);
    } else {
        printf("  bubbles  not run by loom train here: %s\n", quiet.msg);
    }
    printf("  shorter: %s\n", better);
    return v;
}

static void print_time(const loom_plan_time *t, FILE *f) {
    fprintf(f, "step, term by term (exposed ms; the --metrics key that measures it):\n");
    for (int i = 0; i < t->n_terms; i++)
        fprintf(f, "  %-22s %10.3f ms  %5.1f%%  %s\n", t->terms[i].name, t->terms[i].ms,
                t->step_ms > 0 ? 100 * t->terms[i].ms / t->step_ms : 0.0,
                t->terms[i].metric ? t->terms[i].metric : "(step_ms only)");
    if (t->grad_reductions > 1)
        fprintf(f,
                "gradient reduction: grad reduce-scatter x %d micro-batches (sharded "
                "accumulation: each block's as backward produces it, 'dp sharded accum' the "
                "waits), %.1f MB a step on this rank's wire\n",
                t->grad_reductions, t->grad_bytes / 1e6);
    else if (t->grad_reductions == 1)
        fprintf(f,
                "gradient reduction: once a step (%s accumulation), %.1f MB on this rank's "
                "wire\n",
                t->grad_sharded ? "sharded" : "local", t->grad_bytes / 1e6);
    if (t->pp_action_ms[0][0] > 0) { /* pp > 1: the stages are uneven; the slowest paces */
        int slow = 0;
        fprintf(f, "pipeline stages, one micro-batch's F / B / W (ms, cores unshared):");
        for (int r = 0; r < LOOM_PP_MAX_STAGES && t->pp_action_ms[r][0] > 0; r++) {
            const double *a = t->pp_action_ms[r], *b = t->pp_action_ms[slow];
            fprintf(f, "%s %d: %.3f / %.3f / %.3f", r ? ";" : "", r, a[0], a[1], a[2]);
            if (a[0] + a[1] + a[2] > b[0] + b[1] + b[2]) slow = r;
        }
        fprintf(f, " (stage %d the slowest)\n", slow);
    }
    fprintf(f, "predicted step: %.3f ms (%.1f tokens/s, MFU %.1f%%)\n", t->step_ms, t->tokens_per_s,
            100 * t->mfu);
}

loom_status loom_plan_explain(const loom_model_config *mc, const loom_train_config *tc,
                              const loom_profile *p, int ranks_per_node, double moe_load_max,
                              int json, const char *html, loom_error *err) {
    loom_plan_candidate c;
    memset(&c, 0, sizeof c);
    const int world = world_of(tc);
    const loom_plan_placement place =
        loom_plan_placement_of(p, tc, world, ranks_per_node, moe_load_max);
    c.tc = *tc;
    c.tc.threads = place.threads; /* what the run's threads size (attention scratch) */
    tc = &c.tc;
    loom_status st = loom_plan_validate(mc, tc, err);
    if (st || (st = loom_plan_memory_max(mc, tc, &c.mem, &c.mem_stage, err))) return st;
    if (p && (st = loom_plan_step_time(mc, tc, p, &place, &c.time, err))) return st;
    char flags[512];
    loom_plan_layout_flags(tc, flags, sizeof flags);
    /* what cp sends per step (a GPU profile: its backend sends fp32) */
    double cp16 = 0, cp32 = 0;
    const int gpu = p && loom_profile_memory_bytes(p, 2) >= loom_profile_memory_bytes(p, 1);
    if ((st = loom_plan_cp_messages(mc, tc, gpu, &cp16, &cp32, err))) return st;
    if (json) {
        json_t *o = loom_plan_candidate_json(mc, &c, p != NULL), *stages = json_array();
        for (int s = 0; s < tc->layout.pp && !st; s++) {
            loom_plan_memory m;
            char line[512];
            if ((st = loom_plan_memory_of(mc, tc, s, &m, err))) break;
            json_t *x = memory_json(&m, s);
            loom_run_memory_line(&m, tc->micro_batch, mc->seq_len, line, sizeof line);
            json_object_set_new(x, "line", json_string(line));
            json_array_append_new(stages, x);
        }
        json_object_set_new(o, "stages", stages);
        if (tc->layout.cp > 1) {
            json_object_set_new(o, "cp_message_bytes", json_real(cp16 + cp32));
            json_object_set_new(o, "cp_message_bytes_bf16", json_real(cp16));
            json_object_set_new(o, "cp_message_bytes_fp32", json_real(cp32));
        }
        if (p && mc->family == LOOM_FAMILY_VLM && tc->layout.pp > 1)
            json_object_set_new(o, "vision_schedule",
                                vision_placements(mc, tc, p, &place, &c.time, 0));
        json_object_set_new(o, "profile", p ? json_string(loom_profile_name(p)) : json_null());
        json_object_set_new(o, "ranks_per_node", json_integer(place.ranks_per_node));
        if (mc->n_experts > 0)
            json_object_set_new(o, "moe_load_max", json_real(moe_load_max > 1 ? moe_load_max : 1));
        char *s = json_dumps(o, JSON_COMPACT);
        printf("%s\n", s ? s : "{}");
        free(s);
        json_decref(o);
        if (st) return st;
    } else {
        printf("loom plan: %s model, %zu parameters; layout %s (%d rank(s), %d per node)%s%s%s\n",
               loom_family_name(mc->family), parameters_of(mc), flags, world, place.ranks_per_node,
               p ? ", profile '" : "", p ? loom_profile_name(p) : "", p ? "'" : "");
        print_memory(mc, tc, &c.mem, c.mem_stage, stdout);
        if (tc->layout.cp > 1)
            printf("  context-parallel messages: %.0f bytes sent per step by rank 0 (%.0f in bf16, "
                   "%.0f in fp32)\n",
                   cp16 + cp32, cp16, cp32);
        if (p && mc->n_experts > 0)
            printf("routing: the busiest expert at %.3fx the mean load%s\n",
                   moe_load_max > 1 ? moe_load_max : 1.0,
                   moe_load_max > 1 ? " (--moe-load-max)" : " (balanced; --moe-load-max sets it)");
        if (p) {
            print_time(&c.time, stdout);
            if (mc->family == LOOM_FAMILY_VLM && tc->layout.pp > 1)
                json_decref(vision_placements(mc, tc, p, &place, &c.time, 1));
        } else
            printf("(no --profile: memory only; loom calibrate -o profile.json measures this "
                   "machine)\n");
    }
    if (html && html[0] && p) {
        loom_plan_bar bar = {.note = "predicted", .time = c.time};
        snprintf(bar.label, sizeof bar.label, "%s", flags);
        return loom_plan_html_write(html, "loom plan --explain", &bar, 1, err);
    }
    return LOOM_OK;
}

static int by_step(const void *a, const void *b) {
    const double x = ((const loom_plan_candidate *)a)->time.step_ms;
    const double y = ((const loom_plan_candidate *)b)->time.step_ms;
    return x < y ? -1 : x > y;
}

static double term_ms(const loom_plan_time *t, const char *name) {
    for (int i = 0; i < t->n_terms; i++)
        if (!strcmp(t->terms[i].name, name)) return t->terms[i].ms;
    return 0;
}

/* Why a is ahead of b: the term that differs most in a's favour. */
static void why_ahead(const loom_plan_time *a, const loom_plan_time *b, char *buf, size_t n) {
    const char *best = NULL;
    double gain = 0;
    for (int i = 0; i < b->n_terms; i++) {
        const double d = b->terms[i].ms - term_ms(a, b->terms[i].name);
        if (d > gain) gain = d, best = b->terms[i].name;
    }
    for (int i = 0; i < a->n_terms; i++)
        if (term_ms(b, a->terms[i].name) == 0 && -a->terms[i].ms > gain)
            gain = -a->terms[i].ms, best = a->terms[i].name;
    if (best)
        snprintf(buf, n, "%.3f ms ahead of the next: its '%s' is %.3f ms shorter (%.3f vs %.3f)",
                 b->step_ms - a->step_ms, best, gain, term_ms(a, best), term_ms(b, best));
    else
        snprintf(buf, n, "ties with the next");
}

loom_status loom_plan_search(const loom_model_config *mc, const loom_train_config *base,
                             const loom_profile *p, int world, int ranks_per_node,
                             double moe_load_max, double memory_gib, int top, int json,
                             const char *html, loom_error *err) {
    const loom_plan_placement place =
        loom_plan_placement_of(p, base, world, ranks_per_node, moe_load_max);
    loom_train_config threaded = *base;
    threaded.threads = place.threads; /* what the run's threads size (attention scratch) */
    base = &threaded;
    const double budget =
        memory_gib > 0 ? memory_gib * GiB : loom_profile_memory_bytes(p, place.ranks_per_node);
    loom_plan_candidate *all;
    int n;
    loom_error refused = {0};
    loom_status st =
        loom_plan_enumerate(mc, base, world, place.ranks_per_node, &all, &n, &refused, err);
    if (st) return st;
    if (n == 0) {
        free(all);
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "no layout of %d rank(s) is accepted for this model and batch "
                              "(--global-batch %d, --n-layer %d, --n-head %d): loom train would "
                              "refuse each (the last one: %s)",
                              world, base->global_batch, mc->n_layer, mc->n_head, refused.msg);
    }
    int fit = 0, smallest = 0;
    for (int i = 0; i < n; i++) {
        if (all[i].mem.total < all[smallest].mem.total) smallest = i;
        if (all[i].mem.total <= budget) all[fit++] = all[i];
    }
    if (fit == 0) {
        char flags[512];
        loom_plan_layout_flags(&all[smallest].tc, flags, sizeof flags);
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "no layout of %d rank(s) fits %.2f GiB per rank: the smallest needs "
                            "%.2f GiB (%s); give more ranks or --memory-per-rank",
                            world, budget / GiB, all[smallest].mem.total / GiB, flags);
        free(all);
        return st;
    }
    for (int i = 0; i < fit && !st; i++)
        st = loom_plan_step_time(mc, &all[i].tc, p, &place, &all[i].time, err);
    if (st) {
        free(all);
        return st;
    }
    qsort(all, (size_t)fit, sizeof *all, by_step);
    const int k = top < fit ? top : fit;
    if (json) {
        json_t *o = json_object(), *arr = json_array();
        json_object_set_new(o, "world", json_integer(world));
        json_object_set_new(o, "profile", json_string(loom_profile_name(p)));
        json_object_set_new(o, "budget_gib", json_real(budget / GiB));
        json_object_set_new(o, "considered", json_integer(n));
        json_object_set_new(o, "fit", json_integer(fit));
        for (int i = 0; i < k; i++)
            json_array_append_new(arr, loom_plan_candidate_json(mc, &all[i], 1));
        json_object_set_new(o, "top", arr);
        char *s = json_dumps(o, JSON_COMPACT);
        printf("%s\n", s ? s : "{}");
        free(s);
        json_decref(o);
    } else {
        printf("loom plan: %s model, %zu parameters, world %d (%d per node), global batch %d x "
               "%d tokens; profile '%s'; memory budget %.2f GiB per rank\n",
               loom_family_name(mc->family), parameters_of(mc), world, place.ranks_per_node,
               base->global_batch, mc->seq_len, loom_profile_name(p), budget / GiB);
        printf("%d layout(s) accepted by loom train, %d fit the memory; the %d fastest:\n", n, fit,
               k);
        printf(" #  %-64s %10s %11s %6s %9s\n", "layout (loom train flags)", "step ms", "tokens/s",
               "MFU", "mem GiB");
        for (int i = 0; i < k; i++) {
            char flags[512], why[256];
            const loom_plan_time *t = &all[i].time;
            loom_plan_layout_flags(&all[i].tc, flags, sizeof flags);
            printf("%2d  %-64s %10.2f %11.1f %5.1f%% %9.3f\n", i + 1, flags, t->step_ms,
                   t->tokens_per_s, 100 * t->mfu, all[i].mem.total / GiB);
            if (i + 1 < fit)
                why_ahead(t, &all[i + 1].time, why, sizeof why);
            else
                snprintf(why, sizeof why, "the last that fits");
            printf("    largest part: %s (%.0f%% of the step); %s\n",
                   t->n_terms ? t->terms[t->dominant].name : "-",
                   t->step_ms > 0 && t->n_terms ? 100 * t->terms[t->dominant].ms / t->step_ms : 0.0,
                   why);
        }
    }
    if (html && html[0]) {
        loom_plan_bar *bars = calloc((size_t)k, sizeof *bars);
        if (!bars) st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        for (int i = 0; bars && i < k; i++) {
            loom_plan_layout_flags(&all[i].tc, bars[i].label, sizeof bars[i].label);
            bars[i].note = i == 0 ? "predicted fastest" : "predicted";
            bars[i].time = all[i].time;
        }
        if (bars) st = loom_plan_html_write(html, "loom plan: the fastest layouts", bars, k, err);
        free(bars);
    }
    free(all);
    return st;
}
