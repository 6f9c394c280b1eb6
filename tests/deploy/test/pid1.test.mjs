// In a container the daemon is PID 1 of its PID namespace, where the
// kernel drops signals that have no handler.  The daemons block SIGTERM
// and take it with sigwait, which still receives it there: started as PID
// 1 of a new PID namespace (unshare, as root) they drain and exit 0 on the
// SIGTERM the kubelet sends, so the images need no init process.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import test from "node:test";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(process.env.DUET_SOURCE_DIR || path.join(here, "..", "..", ".."));
const build = process.env.DUET_BINARY_DIR;
const root = process.getuid && process.getuid() === 0;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

for (const role of ["prefill", "decode"]) {
  test(`duet-${role} as PID 1 drains on SIGTERM and exits 0`, { skip: !root && "needs root for unshare --pid" }, async () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "duet-pid1-"));
    const cfg = JSON.parse(fs.readFileSync(path.join(repo, "deploy", "k8s", "overlays", "cpu", "cluster.json"), "utf8"));
    cfg.model = path.join(repo, "models", "stories260K");
    // the auth files live in the pod's Secrets; signals do not depend on them
    delete cfg.auth;
    fs.writeFileSync(path.join(tmp, "cluster.json"), JSON.stringify(cfg));
    const log = path.join(tmp, "log");
    const out = fs.openSync(log, "w");
    const exe = path.join(build, role, `duet-${role}`);
    const p = spawn("unshare", ["--pid", "--fork", "--kill-child", exe, "--config", path.join(tmp, "cluster.json"),
      "--name", role, "--listen", "127.0.0.1:0"], {
      stdio: ["ignore", out, out],
      env: { ...process.env, UCX_TLS: "tcp", UCX_TCP_PORT_RANGE: "20000-20999", DUET_LOG_LEVEL: "info" },
    });
    const exited = new Promise((r) => p.on("exit", (code, sig) => r({ code, sig })));
    try {
      const deadline = Date.now() + 60000;
      while (!/serving on port/.test(fs.readFileSync(log, "utf8"))) {
        assert.ok(Date.now() < deadline, `not serving after 60 s:\n${fs.readFileSync(log, "utf8")}`);
        await sleep(100);
      }
      // the daemon: the child of unshare, PID 1 inside
      const kids = fs.readFileSync(`/proc/${p.pid}/task/${p.pid}/children`, "utf8").trim().split(/\s+/);
      assert.equal(kids.length, 1);
      const status = fs.readFileSync(`/proc/${kids[0]}/status`, "utf8");
      assert.match(status, /NSpid:\s+\d+\s+1\n/, "the daemon is not PID 1 of its namespace");
      process.kill(Number(kids[0]), "SIGTERM");
      const t = setTimeout(() => p.kill("SIGKILL"), 30000);
      const { code, sig } = await exited;
      clearTimeout(t);
      const text = fs.readFileSync(log, "utf8");
      assert.equal(sig, null, `killed by ${sig}:\n${text}`);
      assert.equal(code, 0, text);
      assert.match(text, /signal 15: draining/);
      assert.match(text, new RegExp(`${role}: exit 0`));
    } finally {
      if (p.exitCode === null) p.kill("SIGKILL");
      fs.closeSync(out);
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  });
}
