#include "rl/countdown.h"

#include <stdio.h>
#include <string.h>

#include "core/philox.h"

#define CD_SPLIT_STREAM 0x63647370u /* "cdsp": which instances are held out */
#define CD_TRAIN_STREAM 0x63647472u /* draws of the training instances */
#define CD_VAL_STREAM 0x63647661u   /* draws of the held-out instances */

/* Values stay below 2^40 in magnitude (numerators and denominators): products of two
 * never overflow int64 before the check. */
#define CD_LIMIT ((int64_t)1 << 40)

typedef struct {
    int64_t num, den; /* den > 0, reduced */
} rational;

static int64_t gcd64(int64_t a, int64_t b) {
    if (a < 0) a = -a;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a ? a : 1;
}

/* a op b; 0 when it is undefined (division by zero) or too large. */
static int combine(rational a, rational b, char op, rational *out) {
    int64_t n, d;
    switch (op) {
    case '+':
        n = a.num * b.den + b.num * a.den, d = a.den * b.den;
        break;
    case '-':
        n = a.num * b.den - b.num * a.den, d = a.den * b.den;
        break;
    case '*':
        n = a.num * b.num, d = a.den * b.den;
        break;
    default:
        if (b.num == 0) return 0;
        n = a.num * b.den, d = a.den * b.num;
        if (d < 0) n = -n, d = -d;
    }
    const int64_t g = gcd64(n, d);
    n /= g, d /= g;
    if (n >= CD_LIMIT || n <= -CD_LIMIT || d >= CD_LIMIT) return 0;
    *out = (rational){n, d};
    return 1;
}

static int held_out(uint64_t seed, const int *nums, int count, int target) {
    uint64_t h = (uint64_t)target;
    for (int i = 0; i < count; i++) h = h * 0x9e3779b97f4a7c15ull ^ (uint64_t)nums[i];
    return loom_philox_u64(seed, CD_SPLIT_STREAM, h, 0) % 10 == 0;
}

/* One random expression over all the numbers (attempt a's draws): pairs are joined with
 * an operator whose result is a positive integer; 0 if the draws found none. */
static int build(uint64_t seed, uint32_t stream, uint64_t k, uint32_t a, int count, int max,
                 int *nums, int *target, char *answer) {
    int64_t v[LOOM_COUNTDOWN_MAX_NUMBERS];
    char e[LOOM_COUNTDOWN_MAX_NUMBERS][96];
    uint32_t r = a * 64;
    for (int i = 0; i < count; i++) {
        nums[i] = 1 + (int)(loom_philox_u64(seed, stream, k, r++) % (uint64_t)max);
        v[i] = nums[i];
        snprintf(e[i], sizeof e[i], "%d", nums[i]);
    }
    for (int n = count; n > 1; n--) {
        const int i = (int)(loom_philox_u64(seed, stream, k, r++) % (uint64_t)n);
        int j = (int)(loom_philox_u64(seed, stream, k, r++) % (uint64_t)(n - 1));
        if (j >= i) j++;
        const char op = "+-*/"[loom_philox_u64(seed, stream, k, r++) % 4];
        int64_t x;
        if (op == '+')
            x = v[i] + v[j];
        else if (op == '-')
            x = v[i] - v[j];
        else if (op == '*')
            x = v[i] * v[j];
        else
            x = v[j] > 1 && v[i] % v[j] == 0 ? v[i] / v[j] : 0;
        if (x <= 0 || x > LOOM_COUNTDOWN_MAX_TARGET) return 0;
        char joined[96];
        const int last = n == 2;
        if (snprintf(joined, sizeof joined, last ? "%s%c%s" : "(%s%c%s)", e[i], op, e[j]) >=
            (int)sizeof joined)
            return 0;
        /* i keeps the result; the last item moves into j's place */
        v[i] = x;
        memcpy(e[i], joined, sizeof joined);
        if (j != n - 1) {
            v[j] = v[n - 1];
            memcpy(e[j], e[n - 1], sizeof e[j]);
        }
    }
    *target = (int)v[0];
    snprintf(answer, 96, "%s\n", e[0]);
    return 1;
}

