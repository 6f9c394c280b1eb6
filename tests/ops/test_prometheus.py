#!/usr/bin/python3
"""Prometheus scraping a real local cluster (prefill TP=2, decode TP=2,
router; CPU, stories260K) with Debian's prometheus and promtool:

* promtool check rules / test rules on deploy/prometheus/ (the shipped
  recording and alert rules and their unit tests);
* promtool check metrics accepts the router's /metrics exposition, idle and
  after traffic (the daemons export no /metrics: the router reports every
  worker's Info as duet_router_worker_{...}{role,name});
* a Prometheus server scraping the router every second with those rules:
  the target is up, the per-role recording rules evaluate on the scraped
  series, no rule has an evaluation error and no alert fires; after the
  router is stopped the target goes down and DuetRouterDown goes pending.

usage: test_prometheus.py BUILD_DIR SOURCE_DIR   (exit 77: prometheus or
promtool missing; scripts/install-deps.sh installs them)
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "router"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))

PROM = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
if not PROM or not PROMTOOL:
    print("SKIP: prometheus/promtool not installed (apt-get install prometheus; "
          "scripts/install-deps.sh does)")
    sys.exit(77)

from router_cluster import Cluster, check, fail, main  # noqa: E402
from ports import free_port  # noqa: E402


def promtool(*args, stdin=None):
    r = subprocess.run([PROMTOOL] + list(args), input=stdin, capture_output=True, text=True,
                       timeout=120)
    return r.returncode, (r.stdout + r.stderr).strip()


def check_metrics(cl, when):
    st, _, data = cl.http("GET", "/metrics")
    check(st == 200, "/metrics: %d" % st)
    rc, out = promtool("check", "metrics", stdin=data.decode())
    print("promtool check metrics (%s, %d lines): rc %d %s" %
          (when, data.count(b"\n"), rc, out))
    check(rc == 0, "promtool check metrics rejects the router's exposition (%s):\n%s"
          % (when, out))
    return data.decode()


def api(port, path, **params):
    url = "http://127.0.0.1:%d/api/v1/%s" % (port, path)
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        d = json.load(r)
    check(d.get("status") == "success", "%s: %s" % (path, d))
    return d["data"]


def wait_for(what, fn, timeout=60):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except OSError as e:
            last = e
        time.sleep(0.5)
    fail("%s: not after %d s (last: %s)" % (what, timeout, last))


def test(build, src):
    rules_dir = os.path.join(src, "deploy", "prometheus")
    rules = sorted(glob.glob(os.path.join(rules_dir, "*.yml")))
    check(rules, "no rule files under deploy/prometheus")
    rc, out = promtool("check", "rules", *rules)
    print(out)
    check(rc == 0, "promtool check rules failed")
    tests = sorted(glob.glob(os.path.join(rules_dir, "tests", "*.yml")))
    check(tests, "no rule tests under deploy/prometheus/tests")
    rc, out = promtool("test", "rules", *tests)
    print(out)
    check(rc == 0, "promtool test rules failed")

    cl = Cluster(build, src, prefill=[("prefill-0", 2)], decode=[("decode-0", 2)])
    prom = None
    try:
        cl.start_workers()
        cl.start_router()
        check_metrics(cl, "idle")
        for i in range(6):
            st, _, r = cl.post_json("/v1/completions", {"prompt": "Once upon a time %d" % i,
                                                        "max_tokens": 12 + i})
            check(st == 200, "completion %d: %s" % (i, r))
        st, _, _ = cl.http("POST", "/v1/completions", body={"prompt": "x", "max_tokens": -1})
        check(st == 400, "bad request: %d" % st)
        exposition = check_metrics(cl, "after traffic")
        for name in ("duet_router_worker_queue_depth", "duet_router_worker_running",
                     "duet_router_worker_free_pages", "duet_router_time_to_first_token_seconds"):
            check(name in exposition, "%s missing from /metrics" % name)

        port = free_port()
        data = os.path.join(cl.tmp, "prom-data")
        cfg = os.path.join(cl.tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            json.dump({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                       "rule_files": rules,
                       "scrape_configs": [{"job_name": "duet-router",
                                           "static_configs": [{"targets": [
                                               "127.0.0.1:%d" % cl.http_port]}]}]}, f)
        rc, out = promtool("check", "config", cfg)
        check(rc == 0, "promtool check config: %s" % out)
        log = open(os.path.join(cl.tmp, "prometheus.log"), "w")
        prom = subprocess.Popen([PROM, "--config.file=" + cfg, "--storage.tsdb.path=" + data,
                                 "--web.listen-address=127.0.0.1:%d" % port,
                                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def targets_up():
            if prom.poll() is not None:
                fail("prometheus exited %s:\n%s" % (prom.returncode,
                                                    open(os.path.join(cl.tmp, "prometheus.log")).read()))
            t = api(port, "targets")["activeTargets"]
            return t if t and all(x["health"] == "up" for x in t) else None
        t = wait_for("the router target up", targets_up)
        print("targets:", [(x["scrapeUrl"], x["health"]) for x in t])

        # traffic while scraped, so the rates have two samples
        for i in range(4):
            cl.post_json("/v1/completions", {"prompt": "The cat %d" % i, "max_tokens": 8})
            time.sleep(0.5)

        def recorded():
            r = api(port, "query", query="duet:workers_healthy:sum")["result"]
            got = {x["metric"].get("role"): float(x["value"][1]) for x in r}
            return got if got == {"prefill": 1.0, "decode": 1.0} else None
        print("duet:workers_healthy:sum", wait_for("per-role recording rule", recorded, 30))
        for q, want in (("duet:worker_kv_free:ratio", 2), ("duet:worker_running:sum", 2),
                        ("duet:worker_queue_depth:sum", 2),
                        ("duet_router_worker_total_pages", 2)):
            r = wait_for(q, lambda: api(port, "query", query=q)["result"], 30)
            check(len(r) == want, "%s: %s" % (q, r))
            print(q, [(x["metric"].get("role"), x["value"][1]) for x in r])
        r = wait_for("duet:router_requests:rate1m",
                     lambda: api(port, "query", query="duet:router_requests:rate1m")["result"], 30)
        check(float(r[0]["value"][1]) > 0, "request rate %s" % r)
        print("duet:router_requests:rate1m", r[0]["value"][1])

        groups = api(port, "rules")["groups"]
        nrules = 0
        for g in groups:
            for rule in g["rules"]:
                nrules += 1
                check(rule.get("health") == "ok", "rule %s: %s %s" %
                      (rule["name"], rule.get("health"), rule.get("lastError")))
                if rule["type"] == "alerting":
                    check(rule["state"] == "inactive", "alert %s is %s on a healthy cluster"
                          % (rule["name"], rule["state"]))
        print("%d rules evaluated, all healthy, no alert active" % nrules)

        # the router goes away: the target goes down, DuetRouterDown pending
        cl.stop("router")

        def router_down():
            for a in api(port, "alerts")["alerts"]:
                if a["labels"]["alertname"] == "DuetRouterDown":
                    return a["state"]
            return None
        print("DuetRouterDown:", wait_for("DuetRouterDown pending", router_down, 30))
        t = api(port, "targets")["activeTargets"]
        check(t[0]["health"] == "down", "target after the router stopped: %s" % t)
        cl.stop_all()
        print("PASS parts: rules checked and unit-tested, exposition valid, scraped, "
              "recorded, alert on router down")
    finally:
        if prom is not None and prom.poll() is None:
            prom.send_signal(signal.SIGTERM)
            try:
                prom.wait(20)
            except subprocess.TimeoutExpired:
                prom.kill()
        cl.kill_all()


if __name__ == "__main__":
    main(test)
