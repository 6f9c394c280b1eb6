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

import YAML from "yaml";

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

// Generated material for the --check-config runs, one set per identity
// ("role/name": its certificate names spiffe://duet/role/name, so the
// daemon's start-up check that its certificate names its own role and
// instance runs too).
const materials = new Map();
function generated(repo, ident) {
  if (materials.has(ident)) return materials.get(ident);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "duet-deploy-auth-"));
  const r = spawnSync(path.join(repo, "scripts", "gen-auth.sh"), [dir, ident], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`scripts/gen-auth.sh: ${(r.stderr || r.error || "").toString().trim()}`);
  process.on("exit", () => fs.rmSync(dir, { recursive: true, force: true }));
  const own = path.join(dir, ident.replace("/", "-"));
  const m = {
    "auth.ca": path.join(dir, "ca.pem"),
    "auth.cert": own + ".pem",
    "auth.key": own + ".key",
    "auth.secret_file": path.join(dir, "secret"),
    "router.https_cert": path.join(dir, "node.pem"),
    "router.https_key": path.join(dir, "node.key"),
  };
  materials.set(ident, m);
  return m;
}

// The config JSON with every auth file replaced by generated material of
// the same kind (what the Secrets hold in the cluster), the certificate
// naming identity ident ("decode/decode").
export function withLocalAuth(json, repo, ident) {
  if (authFiles(json).length === 0) return json;
  const m = generated(repo, ident);
  const out = JSON.parse(JSON.stringify(json));
  for (const [key] of authFiles(json)) {
    const [sec, field] = key.split(".");
    out[sec][field] = m[key];
  }
  return out;
}

// The identity a process runs as: "router/<router.name>" or "role/--name".
export function identityOf(json, role, name) {
  return role === "router" ? `router/${json.router?.name || "router"}` : `${role}/${name}`;
}

// cert-manager Certificates of deploy/k8s/cert-manager, by secretName.
let certificates = null;
function certManagerCerts(repo) {
  if (certificates) return certificates;
  certificates = new Map();
  const dir = path.join(repo, "deploy", "k8s", "cert-manager");
  for (const f of fs.readdirSync(dir).filter((x) => /\.ya?ml$/.test(x)).sort())
    for (const doc of YAML.parseAllDocuments(fs.readFileSync(path.join(dir, f), "utf8"))) {
      const o = doc.toJS();
      if (o?.kind === "Certificate" && o.spec?.secretName) certificates.set(o.spec.secretName, { file: f, cert: o });
    }
  return certificates;
}

// With TLS on, the Secret that container c's auth.cert comes from must be
// issued by a cert-manager Certificate of deploy/k8s/cert-manager whose one
// duet URI is the process's own identity (docs/security.md "Identities and
// roles"), for server and client use.
export function checkIdentity(w, c, json, ident, repo, E) {
  if (!tlsOn(json) || typeof json.auth?.cert !== "string") return;
  const t = podTemplate(w);
  const m = (c.volumeMounts || []).find((vm) => json.auth.cert.startsWith(vm.mountPath.replace(/\/$/, "") + "/"));
  const v = m && (t.spec.volumes || []).find((x) => x.name === m.name);
  const secret = v?.secret?.secretName;
  if (!secret) return; // checkAuthMounts says why
  const found = certManagerCerts(repo).get(secret);
  if (!found) {
    E(w, `container ${c.name}: Secret ${secret} (auth.cert) is issued by no Certificate in deploy/k8s/cert-manager`);
    return;
  }
  const spec = found.cert.spec;
  const ids = (spec.uris || []).filter((u) => String(u).startsWith("spiffe://duet/"));
  if (ids.length !== 1 || ids[0] !== `spiffe://duet/${ident}`)
    E(w, `container ${c.name}: Secret ${secret} (Certificate ${found.cert.metadata.name}) names ${ids.join(", ") || "no identity"}, the process runs as spiffe://duet/${ident}`);
  for (const u of ["server auth", "client auth"])
    if (!(spec.usages || []).includes(u)) E(w, `Certificate ${found.cert.metadata.name}: usages lack "${u}"`);
}
