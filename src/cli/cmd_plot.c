/* qtitan plot: curves of one or more runs' metrics.jsonl (loss, grad_norm, validation, any
 * numeric key) as one SVG, one panel per metric, the runs overlaid with a legend, steps on the
 * x axis. The SVG is written directly: a few hundred elements need no graphics library; a PNG
 * is that SVG rendered by librsvg and cairo. */
#include "cli/commands.h"

#include <cairo.h>
#include <jansson.h>
#include <librsvg/rsvg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/fs.h"
#include "core/strutil.h"

#define MAX_RUNS 16
#define MAX_METRICS 16

/* Page geometry in SVG user units (pixels). */
#define W 860
#define PANEL_H 280
#define LEFT 90
#define RIGHT 190 /* room for the legend */
#define TOP 40
#define BOTTOM 50

/* Colours that stay apart for the few runs a plot holds. */
static const char *const COLORS[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                     "#9467bd", "#8c564b", "#e377c2", "#17becf"};
#define NCOLORS (int)(sizeof COLORS / sizeof COLORS[0])

typedef struct Series {
    double *x, *y;
    int n, cap;
} Series;

typedef struct Run {
    char *name; /* the folder's last component, for the legend */
    char *path; /* its metrics.jsonl */
    Series s[MAX_METRICS];
} Run;

typedef struct Plot {
    Run runs[MAX_RUNS];
    int nruns;
    char *metrics[MAX_METRICS];
    int nmetrics;
    int explicit_metrics; /* --metric given: each must exist */
    int smooth;
} Plot;

static void usage(FILE *f) {
    fprintf(f, "usage: qtitan plot RUN_DIR... [--out FILE.svg|.png] [--metric loss,grad_norm,...]\n"
               "                   [--smooth N]\n\n"
               "Draws the curves of each run's metrics.jsonl (RUN_DIR is a dump folder, or the\n"
               "metrics.jsonl itself): one panel per metric, runs overlaid with a legend, steps\n"
               "on the x axis.\n"
               "  --out FILE      where the picture goes, SVG or (a name ending in .png) PNG\n"
               "                  (default: plot.svg in the first RUN_DIR)\n"
               "  --metric LIST   comma-separated keys of the records (default: loss, grad_norm\n"
               "                  and every validation key present)\n"
               "  --smooth N      each point the mean of the last N (default 1: raw)\n");
}

static void series_add(Series *s, double x, double y) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->x = xrealloc(s->x, (size_t)s->cap * sizeof *s->x);
        s->y = xrealloc(s->y, (size_t)s->cap * sizeof *s->y);
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
}

static int metric_index(Plot *p, const char *key, int add) {
    for (int i = 0; i < p->nmetrics; i++)
        if (strcmp(p->metrics[i], key) == 0) return i;
    if (!add || p->nmetrics == MAX_METRICS) return -1;
    p->metrics[p->nmetrics] = xstrdup(key);
    return p->nmetrics++;
}

static int is_default_metric(const char *key) {
    return strcmp(key, "loss") == 0 || strcmp(key, "grad_norm") == 0 || strstr(key, "val") == key;
}

/* Reads one run; a record is a JSON object with an integer "step" and numeric keys. */
static int read_run(Plot *p, Run *r, Err *err) {
    char *text;
    size_t len;
    TRY(fs_read_all(r->path, &text, &len, err));
    int rc = 0, lineno = 0, records = 0;
    for (char *line = text, *next; line && *line && rc == 0; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        if (strspn(line, " \t\r") == strlen(line)) continue;
        json_error_t je;
        json_t *o = json_loads(line, JSON_ALLOW_NUL, &je);
        json_t *step = o ? json_object_get(o, "step") : NULL;
        if (!o || !json_is_object(o))
            rc = err_set(err, "%s:%d: not a JSON object (%s)", r->path, lineno,
                         o ? "another JSON value" : je.text);
        else if (!json_is_integer(step))
            rc = err_set(err, "%s:%d: the record has no integer \"step\"", r->path, lineno);
        if (rc == 0) {
            records++;
            const char *key;
            json_t *v;
            json_object_foreach(o, key, v) {
                if (!json_is_number(v)) continue; /* null: a non-finite value, no point */
                int m = metric_index(p, key, !p->explicit_metrics && is_default_metric(key));
                if (m >= 0)
                    series_add(&r->s[m], (double)json_integer_value(step), json_number_value(v));
            }
        }
        json_decref(o);
    }
    free(text);
    if (rc == 0 && records == 0) rc = err_set(err, "%s holds no records", r->path);
    return rc;
}

