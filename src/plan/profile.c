#include "plan/profile.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_field.h"

typedef struct {
    double peak_gflops, efficiency, latency_us, half_dim;
    int n[3];        /* grid sizes along M, N, K (0: no grid) */
    double *axis[3]; /* grid dimensions, increasing */
    double *gflops;  /* n[0] * n[1] * n[2] rates, index (i*n[1] + j)*n[2] + k */
} gemm_term;

typedef struct {
    int has_model;
    double gflops, latency_us;
    int nT, nh; /* grid sizes (0: no grid) */
    double *T, *hd, *us_per_head;
} attention_term;

typedef struct {
    double alpha_us, per_unit_ms; /* ms = alpha_us / 1e3 + x * per_unit_ms */
} line_term;

typedef struct {
    int threads;
    gemm_term gemm[LOOM_GEMM_OPS];
    int has_bf16;                       /* gemm_bf16 present */
    gemm_term gemm_bf16[LOOM_GEMM_OPS]; /* --precision bf16's linear GEMMs (optional) */
    attention_term att[LOOM_ATT_KINDS];
    line_term ew[LOOM_EW_KINDS];
    line_term adamw;
} compute_entry;

typedef struct {
    loom_collective_kind kind;
    int group;
    loom_placement place;
    double alpha_us, busbw_gbs;
} collective_entry;

struct loom_profile {
    char name[128], source[16];
    double memory_bytes;
    int memory_shared, devices_per_node;
    int n_compute;
    compute_entry *compute;
    int n_coll;
    collective_entry *coll;
    double engine_cpu_us, engine_cpu_us_per_mib, engine_post_us;
    double refault_gbps; /* 0: pages handed back cost nothing to touch again */
    /* machine.corun: the kernels' slowdown with k one-thread processes busy at once */
    int n_corun;
    struct {
        int processes;
        double gemm, memory;
    } corun[8];
};

static const char *gemm_names[LOOM_GEMM_OPS] = {"nt", "nn", "tn"};
static const char *att_names[LOOM_ATT_KINDS] = {"causal_fwd", "causal_bwd", "bidir_fwd",
                                                "bidir_bwd",  "block_fwd",  "block_bwd"};
static const char *ew_names[LOOM_EW_KINDS] = {
    "layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd",  "gelu_fwd",   "gelu_bwd",
    "swiglu_fwd",    "swiglu_bwd",    "add",         "crossentropy", "block_merge"};
static const char *coll_names[LOOM_COLL_KINDS] = {"allreduce", "reduce_scatter", "allgather",
                                                  "alltoall", "sendrecv"};

const char *loom_gemm_op_name(loom_gemm_op op) {
    return op >= 0 && op < LOOM_GEMM_OPS ? gemm_names[op] : "?";
}
const char *loom_attention_kind_name(loom_attention_kind k) {
    return k >= 0 && k < LOOM_ATT_KINDS ? att_names[k] : "?";
}
const char *loom_elementwise_kind_name(loom_elementwise_kind k) {
    return k >= 0 && k < LOOM_EW_KINDS ? ew_names[k] : "?";
}
const char *loom_collective_kind_name(loom_collective_kind k) {
    return k >= 0 && k < LOOM_COLL_KINDS ? coll_names[k] : "?";
}

double loom_collective_bus_factor(loom_collective_kind k, int group) {
    if (group < 2) return 0.0;
    double n = group;
    switch (k) {
    case LOOM_COLL_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_ALLTOALL:
        return (n - 1) / n;
    default:
        return 1.0;
    }
}

double loom_profile_elementwise_bytes(loom_elementwise_kind k, double rows, double width) {
    double n = rows * width * 4.0; /* one fp32 buffer of rows x width */
    switch (k) {
    case LOOM_EW_LAYERNORM_FWD:
    case LOOM_EW_RMSNORM_FWD:
    case LOOM_EW_GELU_FWD:
        return 2 * n; /* read inp, write out */
    case LOOM_EW_LAYERNORM_BWD:
    case LOOM_EW_RMSNORM_BWD:
    case LOOM_EW_GELU_BWD:
        return 4 * n; /* read dout, inp; read + write dinp (+=) */
    case LOOM_EW_SWIGLU_FWD:
        return 3 * n; /* read [gate|up] (2 width), write out */
    case LOOM_EW_SWIGLU_BWD:
        return 7 * n; /* read dout, inp (2); read + write dinp (2 + 2) */
    case LOOM_EW_ADD:
        return 3 * n; /* read a, b, write out */
    case LOOM_EW_CROSSENTROPY:
        return 2 * n; /* read the logits, write their gradient */
    case LOOM_EW_BLOCK_MERGE:
        return 3 * n; /* read out_b, read + write out */
    default:
        return 0.0;
    }
}

/* ---- validation: every failure names the file and the field ---- */

typedef struct {
    loom_json_reader r; /* the file; no kind: the errors say "file: field: what" */
    int published;      /* every term needs "sources" */
} ctx;

