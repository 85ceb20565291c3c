#include "ft/batch_info.h"

#include "data/dataset.h"
#include "data/image_shard.h"

/* A dit's batch: the image shards' samples the step drew (data/flow_batch.h). */
static json_t *image_batch(const loom_run_job *j, int64_t batch, int dp, loom_error *err) {
    loom_image_dataset ds;
    if (loom_image_dataset_open(&ds, j->data, err)) return NULL;
    json_t *o = json_object(), *seqs = json_array();
    json_object_set_new(o, "index", json_integer(batch));
    const int per_rank = dp > 0 ? j->global_batch / dp : j->global_batch;
    for (int i = 0; i < j->global_batch; i++) {
        const int64_t idx = loom_image_dataset_pick(&ds, j->seed, batch - 1, i);
        int s = 0;
        while (s + 1 < ds.n_shards && ds.shards[s + 1].first <= idx) s++;
        json_t *q = json_object();
        json_object_set_new(q, "seq", json_integer(i));
        json_object_set_new(q, "dp_rank", json_integer(per_rank > 0 ? i / per_rank : 0));
        json_object_set_new(q, "file", json_string(ds.shards[s].path));
        json_object_set_new(q, "sample", json_integer(idx - ds.shards[s].first));
        json_object_set_new(q, "label", json_integer(loom_image_dataset_label(&ds, idx)));
        json_array_append_new(seqs, q);
    }
    json_object_set_new(o, "sequences", seqs);
    loom_image_dataset_close(&ds);
    return o;
}

json_t *loom_batch_info(const loom_run_job *j, int64_t batch, int dp, loom_error *err) {
    if (j->images) return image_batch(j, batch, dp, err);
    loom_dataset ds;
    if (loom_dataset_open(&ds, j->data, j->vocab_size, j->seq_len, err)) return NULL;
    json_t *o = json_object(), *seqs = json_array();
    json_object_set_new(o, "index", json_integer(batch));
    const int per_rank = dp > 0 ? j->global_batch / dp : j->global_batch;
    for (int i = 0; i < j->global_batch; i++) {
        int64_t off;
        /* the trainer samples batch b as data step b - 1 (train/trainer.c) */
        const loom_shard *sh = loom_dataset_locate(&ds, j->seed, batch - 1, i, &off);
        json_t *q = json_object();
        json_object_set_new(q, "seq", json_integer(i));
        json_object_set_new(q, "dp_rank", json_integer(per_rank > 0 ? i / per_rank : 0));
        json_object_set_new(q, "file", json_string(sh->path));
        json_object_set_new(q, "token_offset", json_integer(off));
        json_object_set_new(q, "tokens", json_integer(j->seq_len + 1));
        json_array_append_new(seqs, q);
    }
    json_object_set_new(o, "sequences", seqs);
    loom_dataset_close(&ds);
    return o;
}
