/* bench-serve plots: data files and a gnuplot script in the --plot
 * directory, rendered to cdf.png (TTFT and TPOT CDFs, one line per run) and,
 * for a request-rate sweep, goodput.png (goodput and throughput against the
 * offered rate).  gnuplot is optional: without it the files stay there for
 * later (`gnuplot plot.gp` in that directory).  The CDFs' x axes end at
 * the largest p99 of the runs (or the SLO, if larger). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/alloc.h"
#include "tools/bench_serve/bench_serve.h"

static bool duet__in_path(const char *exe)
{
    const char *path = getenv("PATH");
    char buf[4096];
    while (path != NULL && *path) {
        const char *c = strchr(path, ':');
        size_t n = c ? (size_t)(c - path) : strlen(path);
        snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, path, exe);
        if (n > 0 && access(buf, X_OK) == 0)
            return true;
        path = c ? c + 1 : NULL;
    }
    return false;
}

static duet_status_t duet__cdf(const char *dir, const char *name, size_t k, const double *v,
                               size_t n)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s/%s_%zu.dat", dir, name, k);
    FILE *f = fopen(p, "w");
    if (f == NULL)
        return duet_error(DUET_ERR_IO, "%s: %s", p, strerror(errno));
    fprintf(f, "# %s_ms fraction_of_requests\n", name);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%.4f %.6f\n", v[i], (double)(i + 1) / (double)n);
    fclose(f);
    return DUET_OK;
}

/* xmax: the largest p99 of the series; the SLO line stays in view. */
static void duet__plot_cdf(FILE *g, const char *what, const char *name,
                           const duet_bs_plot_series_t *series, size_t n, double slo, double xmax)
{
    fprintf(g,
            "set title '%s CDF'\nset xlabel '%s (ms; the axis ends at the largest p99)'\n"
            "set ylabel 'fraction of requests'\n",
            what, what);
    if (slo * 1.05 > xmax)
        xmax = slo * 1.05;
    fprintf(g, "set xrange [0:%g]\n", xmax > 0 ? xmax : 1);
    fprintf(g, "set yrange [0:1]\nset grid\nset key bottom right\nunset arrow\n");
    if (slo > 0)
        fprintf(g, "set arrow from %g, graph 0 to %g, graph 1 nohead dt 2 lc rgb 'red'\n", slo,
                slo);
    fprintf(g, "plot ");
    for (size_t k = 0; k < n; k++)
        fprintf(g, "%s'%s_%zu.dat' using 1:2 with steps lw 2 title '%s'", k ? ", " : "", name, k,
                series[k].label);
    fprintf(g, "\n");
}

duet_status_t duet_bs_plot(const char *dir, const duet_bs_plot_series_t *series, size_t n,
                           const duet_bs_slo_t *slo)
{
    char p[4096];
    double max_ttft = 0, max_tpot = 0;
    duet_status_t st = DUET_OK;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return duet_error(DUET_ERR_IO, "--plot %s: %s", dir, strerror(errno));
    for (size_t k = 0; k < n && st == DUET_OK; k++) {
        double *ttft, *tpot;
        size_t nt, np;
        if ((st = duet_bs_samples(series[k].run, &ttft, &nt, &tpot, &np)) != DUET_OK)
            return st;
        /* the x axis ends at the largest p99: a long tail would squash the rest */
        if (duet_bs_percentile(ttft, nt, 99) > max_ttft)
            max_ttft = duet_bs_percentile(ttft, nt, 99);
        if (duet_bs_percentile(tpot, np, 99) > max_tpot)
            max_tpot = duet_bs_percentile(tpot, np, 99);
        if ((st = duet__cdf(dir, "ttft", k, ttft, nt)) == DUET_OK)
            st = duet__cdf(dir, "tpot", k, tpot, np);
        duet_free(ttft);
        duet_free(tpot);
    }
    if (st != DUET_OK)
        return st;
    if (n > 1) {
        snprintf(p, sizeof(p), "%s/goodput.dat", dir);
        FILE *f = fopen(p, "w");
        if (f == NULL)
            return duet_error(DUET_ERR_IO, "%s: %s", p, strerror(errno));
        fprintf(f, "# request_rate goodput_req_s throughput_req_s\n");
        for (size_t k = 0; k < n; k++)
            fprintf(f, "%g %.4f %.4f\n", series[k].rate, series[k].sum->goodput,
                    series[k].sum->request_throughput);
        fclose(f);
    }
    snprintf(p, sizeof(p), "%s/plot.gp", dir);
    FILE *g = fopen(p, "w");
    if (g == NULL)
        return duet_error(DUET_ERR_IO, "%s: %s", p, strerror(errno));
    fprintf(g, "# duet bench-serve plots: run `gnuplot plot.gp` in this directory\n"
               "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo size 1200,480 font ',11'\n"
               "} else {\n"
               "  set terminal png size 1200,480\n"
               "}\n"
               "set output 'cdf.png'\nset multiplot layout 1,2\n");
    duet__plot_cdf(g, "TTFT", "ttft", series, n, slo->slo_ttft_ms, max_ttft);
    duet__plot_cdf(g, "TPOT", "tpot", series, n, slo->slo_tpot_ms, max_tpot);
    fprintf(g, "unset multiplot\nset xrange [*:*]\n");
    if (n > 1)
        fprintf(g, "set output 'goodput.png'\nunset arrow\nset title 'Goodput vs request rate'\n"
                   "set xlabel 'offered request rate (req/s)'\nset ylabel 'req/s'\n"
                   "set xrange [0:*]\nset yrange [0:*]\nset key top left\nset grid\n"
                   "plot 'goodput.dat' using 1:2 with linespoints lw 2 pt 7 title "
                   "'goodput (met the SLO)', '' using 1:3 with linespoints lw 2 pt 5 title "
                   "'throughput (completed)', x with lines dt 2 lc rgb 'gray' title 'offered'\n");
    fclose(g);

    if (!duet__in_path("gnuplot"))
        return duet_error(DUET_ERR_NOT_FOUND,
                          "--plot: gnuplot is not installed (apt-get install gnuplot-nox); the "
                          "data and plot.gp are in %s",
                          dir);
    pid_t pid = fork();
    if (pid < 0)
        return duet_error(DUET_ERR_IO, "--plot: fork: %s", strerror(errno));
    if (pid == 0) {
        if (chdir(dir) != 0)
            _exit(127);
        execlp("gnuplot", "gnuplot", "plot.gp", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return duet_error(DUET_ERR_IO, "--plot: gnuplot failed in %s (status %d)", dir, status);
    return DUET_OK;
}