static loom_status bad(ctx *c, const char *path, const char *what) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s: %s", path, what);
    loom_json_fail(&c->r, "%s", msg);
    return LOOM_ERR_INPUT; /* said here: the callers' compiler sees a failure is never OK */
}

static void join(char *out, size_t cap, const char *path, const char *key) {
    snprintf(out, cap, "%s%s%s", path, path[0] ? "." : "", key);
}

static loom_status get_object(ctx *c, const json_t *obj, const char *key, const char *path,
                              json_t **out) {
    char p[256];
    join(p, sizeof p, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) return bad(c, p, "missing");
    if (!json_is_object(v)) return bad(c, p, "expected an object");
    *out = v;
    return LOOM_OK;
}

/* A number >= 0 (positive: > 0); absent is an error unless dflt is given (>= 0). */
static loom_status get_number(ctx *c, const json_t *obj, const char *key, const char *path,
                              int positive, double dflt, double *out) {
    char p[256];
    join(p, sizeof p, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (dflt >= 0) {
            *out = dflt;
            return LOOM_OK;
        }
        return bad(c, p, "missing");
    }
    if (!json_is_number(v))
        return bad(c, p, positive ? "expected a positive number" : "expected a number >= 0");
    double x = json_number_value(v);
    if (!isfinite(x) || x < 0 || (positive && x == 0))
        return bad(c, p, positive ? "expected a positive number" : "expected a number >= 0");
    *out = x;
    return LOOM_OK;
}

/* machine.corun (optional): [{"processes": k, "gemm": f, "memory": f}], k increasing. */
static loom_status parse_corun(ctx *c, const json_t *machine, loom_profile *p) {
    const json_t *a = json_object_get(machine, "corun");
    if (!a) return LOOM_OK;
    const int n = json_is_array(a) ? (int)json_array_size(a) : -1;
    if (n < 0 || n > 8) return bad(c, "machine.corun", "expected an array of at most 8 entries");
    for (int i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "machine.corun[%d]", i);
        const json_t *e = json_array_get(a, (size_t)i);
        int64_t k = 0;
        if (!json_is_object(e)) return bad(c, path, "expected an object");
        if (!loom_json_int_in(json_object_get(e, "processes"), 2, 4096, &k) ||
            (i > 0 && k <= p->corun[i - 1].processes))
            return bad(c, path, "processes: expected an integer >= 2, increasing");
        p->corun[i].processes = (int)k;
        loom_status st = get_number(c, e, "gemm", path, 1, -1, &p->corun[i].gemm);
        if (!st) st = get_number(c, e, "memory", path, 1, -1, &p->corun[i].memory);
        if (st) return st;
        if (p->corun[i].gemm > 16 || p->corun[i].memory > 16)
            return bad(c, path, "gemm and memory: expected slowdowns in (0, 16]");
    }
    p->n_corun = n;
    return LOOM_OK;
}

static loom_status check_sources(ctx *c, const json_t *obj, const char *path) {
    if (!c->published) return LOOM_OK;
    char p[256];
    join(p, sizeof p, path, "sources");
    const json_t *v = json_object_get(obj, "sources");
    if (!v) return bad(c, p, "missing (a published profile cites a source for every term)");
    if (json_is_string(v) && json_string_length(v) > 0) return LOOM_OK;
    if (json_is_array(v) && json_array_size(v) > 0) return LOOM_OK;
    return bad(c, p, "expected a non-empty string or array");
}

/* An increasing array of positive numbers; *n its length (>= 1). */
static loom_status get_axis(ctx *c, const json_t *obj, const char *key, const char *path,
                            double **out, int *n) {
    char p[256];
    join(p, sizeof p, path, key);
    const json_t *v = json_object_get(obj, key);
    if (!v) return bad(c, p, "missing");
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > 4096)
        return bad(c, p, "expected a non-empty array of increasing positive numbers");
    size_t len = json_array_size(v);
    double *a = malloc(len * sizeof *a);
    if (!a)
        return loom_error_set(c->r.err, LOOM_ERR_NOMEM, "%s: %s: out of memory", c->r.origin, p);
    for (size_t i = 0; i < len; i++) {
        const json_t *e = json_array_get(v, i);
        double x = json_is_number(e) ? json_number_value(e) : -1;
        if (!isfinite(x) || x <= 0 || (i > 0 && x <= a[i - 1])) {
            free(a);
            return bad(c, p, "expected a non-empty array of increasing positive numbers");
        }
        a[i] = x;
    }
    *out = a;
    *n = (int)len;
    return LOOM_OK;
}

/* An array of exactly n positive numbers. */
static loom_status get_values(ctx *c, const json_t *obj, const char *key, const char *path,
                              size_t n, double **out) {
    char p[256];
    join(p, sizeof p, path, key);
    const json_t *v = json_object_get(obj, key);
    if (!v) return bad(c, p, "missing");
    if (!json_is_array(v) || json_array_size(v) != n) {
        char what[96];
        snprintf(what, sizeof what, "expected an array of %zu positive numbers (the grid's size)",
                 n);
        return bad(c, p, what);
    }
    double *a = malloc(n * sizeof *a);
    if (!a)
        return loom_error_set(c->r.err, LOOM_ERR_NOMEM, "%s: %s: out of memory", c->r.origin, p);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        double x = json_is_number(e) ? json_number_value(e) : -1;
        if (!isfinite(x) || x <= 0) {
            free(a);
            char q[288];
            snprintf(q, sizeof q, "%s[%zu]", p, i);
            return bad(c, q, "expected a positive number");
        }
        a[i] = x;
    }
    *out = a;
    return LOOM_OK;
}

