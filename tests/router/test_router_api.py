#!/usr/bin/python3
"""duet-router end to end on a real cluster (prefill TP=2, decode TP=4,
stories260K, CPU): the npm openai client (tests/clients, pinned 6.49.0)
and Debian's python3-grpcio against the router, both equal to
`duet generate --tp 1` under greedy; the bad-input matrix with curl; API
key on HTTP and gRPC; 429 with a full queue; 504 on timeout; metrics;
/workers; graceful SIGTERM with a stream in flight.

usage: test_router_api.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import grpc

from router_cluster import Cluster, check, detok, fail, main, oracle

# (text, ids, max_tokens); ids avoid byte-fallback tokens (3..258) so the
# continuation's text does not depend on a partial character in the prompt
PROMPTS = [("Once upon a time", None, 24), (None, [1, 300, 400, 350, 450], 16),
           ("The cat", None, 40)]


def openai_client(cl, src, build, skipped):
    node = shutil.which("node")
    mods = os.path.join(src, "tests", "clients", "node_modules", "openai")
    if not node or not os.path.isdir(mods):
        print("SKIP part: node or tests/clients/node_modules/openai missing "
              "(scripts/install-deps.sh runs npm ci)")
        skipped.append("openai")
        return
    cases = []
    for text, ids, n in PROMPTS:
        oids, _ = oracle(build, cl.model, prompt_ids=ids, prompt=text, max_tokens=n)
        cases.append({"prompt": text, "prompt_ids": ids, "max_tokens": n,
                      "expect_text": detok(cl.model, oids), "expect_tokens": len(oids)})
    spec = {"base_url": "http://127.0.0.1:%d/v1" % cl.http_port, "model": "stories260K",
            "cases": cases, "expect_chat_400": True}
    path = os.path.join(cl.tmp, "openai_spec.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    r = subprocess.run([node, os.path.join(src, "tests", "clients", "router_openai.mjs"), path],
                       capture_output=True, text=True, timeout=300)
    print(r.stdout.strip())
    check(r.returncode == 0, "openai client failed:\n%s\n%s" % (r.stdout, r.stderr[-2000:]))


def chat(cl, src, build, skipped):
    """A router whose model directory (tokenizer only; the workers keep the
    real one) has a chat template: chat completions through the openai
    client equal the oracle on the rendered prompt."""
    from router_cluster import free_port
    mdir = os.path.join(cl.tmp, "chat_model")
    os.makedirs(mdir)
    for f in ("config.json", "tokenizer.json"):
        os.symlink(os.path.join(cl.model, f), os.path.join(mdir, f))
    with open(os.path.join(cl.model, "tokenizer_config.json")) as f:
        tc = json.load(f)
    tc["chat_template"] = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: "
                           "{{ m['content'] | trim }}\n{% endfor %}"
                           "{% if add_generation_prompt %}assistant:{% endif %}")
    with open(os.path.join(mdir, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    hp = free_port()
    cfg = cl.write_config(os.path.join(cl.tmp, "chat.json"),
                          {"http": "127.0.0.1:%d" % hp, "grpc": "",
                           "served_model_name": "stories-chat"})
    with open(cfg) as f:
        c = json.load(f)
    c["model"] = mdir
    with open(cfg, "w") as f:
        json.dump(c, f)
    cl.start_router("router-chat", config=cfg, port=hp)
    rendered = "user: Tell me a story\nassistant:"
    ids, _ = oracle(build, cl.model, prompt=rendered, max_tokens=20)
    st, _, rc = cl.post_json("/v1/completions", {"prompt": rendered, "max_tokens": 1})
    check(st == 200, "completion of the rendered prompt: %s" % rc)
    messages = [{"role": "user", "content": "  Tell me a story "}]
    st, _, r = cl.post_json("/v1/chat/completions", {"messages": messages, "max_tokens": 20,
                                                     "temperature": 0}, port=hp)
    check(st == 200 and r["choices"][0]["message"]["content"] == detok(cl.model, ids) and
          r["usage"]["prompt_tokens"] == rc["usage"]["prompt_tokens"],
          "chat (http.client): %s" % r)
    node = shutil.which("node")
    if node and os.path.isdir(os.path.join(src, "tests", "clients", "node_modules", "openai")):
        spec = {"base_url": "http://127.0.0.1:%d/v1" % hp, "model": "stories-chat", "cases": [],
                "chat": {"messages": messages, "max_tokens": 20,
                         "expect_text": detok(cl.model, ids),
                         "expect_prompt_tokens": r["usage"]["prompt_tokens"]}}
        path = os.path.join(cl.tmp, "openai_chat.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        res = subprocess.run([node, os.path.join(src, "tests", "clients", "router_openai.mjs"),
                              path], capture_output=True, text=True, timeout=120)
        print(res.stdout.strip())
        check(res.returncode == 0, "openai chat client:\n%s\n%s" % (res.stdout, res.stderr))
    else:
        skipped.append("openai chat")
    # roles the template cannot render are the client's error
    st, _, r = cl.post_json("/v1/chat/completions", {"messages": [{"role": "user"}],
                                                     "max_tokens": 2}, port=hp)
    check(st == 200, "message without content (null content is allowed): %s" % r)
    st, _, r = cl.post_json("/v1/chat/completions", {"messages": [], "max_tokens": 2}, port=hp)
    check(st == 400 and r["error"]["param"] == "messages", "empty messages: %s" % r)
    cl.stop("router-chat")


def grpc_client(cl, build):
    pb = cl.pb
    stub = cl.router_stub()
    for text, ids, n in PROMPTS:
        oids, _ = oracle(build, cl.model, prompt_ids=ids, prompt=text, max_tokens=n)
        otext = detok(cl.model, oids)
        got, gtext, fin, msgs = [], "", None, 0
        for r in stub.Generate(cl.gen_request(text if text else ids, max_tokens=n), timeout=60):
            msgs += 1
            if r.HasField("chunk"):
                got += list(r.chunk.ids)
                gtext += r.chunk.text
            else:
                fin = r.finished
        check(got == oids, "grpc ids %s != oracle %s" % (got, oids))
        check(gtext == otext, "grpc text %r != %r" % (gtext, otext))
        check(fin is not None and fin.completion_tokens == len(oids) and fin.prompt_tokens > 0,
              "grpc finished: %s" % fin)
        check(msgs >= 3, "grpc: %d messages (not streamed?)" % msgs)
    # a client-chosen request id comes back in finished
    last = list(stub.Generate(cl.gen_request("Once", max_tokens=2, request_id="my-req-7"),
                              timeout=30))[-1]
    check(last.finished.request_id == "my-req-7", "request id: %s" % last.finished.request_id)
    bad = [
        (cl.gen_request("x", model="other"), grpc.StatusCode.NOT_FOUND),
        (cl.gen_request(""), grpc.StatusCode.INVALID_ARGUMENT),
        (cl.gen_request([1, 2, 600]), grpc.StatusCode.INVALID_ARGUMENT),
        (cl.gen_request([5] * 600), grpc.StatusCode.OUT_OF_RANGE),
        (cl.gen_request("x", max_tokens=100000), grpc.StatusCode.INVALID_ARGUMENT),
        (cl.gen_request("x", temperature=-1.0), grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for req, code in bad:
        try:
            list(stub.Generate(req, timeout=30))
            fail("grpc: %s accepted" % str(req)[:80])
        except grpc.RpcError as e:
            check(e.code() == code, "grpc: %s -> %s (want %s)" % (str(req)[:60], e.code(), code))
    h = pb["health_grpc"].HealthStub(cl.channel("127.0.0.1:%d" % cl.grpc_port))
    st = h.Check(pb["health"].HealthCheckRequest(service=""), timeout=5).status
    check(st == pb["health"].HealthCheckResponse.SERVING, "router health %s" % st)


def curl(cl, method, path, data=None, headers=(), port=None, extra=()):
    cmd = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "-X", method,
           "http://127.0.0.1:%d%s" % (port or cl.http_port, path)]
    for h in headers:
        cmd += ["-H", h]
    if data is not None:
        cmd += ["--data-binary", "@-"]
    cmd += list(extra)
    r = subprocess.run(cmd, input=data.encode() if isinstance(data, str) else data,
                       capture_output=True, timeout=60)
    body, _, code = r.stdout.decode(errors="replace").rpartition("\n")
    return int(code), body


def bad_inputs(cl):
    big = json.dumps({"prompt": "x" * 70000, "max_tokens": 1})
    cases = [
        ("malformed JSON", "POST", "/v1/completions", '{"prompt": "x",', 400, None),
        ("not an object", "POST", "/v1/completions", '["x"]', 400, None),
        ("prompt type", "POST", "/v1/completions", '{"prompt": 5}', 400, "prompt"),
        ("max_tokens type", "POST", "/v1/completions", '{"prompt": "x", "max_tokens": "3"}', 400,
         "max_tokens"),
        ("negative max_tokens", "POST", "/v1/completions", '{"prompt": "x", "max_tokens": -5}',
         400, "max_tokens"),
        ("huge max_tokens", "POST", "/v1/completions",
         '{"prompt": "x", "max_tokens": 1000000000}', 400, "max_tokens"),
        ("temperature type", "POST", "/v1/completions", '{"prompt": "x", "temperature": "hot"}',
         400, "temperature"),
        ("empty prompt", "POST", "/v1/completions", '{"prompt": ""}', 400, "prompt"),
        ("empty id prompt", "POST", "/v1/completions", '{"prompt": []}', 400, "prompt"),
        ("token id out of range", "POST", "/v1/completions", '{"prompt": [1, 99999]}', 400,
         "prompt"),
        ("prompt longer than the context", "POST", "/v1/completions",
         json.dumps({"prompt": [5] * 513}), 400, "prompt"),
        ("text prompt longer than the context", "POST", "/v1/completions",
         json.dumps({"prompt": "the cat sat on the mat. " * 200}), 400, "prompt"),
        ("n > 16", "POST", "/v1/completions", '{"prompt": "x", "n": 17}', 400, "n"),
        ("unknown model", "POST", "/v1/completions", '{"prompt": "x", "model": "gpt-9"}', 404,
         "model"),
        ("unknown model id", "GET", "/v1/models/gpt-9", None, 404, "model"),
        ("unknown route", "GET", "/v2/things", None, 404, None),
        ("wrong method", "GET", "/v1/completions", None, 405, None),
        ("wrong method 2", "POST", "/health", "{}", 405, None),
        ("oversized body", "POST", "/v1/completions", big, 413, None),
        ("chat without a template", "POST", "/v1/chat/completions",
         '{"messages": [{"role": "user", "content": "hi"}]}', 400, "messages"),
    ]
    for name, method, path, data, status, param in cases:
        code, body = curl(cl, method, path, data, headers=["Content-Type: application/json"])
        try:
            err = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            fail("%s: status %d, not an OpenAI error body: %r" % (name, code, body[:200]))
        check(code == status, "%s: status %d (want %d): %s" % (name, code, status, body))
        check(set(err) == {"message", "type", "param", "code"} and err["message"],
              "%s: error shape %s" % (name, err))
        check(err["param"] == param, "%s: param %s (want %s)" % (name, err["param"], param))
        if status == 404 and param == "model":
            check(err["code"] == "model_not_found", "%s: code %s" % (name, err["code"]))
        # the router keeps serving after each
        hc, _ = curl(cl, "GET", "/health")
        check(hc == 200, "%s: /health %d afterwards" % (name, hc))
    # oversized body without a Content-Length (chunked upload)
    code, body = curl(cl, "POST", "/v1/completions", big,
                      headers=["Content-Type: application/json", "Transfer-Encoding: chunked"])
    check(code == 413 and json.loads(body)["error"]["code"] == "request_too_large",
          "chunked oversized body: %d %s" % (code, body[:200]))
    code, body = curl(cl, "POST", "/v1/completions", '{"prompt": "Once", "max_tokens": 3}',
                      headers=["Content-Type: application/json"])
    check(code == 200 and json.loads(body)["usage"]["completion_tokens"] == 3,
          "good request after the matrix: %d %s" % (code, body[:200]))


def auth_queue_timeout(cl):
    """Another router on the same workers: API key, max_concurrent 1 with a
    queue of 1, and a third with a short request timeout."""
    hp, gp = cl.http_port + 0, None
    from router_cluster import free_port
    hp, gp = free_port(), free_port()
    cfg = cl.write_config(os.path.join(cl.tmp, "keyed.json"),
                          {"http": "127.0.0.1:%d" % hp, "grpc": "127.0.0.1:%d" % gp,
                           "api_key_env": "DUET_TEST_KEY", "max_concurrent": 1,
                           "queue_limit": 1})
    cl.start_router("router-key", config=cfg, env={"DUET_TEST_KEY": "s3cret"}, port=hp)
    good = ["Content-Type: application/json", "Authorization: Bearer s3cret"]
    body = '{"prompt": "Once", "max_tokens": 2}'
    for hdrs, want in ((["Content-Type: application/json"], 401),
                       (["Content-Type: application/json", "Authorization: Bearer nope"], 401),
                       (["Content-Type: application/json", "Authorization: s3cret"], 401),
                       (good, 200)):
        code, out = curl(cl, "POST", "/v1/completions", body, headers=hdrs, port=hp)
        check(code == want, "api key %s: %d %s" % (hdrs[1:], code, out[:200]))
        if want == 401:
            check(json.loads(out)["error"]["type"] == "authentication_error", out)
    code, _ = curl(cl, "GET", "/v1/models", port=hp)
    check(code == 401, "models without key: %d" % code)
    code, _ = curl(cl, "GET", "/health", port=hp)
    check(code == 200, "health without key: %d" % code)
    stub = cl.router_stub(gp)
    try:
        list(stub.Generate(cl.gen_request("Once", max_tokens=2), timeout=10))
        fail("grpc without key accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAUTHENTICATED, "grpc without key: %s" % e.code())
    out = list(stub.Generate(cl.gen_request("Once", max_tokens=2), timeout=10,
                             metadata=[("authorization", "Bearer s3cret")]))
    check(out[-1].HasField("finished"), "grpc with key")
    h = cl.pb["health_grpc"].HealthStub(cl.channel("127.0.0.1:%d" % gp))
    check(h.Check(cl.pb["health"].HealthCheckRequest(), timeout=5).status ==
          cl.pb["health"].HealthCheckResponse.SERVING, "health probe without key")

    # max_concurrent 1, queue 1: one runs, one waits, the third gets 429
    long_body = {"prompt": "Once", "max_tokens": 480, "ignore_eos": True, "stream": True}
    results = {}

    def run(key):
        results[key] = cl.sse("/v1/completions", long_body, port=hp,
                              headers={"Authorization": "Bearer s3cret"})
    t1 = threading.Thread(target=run, args=("a",))
    t1.start()
    deadline = time.time() + 10
    while time.time() < deadline and cl.metrics(hp).get("duet_router_inflight_requests") != 1:
        time.sleep(0.01)
    t2 = threading.Thread(target=run, args=("b",))
    t2.start()
    while time.time() < deadline and cl.metrics(hp).get("duet_router_queue_depth") != 1:
        time.sleep(0.01)
    check(cl.metrics(hp).get("duet_router_queue_depth") == 1, "second request not queued")
    code, out = curl(cl, "POST", "/v1/completions", body, headers=good, port=hp,
                     extra=["-D", "/dev/stderr"])
    check(code == 429 and json.loads(out)["error"]["type"] == "rate_limit_error",
          "third request: %d %s" % (code, out[:200]))
    r = subprocess.run(["curl", "-s", "-D", "-", "-o", "/dev/null", "-H", good[1], "-d", body,
                        "http://127.0.0.1:%d/v1/completions" % hp], capture_output=True,
                       text=True)
    check("Retry-After: 1" in r.stdout or "retry-after: 1" in r.stdout.lower(),
          "429 without Retry-After: %s" % r.stdout)
    t1.join(60)
    t2.join(60)
    for k in ("a", "b"):
        st, ev, raw = results[k]
        check(st == 200 and ev[-1] == "[DONE]", "queued stream %s: %d %s" % (k, st, raw[-200:]))
    cl.stop("router-key")

    # a short end-to-end deadline: 504 (non-stream) or an error event (stream)
    hp2 = free_port()
    cfg = cl.write_config(os.path.join(cl.tmp, "short.json"),
                          {"http": "127.0.0.1:%d" % hp2, "grpc": "", "request_timeout_ms": 150})
    cl.start_router("router-short", config=cfg, port=hp2)
    slow = {"prompt": "Once", "max_tokens": 480, "ignore_eos": True}
    code, out = curl(cl, "POST", "/v1/completions", json.dumps(slow),
                     headers=["Content-Type: application/json"], port=hp2)
    check(code == 504 and json.loads(out)["error"]["code"] == "timeout",
          "timeout: %d %s" % (code, out[:300]))
    slow["stream"] = True
    st, ev, raw = cl.sse("/v1/completions", slow, port=hp2)
    check(st == 200 and isinstance(ev[-1], dict) and "error" in ev[-1] and
          ev[-1]["error"]["code"] == "timeout" and "[DONE]" not in ev,
          "stream timeout: %s" % raw[-300:])
    cl.stop("router-short")
    bad = cl.pages_at_baseline()
    check(not bad, "pages after timeouts: %s" % bad)


def observability(cl):
    st, _, data = cl.http("GET", "/workers")
    w = json.loads(data)
    check(st == 200 and w["policy"] == "least_load" and len(w["workers"]) == 2,
          "/workers: %s" % w)
    byname = {x["name"]: x for x in w["workers"]}
    check(byname["p0"]["role"] == "prefill" and byname["p0"]["tp"] == 2 and
          byname["d0"]["role"] == "decode" and byname["d0"]["tp"] == 4 and
          all(x["healthy"] for x in w["workers"]) and byname["d0"]["total_pages"] == 512,
          "/workers: %s" % w)
    m = cl.metrics()
    for key in ('duet_router_http_requests_total{route="/v1/completions",code="200"}',
                'duet_router_http_requests_total{route="/v1/completions",code="400"}',
                'duet_router_http_requests_total{route="/v1/completions",code="413"}',
                'duet_router_grpc_requests_total{code="OK"}',
                'duet_router_grpc_requests_total{code="INVALID_ARGUMENT"}',
                'duet_router_worker_healthy{role="decode",name="d0"}'):
        check(m.get(key, 0) > 0, "metric %s missing or zero" % key)
    check(m["duet_router_time_to_first_token_seconds_count"] > 0 and
          m["duet_router_inter_token_latency_seconds_count"] > 0, "latency histograms empty")
    check(m["duet_router_queue_depth"] == 0, "queue depth %s" % m["duet_router_queue_depth"])
    # the workers' prefix caches (docs/prefix-cache.md), from their Info: a
    # prompt of 3 pages sent twice hits on decode the second time
    key = 'duet_prefix_cache_hit_tokens_total{role="decode",name="d0"}'
    hits0 = cl.info("d0").cache_hit_tokens
    prompt = [1] + [(i * 29 + 7) % 500 + 3 for i in range(50)]
    for _ in range(2):
        st, _, _ = cl.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 2})
        check(st == 200, "completion for the cache: %s" % st)
    hits = cl.info("d0").cache_hit_tokens
    check(hits - hits0 >= 48, "decode hit %d tokens of the repeated prompt" % (hits - hits0))
    deadline = time.time() + 15
    while time.time() < deadline and cl.metrics().get(key, 0) < hits:
        time.sleep(0.1)
    m = cl.metrics()
    check(m.get(key, 0) >= hits, "%s: %s, Info says %d" % (key, m.get(key), hits))
    for key in ('duet_prefix_cache_enabled{role="decode",name="d0"}',
                'duet_prefix_cache_enabled{role="prefill",name="p0"}',
                'duet_prefix_cache_cached_pages{role="decode",name="d0"}',
                'duet_prefix_cache_lookups_total{role="prefill",name="p0"}'):
        check(m.get(key, 0) > 0, "metric %s missing or zero" % key)


def graceful_sigterm(cl):
    """SIGTERM with a stream in flight: the stream finishes, the router exits 0
    and no longer accepts connections."""
    out = {}

    def run():
        out["r"] = cl.sse("/v1/completions", {"prompt": "Once", "max_tokens": 480,
                                              "ignore_eos": True, "stream": True})
    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 10
    while time.time() < deadline and cl.metrics().get("duet_router_inflight_requests") != 1:
        time.sleep(0.005)
    cl.procs["router"].proc.send_signal(signal.SIGTERM)
    t.join(60)
    st, ev, raw = out["r"]
    check(st == 200 and ev[-1] == "[DONE]" and ev[-2]["choices"][0]["finish_reason"] == "length",
          "stream across SIGTERM: %s" % raw[-300:])
    rc = cl.procs["router"].proc.wait(timeout=30)
    check(rc == 0, "router exit %s after SIGTERM:\n%s" % (rc, cl.procs["router"].log()))
    try:
        socket.create_connection(("127.0.0.1", cl.http_port), timeout=1).close()
        fail("router still accepting after exit")
    except OSError:
        pass


def test(build, src):
    cl = Cluster(build, src, prefill=[("p0", 2)], decode=[("d0", 4)],
                 router={"max_body_bytes": 65536})
    skipped = []
    try:
        cl.start_workers()
        cl.start_router()
        openai_client(cl, src, build, skipped)
        chat(cl, src, build, skipped)
        grpc_client(cl, build)
        bad_inputs(cl)
        auth_queue_timeout(cl)
        observability(cl)
        graceful_sigterm(cl)
        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        cl.stop_all()
    finally:
        cl.kill_all()
    if skipped:
        print("SKIP: parts skipped: %s" % skipped)
        raise SystemExit(77)


if __name__ == "__main__":
    main(test)
