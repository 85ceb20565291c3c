/* loom data images: IDX files or PNG folders -> image shards (data/image_shard.h);
 * loom data video: image shards -> moving-object clip shards (data/moving_clips.h);
 * every loom data subcommand reads its flags with loom_data_parse_flags (data_flags.c). */
#include "cli/cmd_data_images.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fs.h"
#include "data/idx.h"
#include "data/image_shard.h"
#include "data/moving_clips.h"
#include "data/picture.h"
#include "data/png_folder.h"
#include "data/prepare.h"

/* ---- loom data images ---- */

#define FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One split's samples in memory, from an IDX pair or a PNG folder. */
typedef struct {
    const char *images, *labels; /* the files or folder it came from (for messages) */
    int64_t n;
    int channels, height, width, n_classes; /* n_classes: label max + 1 or subfolder count */
    uint8_t *pixels;
    int32_t *label;
    char **class_names;
    int n_names, is_folder;
} image_source;

static void source_free(image_source *s) {
    free(s->pixels);
    free(s->label);
    for (int i = 0; i < s->n_names; i++) free(s->class_names[i]);
    free(s->class_names);
    memset(s, 0, sizeof *s);
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Loads `images` (a folder of class subfolders or an IDX file with its `labels`). The
 * flags name the options for the messages. Returns 0 or 2 (message printed). */
static int source_load(image_source *s, const char *images, const char *labels, int channels,
                       const char *img_flag, const char *lab_flag) {
    memset(s, 0, sizeof *s);
    s->images = images;
    s->labels = labels;
    loom_error err = {0};
    if (is_dir(images)) {
        if (labels) {
            fprintf(stderr,
                    "loom data: %s '%s': not used when %s is a folder of class subfolders\n",
                    lab_flag, labels, img_flag);
            return 2;
        }
        loom_png_folder f;
        if (loom_png_folder_read(images, channels, &f, &err) != LOOM_OK) {
            fprintf(stderr, "loom data: %s: %s\n", img_flag, err.msg);
            return 2;
        }
        *s = (image_source){.images = images,
                            .n = f.n,
                            .channels = f.channels,
                            .height = f.height,
                            .width = f.width,
                            .n_classes = f.n_classes,
                            .pixels = f.pixels,
                            .label = f.labels,
                            .class_names = f.class_names,
                            .n_names = f.n_classes,
                            .is_folder = 1};
        return 0;
    }
    if (!labels) {
        fprintf(stderr, "loom data: %s is required with the IDX file %s '%s'\n", lab_flag, img_flag,
                images);
        return 2;
    }
    if (channels == 3) {
        fprintf(stderr, "loom data: --channels 3: IDX images have 1 channel (%s '%s')\n", img_flag,
                images);
        return 2;
    }
    loom_idx_images img;
    if (loom_idx_read_images(images, &img, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s: %s\n", img_flag, err.msg);
        return 2;
    }
    uint8_t *lab = NULL;
    int64_t n_lab = 0;
    if (loom_idx_read_labels(labels, &lab, &n_lab, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s: %s\n", lab_flag, err.msg);
        loom_idx_images_free(&img);
        return 2;
    }
    int rc = 0;
    if (n_lab != img.n) {
        fprintf(stderr, "loom data: %s '%s': %lld labels, expected %lld like the images of %s\n",
                lab_flag, labels, (long long)n_lab, (long long)img.n, images);
        rc = 2;
    }
    int32_t *l32 = rc ? NULL : malloc((size_t)n_lab * sizeof *l32);
    if (!rc && !l32) {
        fprintf(stderr, "loom data: out of memory for %lld labels\n", (long long)n_lab);
        rc = 2;
    }
    int max_label = -1;
    for (int64_t i = 0; !rc && i < n_lab; i++) {
        l32[i] = lab[i];
        if (lab[i] > max_label) max_label = lab[i];
    }
    free(lab);
    if (rc) {
        loom_idx_images_free(&img);
        return rc;
    }
    *s = (image_source){.images = images,
                        .labels = labels,
                        .n = img.n,
                        .channels = 1,
                        .height = img.rows,
                        .width = img.cols,
                        .n_classes = max_label + 1,
                        .pixels = img.pixels,
                        .label = l32};
    return 0;
}

/* Checks every label against n_classes; 0 or 2. */
static int source_check_classes(const image_source *s, int n_classes, const char *img_flag,
                                const char *lab_flag) {
    if (s->is_folder) {
        if (s->n_classes > n_classes) {
            fprintf(stderr, "loom data: %s '%s': %d class subfolders, more than --n-classes %d\n",
                    img_flag, s->images, s->n_classes, n_classes);
            return 2;
        }
        return 0;
    }
    for (int64_t i = 0; i < s->n; i++)
        if (s->label[i] >= n_classes) {
            fprintf(stderr,
                    "loom data: %s '%s': label %d of sample %lld is out of range (expected "
                    "0..%d for --n-classes %d)\n",
                    lab_flag, s->labels, s->label[i], (long long)i, n_classes - 1, n_classes);
            return 2;
        }
    return 0;
}

/* Writes the samples of s with is_val(k) == want_val into DIR/SPLIT_*.bin. */
static int write_source(const image_source *s, const loom_image_shape *shape, const char *out,
                        const char *split, double val_fraction, int want_val, int64_t n_split,
                        int64_t shard_samples, int *n_shards) {
    loom_image_writer w;
    loom_error err = {0};
    loom_status st = loom_image_writer_open(&w, out, split, shape, n_split, shard_samples, &err);
    int64_t bytes = (int64_t)s->channels * s->height * s->width;
    for (int64_t k = 0; st == LOOM_OK && k < s->n; k++) {
        int v = val_fraction > 0 && loom_prepare_is_val(val_fraction, k);
        if (v == want_val) st = loom_image_writer_put(&w, s->label[k], s->pixels + k * bytes, &err);
    }
    if (st == LOOM_OK) {
        *n_shards = w.n_shards; /* every shard is closed by its last put */
        st = loom_image_writer_finish(&w, &err);
    } else if (w.dir) {
        loom_image_writer_abort(&w);
    }
    if (st != LOOM_OK) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        return 2;
    }
    return 0;
}

int loom_cmd_data_images(int argc, char **argv, const loom_data_help *help) {
    const char *input = NULL, *labels = NULL, *out = NULL, *val_input = NULL, *val_labels = NULL;
    double val_fraction = -1;
    int64_t shard_samples = 100000, n_classes = 0;
    int channels = 0;
    const loom_data_flag flags[] = {
        {"input", LOOM_DATA_FLAG_STR, .required = 1, .str = &input},
        {"labels", LOOM_DATA_FLAG_STR, .str = &labels},
        {"out", LOOM_DATA_FLAG_STR, .required = 1, .str = &out},
        {"val-input", LOOM_DATA_FLAG_STR, .str = &val_input},
        {"val-labels", LOOM_DATA_FLAG_STR, .str = &val_labels},
        {"val-fraction", LOOM_DATA_FLAG_FRACTION, .f64 = &val_fraction},
        {"shard-samples", LOOM_DATA_FLAG_INT, .i64 = &shard_samples, .lo = 1, .hi = INT32_MAX},
        {"n-classes", LOOM_DATA_FLAG_INT, .i64 = &n_classes, .lo = 1, .hi = LOOM_IMAGE_MAX_DIM},
        {"channels", LOOM_DATA_FLAG_CHOICE, .choice = &channels,
         .choices = (const char *const[]){"1", "3", "auto", NULL},
         .values = (const int[]){1, 3, 0}},
    };
    int rc = loom_data_parse_flags(argc, argv, flags, LOOM_DATA_N_FLAGS(flags), help);
    if (rc >= 0) return rc;
    if (strcmp(input, "fashion-mnist") == 0) {
        const char *given = labels              ? "--labels"
                            : val_input         ? "--val-input"
                            : val_labels        ? "--val-labels"
                            : val_fraction >= 0 ? "--val-fraction"
                                                : NULL;
        if (given) {
            fprintf(stderr,
                    "loom data: %s: not used with --input fashion-mnist (its train and t10k "
                    "files are the train and val splits)\n",
                    given);
            return 2;
        }
        input = FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz";
        labels = FASHION_MNIST_DIR "/train-labels-idx1-ubyte.gz";
        val_input = FASHION_MNIST_DIR "/t10k-images-idx3-ubyte.gz";
        val_labels = FASHION_MNIST_DIR "/t10k-labels-idx1-ubyte.gz";
        const char *need[4] = {input, labels, val_input, val_labels};
        for (int i = 0; i < 4; i++)
            if (access(need[i], R_OK) != 0) {
                fprintf(stderr,
                        "loom data: --input fashion-mnist: %s: %s (expected Debian's "
                        "dataset-fashion-mnist package)\n",
                        need[i], strerror(errno));
                return 2;
            }
    }
    if (val_labels && !val_input) {
        fprintf(stderr, "loom data: --val-labels needs --val-input\n");
        return 2;
    }
    if (val_input && val_fraction >= 0) {
        fprintf(stderr, "loom data: --val-fraction: not used with --val-input (the val split "
                        "comes from its files)\n");
        return 2;
    }
    if (val_fraction < 0) val_fraction = val_input ? 0 : 0.005;

    double t0 = seconds_now();
    image_source tr = {0}, va = {0};
    rc = source_load(&tr, input, labels, channels, "--input", "--labels");
    if (!rc && val_input) {
        /* A PNG val folder is read with the train set's channel count. */
        rc = source_load(&va, val_input, val_labels, tr.is_folder ? tr.channels : channels,
                         "--val-input", "--val-labels");
        if (!rc && (va.is_folder != tr.is_folder || va.channels != tr.channels ||
                    va.height != tr.height || va.width != tr.width)) {
            fprintf(stderr,
                    "loom data: --val-input '%s': %s of %dx%dx%d (CxHxW), expected %s of "
                    "%dx%dx%d like --input\n",
                    val_input, va.is_folder ? "a folder" : "IDX images", va.channels, va.height,
                    va.width, tr.is_folder ? "a folder" : "IDX images", tr.channels, tr.height,
                    tr.width);
            rc = 2;
        }
        for (int i = 0; !rc && tr.is_folder && i < va.n_names; i++)
            if (i >= tr.n_names || strcmp(va.class_names[i], tr.class_names[i]) != 0) {
                fprintf(stderr,
                        "loom data: --val-input '%s': class subfolder %d is '%s', expected '%s' "
                        "like --input\n",
                        val_input, i, va.class_names[i],
                        i < tr.n_names ? tr.class_names[i] : "(none)");
                rc = 2;
            }
    }
    int k = (int)n_classes;
    if (!rc && k == 0) k = tr.n_classes > va.n_classes ? tr.n_classes : va.n_classes;
    if (!rc) rc = source_check_classes(&tr, k, "--input", "--labels");
    if (!rc && val_input) rc = source_check_classes(&va, k, "--val-input", "--val-labels");
    if (!rc && loom_mkdir_p(out) != 0) {
        fprintf(stderr, "loom data: --out '%s': cannot create directory: %s\n", out,
                strerror(errno));
        rc = 2;
    }
    loom_image_shape shape = {1, tr.channels, tr.height, tr.width, k};
    int64_t n_val = 0;
    if (val_input)
        n_val = va.n;
    else
        for (int64_t i = 0; val_fraction > 0 && i < tr.n; i++)
            n_val += loom_prepare_is_val(val_fraction, i);
    int64_t n_train = tr.n - (val_input ? 0 : n_val);
    int train_shards = 0, val_shards = 0;
    if (!rc && n_train == 0) {
        fprintf(stderr, "loom data: --val-fraction %g leaves no train sample of %lld\n",
                val_fraction, (long long)tr.n);
        rc = 2;
    }
    if (!rc)
        rc = write_source(&tr, &shape, out, "train", val_input ? 0 : val_fraction, 0, n_train,
                          shard_samples, &train_shards);
    if (!rc)
        rc = val_input
                 ? write_source(&va, &shape, out, "val", 0, 0, n_val, shard_samples, &val_shards)
                 : write_source(&tr, &shape, out, "val", val_fraction, 1, n_val, shard_samples,
                                &val_shards);
    if (!rc)
        fprintf(stderr,
                "loom data: %lld train + %lld val samples of %dx%dx%d (CxHxW), %d classes, %d + %d "
                "shard(s) in %s (%.2f s)\n",
                (long long)n_train, (long long)n_val, shape.channels, shape.height, shape.width, k,
                train_shards, val_shards, out, seconds_now() - t0);
    source_free(&tr);
    source_free(&va);
    return rc;
}

/* ---- loom data video ---- */

/* Opens an image dataset for a flag; 0 or 2 (message printed). */
static int open_images(loom_image_dataset *ds, const char *flag, const char *glob) {
    loom_error err = {0};
    if (loom_image_dataset_open(ds, glob, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s: %s\n", flag, err.msg);
        return 2;
    }
    return 0;
}

/* The first clips of (o) as a GIF (.gif) or a PNG strip (anything else). */
static int write_preview(const char *path, const loom_image_dataset *src,
                         const loom_moving_options *o, int64_t n_clips) {
    int n = n_clips < 16 ? (int)n_clips : 16;
    if (n == 0) return 0;
    size_t clip = (size_t)o->frames * src->channels * o->size * o->size;
    uint8_t *clips = malloc(clip * (size_t)n);
    loom_moving_object *objs = malloc((size_t)o->objects * sizeof *objs);
    loom_error err = {0};
    loom_status st = LOOM_OK;
    if (!clips || !objs) st = loom_error_set(&err, LOOM_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; st == LOOM_OK && i < n; i++)
        loom_moving_render(src, o, i, objs, clips + clip * (size_t)i);
    size_t len = strlen(path);
    if (st == LOOM_OK) {
        if (len > 4 && strcasecmp(path + len - 4, ".gif") == 0)
            st = loom_picture_write_gif(path, clips, n, o->frames, src->channels, o->size, o->size,
                                        4, 10, &err);
        else
            st = loom_picture_write_png_strip(path, clips, n, o->frames, src->channels, o->size,
                                              o->size, &err);
    }
    free(clips);
    free(objs);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom data: --preview: %s\n", err.msg);
        return 2;
    }
    return 0;
}

int loom_cmd_data_video(int argc, char **argv, const loom_data_help *help) {
    const char *from = NULL, *out = NULL, *val_from = NULL, *preview = NULL;
    int64_t frames = 8, size = 48, objects = 2, clips = 2000, val_clips = -1, seed = 1;
    int64_t shard_samples = 100000;
    const loom_data_flag flags[] = {
        {"from-images", LOOM_DATA_FLAG_STR, .required = 1, .str = &from},
        {"out", LOOM_DATA_FLAG_STR, .required = 1, .str = &out},
        {"frames", LOOM_DATA_FLAG_INT, .i64 = &frames, .lo = 1, .hi = LOOM_IMAGE_MAX_DIM},
        {"size", LOOM_DATA_FLAG_INT, .i64 = &size, .lo = 1, .hi = LOOM_MOVING_MAX_SIZE},
        {"objects", LOOM_DATA_FLAG_INT, .i64 = &objects, .lo = 1, .hi = LOOM_MOVING_MAX_OBJECTS},
        {"clips", LOOM_DATA_FLAG_INT, .i64 = &clips, .lo = 1, .hi = INT32_MAX},
        {"seed", LOOM_DATA_FLAG_INT, .i64 = &seed, .lo = 0, .hi = INT64_MAX},
        {"val-clips", LOOM_DATA_FLAG_INT, .i64 = &val_clips, .lo = 0, .hi = INT32_MAX},
        {"val-from-images", LOOM_DATA_FLAG_STR, .str = &val_from},
        {"shard-samples", LOOM_DATA_FLAG_INT, .i64 = &shard_samples, .lo = 1, .hi = INT32_MAX},
        {"preview", LOOM_DATA_FLAG_STR, .str = &preview},
    };
    int rc = loom_data_parse_flags(argc, argv, flags, LOOM_DATA_N_FLAGS(flags), help);
    if (rc >= 0) return rc;
    if (val_clips < 0) val_clips = clips / 10;
    double t0 = seconds_now();
    loom_image_dataset src = {0}, vsrc = {0};
    rc = open_images(&src, "--from-images", from);
    if (!rc && val_from && val_clips > 0) {
        rc = open_images(&vsrc, "--val-from-images", val_from);
        if (!rc && (vsrc.frames != src.frames || vsrc.channels != src.channels ||
                    vsrc.height != src.height || vsrc.width != src.width ||
                    vsrc.n_classes != src.n_classes)) {
            fprintf(stderr,
                    "loom data: --val-from-images '%s': %dx%dx%dx%d (FxCxHxW), %d classes, "
                    "expected %dx%dx%dx%d, %d classes like --from-images\n",
                    val_from, vsrc.frames, vsrc.channels, vsrc.height, vsrc.width, vsrc.n_classes,
                    src.frames, src.channels, src.height, src.width, src.n_classes);
            rc = 2;
        }
    }
    loom_moving_options o = {.frames = (int)frames,
                             .size = (int)size,
                             .objects = (int)objects,
                             .seed = (uint64_t)seed,
                             .stream = LOOM_MOVING_STREAM_TRAIN};
    loom_error err = {0};
    if (!rc && loom_moving_check(&src, &o, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: --from-images '%s': %s\n", from, err.msg);
        rc = 2;
    }
    if (!rc && loom_mkdir_p(out) != 0) {
        fprintf(stderr, "loom data: --out '%s': cannot create directory: %s\n", out,
                strerror(errno));
        rc = 2;
    }
    if (!rc && loom_moving_write(&src, &o, clips, out, "train", shard_samples, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        rc = 2;
    }
    loom_moving_options vo = o;
    vo.stream = LOOM_MOVING_STREAM_VAL;
    const loom_image_dataset *vs = vsrc.n_shards ? &vsrc : &src;
    if (!rc && loom_moving_write(vs, &vo, val_clips, out, "val", shard_samples, &err) != LOOM_OK) {
        fprintf(stderr, "loom data: %s\n", err.msg);
        rc = 2;
    }
    if (!rc && preview) rc = write_preview(preview, &src, &o, clips);
    if (!rc) {
        int64_t per = shard_samples;
        fprintf(stderr,
                "loom data: %lld train + %lld val clips of %dx%dx%dx%d (FxCxHxW), %d object(s), "
                "%d classes, %lld + %lld shard(s) in %s (%.2f s)\n",
                (long long)clips, (long long)val_clips, o.frames, src.channels, o.size, o.size,
                o.objects, src.n_classes, (long long)((clips + per - 1) / per),
                (long long)((val_clips + per - 1) / per), out, seconds_now() - t0);
    }
    loom_image_dataset_close(&src);
    loom_image_dataset_close(&vsrc);
    return rc;
}