/* Optional measured evidence: [[x > 0, us >= 0], ...]. */
static loom_status check_points(ctx *c, const json_t *obj, const char *path) {
    const json_t *v = json_object_get(obj, "points");
    if (!v) return LOOM_OK;
    char p[256];
    join(p, sizeof p, path, "points");
    if (!json_is_array(v)) return bad(c, p, "expected an array of [x, microseconds] pairs");
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        const json_t *x = json_array_get(e, 0), *t = json_array_get(e, 1);
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_number(x) ||
            !json_is_number(t) || json_number_value(x) <= 0 || json_number_value(t) < 0) {
            char q[288];
            snprintf(q, sizeof q, "%s[%zu]", p, i);
            return bad(c, q, "expected [x > 0, microseconds >= 0]");
        }
    }
    return LOOM_OK;
}

static loom_status parse_gemm(ctx *c, const json_t *obj, const char *path, gemm_term *g) {
    loom_status st = check_sources(c, obj, path);
    if (!st) st = get_number(c, obj, "peak_gflops", path, 1, -1, &g->peak_gflops);
    if (!st) st = get_number(c, obj, "efficiency", path, 1, 1.0, &g->efficiency);
    if (!st && g->efficiency > 1) {
        char p[256];
        join(p, sizeof p, path, "efficiency");
        return bad(c, p, "expected a number in (0, 1]");
    }
    if (!st) st = get_number(c, obj, "latency_us", path, 0, -1, &g->latency_us);
    if (!st) st = get_number(c, obj, "half_dim", path, 0, -1, &g->half_dim);
    if (st) return st;
    const json_t *grid = json_object_get(obj, "grid");
    if (!grid) return LOOM_OK;
    char gp[256];
    join(gp, sizeof gp, path, "grid");
    if (!json_is_object(grid)) return bad(c, gp, "expected an object");
    static const char *axes[3] = {"M", "N", "K"};
    for (int a = 0; a < 3 && !st; a++) st = get_axis(c, grid, axes[a], gp, &g->axis[a], &g->n[a]);
    if (!st)
        st = get_values(c, grid, "gflops", gp, (size_t)g->n[0] * g->n[1] * g->n[2], &g->gflops);
    return st;
}

static loom_status parse_attention(ctx *c, const json_t *obj, const char *path, attention_term *a) {
    loom_status st = check_sources(c, obj, path);
    if (st) return st;
    const json_t *grid = json_object_get(obj, "grid");
    if (json_object_get(obj, "gflops") || !grid) {
        a->has_model = 1;
        st = get_number(c, obj, "gflops", path, 1, -1, &a->gflops);
        if (!st) st = get_number(c, obj, "latency_us", path, 0, 0.0, &a->latency_us);
        if (st) return st;
    }
    if (!grid) return LOOM_OK;
    char gp[256];
    join(gp, sizeof gp, path, "grid");
    if (!json_is_object(grid)) return bad(c, gp, "expected an object");
    st = get_axis(c, grid, "T", gp, &a->T, &a->nT);
    if (!st) st = get_axis(c, grid, "hd", gp, &a->hd, &a->nh);
    if (!st) st = get_values(c, grid, "us_per_head", gp, (size_t)a->nT * a->nh, &a->us_per_head);
    return st;
}

/* unit "gbps": x in bytes at GB/s (1e9 bytes/s); "ns_per_param": x in parameters. */
static loom_status parse_line(ctx *c, const json_t *obj, const char *path, const char *unit,
                              line_term *l) {
    loom_status st = check_sources(c, obj, path);
    double r = 0;
    if (!st) st = get_number(c, obj, "alpha_us", path, 0, -1, &l->alpha_us);
    if (!st) st = get_number(c, obj, unit, path, 1, -1, &r);
    if (!st) st = check_points(c, obj, path);
    if (st) return st;
    l->per_unit_ms = strcmp(unit, "gbps") == 0 ? 1.0 / (r * 1e6) : r * 1e-6;
    return LOOM_OK;
}

