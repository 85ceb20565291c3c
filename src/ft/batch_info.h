/* Where a failing step's batch comes from, for the diagnosis of a loss spike or a
 * non-finite loss: every sequence of the global batch with the data-parallel rank that
 * trained on it and its place in the data (shard file, token offset), recomputed from
 * the seed exactly as `loom train` samples it (data/dataset.h). */
#ifndef LOOM_FT_BATCH_INFO_H
#define LOOM_FT_BATCH_INFO_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"
#include "ft/run_config.h"

/* {"index": batch, "sequences": [{"seq", "dp_rank", "file", "token_offset", "tokens"}]} (a dit:
 * "file", "sample" index in it and "label" instead of the token fields)
 * for 1-based batch `batch` of the job's data order with dp data-parallel ranks; NULL
 * with err set when the data cannot be opened. */
json_t *loom_batch_info(const loom_run_job *j, int64_t batch, int dp, loom_error *err);

#endif
