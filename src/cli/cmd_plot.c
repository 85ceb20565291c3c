/* loom plot: reads `loom train --metrics` JSON lines, writes each curve to a data file in a
 * private temporary folder and runs gnuplot on a generated script (its standard input).
 * Nothing from the command line reaches a shell: gnuplot is started with posix_spawnp,
 * labels are quoted as gnuplot strings, and gnuplot writes into the temporary folder (an
 * output name such as '|cmd' would be a pipe to gnuplot); loom copies the PNG into place. */
#include "core/flags.h"
#include "cli/cmd_plot.h"

#include "core/error.h"
#include "core/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

enum { TRAIN, VAL, TPS, N_SERIES };
static const char *series_name[N_SERIES] = {"train", "val", "tps"};

typedef struct {
    const char *path;
    long count[N_SERIES];
    double loss_min, loss_max; /* over the positive training and validation losses */
} curve_file;

/* A numeric field: 1 present (sets *v), 0 absent or null, -1 of another type. */
static int number_field(json_t *obj, const char *key, double *v) {
    json_t *x = json_object_get(obj, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_number(x)) return -1;
    *v = json_number_value(x);
    return 1;
}

/* Reads one metrics file into TMP/<series>_<index>.dat ("step value" lines). */
static loom_status read_metrics(curve_file *cf, int index, const char *tmp, loom_error *err) {
    FILE *in = fopen(cf->path, "r");
    if (!in)
        return loom_error_set(err, LOOM_ERR_INPUT, "metrics file '%s': cannot open: %s", cf->path,
                              strerror(errno));
    FILE *out[N_SERIES] = {0};
    loom_status st = LOOM_OK;
    for (int s = 0; s < N_SERIES && st == LOOM_OK; s++) {
        char name[4200];
        snprintf(name, sizeof name, "%s/%s_%d.dat", tmp, series_name[s], index);
        out[s] = fopen(name, "w");
        if (!out[s])
            st = loom_error_set(err, LOOM_ERR_IO, "%s: cannot create: %s", name, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0, records = 0;
    while (st == LOOM_OK && getline(&line, &cap, in) != -1) {
        lineno++;
        if (line[strspn(line, " \t\r\n")] == '\0') continue; /* blank line */
        json_error_t jerr;
        json_t *obj = json_loads(line, JSON_DECODE_ANY, &jerr);
        double step = 0, v[N_SERIES] = {0};
        int has[N_SERIES] = {0};
        if (!obj || !json_is_object(obj)) {
            st = loom_error_set(err, LOOM_ERR_INPUT, "%s:%ld: expected a JSON object per line%s%s",
                                cf->path, lineno, obj ? "" : ": ", obj ? "" : jerr.text);
        } else if (number_field(obj, "step", &step) != 1 || !isfinite(step)) {
            st = loom_error_set(err, LOOM_ERR_INPUT, "%s:%ld: expected a number in field \"step\"",
                                cf->path, lineno);
        } else {
            static const char *keys[N_SERIES] = {"loss", "val_loss", "tokens_per_s"};
            for (int s = 0; s < N_SERIES && st == LOOM_OK; s++) {
                has[s] = number_field(obj, keys[s], &v[s]);
                if (has[s] < 0)
                    st = loom_error_set(err, LOOM_ERR_INPUT,
                                        "%s:%ld: field \"%s\": expected a number", cf->path, lineno,
                                        keys[s]);
            }
            if (st == LOOM_OK && has[TRAIN] != 1 && has[VAL] != 1)
                st = loom_error_set(err, LOOM_ERR_INPUT,
                                    "%s:%ld: expected a field \"loss\" or \"val_loss\"", cf->path,
                                    lineno);
        }
        json_decref(obj);
        for (int s = 0; s < N_SERIES && st == LOOM_OK; s++) {
            if (has[s] != 1) continue;
            fprintf(out[s], "%.17g %.17g\n", step, v[s]);
            cf->count[s]++;
            if (s != TPS && v[s] > 0) {
                if (cf->loss_min == 0 || v[s] < cf->loss_min) cf->loss_min = v[s];
                if (v[s] > cf->loss_max) cf->loss_max = v[s];
            }
        }
        records++;
    }
    free(line);
    if (st == LOOM_OK && ferror(in))
        st = loom_error_set(err, LOOM_ERR_INPUT, "metrics file '%s': read failed: %s", cf->path,
                            strerror(errno));
    if (st == LOOM_OK && records == 0)
        st = loom_error_set(err, LOOM_ERR_INPUT,
                            "metrics file '%s': no records (expected JSON lines from loom train "
                            "--metrics)",
                            cf->path);
    fclose(in);
    for (int s = 0; s < N_SERIES; s++)
        if (out[s] && fclose(out[s]) != 0 && st == LOOM_OK)
            st = loom_error_set(err, LOOM_ERR_IO, "temporary data file: write failed: %s",
                                strerror(errno));
    return st;
}

/* Writes s as a single-quoted gnuplot string: '' stands for ', control characters
 * become '?' (a gnuplot string cannot span lines). */
static void put_quoted(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputs("''", f);
        else
            fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, f);
    }
    fputc('\'', f);
}