static loom_status parse_compute(ctx *c, const json_t *obj, const char *path, compute_entry *e) {
    char p[256];
    join(p, sizeof p, path, "threads");
    int64_t threads = 0;
    if (!json_object_get(obj, "threads")) return bad(c, p, "missing");
    if (!loom_json_int_in(json_object_get(obj, "threads"), 1, 4096, &threads))
        return bad(c, p, "expected an integer in [1, 4096]");
    e->threads = (int)threads;
    json_t *gemm, *att, *ew, *adamw;
    char gp[256];
    loom_status st = get_object(c, obj, "gemm", path, &gemm);
    join(gp, sizeof gp, path, "gemm");
    for (int i = 0; i < LOOM_GEMM_OPS && !st; i++) {
        json_t *o;
        char q[256];
        join(q, sizeof q, gp, gemm_names[i]);
        st = get_object(c, gemm, gemm_names[i], gp, &o);
        if (!st) st = parse_gemm(c, o, q, &e->gemm[i]);
    }
    const json_t *bf = json_object_get(obj, "gemm_bf16");
    if (!st && bf) { /* optional: profiles calibrated before bf16, or without bf16 CPUs */
        json_t *o;
        join(gp, sizeof gp, path, "gemm_bf16");
        if (!json_is_object(bf)) return bad(c, gp, "expected an object");
        for (int i = 0; i < LOOM_GEMM_OPS && !st; i++) {
            char q[256];
            join(q, sizeof q, gp, gemm_names[i]);
            st = get_object(c, bf, gemm_names[i], gp, &o);
            if (!st) st = parse_gemm(c, o, q, &e->gemm_bf16[i]);
        }
        e->has_bf16 = !st;
    }
    if (!st) st = get_object(c, obj, "attention", path, &att);
    join(gp, sizeof gp, path, "attention");
    for (int i = 0; i < LOOM_ATT_KINDS && !st; i++) {
        json_t *o;
        char q[256];
        join(q, sizeof q, gp, att_names[i]);
        st = get_object(c, att, att_names[i], gp, &o);
        if (!st) st = parse_attention(c, o, q, &e->att[i]);
    }
    if (!st) st = get_object(c, obj, "elementwise", path, &ew);
    join(gp, sizeof gp, path, "elementwise");
    for (int i = 0; i < LOOM_EW_KINDS && !st; i++) {
        json_t *o;
        char q[256];
        join(q, sizeof q, gp, ew_names[i]);
        st = get_object(c, ew, ew_names[i], gp, &o);
        if (!st) st = parse_line(c, o, q, "gbps", &e->ew[i]);
    }
    if (!st) st = get_object(c, obj, "adamw", path, &adamw);
    join(gp, sizeof gp, path, "adamw");
    if (!st) st = parse_line(c, adamw, gp, "ns_per_param", &e->adamw);
    return st;
}

static loom_status parse_collective(ctx *c, const json_t *obj, const char *path,
                                    collective_entry *e) {
    if (!json_is_object(obj)) return bad(c, path, "expected an object");
    char p[256];
    join(p, sizeof p, path, "kind");
    const char *kind = json_string_value(json_object_get(obj, "kind"));
    if (!json_object_get(obj, "kind")) return bad(c, p, "missing");
    int k = -1;
    for (int i = 0; kind && i < LOOM_COLL_KINDS; i++)
        if (strcmp(kind, coll_names[i]) == 0) k = i;
    if (k < 0)
        return bad(c, p,
                   "expected one of allreduce, reduce_scatter, allgather, alltoall, sendrecv");
    e->kind = (loom_collective_kind)k;
    join(p, sizeof p, path, "group");
    int64_t group = 0;
    if (!json_object_get(obj, "group")) return bad(c, p, "missing");
    if (!loom_json_int_in(json_object_get(obj, "group"), 2, 1 << 24, &group))
        return bad(c, p, "expected an integer >= 2");
    e->group = (int)group;
    join(p, sizeof p, path, "placement");
    const json_t *pl = json_object_get(obj, "placement");
    e->place = LOOM_PLACE_INTRA;
    if (pl) {
        const char *s = json_string_value(pl);
        if (s && strcmp(s, "intra_node") == 0)
            e->place = LOOM_PLACE_INTRA;
        else if (s && strcmp(s, "inter_node") == 0)
            e->place = LOOM_PLACE_INTER;
        else
            return bad(c, p, "expected \"intra_node\" or \"inter_node\"");
    }
    loom_status st = check_sources(c, obj, path);
    if (!st) st = get_number(c, obj, "alpha_us", path, 0, -1, &e->alpha_us);
    if (!st) st = get_number(c, obj, "busbw_gbs", path, 1, -1, &e->busbw_gbs);
    if (!st) st = check_points(c, obj, path);
    return st;
}

