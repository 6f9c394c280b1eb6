/* bench-serve workloads: random lengths, a shared prefix, and replay of a
 * Mooncake FAST'25 trace (one JSON object a line: timestamp in ms,
 * input_length, output_length, hash_ids with one id per 512-token block). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "tools/bench_serve/bench_serve.h"

/* Block namespaces so that trace hash ids, prefixes and per-request
 * content never collide. */
#define DUET__NS_TRACE  (0ULL << 60)
#define DUET__NS_PREFIX (1ULL << 60)
#define DUET__NS_UNIQUE (2ULL << 60)

void duet_bs_workload_free(duet_bs_workload_t *wl)
{
    if (wl == NULL)
        return;
    for (size_t i = 0; i < wl->n; i++)
        duet_free(wl->reqs[i].ids);
    duet_free(wl->reqs);
    memset(wl, 0, sizeof(*wl));
}

/* Block b of the workload with its salt: b itself for salt 0, else another
 * block of the same namespace, the same for equal (b, salt), so blocks
 * shared within the workload stay shared and none is shared with a
 * workload of another salt. */
static uint64_t duet__salted(const duet_bs_workload_config_t *cfg, uint64_t b)
{
    if (cfg->salt == 0)
        return b;
    uint64_t s = b ^ (cfg->salt * 0xa0761d6478bd642fULL);
    return (b & (0xfULL << 60)) | (duet_bs_rand(&s) >> 4);
}

static uint64_t duet__unique_block(const duet_bs_workload_config_t *cfg, size_t i)
{
    uint64_t s = cfg->seed ^ ((uint64_t)i * 0xd6e8feb86659fd93ULL);
    return duet__salted(cfg, DUET__NS_UNIQUE | (duet_bs_rand(&s) >> 4));
}

/* Fill ids[from, n) with a request-unique stream. */
static void duet__fill_unique(const duet_bs_workload_config_t *cfg, int32_t *ids, size_t from,
                              size_t n, size_t i)
{
    uint64_t b = duet__unique_block(cfg, i);
    for (size_t j = from; j < n; j++)
        ids[j] = duet_bs_prompt_token(b, j, cfg->first_token_id, cfg->vocab_size);
}

static int duet__uniform_len(uint64_t *rng, int len, double ratio)
{
    int lo = (int)(len * (1.0 - ratio)), hi = (int)(len * (1.0 + ratio));
    if (lo < 1)
        lo = 1;
    if (hi < lo)
        hi = lo;
    return lo + (int)(duet_bs_rand(rng) % (uint64_t)(hi - lo + 1));
}

static void duet__fit(const duet_bs_workload_config_t *cfg, size_t *in, int *out, size_t *cut)
{
    if (cfg->max_context <= 0)
        return;
    if (*out > cfg->max_context - 1)
        *out = cfg->max_context - 1;
    if (*in + (size_t)*out > (size_t)cfg->max_context) {
        *in = (size_t)(cfg->max_context - *out);
        (*cut)++;
    }
}