static void put_data_file(FILE *f, const char *tmp, int s, int index) {
    char name[4200];
    snprintf(name, sizeof name, "%s/%s_%d.dat", tmp, series_name[s], index);
    put_quoted(f, name);
}

/* One panel: the curves of series s (and VAL with TRAIN), one colour per file. */
static void put_plot(FILE *f, const curve_file *cf, int n, const char *tmp, int s) {
    const char *sep = "plot ";
    for (int i = 0; i < n; i++) {
        int kinds[2] = {s, s == TRAIN ? VAL : -1};
        for (int k = 0; k < 2; k++) {
            int kind = kinds[k];
            if (kind < 0 || cf[i].count[kind] == 0) continue;
            fputs(sep, f);
            sep = ", \\\n     ";
            put_data_file(f, tmp, kind, i);
            fprintf(f, " using 1:2 with %s lw 2 lc %d",
                    kind == VAL              ? "linespoints dt 2 pt 7 ps 1.2"
                    : cf[i].count[kind] == 1 ? "points pt 7"
                                             : "lines",
                    i + 1);
            fputs(" title ", f);
            char label[4200];
            snprintf(label, sizeof label, "%s%s", cf[i].path,
                     s == TRAIN ? (kind == VAL ? " (validation)" : " (training)") : "");
            put_quoted(f, label);
        }
    }
    fputc('\n', f);
}

/* Log-scale y: gnuplot labels only powers of ten, so a loss curve inside one decade would
 * get no labels; six tics spaced evenly in log between the extremes instead. */
static void put_log_tics(FILE *f, const curve_file *cf, int n) {
    double lo = 0, hi = 0;
    for (int i = 0; i < n; i++) {
        if (cf[i].loss_min > 0 && (lo == 0 || cf[i].loss_min < lo)) lo = cf[i].loss_min;
        if (cf[i].loss_max > hi) hi = cf[i].loss_max;
    }
    fputs("set logscale y\nset autoscale yfix\n", f);
    if (!(lo > 0 && hi > lo && hi / lo < 100)) return;
    fputs("set format y '%.3g'\nset ytics (", f);
    for (int j = 0; j <= 5; j++) fprintf(f, "%s%.3g", j ? ", " : "", lo * pow(hi / lo, j / 5.0));
    fputs(")\n", f);
}