static loom_status parse_root(ctx *c, const json_t *root, loom_profile *p) {
    if (!json_is_object(root)) return bad(c, "(top level)", "expected an object");
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, "loom-profile") != 0)
        return bad(c, "format", "expected \"loom-profile\"");
    int64_t version = 0;
    if (!loom_json_int_in(json_object_get(root, "version"), 1, 1, &version))
        return bad(c, "version", "expected 1");
    const char *name = json_string_value(json_object_get(root, "name"));
    if (!name || !name[0]) return bad(c, "name", "expected a non-empty string");
    snprintf(p->name, sizeof p->name, "%s", name);
    const char *source = json_string_value(json_object_get(root, "source"));
    if (!source || (strcmp(source, "measured") != 0 && strcmp(source, "published") != 0))
        return bad(c, "source", "expected \"measured\" or \"published\"");
    snprintf(p->source, sizeof p->source, "%s", source);
    c->published = strcmp(source, "published") == 0;

    json_t *machine, *engine;
    loom_status st = get_object(c, root, "machine", "", &machine);
    if (!st) st = check_sources(c, machine, "machine");
    double gib = 0, dpn = 0;
    if (!st) st = get_number(c, machine, "memory_gib", "machine", 1, -1, &gib);
    if (!st) st = get_number(c, machine, "devices_per_node", "machine", 1, -1, &dpn);
    if (!st && (dpn != floor(dpn) || dpn > 4096))
        return bad(c, "machine.devices_per_node", "expected an integer in [1, 4096]");
    if (st) return st;
    p->memory_bytes = gib * 1073741824.0;
    p->devices_per_node = (int)dpn;
    const json_t *shared = json_object_get(machine, "memory_shared");
    if (shared && !json_is_boolean(shared))
        return bad(c, "machine.memory_shared", "expected true or false");
    p->memory_shared = shared && json_is_true(shared);
    st = get_number(c, machine, "refault_gbps", "machine", 0, 0.0, &p->refault_gbps);
    if (!st) st = parse_corun(c, machine, p);
    if (st) return st;

    const json_t *compute = json_object_get(root, "compute");
    if (!compute) return bad(c, "compute", "missing");
    if (!json_is_array(compute) || json_array_size(compute) == 0 || json_array_size(compute) > 64)
        return bad(c, "compute", "expected a non-empty array (one entry per thread count)");
    p->n_compute = (int)json_array_size(compute);
    p->compute = calloc((size_t)p->n_compute, sizeof *p->compute);
    if (!p->compute)
        return loom_error_set(c->r.err, LOOM_ERR_NOMEM, "%s: out of memory", c->r.origin);
    for (int i = 0; i < p->n_compute && !st; i++) {
        char path[64];
        snprintf(path, sizeof path, "compute[%d]", i);
        const json_t *e = json_array_get(compute, (size_t)i);
        if (!json_is_object(e)) return bad(c, path, "expected an object");
        st = parse_compute(c, e, path, &p->compute[i]);
        for (int j = 0; j < i && !st; j++)
            if (p->compute[j].threads == p->compute[i].threads) {
                snprintf(path, sizeof path, "compute[%d].threads", i);
                return bad(c, path, "two entries for the same thread count");
            }
    }
    if (st) return st;

    const json_t *coll = json_object_get(root, "collectives");
    if (!coll) return bad(c, "collectives", "missing");
    if (!json_is_array(coll)) return bad(c, "collectives", "expected an array");
    p->n_coll = (int)json_array_size(coll);
    p->coll = calloc((size_t)p->n_coll + 1, sizeof *p->coll);
    if (!p->coll) return loom_error_set(c->r.err, LOOM_ERR_NOMEM, "%s: out of memory", c->r.origin);
    for (int i = 0; i < p->n_coll && !st; i++) {
        char path[64];
        snprintf(path, sizeof path, "collectives[%d]", i);
        st = parse_collective(c, json_array_get(coll, (size_t)i), path, &p->coll[i]);
        for (int j = 0; j < i && !st; j++)
            if (p->coll[j].kind == p->coll[i].kind && p->coll[j].group == p->coll[i].group &&
                p->coll[j].place == p->coll[i].place)
                return bad(c, path, "a second entry for the same kind, group and placement");
    }
    if (st) return st;
    for (int k = 0; k < LOOM_COLL_KINDS; k++) {
        int found = 0;
        for (int i = 0; i < p->n_coll; i++) found |= p->coll[i].kind == (loom_collective_kind)k;
        if (!found) {
            char what[96];
            snprintf(what, sizeof what, "no entry of kind \"%s\"", coll_names[k]);
            return bad(c, "collectives", what);
        }
    }
    st = get_object(c, root, "engine", "", &engine);
    if (!st) st = check_sources(c, engine, "engine");
    if (!st) st = get_number(c, engine, "cpu_us_per_op", "engine", 0, -1, &p->engine_cpu_us);
    if (!st)
        st = get_number(c, engine, "cpu_us_per_mib", "engine", 0, 0.0, &p->engine_cpu_us_per_mib);
    if (!st) st = get_number(c, engine, "post_us", "engine", 0, -1, &p->engine_post_us);
    return st;
}

loom_status loom_profile_parse(loom_profile **out, const char *text, const char *name,
                               loom_error *err) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: not valid JSON (line %d: %s)", name,
                              jerr.line, jerr.text);
    loom_profile *p = calloc(1, sizeof *p);
    if (!p) {
        json_decref(root);
        return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", name);
    }
    ctx c = {{name, NULL, err}, 0};
    loom_status st = parse_root(&c, root, p);
    json_decref(root);
    if (st) {
        loom_profile_free(p);
        return st;
    }
    *out = p;
    return LOOM_OK;
}

