#include "ft/beat.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

_Static_assert(sizeof(loom_beat) < 1400, "a beat must fit one unfragmented datagram");

loom_status loom_beat_token_new(uint8_t token[LOOM_BEAT_TOKEN_BYTES], loom_error *err) {
    size_t got = 0;
    while (got < LOOM_BEAT_TOKEN_BYTES) {
        ssize_t n = getrandom(token + got, LOOM_BEAT_TOKEN_BYTES - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return loom_error_set(err, LOOM_ERR_IO, "getrandom: %s", strerror(errno));
        got += (size_t)n;
    }
    return LOOM_OK;
}

void loom_beat_token_hex(const uint8_t token[LOOM_BEAT_TOKEN_BYTES], char hex[33]) {
    for (int i = 0; i < LOOM_BEAT_TOKEN_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", token[i]);
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

loom_status loom_beat_token_parse(uint8_t token[LOOM_BEAT_TOKEN_BYTES], const char *hex,
                                  loom_error *err) {
    if (strlen(hex) != 2 * LOOM_BEAT_TOKEN_BYTES)
        return loom_error_set(err, LOOM_ERR_INPUT, "LOOM_FT_TOKEN: expected %d hex digits",
                              2 * LOOM_BEAT_TOKEN_BYTES);
    for (int i = 0; i < LOOM_BEAT_TOKEN_BYTES; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return loom_error_set(err, LOOM_ERR_INPUT, "LOOM_FT_TOKEN: expected hex digits");
        token[i] = (uint8_t)(hi << 4 | lo);
    }
    return LOOM_OK;
}

void loom_beat_fill(loom_beat *b, const uint8_t token[LOOM_BEAT_TOKEN_BYTES], int rank, int world,
                    int attempt, const char *host) {
    loom_progress_snapshot s;
    loom_progress_read(&s);
    uint32_t seq = b->seq;
    memset(b, 0, sizeof *b);
    b->magic = LOOM_BEAT_MAGIC;
    b->version = LOOM_BEAT_VERSION;
    b->size = (uint16_t)sizeof *b;
    memcpy(b->token, token, LOOM_BEAT_TOKEN_BYTES);
    b->rank = rank;
    b->world = world;
    b->attempt = attempt;
    b->pid = (int32_t)getpid();
    b->seq = seq + 1;
    b->phase = (int32_t)s.phase;
    b->steps_done = s.steps_done;
    b->nonfinite_step = s.nonfinite_step;
    b->start_step = s.start_step;
    snprintf(b->host, sizeof b->host, "%s", host);
    b->n_comms = s.n_comms;
    for (int i = 0; i < s.n_comms; i++) {
        loom_beat_comm *c = &b->comms[i];
        memcpy(c->name, s.comms[i].name, sizeof c->name);
        c->group_first = s.comms[i].group_first;
        c->group_size = s.comms[i].group_size;
        memcpy(c->started_op, s.comms[i].started_op, sizeof c->started_op);
        memcpy(c->waiting_op, s.comms[i].waiting_op, sizeof c->waiting_op);
        c->started = s.comms[i].started;
        c->waiting_seq = s.comms[i].waiting_seq;
        c->waited_ms = s.comms[i].waited_ms;
    }
    b->n_recent = s.n_recent < LOOM_BEAT_RECENT ? s.n_recent : LOOM_BEAT_RECENT;
    for (int i = 0; i < b->n_recent; i++) {
        b->recent_step[i] = s.recent[i].step;
        b->recent_loss[i] = s.recent[i].loss;
        b->recent_compute_ms[i] = s.recent[i].compute_ms;
        b->recent_local_loss[i] = s.recent[i].local_loss;
        b->recent_blocked_ms[i] = s.recent[i].blocked_ms;
    }
}

static void terminate(char *s, size_t n) {
    s[n - 1] = 0;
}

int loom_beat_accept(const void *data, size_t len, const uint8_t token[LOOM_BEAT_TOKEN_BYTES],
                     loom_beat *out) {
    if (len != sizeof *out) return 0;
    memcpy(out, data, sizeof *out);
    /* Compare the whole token without an early exit (no timing hint about a prefix). */
    unsigned diff = 0;
    for (int i = 0; i < LOOM_BEAT_TOKEN_BYTES; i++) diff |= out->token[i] ^ token[i];
    if (out->magic != LOOM_BEAT_MAGIC || out->version != LOOM_BEAT_VERSION ||
        out->size != sizeof *out || diff)
        return 0;
    if (out->rank < 0 || out->world < 1 || out->rank >= out->world || out->world > 1 << 20 ||
        out->phase < 0 || out->phase >= LOOM_PHASE_COUNT || out->n_comms < 0 ||
        out->n_comms > LOOM_PROGRESS_COMMS || out->n_recent < 0 ||
        out->n_recent > LOOM_BEAT_RECENT || out->steps_done < 0)
        return 0;
    terminate(out->host, sizeof out->host);
    terminate(out->msg, sizeof out->msg);
    for (int i = 0; i < LOOM_PROGRESS_COMMS; i++) {
        terminate(out->comms[i].name, sizeof out->comms[i].name);
        terminate(out->comms[i].started_op, sizeof out->comms[i].started_op);
        terminate(out->comms[i].waiting_op, sizeof out->comms[i].waiting_op);
    }
    return 1;
}