static loom_status write_script(const char *path, const curve_file *cf, int n, const char *tmp,
                                const char *title, int log_y, loom_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return loom_error_set(err, LOOM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int any_tps = 0;
    for (int i = 0; i < n; i++) any_tps |= cf[i].count[TPS] > 0;
    fprintf(f,
            "set encoding utf8\n"
            "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
            "  set terminal pngcairo noenhanced size 1100,%d font ',11'\n"
            "} else {\n"
            "  set terminal png noenhanced size 1100,%d\n"
            "}\n",
            any_tps ? 900 : 520, any_tps ? 900 : 520);
    fputs("set output ", f);
    char png[4200];
    snprintf(png, sizeof png, "%s/out.png", tmp);
    put_quoted(f, png);
    fprintf(f, "\nset multiplot layout %d,1", any_tps ? 2 : 1);
    if (title) {
        fputs(" title ", f);
        put_quoted(f, title);
    }
    /* Fixed margins line the panels up whatever the width of their keys. */
    fputs("\nset lmargin at screen 0.09\nset rmargin at screen 0.70\nset grid\n"
          "set key outside right top\nset xlabel 'step'\nset ylabel 'loss'\n"
          "set title 'loss'\n",
          f);
    if (log_y) put_log_tics(f, cf, n);
    put_plot(f, cf, n, tmp, TRAIN);
    if (any_tps) {
        fputs("unset logscale y\nset autoscale y\nset ytics autofreq\nset ylabel 'tokens/s'\n"
              "set title 'throughput'\nset yrange [0:*]\nset format y '%.1s%c'\n",
              f);
        put_plot(f, cf, n, tmp, TPS);
    }
    fputs("unset multiplot\nunset output\n", f);
    if (fclose(f) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return LOOM_OK;
}

/* The most telling line of gnuplot's error output (the first that names an error). */
static void gnuplot_message(const char *err_path, char *msg, size_t cap) {
    snprintf(msg, cap, "no message");
    FILE *f = fopen(err_path, "r");
    if (!f) return;
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[strspn(line, " \t^")]) continue;
        if (!found) snprintf(msg, cap, "%s", line + strspn(line, " \t"));
        if (strstr(line, "rror")) {
            snprintf(msg, cap, "%s", line + strspn(line, " \t"));
            found = 1;
        }
    }
    fclose(f);
}

/* Runs gnuplot with the script on standard input; 0, 1 (gnuplot failed) or 2 (absent). */
static int run_gnuplot(const char *tmp, const char *script) {
    char err_path[4200];
    snprintf(err_path, sizeof err_path, "%s/gnuplot.err", tmp);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, script, O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    char *args[] = {"gnuplot", NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "gnuplot", &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc == ENOENT) {
        fprintf(stderr, "loom plot: gnuplot not found on PATH (install it: apt-get install "
                        "gnuplot-nox)\n");
        return 2;
    }
    if (rc != 0) {
        fprintf(stderr, "loom plot: cannot start gnuplot: %s\n", strerror(rc));
        return 1;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            fprintf(stderr, "loom plot: waiting for gnuplot: %s\n", strerror(errno));
            return 1;
        }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    char msg[600];
    gnuplot_message(err_path, msg, sizeof msg);
    if (WIFEXITED(status))
        fprintf(stderr, "loom plot: gnuplot failed (exit %d): %s\n", WEXITSTATUS(status), msg);
    else
        fprintf(stderr, "loom plot: gnuplot killed by signal %d: %s\n", WTERMSIG(status), msg);
    return 1;
}

/* Copies the finished PNG next to out, then renames it into place (no half-written
 * output, and out is never a name gnuplot interprets). */