loom_status loom_profile_load(loom_profile **out, const char *path, loom_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return loom_error_set(err, LOOM_ERR_INPUT, "%s: cannot open the profile", path);
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 131072;
            char *t = realloc(text, cap);
            if (!t) {
                free(text);
                fclose(f);
                return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
            }
            text = t;
        }
        size_t n = fread(text + len, 1, 65536, f);
        len += n;
        if (n < 65536) break;
    }
    int bad_read = ferror(f);
    fclose(f);
    if (bad_read) {
        free(text);
        return loom_error_set(err, LOOM_ERR_IO, "%s: read failed", path);
    }
    text[len] = 0;
    loom_status st = loom_profile_parse(out, text, path, err);
    free(text);
    return st;
}

void loom_profile_free(loom_profile *p) {
    if (!p) return;
    for (int i = 0; i < p->n_compute; i++) {
        compute_entry *e = &p->compute[i];
        for (int g = 0; g < LOOM_GEMM_OPS; g++) {
            for (int a = 0; a < 3; a++) free(e->gemm[g].axis[a]), free(e->gemm_bf16[g].axis[a]);
            free(e->gemm[g].gflops);
            free(e->gemm_bf16[g].gflops);
        }
        for (int a = 0; a < LOOM_ATT_KINDS; a++) {
            free(e->att[a].T);
            free(e->att[a].hd);
            free(e->att[a].us_per_head);
        }
    }
    free(p->compute);
    free(p->coll);
    free(p);
}

const char *loom_profile_name(const loom_profile *p) {
    return p->name;
}
const char *loom_profile_source(const loom_profile *p) {
    return p->source;
}
double loom_profile_memory_bytes(const loom_profile *p, int ranks_per_node) {
    return p->memory_shared && ranks_per_node > 1 ? p->memory_bytes / ranks_per_node
                                                  : p->memory_bytes;
}
int loom_profile_devices_per_node(const loom_profile *p) {
    return p->devices_per_node;
}
double loom_profile_engine_cpu_us(const loom_profile *p, double bytes) {
    return p->engine_cpu_us + (bytes > 0 ? bytes / 1048576.0 * p->engine_cpu_us_per_mib : 0);
}
void loom_profile_corun(const loom_profile *p, double busy, double *gemm, double *memory) {
    /* linear in the busy processes from (1, 1) through the measured points, flat after */
    double k0 = 1, g0 = 1, m0 = 1;
    *gemm = *memory = 1;
    for (int i = 0; i < p->n_corun && busy > k0; i++) {
        const double k1 = p->corun[i].processes, g1 = p->corun[i].gemm, m1 = p->corun[i].memory;
        const double w = busy >= k1 ? 1.0 : (busy - k0) / (k1 - k0);
        *gemm = g0 + w * (g1 - g0), *memory = m0 + w * (m1 - m0);
        k0 = k1, g0 = g1, m0 = m1;
    }
}

double loom_profile_refault_ms(const loom_profile *p, double bytes) {
    return p->refault_gbps > 0 && bytes > 0 ? bytes / (p->refault_gbps * 1e6) : 0;
}

double loom_profile_engine_post_us(const loom_profile *p) {
    return p->engine_post_us;
}

/* ---- lookups ---- */

static const compute_entry *entry_for(const loom_profile *p, int threads) {
    const compute_entry *best = NULL, *fewest = &p->compute[0];
    for (int i = 0; i < p->n_compute; i++) {
        const compute_entry *e = &p->compute[i];
        if (e->threads <= threads && (!best || e->threads > best->threads)) best = e;
        if (e->threads < fewest->threads) fewest = e;
    }
    return best ? best : fewest;
}

double loom_profile_gemm_peak_gflops(const loom_profile *p, loom_gemm_op op, int threads) {
    if (!p || op < 0 || op >= LOOM_GEMM_OPS) return 0;
    return entry_for(p, threads)->gemm[op].peak_gflops;
}

/* Index i and weight w of x between axis[i] and axis[i+1] in log space; w may fall outside
 * [0, 1] (extrapolation along the edge segment) when allowed. n == 1: i = 0, w = 0. */
static void bracket(const double *axis, int n, double x, int *i, double *w) {
    *i = 0;
    *w = 0;
    if (n == 1) return;
    int j = 0;
    while (j < n - 2 && x > axis[j + 1]) j++;
    *i = j;
    *w = (log(x) - log(axis[j])) / (log(axis[j + 1]) - log(axis[j]));
}

static double clamp_to(const double *axis, int n, double x) {
    return fmin(fmax(x, axis[0]), axis[n - 1]);
}

static loom_status check_dims(loom_error *err, const char *what, double a, double b, double c) {
    if (!(a > 0 && b > 0 && c > 0 && isfinite(a) && isfinite(b) && isfinite(c)))
        return loom_error_set(err, LOOM_ERR_INPUT, "%s: dimensions must be positive", what);
    return LOOM_OK;
}