void loom_countdown_draw(uint64_t seed, int val, uint64_t k, int count, int max, char *prompt,
                         char *answer) {
    const uint32_t stream = val ? CD_VAL_STREAM : CD_TRAIN_STREAM;
    int nums[LOOM_COUNTDOWN_MAX_NUMBERS], target = 0;
    for (uint32_t a = 0;; a++)
        if (build(seed, stream, k, a, count, max, nums, &target, answer) &&
            held_out(seed, nums, count, target) == val)
            break;
    int len = 0;
    for (int i = 0; i < count; i++)
        len += snprintf(prompt + len, 96 - (size_t)len, "%s%d", i ? " " : "", nums[i]);
    snprintf(prompt + len, 96 - (size_t)len, ">%d=", target);
}

/* A recursive-descent parser over the completion: expr = term (('+'|'-') term)*,
 * term = factor (('*'|'/') factor)*, factor = number | '(' expr ')'. */
typedef struct {
    const char *s;
    size_t n, i;
    int nums[LOOM_COUNTDOWN_MAX_NUMBERS], used[LOOM_COUNTDOWN_MAX_NUMBERS], count;
    int depth;
} parser;

static int expr(parser *p, rational *out);

static int factor(parser *p, rational *out) {
    if (p->i < p->n && p->s[p->i] == '(') {
        if (++p->depth > 32) return 0;
        p->i++;
        if (!expr(p, out) || p->i >= p->n || p->s[p->i] != ')') return 0;
        p->i++;
        p->depth--;
        return 1;
    }
    int64_t v = 0;
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && p->i - start < 6)
        v = v * 10 + (p->s[p->i++] - '0');
    if (p->i == start || (p->s[start] == '0' && p->i - start > 1)) return 0;
    for (int k = 0; k < p->count; k++) /* a given number not used yet */
        if (!p->used[k] && p->nums[k] == v) {
            p->used[k] = 1;
            *out = (rational){v, 1};
            return 1;
        }
    return 0;
}

static int term(parser *p, rational *out) {
    if (!factor(p, out)) return 0;
    while (p->i < p->n && (p->s[p->i] == '*' || p->s[p->i] == '/')) {
        const char op = p->s[p->i++];
        rational b;
        if (!factor(p, &b) || !combine(*out, b, op, out)) return 0;
    }
    return 1;
}

static int expr(parser *p, rational *out) {
    if (!term(p, out)) return 0;
    while (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) {
        const char op = p->s[p->i++];
        rational b;
        if (!term(p, &b) || !combine(*out, b, op, out)) return 0;
    }
    return 1;
}

float loom_reward_countdown(const char *prompt, size_t prompt_len, const char *completion,
                            size_t completion_len) {
    parser p = {0};
    size_t i = 0;
    int target = -1;
    while (i < prompt_len) { /* "N1 N2 ... Nk>T=" */
        int64_t v = 0;
        size_t start = i;
        while (i < prompt_len && prompt[i] >= '0' && prompt[i] <= '9' && i - start < 6)
            v = v * 10 + (prompt[i++] - '0');
        if (i == start || i >= prompt_len) return -1.0f;
        if (prompt[i] == ' ' && p.count < LOOM_COUNTDOWN_MAX_NUMBERS) {
            p.nums[p.count++] = (int)v;
            i++;
        } else if (prompt[i] == '>' && p.count < LOOM_COUNTDOWN_MAX_NUMBERS && target < 0) {
            p.nums[p.count++] = (int)v;
            i++;
            start = i;
            int64_t t = 0;
            while (i < prompt_len && prompt[i] >= '0' && prompt[i] <= '9' && i - start < 6)
                t = t * 10 + (prompt[i++] - '0');
            if (i == start || i + 1 != prompt_len || prompt[i] != '=') return -1.0f;
            target = (int)t;
            i++;
        } else
            return -1.0f;
    }
    if (target < 0 || p.count < 1) return -1.0f;
    if (completion_len < 2 || completion[completion_len - 1] != '\n') return 0.0f;
    p.s = completion;
    p.n = completion_len - 1;
    rational v;
    if (!expr(&p, &v) || p.i != p.n) return 0.0f;
    return v.den == 1 && v.num == target ? 1.0f : 0.0f;
}