static duet_status_t duet__synthetic(const duet_bs_workload_config_t *cfg, duet_bs_workload_t *wl)
{
    size_t n = cfg->num_requests ? cfg->num_requests : 100;
    uint64_t rng = cfg->seed;
    wl->reqs = DUET_NEW_ARRAY(duet_bs_req_t, n);
    if (wl->reqs == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: workload of %zu requests", n);
    for (size_t i = 0; i < n; i++, wl->n++) {
        duet_bs_req_t *r = &wl->reqs[i];
        size_t in;
        if (cfg->dataset == DUET_BS_RANDOM) {
            in = (size_t)duet__uniform_len(&rng, cfg->input_len, cfg->range_ratio);
            r->out_len = duet__uniform_len(&rng, cfg->output_len, cfg->range_ratio);
        } else {
            in = (size_t)cfg->prefix_len + (size_t)cfg->suffix_len;
            r->out_len = cfg->output_len;
        }
        duet__fit(cfg, &in, &r->out_len, &wl->truncated);
        r->ids = DUET_NEW_ARRAY(int32_t, in ? in : 1);
        if (r->ids == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: prompt of %zu tokens", in);
        r->n_ids = in;
        size_t shared = 0;
        if (cfg->dataset == DUET_BS_SHARED_PREFIX) {
            uint64_t b = duet__salted(cfg, DUET__NS_PREFIX | (i % (size_t)cfg->num_prefixes));
            shared = (size_t)cfg->prefix_len < in ? (size_t)cfg->prefix_len : in;
            for (size_t j = 0; j < shared; j++)
                r->ids[j] = duet_bs_prompt_token(b, j, cfg->first_token_id, cfg->vocab_size);
        }
        duet__fill_unique(cfg, r->ids, shared, in, i);
    }
    return DUET_OK;
}

/* A non-negative integer field of a trace line. */
static duet_status_t duet__trace_int(const cJSON *o, const char *field, const char *path,
                                     size_t line, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    if (v == NULL)
        return duet_error(DUET_ERR_FORMAT, "%s:%zu: field '%s' is missing", path, line, field);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble > 1e15)
        return duet_error(DUET_ERR_FORMAT, "%s:%zu: field '%s' must be a non-negative integer",
                          path, line, field);
    *out = v->valuedouble;
    return DUET_OK;
}

/* Parse one trace line into r (before scaling: n_ids = input_length). */
static duet_status_t duet__trace_line(const duet_bs_workload_config_t *cfg, const char *text,
                                      size_t line, size_t idx, duet_bs_req_t *r, double *ts)
{
    const char *path = cfg->trace_path;
    duet_status_t st;
    double in, out;
    cJSON *o = cJSON_Parse(text);
    if (o == NULL || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return duet_error(DUET_ERR_FORMAT, "%s:%zu: not a JSON object", path, line);
    }
    if ((st = duet__trace_int(o, "timestamp", path, line, ts)) != DUET_OK ||
        (st = duet__trace_int(o, "input_length", path, line, &in)) != DUET_OK ||
        (st = duet__trace_int(o, "output_length", path, line, &out)) != DUET_OK)
        goto delete_json;
    if (in < 1) {
        st = duet_error(DUET_ERR_FORMAT, "%s:%zu: field 'input_length' must be at least 1", path,
                        line);
        goto delete_json;
    }
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "hash_ids"), *e;
    if (h == NULL) {
        st = duet_error(DUET_ERR_FORMAT, "%s:%zu: field 'hash_ids' is missing", path, line);
        goto delete_json;
    }
    if (!cJSON_IsArray(h)) {
        st = duet_error(DUET_ERR_FORMAT, "%s:%zu: field 'hash_ids' must be an array of integers",
                        path, line);
        goto delete_json;
    }
    size_t n_hash = (size_t)cJSON_GetArraySize(h), k = 0;
    uint64_t *hash = DUET_NEW_ARRAY(uint64_t, n_hash ? n_hash : 1);
    if (hash == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "%s:%zu: hash_ids", path, line);
        goto delete_json;
    }
    cJSON_ArrayForEach(e, h)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble != floor(e->valuedouble)) {
            duet_free(hash);
            st = duet_error(DUET_ERR_FORMAT,
                            "%s:%zu: field 'hash_ids' element %zu must be a non-negative integer",
                            path, line, k);
            goto delete_json;
        }
        hash[k++] = (uint64_t)e->valuedouble;
    }

    /* scale */
    double ls = cfg->trace_len_scale;
    double os = cfg->trace_output_scale < 0 ? ls : cfg->trace_output_scale;
    size_t n_in = (size_t)llround(in * ls);
    int n_out = (int)llround(out * os);
    int block = cfg->trace_block_size > 0 ? cfg->trace_block_size : (int)llround(512 * ls);
    if (n_in < 1)
        n_in = 1;
    if (n_out < 1)
        n_out = 1;
    if (block < 1)
        block = 1;
    r->out_len = n_out;
    r->n_ids = n_in;
    r->ids = DUET_NEW_ARRAY(int32_t, n_in);
    if (r->ids == NULL) {
        duet_free(hash);
        st = duet_error(DUET_ERR_NO_MEMORY, "%s:%zu: prompt", path, line);
        goto delete_json;
    }
    size_t from = n_hash * (size_t)block < n_in ? n_hash * (size_t)block : n_in;
    for (size_t p = 0; p < from; p++)
        r->ids[p] =
            duet_bs_prompt_token(duet__salted(cfg, DUET__NS_TRACE | hash[p / (size_t)block]),
                                 p % (size_t)block, cfg->first_token_id, cfg->vocab_size);
    duet__fill_unique(cfg, r->ids, from, n_in, idx);
    duet_free(hash);
delete_json:
    cJSON_Delete(o);
    return st;
}

static duet_status_t duet__trace(const duet_bs_workload_config_t *cfg, duet_bs_workload_t *wl)
{
    duet_status_t st = DUET_OK;
    FILE *f = fopen(cfg->trace_path, "r");
    char *line = NULL;
    size_t cap = 0, no = 0, cap_reqs = 0;
    double t0 = 0;
    if (f == NULL)
        return duet_error(DUET_ERR_IO, "%s: %s", cfg->trace_path, strerror(errno));
    wl->has_times = true;
    while (cfg->num_requests == 0 || wl->n < cfg->num_requests) {
        ssize_t len = getline(&line, &cap, f);
        if (len < 0)
            break;
        no++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = '\0';
        if (len == 0)
            continue;
        if (wl->n == cap_reqs) {
            size_t nc = cap_reqs ? 2 * cap_reqs : 1024;
            duet_bs_req_t *g = duet_realloc(wl->reqs, nc * sizeof(*g));
            if (g == NULL) {
                st = duet_error(DUET_ERR_NO_MEMORY, "%s: %zu requests", cfg->trace_path, nc);
                goto close_file;
            }
            wl->reqs = g;
            cap_reqs = nc;
        }
        duet_bs_req_t *r = &wl->reqs[wl->n];
        double ts;
        memset(r, 0, sizeof(*r));
        if ((st = duet__trace_line(cfg, line, no, wl->n, r, &ts)) != DUET_OK)
            goto close_file;
        if (wl->n == 0)
            t0 = ts;
        if (ts < t0)
            ts = t0; /* out of order: arrives with the earlier one */
        r->arrival_ns = (int64_t)((ts - t0) * cfg->trace_time_scale * 1e6);
        duet__fit(cfg, &r->n_ids, &r->out_len, &wl->truncated);
        wl->n++;
    }
    if (ferror(f))
        st = duet_error(DUET_ERR_IO, "%s: read error", cfg->trace_path);
    else if (wl->n == 0)
        st = duet_error(DUET_ERR_FORMAT, "%s: no requests", cfg->trace_path);
close_file:
    free(line);
    fclose(f);
    return st;
}

duet_status_t duet_bs_workload_build(const duet_bs_workload_config_t *cfg, duet_bs_workload_t *wl)
{
    duet_status_t st;
    memset(wl, 0, sizeof(*wl));
    if (cfg->first_token_id < 0 || cfg->vocab_size <= cfg->first_token_id)
        return duet_error(DUET_ERR_INVALID, "bench-serve: --vocab-size must exceed %d",
                          cfg->first_token_id);
    st = cfg->dataset == DUET_BS_TRACE ? duet__trace(cfg, wl) : duet__synthetic(cfg, wl);
    if (st != DUET_OK)
        duet_bs_workload_free(wl);
    return st;
}