/* The measured rate at (M, N, K) inside the grid: trilinear in log space, GFLOP/s. */
static double grid_rate(const gemm_term *g, const double d[3]) {
    int idx[3];
    double w[3];
    for (int a = 0; a < 3; a++) bracket(g->axis[a], g->n[a], d[a], &idx[a], &w[a]);
    double logr = 0;
    for (int corner = 0; corner < 8; corner++) {
        double wt = 1;
        int at[3];
        for (int a = 0; a < 3; a++) {
            int hi = (corner >> a) & 1;
            if (hi && g->n[a] == 1) wt = 0;
            at[a] = idx[a] + (g->n[a] == 1 ? 0 : hi);
            wt *= hi ? w[a] : 1 - w[a];
        }
        if (wt == 0) continue;
        logr += wt * log(g->gflops[((size_t)at[0] * g->n[1] + at[1]) * g->n[2] + at[2]]);
    }
    return exp(logr);
}

/* The curve's work term: FLOPs stretched by the smallest dimension's shortfall. */
static double curve_work(const gemm_term *g, double M, double N, double K) {
    return 2.0 * M * N * K * (1 + g->half_dim / fmin(M, fmin(N, K)));
}

/* One GEMM term's time, ms. Inside the grid its measured rate. Outside it the curve's
 * shape through the grid's nearest shape (each dimension clamped into the grid): a
 * vocabulary-wide head (128 x 32,000 x 128) then runs at the rate measured at the
 * grid's widest N, as it does on a CPU (29.6 against 33.0 GFLOP/s at N 1,024, one
 * thread here), where the fitted curve alone priced it 29% fast (docs/PROFILE.md). */
static double term_ms(const gemm_term *g, double M, double N, double K) {
    const double latency_ms = g->latency_us * 1e-3;
    if (!g->gflops) {
        const double rate = g->peak_gflops * g->efficiency;
        return latency_ms + curve_work(g, M, N, K) / (rate * 1e6);
    }
    const double d[3] = {M, N, K};
    double c[3];
    for (int a = 0; a < 3; a++) c[a] = clamp_to(g->axis[a], g->n[a], d[a]);
    const double at_grid = 2.0 * c[0] * c[1] * c[2] / (grid_rate(g, c) * 1e6);
    if (c[0] == M && c[1] == N && c[2] == K) return at_grid;
    const double lat = fmin(latency_ms, at_grid / 2); /* a fit's latency never the whole call */
    return lat + (at_grid - lat) * curve_work(g, M, N, K) / curve_work(g, c[0], c[1], c[2]);
}

loom_status loom_profile_gemm_ms(const loom_profile *p, loom_gemm_op op, double M, double N,
                                 double K, int threads, double *ms, loom_error *err) {
    if (op < 0 || op >= LOOM_GEMM_OPS)
        return loom_error_set(err, LOOM_ERR_INPUT, "gemm lookup: unknown op %d", (int)op);
    loom_status st = check_dims(err, "gemm lookup", M, N, K);
    if (st) return st;
    *ms = term_ms(&entry_for(p, threads)->gemm[op], M, N, K);
    return LOOM_OK;
}

int loom_profile_has_gemm_bf16(const loom_profile *p, int threads) {
    return p && entry_for(p, threads)->has_bf16;
}

loom_status loom_profile_gemm_bf16_ms(const loom_profile *p, loom_gemm_op op, double M, double N,
                                      double K, int threads, double *ms, loom_error *err) {
    if (op < 0 || op >= LOOM_GEMM_OPS)
        return loom_error_set(err, LOOM_ERR_INPUT, "gemm lookup: unknown op %d", (int)op);
    loom_status st = check_dims(err, "gemm lookup", M, N, K);
    if (st) return st;
    const compute_entry *e = entry_for(p, threads);
    if (!e->has_bf16)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--precision bf16: profile %s has no gemm_bf16 for %d thread(s) "
                              "(measured before bf16, or on a CPU without it: run loom calibrate "
                              "on a CPU with AVX512-BF16; docs/PROFILE.md)",
                              loom_profile_name(p), e->threads);
    *ms = term_ms(&e->gemm_bf16[op], M, N, K);
    return LOOM_OK;
}

/* Floating-point work of one (sample, head) of kind k, for the model form. */
static double attention_flops(loom_attention_kind k, double T, double hd) {
    double full = 4.0 * T * T * hd; /* Q K^T and P V over every (query, key) pair */
    switch (k) {
    case LOOM_ATT_CAUSAL_FWD:
        return full / 2;
    case LOOM_ATT_CAUSAL_BWD:
        return 2.5 * full / 2; /* five matmuls against two */
    case LOOM_ATT_BIDIR_BWD:
    case LOOM_ATT_BLOCK_BWD:
        return 2.5 * full;
    default:
        return full;
    }
}

