/* The heartbeat record: one fixed-size UDP datagram from a rank to the supervisor. It is
 * plain data (numbers and NUL-terminated strings of fixed size), checked on receipt
 * (exact size, magic, version, the job's token, ranges) and never interpreted beyond
 * that. Native byte order: every host of one job runs the same binary on the same
 * architecture. */
#ifndef LOOM_FT_BEAT_H
#define LOOM_FT_BEAT_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/progress.h"

#define LOOM_BEAT_MAGIC 0x4c4f4f4du /* "LOOM" */
#define LOOM_BEAT_VERSION 2
#define LOOM_BEAT_TOKEN_BYTES 16
#define LOOM_BEAT_RECENT 8
#define LOOM_BEAT_MSG 160

typedef struct {
    char name[LOOM_PROGRESS_NAME];
    int32_t group_first, group_size; /* the instance: world rank of its rank 0 (-1: ?) */
    char started_op[LOOM_PROGRESS_OP];
    char waiting_op[LOOM_PROGRESS_OP];
    uint64_t started, waiting_seq;
    double waited_ms;
} loom_beat_comm;

typedef struct {
    uint32_t magic;
    uint16_t version, size;
    uint8_t token[LOOM_BEAT_TOKEN_BYTES];
    int32_t rank, world, attempt, pid;
    uint32_t seq; /* beats sent by this rank so far */
    int32_t phase, n_comms, n_recent;
    int64_t steps_done, nonfinite_step, start_step;
    char host[64];
    loom_beat_comm comms[LOOM_PROGRESS_COMMS];
    int64_t recent_step[LOOM_BEAT_RECENT];
    double recent_loss[LOOM_BEAT_RECENT], recent_compute_ms[LOOM_BEAT_RECENT];
    double recent_local_loss[LOOM_BEAT_RECENT]; /* this rank's own, before the reduction */
    double recent_blocked_ms[LOOM_BEAT_RECENT]; /* waiting for communication */
    char msg[LOOM_BEAT_MSG];                    /* the error of a failed rank's last beat */
} loom_beat;

/* Token: 16 random bytes (getrandom), passed to ranks as 32 hex digits. */
loom_status loom_beat_token_new(uint8_t token[LOOM_BEAT_TOKEN_BYTES], loom_error *err);
void loom_beat_token_hex(const uint8_t token[LOOM_BEAT_TOKEN_BYTES], char hex[33]);
loom_status loom_beat_token_parse(uint8_t token[LOOM_BEAT_TOKEN_BYTES], const char *hex,
                                  loom_error *err);

/* Fills a beat from this process's progress record. */
void loom_beat_fill(loom_beat *b, const uint8_t token[LOOM_BEAT_TOKEN_BYTES], int rank, int world,
                    int attempt, const char *host);
/* Checks a received datagram: 1 if it is a well-formed beat of this job (copied into
 * *out with every string terminated), 0 otherwise. */
int loom_beat_accept(const void *data, size_t len, const uint8_t token[LOOM_BEAT_TOKEN_BYTES],
                     loom_beat *out);

#endif