static loom_status install_png(const char *png, const char *out, loom_error *err) {
    FILE *in = fopen(png, "rb");
    if (!in)
        return loom_error_set(err, LOOM_ERR_IO, "gnuplot wrote no image (%s): %s", png,
                              strerror(errno));
    loom_mkdir_parent(out); /* fopen reports what still fails */
    size_t len = strlen(out) + 32;
    char *part = malloc(len);
    if (!part) {
        fclose(in);
        return loom_error_set(err, LOOM_ERR_NOMEM, "-o '%s': out of memory", out);
    }
    snprintf(part, len, "%s.part%ld", out, (long)getpid());
    FILE *o = fopen(part, "wb");
    loom_status st = LOOM_OK;
    if (!o) {
        st = loom_error_set(err, LOOM_ERR_INPUT, "-o '%s': cannot write: %s", out, strerror(errno));
    } else {
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0)
            if (fwrite(buf, 1, n, o) != n) break;
        int bad = ferror(in) || ferror(o);
        if (fclose(o) != 0 || bad || rename(part, out) != 0) {
            st = loom_error_set(err, LOOM_ERR_INPUT, "-o '%s': cannot write: %s", out,
                                strerror(errno));
            unlink(part);
        }
    }
    fclose(in);
    free(part);
    return st;
}

static void remove_tree_flat(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d));) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char p[4400];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

int loom_cmd_plot(int argc, char **argv) {
    const char *out = NULL, *title = NULL;
    int log_y = 0, first = argc;
    const loom_flag flags[] = {
        LOOM_FLAG_STR_SHORT(0, "output", 'o', &out, "OUT.png", "the image to write"),
        LOOM_FLAG_STR(0, "title", &title, "T", "the plot's title"),
        LOOM_FLAG_SW(0, "log-y", &log_y, "a logarithmic loss axis"),
    };
    static const loom_flag_group groups[] = {{"Watching a run", "docs/training.md"}};
    const loom_flag_spec spec = {
        .usage = "usage: loom plot METRICS.jsonl... -o OUT.png [--title T] [--log-y]",
        .about = "  Draws training loss (and validation loss where recorded) against step, and "
                 "tokens/s,\n"
                 "  one curve per metrics file (written by loom train --metrics), with gnuplot.",
        LOOM_FLAGS_TABLE(flags, groups),
        .positional = 1};
    loom_flags_outcome fo = loom_flags_run(&spec, "loom plot", argc, argv, &first);
    if (fo != LOOM_FLAGS_GO) return fo;
    int n = argc - first;
    if (n < 1 || !out || !out[0]) {
        fprintf(stderr, "loom plot: %s (usage: loom plot METRICS.jsonl... -o OUT.png)\n",
                n < 1 ? "no metrics file given" : "-o OUT.png is required");
        return 2;
    }
    curve_file *cf = calloc((size_t)n, sizeof *cf);
    const char *base = getenv("TMPDIR");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/loom_plot_XXXXXX", base && base[0] ? base : "/tmp");
    if (!cf || !mkdtemp(tmp)) {
        fprintf(stderr, "loom plot: cannot create a temporary folder %s: %s\n", tmp,
                cf ? strerror(errno) : "out of memory");
        free(cf);
        return 2;
    }
    loom_error err = {0};
    loom_status st = LOOM_OK;
    for (int i = 0; i < n && st == LOOM_OK; i++) {
        cf[i].path = argv[first + i];
        st = read_metrics(&cf[i], i, tmp, &err);
    }
    char script[4200], png[4200];
    snprintf(script, sizeof script, "%s/plot.gp", tmp);
    snprintf(png, sizeof png, "%s/out.png", tmp);
    if (st == LOOM_OK) st = write_script(script, cf, n, tmp, title, log_y, &err);
    int rc = st == LOOM_OK ? 0 : 2;
    if (st == LOOM_OK) rc = run_gnuplot(tmp, script);
    if (rc == 0 && access(png, R_OK) != 0) {
        fprintf(stderr, "loom plot: gnuplot exited without writing an image\n");
        rc = 1;
    }
    if (rc == 0) {
        st = install_png(png, out, &err);
        rc = st == LOOM_OK ? 0 : 2;
    }
    if (st != LOOM_OK) fprintf(stderr, "loom plot: %s\n", err.msg);
    remove_tree_flat(tmp);
    free(cf);
    if (rc == 0)
        fprintf(stderr, "loom plot: wrote %s (%d metrics file%s)\n", out, n, n > 1 ? "s" : "");
    return rc;
}