/* A step of 1, 2 or 5 times a power of ten giving about n intervals over [lo, hi]. */
static double nice_step(double lo, double hi, int n) {
    double raw = (hi - lo) / n;
    if (!(raw > 0)) return 1;
    double p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void fmt_tick(char *buf, size_t cap, double v, double step) {
    if (fabs(v) < step * 1e-9) v = 0;
    if (fabs(v) >= 1e5 || (fabs(v) < 1e-3 && v != 0))
        snprintf(buf, cap, "%.2g", v);
    else
        snprintf(buf, cap, "%.*f", step >= 1 ? 0 : (int)ceil(-log10(step)), v);
}

static void xml_text(FILE *f, const char *s) {
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

static void panel(FILE *f, const Plot *p, int m, double y0) {
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (int r = 0; r < p->nruns; r++) {
        const Series *s = &p->runs[r].s[m];
        for (int i = 0; i < s->n; i++) {
            if (!isfinite(s->y[i])) continue;
            xmin = fmin(xmin, s->x[i]), xmax = fmax(xmax, s->x[i]);
            ymin = fmin(ymin, s->y[i]), ymax = fmax(ymax, s->y[i]);
        }
    }
    if (xmin > xmax) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
    if (xmax == xmin) xmin -= 1, xmax += 1;
    if (ymax == ymin) ymin -= fabs(ymin) * 0.1 + 1e-3, ymax += fabs(ymax) * 0.1 + 1e-3;
    double ys = nice_step(ymin, ymax, 5), xs = fmax(1, nice_step(xmin, xmax, 8)); /* whole steps */
    ymin = floor(ymin / ys) * ys, ymax = ceil(ymax / ys) * ys;
    double px0 = LEFT, px1 = W - RIGHT, py0 = y0 + TOP, py1 = y0 + PANEL_H - BOTTOM;
#define SX(x) (px0 + ((x)-xmin) / (xmax - xmin) * (px1 - px0))
#define SY(y) (py1 - ((y)-ymin) / (ymax - ymin) * (py1 - py0))
    fprintf(f,
            "<g class=\"panel\">\n<text x=\"%d\" y=\"%.1f\" font-size=\"16\" "
            "font-weight=\"bold\">",
            LEFT, y0 + 24);
    xml_text(f, p->metrics[m]);
    fputs("</text>\n", f);
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#333\"/>\n",
            px0, py0, px1 - px0, py1 - py0);
    char t[64];
    for (double v = ymin; v <= ymax + ys * 1e-6; v += ys) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", px0,
                SY(v), px1, SY(v));
        fmt_tick(t, sizeof t, v, ys);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
                px0 - 6, SY(v) + 4, t);
    }
    for (double v = ceil(xmin / xs) * xs; v <= xmax + xs * 1e-6; v += xs) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n",
                SX(v), py1, SX(v), py1 + 5);
        fmt_tick(t, sizeof t, v, xs);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                SX(v), py1 + 18, t);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\">step</text>\n",
            (px0 + px1) / 2, py1 + 38);
    fprintf(f,
            "<text x=\"%d\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 %d %.1f)\">",
            22, (py0 + py1) / 2, 22, (py0 + py1) / 2);
    xml_text(f, p->metrics[m]);
    fputs("</text>\n", f);
    for (int r = 0; r < p->nruns; r++) {
        const Series *s = &p->runs[r].s[m];
        const char *color = COLORS[r % NCOLORS];
        int k = p->smooth > 1 ? p->smooth : 1, open = 0;
        double sum = 0;
        int in = 0;
        for (int i = 0; i < s->n; i++) {
            /* Trailing mean of the last k finite points; a non-finite point breaks the line. */
            if (!isfinite(s->y[i])) {
                if (open) fputs("\"/>\n", f);
                open = 0, sum = 0, in = 0;
                continue;
            }
            sum += s->y[i], in++;
            if (in > k) sum -= s->y[i - k], in = k;
            double y = sum / in;
            if (!open)
                fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                        color);
            fprintf(f, "%s%.2f,%.2f", open ? " " : "", SX(s->x[i]), SY(y));
            open = 1;
        }
        if (open) fputs("\"/>\n", f);
        if (s->n == 1 && isfinite(s->y[0]))
            fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"/>\n", SX(s->x[0]),
                    SY(s->y[0]), color);
        double ly = py0 + 14 + 20 * r;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"3\"/>\n",
                px1 + 14, ly - 4, px1 + 38, ly - 4, color);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">", px1 + 44, ly);
        xml_text(f, p->runs[r].name);
        fputs("</text>\n", f);
    }
    fputs("</g>\n", f);
