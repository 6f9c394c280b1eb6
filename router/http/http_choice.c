/* The job sink of one choice of a completion request (http_internal.h
 * duet__choice_t; docs/api-logprobs.md "Fan-out").  Each choice is its own
 * job; chunks of several choices interleave in one SSE stream, each
 * carrying its index, and a non-streaming response is assembled once
 * every choice ended.  The first failure ends the request: the other
 * choices are cancelled, and it is the error the client sees (an HTTP
 * error before any token reached the client, else an SSE error event). */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "router/http/http_internal.h"

#define DUET__MAX_PENDING (16u << 20)

/* A token's own bytes, as it reads inside a text: decoders strip a
 * leading space at the start of a text only (SentencePiece's "▁the" alone
 * decodes to "the"), so the token is decoded twice in a row and the
 * first copy's bytes are dropped. */
size_t duet__http_tok_bytes(void *ud, int32_t id, char *buf, size_t cap)
{
    duet_router_t *rt = ud;
    int32_t two[2] = {id, id};
    char *one = NULL, *both = NULL;
    size_t n1 = 0, n2 = 0, len = 0;

    if (cap > 0 && duet_tokenizer_decode_bytes(rt->tok, two, 1, false, &one, &n1) == DUET_OK &&
        duet_tokenizer_decode_bytes(rt->tok, two, 2, false, &both, &n2) == DUET_OK && n2 >= n1) {
        len = n2 - n1 < cap ? n2 - n1 : cap;
        memcpy(buf, both + n1, len);
    }
    duet_free(one);
    duet_free(both);
    return len;
}

bool duet__http_choice_add_lps(duet__choice_t *c, const duet_router_oai_lp_t *lps, size_t n)
{
    if (n == 0)
        return true;
    if (c->n_lps + n > c->cap_lps) {
        size_t cap = (c->n_lps + n) * 2;
        duet_router_oai_lp_t *p = duet_realloc(c->lps, cap * sizeof(*p));
        if (p == NULL)
            return false;
        c->lps = p;
        c->cap_lps = cap;
    }
    memcpy(c->lps + c->n_lps, lps, n * sizeof(*lps));
    c->n_lps += n;
    return true;
}

static void duet__lp_from_pb(const Duet__V1__TokenLogprob *m, duet_router_oai_lp_t *lp)
{
    memset(lp, 0, sizeof(*lp));
    lp->id = m->id;
    lp->has_logprob = true;
    lp->logprob = m->logprob;
    for (size_t k = 0; k < m->n_top && k < DUET_ROUTER_OAI_TOP_MAX_CHAT; k++) {
        lp->top_ids[k] = m->top[k]->id;
        lp->top_logprobs[k] = m->top[k]->logprob;
        lp->n_top++;
    }
}

/* The chunk's logprobs in order (with echo, the first chunk's start with
 * the prompt's); *lps_p is duet_malloc'd (NULL when none). */
static bool duet__choice_chunk_lps(const duet__choice_t *c, const Duet__V1__TokenChunk *chunk,
                                   bool first, duet_router_oai_lp_t **lps_p, size_t *n_p)
{
    const duet__hreq_t *r = c->r;
    bool echo = first && r->echo;
    size_t n = (echo ? 1 + chunk->n_prompt_logprobs : 0) + chunk->n_logprobs, k = 0;
    duet_router_oai_lp_t *lps;

    *lps_p = NULL;
    *n_p = 0;
    if (!r->logprobs || n == 0)
        return true;
    if ((lps = DUET_NEW_ARRAY(duet_router_oai_lp_t, n)) == NULL)
        return false;
    if (echo) {
        lps[k++].id = r->prompts[c->prompt].first_id; /* no logprob */
        for (size_t i = 0; i < chunk->n_prompt_logprobs; i++)
            duet__lp_from_pb(chunk->prompt_logprobs[i], &lps[k++]);
    }
    for (size_t i = 0; i < chunk->n_logprobs; i++)
        duet__lp_from_pb(chunk->logprobs[i], &lps[k++]);
    *lps_p = lps;
    *n_p = k;
    return true;
}

/* Stream one event of choice c (lock held). */
static void duet__stream_event(duet__choice_t *c, const char *echo, size_t echo_len,
                               const char *text, size_t len, const duet_router_oai_lp_t *lps,
                               size_t n_lps, const char *finish)
{
    duet__hreq_t *r = c->r;
    duet_router_oai_meta_t m;
    duet_router_buf_t lp, t;

    duet__http_meta(r, &m);
    duet_router_buf_init(&lp);
    duet_router_buf_init(&t);
    if (n_lps > 0)
        duet_router_oai_render_logprobs(&lp, r->api, lps, n_lps, duet__http_tok_bytes, r->http->rt,
                                        &c->text_offset);
    duet_router_buf_append(&t, echo, echo_len);
    duet_router_buf_append(&t, text, len);
    duet_router_oai_render_chunk_choice(&r->out, &m, c->index, t.data ? t.data : "", t.len,
                                        n_lps > 0 ? lp.data : NULL, lp.len, finish,
                                        r->api == DUET_ROUTER_API_CHAT && !c->sent_role);
    c->sent_role = true;
    if (lp.oom || t.oom)
        r->out.oom = true;
    duet_router_buf_cleanup(&lp);
    duet_router_buf_cleanup(&t);
}

