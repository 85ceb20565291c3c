#include "cli/plan_html.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Colours for the terms by first appearance (Tableau 10). */
static const char *COLOURS[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
#define N_COLOURS (int)(sizeof COLOURS / sizeof COLOURS[0])
#define MAX_NAMES 64

static void put_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

static int name_index(const char **names, int *n, const char *name) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(names[i], name)) return i;
    if (*n == MAX_NAMES) return MAX_NAMES - 1;
    names[*n] = name;
    return (*n)++;
}

loom_status loom_plan_html_write(const char *path, const char *title, const loom_plan_bar *bars,
                                 int n, loom_error *err) {
    FILE *f = fopen(path, "w");
    if (!f)
        return loom_error_set(err, LOOM_ERR_INPUT, "--html '%s': cannot write: %s", path,
                              strerror(errno));
    const char *names[MAX_NAMES];
    int n_names = 0;
    double longest = 0;
    for (int b = 0; b < n; b++) {
        if (bars[b].time.step_ms > longest) longest = bars[b].time.step_ms;
        for (int t = 0; t < bars[b].time.n_terms; t++)
            name_index(names, &n_names, bars[b].time.terms[t].name);
    }
    if (!(longest > 0)) longest = 1;
    const int label_w = 430, bar_w = 640, row_h = 44, top = 30;
    const int legend_h = 24 * ((n_names + 3) / 4) + 10, height = top + n * row_h + 40 + legend_h;
    fprintf(f, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>");
    put_escaped(f, title);
    fprintf(f, "</title></head>\n<body style=\"font-family: sans-serif\">\n<h2>");
    put_escaped(f, title);
    fprintf(f,
            "</h2>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-size=\"12\">\n",
            label_w + bar_w + 120, height);
    for (int b = 0; b < n; b++) {
        const loom_plan_bar *x = &bars[b];
        const int y = top + b * row_h;
        fprintf(f, "<text x=\"4\" y=\"%d\">", y + 14);
        put_escaped(f, x->label);
        fprintf(f, "</text>\n");
        if (x->note) {
            fprintf(f, "<text x=\"4\" y=\"%d\" fill=\"#666\">", y + 30);
            put_escaped(f, x->note);
            fprintf(f, "</text>\n");
        }
        double at = 0;
        for (int t = 0; t < x->time.n_terms; t++) {
            const loom_plan_term *term = &x->time.terms[t];
            if (!(term->ms > 0)) continue;
            const int c = name_index(names, &n_names, term->name) % N_COLOURS;
            const double x0 = label_w + at / longest * bar_w, w = term->ms / longest * bar_w;
            fprintf(f,
                    "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"28\" fill=\"%s\">"
                    "<title>",
                    x0, y + 2, w, COLOURS[c]);
            put_escaped(f, term->name);
            fprintf(f, ": %.3f ms</title></rect>\n", term->ms);
            at += term->ms;
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%d\">%.2f ms</text>\n", label_w + at / longest * bar_w + 6,
                y + 20, x->time.step_ms);
    }
    const int ly = top + n * row_h + 20;
    for (int i = 0; i < n_names; i++) {
        const int lx = 4 + (i % 4) * 260, yy = ly + (i / 4) * 24;
        fprintf(f,
                "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/>"
                "<text x=\"%d\" y=\"%d\">",
                lx, yy, COLOURS[i % N_COLOURS], lx + 20, yy + 12);
        put_escaped(f, names[i]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n<p>Each bar is one layout's step, its parts stacked in order (hover "
               "for each part's milliseconds). docs/PLAN.md explains the parts.</p>\n"
               "</body></html>\n");
    if (fclose(f) != 0) return loom_error_set(err, LOOM_ERR_IO, "--html '%s': write failed", path);
    return LOOM_OK;
}
