/* TensorBoard event files: scalar summaries that `tensorboard --logdir DIR` reads, written
 * without TensorFlow. A file is a sequence of TFRecords, each a serialized tensorflow.Event:
 *   uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes,
 *   length bytes of data, uint32 masked CRC-32C of the data;
 *   masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
 * The first event holds file_version "brain.Event:2"; each scalar is
 * Event{wall_time, step, summary{value{tag, simple_value}}}. */
#ifndef LOOM_TRAIN_TENSORBOARD_H
#define LOOM_TRAIN_TENSORBOARD_H

#include <stdint.h>

#include "core/error.h"

typedef struct loom_tb_writer loom_tb_writer;

/* Creates dir (mkdir -p) and dir/events.out.tfevents.<unix seconds>.<hostname> (".N" is
 * appended if that name is taken), then writes the file_version event. */
loom_status loom_tb_open(loom_tb_writer **w, const char *dir, loom_error *err);
/* One scalar summary event at the current wall time; value is stored as a float. */
loom_status loom_tb_scalar(loom_tb_writer *w, const char *tag, int64_t step, double value,
                           loom_error *err);
/* Hands buffered events to the operating system (a crash of the process loses nothing). */
loom_status loom_tb_flush(loom_tb_writer *w, loom_error *err);
/* The path of the event file (valid until close). */
const char *loom_tb_path(const loom_tb_writer *w);
/* Flushes and closes; NULL-safe. */
void loom_tb_close(loom_tb_writer *w);

#endif