static bool duet__choice_on_chunk(void *arg, const Duet__V1__TokenChunk *chunk, const uint8_t *raw,
                                  size_t len)
{
    duet__choice_t *c = arg;
    duet__hreq_t *r = c->r;
    duet_router_oai_lp_t *lps = NULL;
    size_t n_lps = 0, tlen = strlen(chunk->text);
    bool keep = true, first;

    (void)raw;
    (void)len;
    pthread_mutex_lock(&r->lock);
    if (r->conn_gone || r->failed) { /* a failed request's others are being cancelled */
        pthread_mutex_unlock(&r->lock);
        return true;
    }
    first = !c->got_chunk;
    c->got_chunk = true;
    r->end_started = true;
    if (!duet__choice_chunk_lps(c, chunk, first, &lps, &n_lps)) {
        pthread_mutex_unlock(&r->lock);
        return false;
    }
    const duet__hprompt_t *p = &r->prompts[c->prompt];
    const char *echo = first && r->echo ? p->echo : "";
    size_t echo_len = first && r->echo ? p->echo_len : 0;
    if (r->stream) {
        if (tlen > 0 || n_lps > 0 || echo_len > 0 ||
            (r->api == DUET_ROUTER_API_CHAT && !c->sent_role))
            duet__stream_event(c, echo, echo_len, chunk->text, tlen, lps, n_lps, NULL);
        keep = !r->out.oom && duet_router_buf_unread(&r->out) <= DUET__MAX_PENDING;
        r->ready = true;
        duet__http_hreq_resume_locked(r);
    } else {
        keep = duet_router_buf_append(&c->text, echo, echo_len) &&
               duet_router_buf_append(&c->text, chunk->text, tlen) &&
               duet__http_choice_add_lps(c, lps, n_lps);
    }
    pthread_mutex_unlock(&r->lock);
    duet_free(lps);
    return keep;
}

/* The stream's end once every choice ended (lock held). */
static void duet__stream_end(duet__hreq_t *r)
{
    duet_router_oai_meta_t m;

    duet__http_meta(r, &m);
    if (!r->failed) {
        duet_router_oai_usage_t u = {r->end_prompt, r->end_completion};
        if (r->include_usage)
            duet_router_oai_render_usage_chunk(&r->out, &m, &u);
        duet_router_sse_done(&r->out);
    }
}

static void duet__choice_on_end(void *arg, const duet_router_job_end_t *end)
{
    duet__choice_t *c = arg;
    duet__hreq_t *r = c->r;
    duet_router_job_t *others[DUET_ROUTER_OAI_CHOICES_MAX];
    int n_others = 0;

    pthread_mutex_lock(&r->lock);
    c->ended = true;
    c->end_ok = end->ok;
    c->end_reason = end->reason;
    c->end_completion = end->completion_tokens;
    r->n_ended++;
    if (!end->ok && !r->failed) {
        r->failed = true;
        r->end_code = end->code;
        snprintf(r->end_msg, sizeof(r->end_msg), "%s", end->message ? end->message : "");
        for (int i = 0; i < r->n_choices; i++) {
            duet__choice_t *o = &r->choices[i];
            if (o != c && !o->ended && o->job != NULL)
                others[n_others++] = duet_router_job_ref(o->job);
        }
    }
    if (end->ok)
        r->end_completion += end->completion_tokens;
    if (r->stream && !r->conn_gone) {
        if (end->ok && !r->failed) {
            if (r->api == DUET_ROUTER_API_CHAT && !c->sent_role)
                duet__stream_event(c, "", 0, "", 0, NULL, 0, NULL);
            duet__stream_event(c, "", 0, "", 0, NULL, 0, duet_router_oai_finish_name(end->reason));
        } else if (r->failed && r->end_started && !r->err_sent) {
            duet_router_oai_error_t err;
            duet_router_error_from_grpc(r->end_code, r->end_msg, true, &err);
            duet_router_sse_error(&r->out, &err);
            r->err_sent = true;
        }
    }
    if (r->n_ended == r->n_choices) {
        r->ended = true;
        r->end_ok = !r->failed;
        if (r->stream && !r->conn_gone)
            duet__stream_end(r);
    }
    r->ready = true;
    duet__http_hreq_resume_locked(r);
    pthread_mutex_unlock(&r->lock);
    for (int i = 0; i < n_others; i++) {
        duet_router_job_cancel(others[i]);
        duet_router_job_release(others[i]);
    }
    duet__http_hreq_unref(r); /* the sink's reference */
}

const duet_router_sink_t duet__http_choice_sink = {duet__choice_on_chunk, duet__choice_on_end};
