#include "rl/reward.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rl/countdown.h"

/* A decimal number of at most 18 digits at s[*i]; -1 if none. */
static int64_t number(const char *s, size_t n, size_t *i) {
    int64_t v = 0;
    size_t start = *i;
    while (*i < n && s[*i] >= '0' && s[*i] <= '9' && *i - start < 18)
        v = v * 10 + (s[(*i)++] - '0');
    return *i > start ? v : -1;
}

float loom_reward_arith(const char *prompt, size_t prompt_len, const char *completion,
                        size_t completion_len) {
    const float countdown = loom_reward_countdown(prompt, prompt_len, completion, completion_len);
    if (countdown >= 0.0f) return countdown;
    size_t i = 0;
    int64_t a = number(prompt, prompt_len, &i);
    if (a < 0 || i >= prompt_len) return 0.0f;
    char op = prompt[i++];
    int64_t b = number(prompt, prompt_len, &i);
    if (b < 0 || i + 1 != prompt_len || prompt[i] != '=' || (op != '+' && op != '*')) return 0.0f;
    char want[48];
    int len = snprintf(
        want, sizeof want, "%llu\n",
        (unsigned long long)(op == '+' ? (uint64_t)a + (uint64_t)b : (uint64_t)a * (uint64_t)b));
    return (size_t)len == completion_len && memcmp(want, completion, completion_len) == 0 ? 1.0f
                                                                                          : 0.0f;
}

/* Length of the valid UTF-8 sequence at s[0..n) (RFC 3629: no overlong form, surrogate
 * or code point past U+10FFFF, as jansson checks), 0 if none. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    const unsigned c = s[0];
    size_t k = c < 0x80                 ? 1
               : c >= 0xc2 && c <= 0xdf ? 2
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
    if (k == 0 || k > n) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    const unsigned d = k > 1 ? s[1] : 0x80;
    if ((c == 0xe0 && d < 0xa0) || (c == 0xed && d > 0x9f) || (c == 0xf0 && d < 0x90) ||
        (c == 0xf4 && d > 0x8f))
        return 0;
    return k;
}

/* s[0..n) as UTF-8, each byte outside a valid sequence replaced by U+FFFD; malloc'd. */
static char *utf8_clean(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(3 * n + 1);
    size_t j = 0;
    for (size_t i = 0; o && i < n;) {
        size_t k = utf8_len((const unsigned char *)s + i, n - i);
        if (k && !(k == 1 && s[i] == 0)) {
            memcpy(o + j, s + i, k);
            i += k, j += k;
        } else {
            memcpy(o + j, "\xef\xbf\xbd", 3);
            i++, j += 3;
        }
    }
    *out_len = j;
    return o;
}

loom_status loom_reward_cmd(const char *cmd, int n, const char *const *prompt,
                            const size_t *prompt_len, const char *const *completion,
                            const size_t *completion_len, float *reward, loom_error *err) {
    /* The pairs go through a file (no pipe deadlock with a command that writes as it
     * reads); its stdout is read through a pipe. */
    char path[] = "/tmp/loom_reward_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return loom_error_set(err, LOOM_ERR_IO, "--reward-cmd: cannot create its input file: %s",
                              strerror(errno));
    FILE *in = fdopen(fd, "w");
    loom_status st = LOOM_OK;
    for (int i = 0; in && i < n && !st; i++) {
        size_t pl, cl;
        char *p = utf8_clean(prompt[i], prompt_len[i], &pl);
        char *c = utf8_clean(completion[i], completion_len[i], &cl);
        json_t *o = p && c ? json_pack("{s:s%,s:s%}", "prompt", p, pl, "completion", c, cl) : NULL;
        free(p);
        free(c);
        char *line = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        if (!line || fprintf(in, "%s\n", line) < 0)
            st = loom_error_set(err, LOOM_ERR_IO, "--reward-cmd: cannot write its input");
        free(line);
        json_decref(o);
    }
    if (!in || fclose(in)) {
        if (!st) st = loom_error_set(err, LOOM_ERR_IO, "--reward-cmd: cannot write its input");
    }
    if (st) {
        unlink(path);
        return st;
    }
    size_t cap = strlen(cmd) + strlen(path) + 32;
    char *full = malloc(cap);
    if (!full) {
        unlink(path);
        return loom_error_set(err, LOOM_ERR_NOMEM, "--reward-cmd: out of memory");
    }
    snprintf(full, cap, "(%s) < %s", cmd, path);
    FILE *out = popen(full, "r");
    free(full);
    if (!out) {
        unlink(path);
        return loom_error_set(err, LOOM_ERR_IO, "--reward-cmd: cannot start: %s", strerror(errno));
    }
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int got = 0;
    while ((len = getline(&line, &lcap, out)) >= 0) {
        if (st) continue; /* drain the pipe */
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        char *end;
        errno = 0;
        double v = strtod(line, &end);
        while (*end == ' ' || *end == '\t') end++;
        if (got >= n)
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "--reward-cmd: output line %d: more lines than the %d completions",
                                got + 1, n);
        else if (len == 0 || end == line || *end || !isfinite(v))
            st = loom_error_set(err, LOOM_ERR_INPUT,
                                "--reward-cmd: output line %d: '%.60s' is not a finite number",
                                got + 1, line);
        else
            reward[got++] = (float)v;
    }
    free(line);
    int status = pclose(out);
    unlink(path);
    if (st) return st;
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--reward-cmd: '%s' failed (exit status %d) at output line %d", cmd,
                              WIFEXITED(status) ? WEXITSTATUS(status) : -1, got + 1);
    if (got != n)
        return loom_error_set(err, LOOM_ERR_INPUT,
                              "--reward-cmd: %d output lines for %d completions (line %d missing)",
                              got, n, got + 1);
    return LOOM_OK;
}