#undef SX
#undef SY
}

static void emit_svg(FILE *f, const Plot *p) {
    int h = PANEL_H * p->nmetrics;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, h, W, h);
    for (int m = 0; m < p->nmetrics; m++)
        panel(f, p, m, (double)m * PANEL_H);
    fputs("</svg>\n", f);
}

static int write_svg(const Plot *p, const char *out, Err *err) {
    char *tmp = fs_tmp_name(out);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(tmp);
        return err_sys(err, "cannot create %s", out);
    }
    emit_svg(f, p);
    int ok = !ferror(f);
    ok = fclose(f) == 0 && ok;
    int rc = 0;
    if (!ok)
        rc = err_sys(err, "cannot write %s", out);
    else if (rename(tmp, out) != 0)
        rc = err_sys(err, "cannot rename %s to %s", tmp, out);
    if (rc != 0) remove(tmp);
    free(tmp);
    return rc;
}

/* The PNG is the same SVG rendered by librsvg onto a cairo image (the picture rsvg-convert
 * makes of the .svg), so the two outputs never draw differently. */
static int write_png(const Plot *p, const char *out, Err *err) {
    char *svg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&svg, &len);
    if (!f) return err_sys(err, "cannot build the picture for %s", out);
    emit_svg(f, p);
    if (fclose(f) != 0) {
        free(svg);
        return err_sys(err, "cannot build the picture for %s", out);
    }
    GError *gerr = NULL;
    RsvgHandle *h = rsvg_handle_new_from_data((const guint8 *)svg, len, &gerr);
    free(svg);
    if (!h) {
        int rc = err_set(err, "cannot render %s: %s", out, gerr ? gerr->message : "librsvg failed");
        if (gerr) g_error_free(gerr);
        return rc;
    }
    int w = W, ht = PANEL_H * p->nmetrics;
    cairo_surface_t *img = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, w, ht);
    cairo_t *cr = cairo_create(img);
    RsvgRectangle view = {0, 0, w, ht};
    int rc = 0;
    if (!rsvg_handle_render_document(h, cr, &view, &gerr)) {
        rc = err_set(err, "cannot render %s: %s", out, gerr ? gerr->message : "librsvg failed");
        if (gerr) g_error_free(gerr);
    }
    cairo_destroy(cr);
    g_object_unref(h);
    char *tmp = rc == 0 ? fs_tmp_name(out) : NULL;
    if (rc == 0) {
        cairo_status_t st = cairo_surface_write_to_png(img, tmp);
        if (st != CAIRO_STATUS_SUCCESS)
            rc = err_set(err, "cannot write %s: %s", out, cairo_status_to_string(st));
        else if (rename(tmp, out) != 0)
            rc = err_sys(err, "cannot rename %s to %s", tmp, out);
        if (rc != 0) remove(tmp);
    }
    cairo_surface_destroy(img);
    free(tmp);
    return rc;
}