loom_status loom_profile_attention_ms(const loom_profile *p, loom_attention_kind k, double heads,
                                      double T, double hd, int threads, double *ms,
                                      loom_error *err) {
    if (k < 0 || k >= LOOM_ATT_KINDS)
        return loom_error_set(err, LOOM_ERR_INPUT, "attention lookup: unknown kind %d", (int)k);
    loom_status st = check_dims(err, "attention lookup", heads, T, hd);
    if (st) return st;
    const attention_term *a = &entry_for(p, threads)->att[k];
    if (a->us_per_head) {
        /* bilinear in (log T, log hd) of log time, extrapolated along the edge segments;
         * an axis of one point scales as T^2 (attention's pairs) or hd^1 */
        int i, j;
        double wi, wj;
        bracket(a->T, a->nT, T, &i, &wi);
        bracket(a->hd, a->nh, hd, &j, &wj);
        double lt = 0;
        for (int ci = 0; ci < 2; ci++)
            for (int cj = 0; cj < 2; cj++) {
                if ((ci && a->nT == 1) || (cj && a->nh == 1)) continue;
                double wt = (ci ? wi : 1 - wi) * (cj ? wj : 1 - wj);
                lt += wt * log(a->us_per_head[(size_t)(i + ci) * a->nh + (j + cj)]);
            }
        if (a->nT == 1) lt += 2 * log(T / a->T[0]);
        if (a->nh == 1) lt += log(hd / a->hd[0]);
        *ms = heads * exp(lt) * 1e-3;
        return LOOM_OK;
    }
    *ms = a->latency_us * 1e-3 + heads * attention_flops(k, T, hd) / (a->gflops * 1e6);
    return LOOM_OK;
}

loom_status loom_profile_elementwise_ms(const loom_profile *p, loom_elementwise_kind k,
                                        double bytes, int threads, double *ms, loom_error *err) {
    if (k < 0 || k >= LOOM_EW_KINDS)
        return loom_error_set(err, LOOM_ERR_INPUT, "elementwise lookup: unknown kind %d", (int)k);
    if (!(bytes >= 0) || !isfinite(bytes))
        return loom_error_set(err, LOOM_ERR_INPUT, "elementwise lookup: bytes must be >= 0");
    const line_term *l = &entry_for(p, threads)->ew[k];
    *ms = bytes == 0 ? 0 : l->alpha_us * 1e-3 + bytes * l->per_unit_ms;
    return LOOM_OK;
}

loom_status loom_profile_adamw_ms(const loom_profile *p, double params, int threads, double *ms,
                                  loom_error *err) {
    if (!(params >= 0) || !isfinite(params))
        return loom_error_set(err, LOOM_ERR_INPUT, "adamw lookup: parameters must be >= 0");
    const line_term *l = &entry_for(p, threads)->adamw;
    *ms = params == 0 ? 0 : l->alpha_us * 1e-3 + params * l->per_unit_ms;
    return LOOM_OK;
}

loom_status loom_profile_collective_ms(const loom_profile *p, loom_collective_kind k, int group,
                                       loom_placement place, double bytes, double *ms,
                                       loom_error *err) {
    if (k < 0 || k >= LOOM_COLL_KINDS)
        return loom_error_set(err, LOOM_ERR_INPUT, "collective lookup: unknown kind %d", (int)k);
    if (!(bytes >= 0) || !isfinite(bytes) || group < 1)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "collective lookup: group must be >= 1 and bytes >= 0");
    if (group == 1 || bytes == 0) {
        *ms = 0;
        return LOOM_OK;
    }
    /* exact group (intra first under ANY), else interpolation in log(group) between the
     * nearest smaller and larger groups, else the nearest one */
    const collective_entry *exact = NULL, *lo = NULL, *hi = NULL;
    for (int i = 0; i < p->n_coll; i++) {
        const collective_entry *e = &p->coll[i];
        if (e->kind != k || (place != LOOM_PLACE_ANY && e->place != place)) continue;
        if (e->group == group) {
            if (!exact || (exact->place == LOOM_PLACE_INTER && e->place == LOOM_PLACE_INTRA))
                exact = e;
        } else if (e->group < group) {
            if (!lo || e->group > lo->group ||
                (e->group == lo->group && e->place == LOOM_PLACE_INTRA))
                lo = e;
        } else if (!hi || e->group < hi->group ||
                   (e->group == hi->group && e->place == LOOM_PLACE_INTRA)) {
            hi = e;
        }
    }
    double alpha, busbw;
    if (exact) {
        alpha = exact->alpha_us, busbw = exact->busbw_gbs;
    } else if (lo && hi) {
        double w = (log((double)group) - log((double)lo->group)) /
                   (log((double)hi->group) - log((double)lo->group));
        alpha = lo->alpha_us + w * (hi->alpha_us - lo->alpha_us);
        busbw = lo->busbw_gbs + w * (hi->busbw_gbs - lo->busbw_gbs);
    } else if (lo || hi) {
        const collective_entry *e = lo ? lo : hi;
        alpha = e->alpha_us, busbw = e->busbw_gbs;
    } else {
        return loom_error_set(err, LOOM_ERR_INPUT, "profile %s: no %s entry for %s groups", p->name,
                              coll_names[k],
                              place == LOOM_PLACE_INTER ? "inter_node" : "intra_node");
    }
    *ms = alpha * 1e-3 + bytes * loom_collective_bus_factor(k, group) / (busbw * 1e6);
    return LOOM_OK;
}
