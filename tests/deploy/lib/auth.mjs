// Authentication in the manifests (docs/security.md "Authentication"): the
// files the cluster config's auth section and router.https_* name must come
// from Secret volumes mounted into the container; the probes of a server
// that wants TLS go through `duet-client --health` with the same config
// (kubelet's native gRPC probe speaks plaintext only); and the --check-config
// runs get generated material (scripts/gen-auth.sh) in place of the Secret
// files, which exist only in the cluster.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { hostPort, podTemplate } from "./k8s.mjs";

// [config key path, getter] of every file an auth-enabled config names.
function authFiles(json) {
  const a = json.auth || {};
  const r = json.router || {};
  return [
    ["auth.ca", a.ca],
    ["auth.cert", a.cert],
    ["auth.key", a.key],
    ["auth.secret_file", a.secret_file],
    ["router.https_cert", r.https_cert],
    ["router.https_key", r.https_key],
  ].filter(([, v]) => typeof v === "string" && v !== "");
}

// True when the config turns TLS on for the gRPC servers.
export function tlsOn(json) {
  return typeof json.auth?.ca === "string" && json.auth.ca !== "";
}

// Every auth file of the config is under a read-only mount of a Secret
// volume of container c (router: the https keys too; daemons ignore them).
export function checkAuthMounts(w, c, json, { router }, E) {
  const t = podTemplate(w);
  for (const [key, file] of authFiles(json)) {
    if (!router && key.startsWith("router.")) continue;
    if (!path.isAbsolute(file)) {
      E(w, `config ${key} ${file}: not an absolute path (a pod has no config directory to resolve it against)`);
      continue;
    }
    const m = (c.volumeMounts || []).find((vm) => file.startsWith(vm.mountPath.replace(/\/$/, "") + "/"));
    const v = m && (t.spec.volumes || []).find((x) => x.name === m.name);
    if (!m) E(w, `container ${c.name}: config ${key} ${file} is on no volumeMount`);
    else if (!v?.secret && !v?.projected?.sources?.every((s) => s.secret))
      E(w, `container ${c.name}: config ${key} ${file} is on volume ${m.name}, not a Secret`);
    else if (!m.readOnly) E(w, `container ${c.name}: volumeMount ${m.name} (${key}) is not readOnly`);
    else if (v.secret?.items && !v.secret.items.some((i) => i.path === path.relative(m.mountPath, file)))
      E(w, `container ${c.name}: Secret volume ${m.name} does not project ${path.relative(m.mountPath, file)} (${key})`);
  }
}

// A probe of a TLS server: exec duet-client --health --target 127.0.0.1:PORT
// --config <the container's config>.  Returns an error string or null.
export function execProbeProblem(k, p, port, cfgPath, who) {
  const cmd = (p.exec?.command || []).map(String);
  if (path.basename(cmd[0] || "") !== "duet-client" || !cmd.includes("--health"))
    return `${k}: auth.ca turns TLS on: not an exec probe of duet-client --health (kubelet's gRPC probe speaks plaintext only)`;
  const ti = cmd.indexOf("--target");
  const hp = ti >= 0 ? hostPort(cmd[ti + 1] || "") : null;
  if (!hp || hp.port !== port) return `${k}: probes port ${hp ? hp.port : cmd[ti + 1]}, ${who} listens on ${port}`;
  const ci = cmd.indexOf("--config");
  if (ci < 0 || cmd[ci + 1] !== cfgPath)
    return `${k}: duet-client --config ${ci < 0 ? "(none)" : cmd[ci + 1]}: the container's config is ${cfgPath} (its auth section)`;
  return null;
}

// Generated material for the --check-config runs, made once per process.
let material = null;
function generated(repo) {
  if (material) return material;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "duet-deploy-auth-"));
  const r = spawnSync(path.join(repo, "scripts", "gen-auth.sh"), [dir], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`scripts/gen-auth.sh: ${(r.stderr || r.error || "").toString().trim()}`);
  process.on("exit", () => fs.rmSync(dir, { recursive: true, force: true }));
  material = {
    "auth.ca": path.join(dir, "ca.pem"),
    "auth.cert": path.join(dir, "node.pem"),
    "auth.key": path.join(dir, "node.key"),
    "auth.secret_file": path.join(dir, "secret"),
    "router.https_cert": path.join(dir, "node.pem"),
    "router.https_key": path.join(dir, "node.key"),
  };
  return material;
}

// The config JSON with every auth file replaced by generated material of
// the same kind (what the Secrets hold in the cluster).
export function withLocalAuth(json, repo) {
  if (authFiles(json).length === 0) return json;
  const m = generated(repo);
  const out = JSON.parse(JSON.stringify(json));
  for (const [key] of authFiles(json)) {
    const [sec, field] = key.split(".");
    out[sec][field] = m[key];
  }
  return out;
}