static int run_plot(Plot *p, const char **dirs, int ndirs, const char *metric_list,
                    const char *out_arg, Err *err) {
    if (metric_list) {
        p->explicit_metrics = 1;
        char *copy = xstrdup(metric_list), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
            if (metric_index(p, t, 1) < 0) {
                free(copy);
                return err_set(err, "--metric: at most %d metrics", MAX_METRICS);
            }
        free(copy);
        if (p->nmetrics == 0) return err_set(err, "--metric: no metric named");
    }
    for (int i = 0; i < ndirs; i++) {
        if (!fs_exists(dirs[i]))
            return err_set(err,
                           "%s does not exist; expected a run's dump folder (holding "
                           "metrics.jsonl) or a metrics.jsonl file",
                           dirs[i]);
        Run *r = &p->runs[p->nruns++];
        r->path = fs_is_dir(dirs[i]) ? fs_join(dirs[i], "metrics.jsonl") : xstrdup(dirs[i]);
        const char *d = dirs[i] + strlen(dirs[i]);
        while (d > dirs[i] && d[-1] == '/')
            d--;
        const char *end = d;
        while (d > dirs[i] && d[-1] != '/')
            d--;
        r->name = end > d ? strndup(d, (size_t)(end - d)) : xstrdup(dirs[i]);
        TRY(read_run(p, r, err));
    }
    for (int m = 0; m < p->nmetrics; m++) {
        int points = 0;
        for (int r = 0; r < p->nruns; r++)
            points += p->runs[r].s[m].n;
        if (points == 0)
            return err_set(err, "metric \"%s\" is in none of the runs' records", p->metrics[m]);
    }
    if (p->nmetrics == 0) return err_set(err, "the runs' records hold no loss to plot");
    char *out =
        out_arg ? xstrdup(out_arg) : fs_join(fs_is_dir(dirs[0]) ? dirs[0] : ".", "plot.svg");
    /* The picture replaces --out: were it one of the runs' records, they would be lost. */
    int rc = 0;
    for (int r = 0; r < p->nruns && rc == 0; r++)
        if (fs_same_file(out, p->runs[r].path))
            rc = err_set(err,
                         "--out %s is the records file of run %s; writing it would destroy them",
                         out, p->runs[r].name);
    if (rc == 0) rc = str_ends_with(out, ".png") ? write_png(p, out, err) : write_svg(p, out, err);
    if (rc == 0) printf("plot: %s (%d metric(s), %d run(s))\n", out, p->nmetrics, p->nruns);
    free(out);
    return rc;
}

int cmd_plot(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *dirs[MAX_RUNS], *metric_list = NULL, *out = NULL;
    int ndirs = 0, smooth = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (strcmp(a, "--out") == 0 && has) {
            out = argv[++i];
        } else if (strcmp(a, "--metric") == 0 && has) {
            metric_list = argv[++i];
        } else if (strcmp(a, "--smooth") == 0 && has) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1000000) {
                fprintf(stderr, "error: --smooth %s: expected an integer >= 1\n", argv[i]);
                return 2;
            }
            smooth = (int)v;
        } else if (strncmp(a, "--", 2) == 0) {
            fprintf(stderr, "error: unknown or incomplete option %s (see qtitan plot --help)\n", a);
            return 2;
        } else if (ndirs == MAX_RUNS) {
            fprintf(stderr, "error: at most %d runs in one plot\n", MAX_RUNS);
            return 2;
        } else {
            dirs[ndirs++] = a;
        }
    }
    if (ndirs == 0) {
        fprintf(stderr, "error: no RUN_DIR given (see qtitan plot --help)\n");
        return 2;
    }
    if (out && !str_ends_with(out, ".svg") && !str_ends_with(out, ".png")) {
        fprintf(stderr, "error: --out %s: plot writes SVG or PNG (a name ending in .svg or .png)\n",
                out);
        return 2;
    }
    Plot p;
    memset(&p, 0, sizeof p);
    p.smooth = smooth;
    Err err;
    int rc = run_plot(&p, dirs, ndirs, metric_list, out, &err);
    if (rc != 0) fprintf(stderr, "error: %s\n", err.msg);
    for (int r = 0; r < p.nruns; r++) {
        for (int m = 0; m < MAX_METRICS; m++) {
            free(p.runs[r].s[m].x);
            free(p.runs[r].s[m].y);
        }
        free(p.runs[r].name);
        free(p.runs[r].path);
    }
    for (int m = 0; m < p.nmetrics; m++)
        free(p.metrics[m]);
    return rc == 0 ? 0 : 1;
}
