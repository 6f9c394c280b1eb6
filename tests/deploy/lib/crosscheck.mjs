// Cross-checks of rendered manifests against the duet binaries: the
// daemons' own --check-config decides whether each pod's command line and
// the ConfigMap's cluster config start, and what port the daemon listens
// on; everything the manifests say about that daemon (container and probe
// ports, headless Service, discover name, GPUs, grace period, /dev/shm,
// UCX ports, NetworkPolicy, image) is compared with it.
//
// A pod runs one duet container, or a prefill and a decode container (the
// same-node layout, lib/pair.mjs: both see the pod's GPUs, KV moves over
// cuda_ipc).
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { checkAuthMounts, checkIdentity, execProbeProblem, identityOf, tlsOn, withLocalAuth } from "./auth.mjs";
import { checkNetworkPolicy } from "./netpol.mjs";
import { checkPair, daemonDevices } from "./pair.mjs";
import { validateObject } from "./schema.mjs";
import {
  hostPort, id, mapSelects, parseArgs, parseQuantity, podTemplate, resolvePort, selects, UCX_TCP_DEVICES,
} from "./k8s.mjs";

const ROLES = { "duet-prefill": "prefill", "duet-decode": "decode", "duet-router": "router" };
const NON_INSTANCE_FLAGS = new Set(["--config", "--name", "--model", "--log-level", "--check-config"]);
const DRAIN_MARGIN_S = 5;       // gRPC shutdown (2 s) + UCX and engine teardown
const EPHEMERAL = [32768, 60999]; // Linux ip_local_port_range default
const UCX_CUDA_TLS = /^(cuda|cuda_copy|cuda_ipc|gdr_copy)$/;
const UCX_BOOL = /^(y|n|yes|no|on|off|1|0|true|false)$/i;

function run(exe, args, timeoutMs = 60000) {
  const r = spawnSync(exe, args, { encoding: "utf8", timeout: timeoutMs });
  if (r.error) return { status: -1, stdout: "", stderr: String(r.error.message) };
  return r;
}

// Defaults of every instance and router key, from the binary's --help
// table (so a changed default in common/cluster.c is seen here).
const defaultsCache = new Map();
export function binaryDefaults(exe) {
  if (defaultsCache.has(exe)) return defaultsCache.get(exe);
  const r = run(exe, ["--help"]);
  if (r.status !== 0) throw new Error(`${exe} --help failed: ${r.stderr}`);
  const inst = new Map();
  const router = new Map();
  for (const line of r.stdout.split("\n")) {
    let m = /^\s+prefill\[\]\.\/decode\[\]\.(\w+)\s+\w+\s+default\s+(\S*)/.exec(line);
    if (m) inst.set(m[1], m[2] === "(none)" ? undefined : m[2]);
    m = /^\s+router\.(\w+)\s+\w+\s+default\s+(\S*)/.exec(line);
    if (m) router.set(m[1], m[2]);
  }
  if (!inst.has("drain_timeout_ms")) throw new Error(`${exe} --help: no instance key table`);
  const d = { inst, router };
  defaultsCache.set(exe, d);
  return d;
}

function imageName(image) {
  const noDigest = image.split("@")[0];
  const last = noDigest.split("/").pop();
  const i = last.indexOf(":");
  return { name: i < 0 ? last : last.slice(0, i), tag: i < 0 ? null : last.slice(i + 1), digest: image.includes("@") };
}

function envMap(c) {
  const m = new Map();
  for (const e of c.env || []) m.set(e.name, e.value);
  return m;
}

// The cluster config a container reads: --config PATH resolved through its
// volumeMounts to a ConfigMap of the rendered output.
function configOf(objects, w, c, args, E) {
  const cfgPath = args.get("--config");
  if (!cfgPath) {
    E(w, `container ${c.name}: no --config`);
    return null;
  }
  const t = podTemplate(w);
  const mount = (c.volumeMounts || []).find((m) => cfgPath.startsWith(m.mountPath.replace(/\/$/, "") + "/"));
  if (!mount) {
    E(w, `container ${c.name}: --config ${cfgPath} is on no volumeMount`);
    return null;
  }
  const vol = (t.spec.volumes || []).find((v) => v.name === mount.name);
  if (!vol || !vol.configMap) {
    E(w, `container ${c.name}: --config ${cfgPath} is not on a ConfigMap volume`);
    return null;
  }
  const key0 = cfgPath.slice(mount.mountPath.replace(/\/$/, "").length + 1);
  const item = (vol.configMap.items || []).find((i) => i.path === key0);
  const key = item ? item.key : key0;
  const cm = objects.find(
    (o) => o.kind === "ConfigMap" && o.metadata.name === vol.configMap.name && o.metadata.namespace === w.metadata.namespace,
  );
  if (!cm) {
    E(w, `volume ${vol.name}: ConfigMap ${vol.configMap.name} is not in the manifests`);
    return null;
  }
  const text = (cm.data || {})[key];
  if (text === undefined) {
    E(w, `--config ${cfgPath}: ConfigMap ${cm.metadata.name} has no key ${key}`);
    return null;
  }
  try {
    return { cm: cm.metadata.name, text, json: JSON.parse(text) };
  } catch (e) {
    E(w, `ConfigMap ${cm.metadata.name} ${key}: not JSON: ${e.message}`);
    return null;
  }
}

function writeTemp(text) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "duet-deploy-"));
  const f = path.join(dir, "cluster.json");
  fs.writeFileSync(f, text);
  return { dir, file: f };
}

// The repository copy of the model the pods name (same directory name
// under <repo>/models): the --check-config runs load its config.json.
function repoModel(repo, modelPath) {
  const p = path.join(repo, "models", path.basename(modelPath || ""));
  return modelPath && fs.existsSync(path.join(p, "config.json")) ? p : null;
}

function checkSecurity(w, c, { rdma, daemon }, E) {
  const t = podTemplate(w);
  const psc = t.spec.securityContext || {};
  const sc = c.securityContext || {};
  const nonRoot = sc.runAsNonRoot ?? psc.runAsNonRoot;
  const uid = sc.runAsUser ?? psc.runAsUser;
  if (nonRoot !== true || uid === 0) E(w, `container ${c.name}: must run as non-root (runAsNonRoot: true)`);
  if (sc.readOnlyRootFilesystem !== true) E(w, `container ${c.name}: readOnlyRootFilesystem is not true`);
  const drop = sc.capabilities?.drop || [];
  if (!drop.includes("ALL")) E(w, `container ${c.name}: capabilities are not dropped (drop: [ALL])`);
  const add = sc.capabilities?.add || [];
  if (daemon && !add.includes("IPC_LOCK"))
    E(w, `container ${c.name}: capabilities.add lacks IPC_LOCK (RDMA memory registration)`);
  if (!daemon && add.length) E(w, `container ${c.name}: the router needs no capabilities (adds ${add.join(",")})`);
  if (!rdma && sc.allowPrivilegeEscalation !== false)
    E(w, `container ${c.name}: allowPrivilegeEscalation is not false`);
}

function checkSpread(w, labels, E) {
  const t = podTemplate(w);
  const aa = t.spec.affinity?.podAntiAffinity;
  const terms = [
    ...(aa?.requiredDuringSchedulingIgnoredDuringExecution || []),
    ...(aa?.preferredDuringSchedulingIgnoredDuringExecution || []).map((p) => p.podAffinityTerm),
  ];
  if (!terms.some((term) => term && term.topologyKey === "kubernetes.io/hostname" && selects(term.labelSelector, labels)))
    E(w, "no podAntiAffinity term on kubernetes.io/hostname selects its own pods: replicas may share a node");
}

function checkPdb(objects, w, labels, otherTemplates, E) {
  const pdbs = objects.filter(
    (o) => o.kind === "PodDisruptionBudget" && o.metadata.namespace === w.metadata.namespace && selects(o.spec.selector, labels),
  );
  if (pdbs.length !== 1) {
    E(w, `${pdbs.length} PodDisruptionBudgets select its pods (1 expected)`);
    return;
  }
  for (const [ow, ol] of otherTemplates)
    if (ow !== w && selects(pdbs[0].spec.selector, ol))
      E(w, `${id(pdbs[0])} also selects the pods of ${id(ow)}: one budget for two workloads`);
}

function checkImage(w, c, opts, E) {
  const img = imageName(c.image || "");
  if (!img.digest && (!img.tag || img.tag === "latest")) E(w, `container ${c.name}: image ${c.image} is not pinned to a tag`);
  const info = opts.images.get(img.name);
  if (!info) {
    E(w, `container ${c.name}: image ${img.name} is built by no Dockerfile under deploy/docker (LABEL org.opencontainers.image.title)`);
    return null;
  }
  const cmd0 = (c.command || [])[0];
  const exe = cmd0.startsWith("/") ? cmd0 : `/usr/local/bin/${cmd0}`;
  if (!info.binaries.has(exe)) E(w, `container ${c.name}: ${exe} is not in image ${img.name}`);
  // exec probes (duet-client --health where TLS is on) run from the image too
  for (const k of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const p0 = c[k]?.exec?.command?.[0];
    if (!p0) continue;
    const pexe = p0.startsWith("/") ? p0 : `/usr/local/bin/${p0}`;
    if (!info.binaries.has(pexe)) E(w, `${k}: ${pexe} is not in image ${img.name}`);
  }
  return info;
}

function checkModel(w, c, modelPath, info, E) {
  if (!modelPath || !modelPath.startsWith("/")) {
    E(w, `container ${c.name}: model ${modelPath} is not an absolute path in the container`);
    return;
  }
  const under = (dir) => modelPath === dir || modelPath.startsWith(dir.replace(/\/$/, "") + "/");
  const mounted = (c.volumeMounts || []).some((m) => under(m.mountPath));
  const inImage = info && info.dataPaths.some((d) => under(d));
  if (!mounted && !inImage)
    E(w, `container ${c.name}: model ${modelPath} is neither in image ${info?.title} nor under a volumeMount`);
}

function ucxRange(env) {
  const r = env.get("UCX_TCP_PORT_RANGE");
  const m = /^(\d+)-(\d+)$/.exec(r || "");
  return m ? [Number(m[1]), Number(m[2])] : null;
}

function checkDaemon(objects, d, opts, ctx, E) {
  const { w, c, role, args, labels } = d;
  const t = podTemplate(w);
  const ns = w.metadata.namespace;
  const exe = path.join(opts.build, role, `duet-${role}`);
  const cfg = configOf(objects, w, c, args, E);
  if (!cfg) return;
  d.cfg = cfg;
  const name = args.get("--name");
  const entry = (cfg.json[role] || []).find((e) => e.name === name);
  const modelPath = args.get("--model") || cfg.json.model;
  const info = checkImage(w, c, opts, E);
  checkModel(w, c, modelPath, info, E);

  // the binary decides: the pod's own command line in --check-config mode
  const model = repoModel(opts.repo, modelPath);
  if (!model) {
    E(w, `model ${modelPath}: no models/${path.basename(modelPath || "?")} in the repository for --check-config`);
    return;
  }
  checkAuthMounts(w, c, cfg.json, { router: false }, E);
  const ident = identityOf(cfg.json, role, name);
  checkIdentity(w, c, cfg.json, ident, opts.repo, E);
  const tmp = writeTemp(JSON.stringify(withLocalAuth(cfg.json, opts.repo, ident)));
  const argv = (c.args || []).map(String);
  const ci = argv.indexOf("--config");
  argv[ci + 1] = tmp.file;
  const mi = argv.indexOf("--model");
  if (mi >= 0) argv[mi + 1] = model;
  else argv.push("--model", model);
  argv.push("--check-config");
  const r = run(exe, argv);
  fs.rmSync(tmp.dir, { recursive: true, force: true });
  // exit 3: the config is valid but this build lacks the entry's backend
  // (a CPU-only CI build checking a cuda entry): the other checks still run
  if (r.status === 3 && /has no CUDA support/.test(r.stderr || "")) {
    ctx.notes.push(`note: duet-${role} --check-config: ${(r.stderr || "").trim()} (config valid)`);
  } else if (r.status !== 0) {
    E(w, `duet-${role} --check-config: ${(r.stderr || r.stdout).trim()}`);
    return;
  }
  const m = /config ok: (\S+) tp (\d+) listen (\S+) model/.exec(r.stdout);
  if (!m) {
    E(w, `duet-${role} --check-config printed no "config ok" line: ${r.stdout.trim()}`);
    return;
  }
  ctx.used[role].set(name, [...(ctx.used[role].get(name) || []), w]);
  const tp = Number(m[2]);
  const listen = hostPort(m[3]);
  d.port = listen.port;
  if (!["0.0.0.0", "[::]", "::", ""].includes(listen.host))
    E(w, `duet-${role} listens on ${m[3]}: one address of the pod; use 0.0.0.0`);

  // effective instance values: binary defaults <- config entry <- flags
  const eff = new Map(binaryDefaults(exe).inst);
  for (const [k, v] of Object.entries(entry || {})) eff.set(k, String(v));
  for (const [k, v] of args) if (!NON_INSTANCE_FLAGS.has(k)) eff.set(k.slice(2).replace(/-/g, "_"), v);
  const backend = eff.get("backend");
  const threads = Number(eff.get("threads"));
  const drainMs = Number(eff.get("drain_timeout_ms"));

  // ports: container, probes
  // (grpc-<role> where two daemons share a pod: one name per port)
  const cport = (c.ports || []).find((p) => p.name === (d.pair ? `grpc-${role}` : "grpc"));
  if (!cport) E(w, `container ${c.name}: no container port named ${d.pair ? `grpc-${role}` : "grpc"}`);
  else if (cport.containerPort !== listen.port)
    E(w, `container port ${cport.name} is ${cport.containerPort} but duet-${role} listens on ${listen.port}`);
  const authTls = tlsOn(cfg.json);
  for (const k of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const p = c[k];
    if (!p) E(w, `container ${c.name}: no ${k}`);
    else if (authTls) {
      const why = execProbeProblem(k, p, listen.port, args.get("--config"), `duet-${role}`);
      if (why) E(w, why);
    } else if (!p.grpc) E(w, `${k}: not a native gRPC probe (grpc.health.v1)`);
    else {
      const port = resolvePort(c, p.grpc.port);
      if (port !== listen.port) E(w, `${k}: probes port ${p.grpc.port}, duet-${role} listens on ${listen.port}`);
      if (p.grpc.service) E(w, `${k}: service "${p.grpc.service}": the daemons report health for "" only`);
    }
  }
  const live = c.livenessProbe;
  if (live) {
    const window = (live.periodSeconds ?? 10) * (live.failureThreshold ?? 3);
    if (window < drainMs / 1000)
      E(w, `livenessProbe gives up after ${window}s of NOT_SERVING, shorter than the ${drainMs / 1000}s drain`);
  }

  // GPUs and CPUs
  const lim = c.resources?.limits || {};
  const req = c.resources?.requests || {};
  const gpuL = lim["nvidia.com/gpu"];
  const gpuR = req["nvidia.com/gpu"];
  d.tp = tp;
  d.backend = backend;
  d.devices = daemonDevices(entry, args, tp);
  if (backend === "cuda" && d.pair) {
    // the GPUs come from the pod's claim (lib/pair.mjs), seen by both daemons
    if (gpuL !== undefined || gpuR !== undefined)
      E(w, `container ${c.name} asks for nvidia.com/gpu: device-plugin GPUs are visible to that container only, so the other daemon could not map their memory (cuda_ipc); name the pod's ResourceClaim instead`);
    if (info && !info.cuda) E(w, `backend cuda in image ${info.title}, which is not built with CUDA`);
  } else if (backend === "cuda") {
    if (Number(gpuL) !== tp) E(w, `limits nvidia.com/gpu is ${gpuL ?? "unset"} but ${name} has tp ${tp} (one GPU per rank)`);
    else {
      const out = d.devices.filter((x) => !(x >= 0 && x < tp));
      if (out.length) E(w, `${name} devices [${d.devices}]: the container sees ${tp} GPUs (nvidia.com/gpu), ${out.join(", ")} is none of them`);
    }
    if (gpuR !== undefined && Number(gpuR) !== tp) E(w, `requests nvidia.com/gpu is ${gpuR} but ${name} has tp ${tp}`);
    if (info && !info.cuda) E(w, `backend cuda in image ${info.title}, which is not built with CUDA`);
  } else {
    if (gpuL !== undefined || gpuR !== undefined) E(w, `backend ${backend} but the pod asks for nvidia.com/gpu`);
    if (!(threads > 0)) E(w, `${name}: threads is 0 (automatic counts the node's CPUs, not the pod's): set it`);
    else if (!(parseQuantity(req.cpu) >= tp * threads))
      E(w, `requests cpu ${req.cpu ?? "unset"} < tp ${tp} x threads ${threads}`);
  }

  // SIGTERM drain fits the grace period
  const grace = t.spec.terminationGracePeriodSeconds ?? 30;
  if (!(grace > drainMs / 1000 + DRAIN_MARGIN_S))
    E(w, `terminationGracePeriodSeconds ${grace} <= drain_timeout_ms ${drainMs}/1000 + ${DRAIN_MARGIN_S}s teardown: SIGKILL cuts the drain`);

  // /dev/shm in memory, bounded, inside the memory limit
  const shmMount = (c.volumeMounts || []).find((vm) => vm.mountPath === "/dev/shm");
  const shmVol = shmMount && (t.spec.volumes || []).find((v) => v.name === shmMount.name);
  if (!shmVol || !shmVol.emptyDir || shmVol.emptyDir.medium !== "Memory")
    E(w, "/dev/shm is not an emptyDir with medium Memory (the runtime's default is 64 MiB)");
  else if (!shmVol.emptyDir.sizeLimit) E(w, "/dev/shm has no sizeLimit");
  else if (!(parseQuantity(lim.memory) > parseQuantity(shmVol.emptyDir.sizeLimit)))
    E(w, `memory limit ${lim.memory ?? "unset"} does not cover /dev/shm ${shmVol.emptyDir.sizeLimit} (tmpfs pages count against it)`);

  // UCX: a network transport and a pinned, big enough TCP port range
  const env = envMap(c);
  const tls = env.get("UCX_TLS");
  const rdma = Object.keys({ ...lim, ...req }).some((k) => k.startsWith("rdma/"));
  if (!tls) E(w, "UCX_TLS is unset: UCX may pick shared-memory transports, which cannot reach another pod");
  else {
    const t2 = tls.split(",").map((s) => s.trim().replace(/^\^/, ""));
    if (!t2.some((x) => /^(tcp|rc.*|ud.*|dc.*|ib)$/.test(x))) E(w, `UCX_TLS ${tls}: no network transport`);
    if (!t2.includes("tcp")) E(w, `UCX_TLS ${tls}: tcp carries the control endpoint's peer-failure detection`);
    if (rdma && !t2.some((x) => /^(rc|ud|dc|ib)/.test(x))) E(w, `asks for an RDMA device but UCX_TLS ${tls} has no verbs transport`);
    const cudaTls = t2.filter((x) => UCX_CUDA_TLS.test(x));
    if (cudaTls.length && info && !info.ucx?.cuda)
      E(w, `UCX_TLS ${tls} names ${cudaTls.join(", ")} but image ${info.title} has the distribution's UCX, without CUDA transports`);
    if (d.pair && backend === "cuda") {
      // the reason the two daemons share a pod: puts GPU to GPU
      if (!t2.some((x) => x === "cuda_ipc" || x === "cuda"))
        E(w, `UCX_TLS ${tls}: no cuda_ipc, so this pod's prefill and decode cannot put KV GPU to GPU`);
      if (!t2.some((x) => x === "cuda_copy" || x === "cuda"))
        E(w, `UCX_TLS ${tls}: no cuda_copy, so UCX does not recognise GPU memory and the daemons stage KV through host memory`);
    }
  }
  // a protocol-info glob: UCX >= 1.16 (1.13 takes y|n only, and the daemon
  // would not start)
  const protoInfo = env.get("UCX_PROTO_INFO");
  if (protoInfo !== undefined && !UCX_BOOL.test(protoInfo) && info) {
    const v = (info.ucx?.version || "0.0").split(".").map(Number);
    if (!info.ucx?.pinned || v[0] * 100 + v[1] < 116)
      E(w, `UCX_PROTO_INFO "${protoInfo}" needs UCX >= 1.16; image ${info.title}'s UCX (${info.ucx?.version ?? "the distribution's"}) takes only y or n and would fail to start`);
  }
  const range = ucxRange(env);
  if (!range) E(w, "UCX_TCP_PORT_RANGE is not set to A-B: the transfer ports are ephemeral and no NetworkPolicy can name them");
  else {
    const [a, b] = range;
    const need = UCX_TCP_DEVICES * tp;
    if (b - a + 1 < 2 * need)
      E(w, `UCX_TCP_PORT_RANGE ${a}-${b} has ${b - a + 1} ports for ${need} listeners (tp ${tp} x ${UCX_TCP_DEVICES} devices, x2 headroom); UCX 1.13 spins forever when the range is exhausted`);
    if (a <= EPHEMERAL[1] && b >= EPHEMERAL[0]) E(w, `UCX_TCP_PORT_RANGE ${a}-${b} overlaps the ephemeral ports ${EPHEMERAL.join("-")}`);
    if (listen.port >= a && listen.port <= b) E(w, `UCX_TCP_PORT_RANGE ${a}-${b} contains the gRPC port ${listen.port}`);
    d.range = range;
    d.listeners = need;
  }
  checkSecurity(w, c, { rdma, daemon: true }, E);
  if (rdma) {
    const cmd0 = c.command[0];
    if (!info || info.capBinaries.get(cmd0) !== "cap_ipc_lock+ep")
      E(w, `asks for an RDMA device but runs ${cmd0}, not a copy with cap_ipc_lock (non-root pods get IPC_LOCK only from file capabilities)`);
    if (c.securityContext?.allowPrivilegeEscalation !== true)
      E(w, "asks for an RDMA device: file capabilities need allowPrivilegeEscalation: true");
  }

  // identity: StatefulSet + headless Service + discover name
  if (w.kind !== "StatefulSet") {
    E(w, "daemons run as StatefulSets (stable per-pod DNS names behind a headless Service)");
    return;
  }
  const svcName = w.spec.serviceName;
  const svc = objects.find((o) => o.kind === "Service" && o.metadata.name === svcName && o.metadata.namespace === ns);
  if (!svc) E(w, `serviceName ${svcName}: no such Service`);
  else {
    if (svc.spec.clusterIP !== "None") E(svc, "governs a StatefulSet but is not headless (clusterIP: None)");
    if (!mapSelects(svc.spec.selector, labels)) E(svc, `selector does not select the pods of ${id(w)}`);
    for (const [ow, ol] of ctx.templates)
      if (ow !== w && mapSelects(svc.spec.selector, ol)) E(svc, `selector also selects the pods of ${id(ow)}: its DNS name would mix entries`);
    const sp = (svc.spec.ports || []).find((p) => p.port === listen.port);
    if (!sp) E(svc, `no port ${listen.port} (duet-${role} listens there)`);
    else if (resolvePort(c, sp.targetPort ?? sp.port) !== listen.port)
      E(svc, `port ${sp.port} targets ${sp.targetPort}, not the daemon's ${listen.port}`);
  }
  if (entry) {
    const want = `${svcName}.${ns}.svc.cluster.local:${listen.port}`;
    if (entry.discover !== want)
      E(w, `config ${role} entry ${name}: discover is ${entry.discover ?? "unset"}, the headless Service is ${want}`);
    if (entry.address) E(w, `config ${role} entry ${name}: address ${entry.address} names one pod; StatefulSet pods are found through discover`);
  }
  checkSpread(w, labels, E);
  checkPdb(objects, w, labels, ctx.templates, E);
}

function checkRouter(objects, d, opts, ctx, E) {
  const { w, c, args, labels } = d;
  const t = podTemplate(w);
  const cfg = configOf(objects, w, c, args, E);
  if (!cfg) return;
  d.cfg = cfg;
  const info = checkImage(w, c, opts, E);
  checkModel(w, c, cfg.json.model, info, E);
  checkSecurity(w, c, { rdma: false, daemon: false }, E);
  const defs = binaryDefaults(path.join(opts.build, "prefill", "duet-prefill")).router;
  const http = hostPort(args.get("--http") ?? cfg.json.router?.http ?? defs.get("http"));
  const grpc = hostPort(args.get("--grpc") ?? cfg.json.router?.grpc ?? defs.get("grpc"));
  for (const [what, hp] of [["http", http], ["grpc", grpc]]) {
    if (!hp) {
      E(w, `router ${what} address is not host:port`);
      return;
    }
    if (!["0.0.0.0", "[::]", "::", ""].includes(hp.host)) E(w, `router ${what} binds ${hp.host}: use 0.0.0.0 in a pod`);
    const cp = (c.ports || []).find((p) => p.name === what);
    if (!cp || cp.containerPort !== hp.port) E(w, `container port ${what} is ${cp?.containerPort ?? "missing"} but the router listens on ${hp.port}`);
  }
  d.port = grpc.port;
  const ready = c.readinessProbe;
  const tls = tlsOn(cfg.json);
  const https = !!cfg.json.router?.https_cert;
  checkAuthMounts(w, c, cfg.json, { router: true }, E);
  checkIdentity(w, c, cfg.json, identityOf(cfg.json, "router"), opts.repo, E);
  if (tls) {
    const why = ready ? execProbeProblem("readinessProbe", ready, grpc.port, args.get("--config"), "duet-router") : "no readinessProbe";
    if (why) E(w, why);
  } else if (!ready?.grpc || resolvePort(c, ready.grpc.port) !== grpc.port)
    E(w, `readinessProbe: not a gRPC probe of the router's grpc.health.v1 on ${grpc.port}`);
  const live = c.livenessProbe;
  if (!live) E(w, "no livenessProbe");
  else if (live.httpGet && resolvePort(c, live.httpGet.port) !== http.port) E(w, `livenessProbe: port ${live.httpGet.port} is not the HTTP port ${http.port}`);
  else if (live.httpGet && (live.httpGet.scheme ?? "HTTP") !== (https ? "HTTPS" : "HTTP"))
    E(w, `livenessProbe: scheme ${live.httpGet.scheme ?? "HTTP"}, the router serves ${https ? "HTTPS (router.https_cert)" : "HTTP"}`);
  else if (live.grpc && tls) E(w, "livenessProbe: a native gRPC probe of a TLS server (auth.ca) cannot connect");
  else if (live.grpc && resolvePort(c, live.grpc.port) !== grpc.port) E(w, `livenessProbe: port ${live.grpc.port} is not the gRPC port ${grpc.port}`);
  else if (live.exec) {
    const why = execProbeProblem("livenessProbe", live, grpc.port, args.get("--config"), "duet-router");
    if (why) E(w, why);
  }
  const ann = t.metadata?.annotations || {};
  if (ann["prometheus.io/scrape"] !== "true") E(w, "pod annotation prometheus.io/scrape is not \"true\"");
  if (Number(ann["prometheus.io/port"]) !== http.port) E(w, `prometheus.io/port ${ann["prometheus.io/port"]} is not the HTTP port ${http.port} (/metrics)`);
  if ((ann["prometheus.io/path"] ?? "/metrics") !== "/metrics") E(w, `prometheus.io/path ${ann["prometheus.io/path"]}: the router serves /metrics`);
  // grace: preStop sleep + --grace-ms + margin
  const pre = c.lifecycle?.preStop;
  let sleepS = 0;
  if (pre?.sleep) sleepS = pre.sleep.seconds;
  else if (pre?.exec?.command?.[0] === "sleep") sleepS = Number(pre.exec.command[1]);
  const graceMs = Number(args.get("--grace-ms") ?? 30000);
  const tgps = t.spec.terminationGracePeriodSeconds ?? 30;
  if (!(tgps > sleepS + graceMs / 1000 + DRAIN_MARGIN_S))
    E(w, `terminationGracePeriodSeconds ${tgps} <= preStop ${sleepS}s + --grace-ms ${graceMs}/1000 + ${DRAIN_MARGIN_S}s`);
  // a Service with both ports
  const svcs = objects.filter((o) => o.kind === "Service" && o.metadata.namespace === w.metadata.namespace && mapSelects(o.spec.selector, labels));
  for (const [what, hp] of [["http", http], ["grpc", grpc]]) {
    if (!svcs.some((s) => (s.spec.ports || []).some((p) => resolvePort(c, p.targetPort ?? p.port) === hp.port)))
      E(w, `no Service exposes the router's ${what} port ${hp.port}`);
  }
  checkSpread(w, labels, E);
  checkPdb(objects, w, labels, ctx.templates, E);

  // the router's own check, where this duet-router resolves discover names
  const exe = path.join(opts.build, "router", "duet-router");
  if (!fs.existsSync(exe)) {
    ctx.notes.push(`skip: duet-router --check-config (${exe} not built)`);
    return;
  }
  const model = repoModel(opts.repo, cfg.json.model);
  if (!model) return;
  const tmp = writeTemp(JSON.stringify({ ...withLocalAuth(cfg.json, opts.repo, identityOf(cfg.json, "router")), model }));
  const argv = (c.args || []).map(String);
  argv[argv.indexOf("--config") + 1] = tmp.file;
  argv.push("--check-config");
  const r = run(exe, argv);
  fs.rmSync(tmp.dir, { recursive: true, force: true });
  const msg = (r.stderr || r.stdout).trim();
  if (r.status !== 0 && /discover/.test(msg) && /not supported/.test(msg))
    ctx.notes.push(`skip: duet-router --check-config: this duet-router does not resolve discover entries yet (${msg})`);
  else if (r.status !== 0) E(w, `duet-router --check-config: ${msg}`);
}

// All checks of one rendered overlay.  opts: { build, repo, images: Map
// image name -> checkDockerfile() info }.  Returns { errors, notes }.
export function checkRendered(objects, opts) {
  const errors = [];
  const notes = [];
  const E = (o, msg) => errors.push(`${o ? id(o) + ": " : ""}${msg}`);
  for (const o of objects) for (const e of validateObject(o)) E(o, e);
  if (errors.length) return { errors, notes };

  const namespaces = new Set(objects.filter((o) => o.kind === "Namespace").map((o) => o.metadata.name));
  for (const o of objects)
    if (o.kind !== "Namespace" && !namespaces.has(o.metadata.namespace))
      E(o, `namespace ${o.metadata.namespace ?? "(none)"} is not created by the manifests`);

  const workloads = objects.filter((o) => o.kind === "Deployment" || o.kind === "StatefulSet");
  const ctx = { used: { prefill: new Map(), decode: new Map() }, templates: [], notes };
  const found = [];
  const pods = []; // { w, ns, labels, roles: Set, daemons: [found entries] }
  for (const w of workloads) {
    const t = podTemplate(w);
    const labels = t.metadata?.labels || {};
    ctx.templates.push([w, labels]);
    if (!selects(w.spec.selector, labels)) E(w, "spec.selector does not select its own pod template");
    for (const k of ["hostIPC", "hostPID", "hostNetwork"])
      if (t.spec[k]) E(w, `${k}: true: the pod joins the node's namespace (the containers of one pod already share IPC, which cuda_ipc needs)`);
    const cs = t.spec.containers.filter((c) => ROLES[path.basename((c.command || [])[0] || "")]);
    const roles = cs.map((c) => ROLES[path.basename(c.command[0])]);
    const pair = cs.length === 2 && roles.includes("prefill") && roles.includes("decode");
    if (cs.length !== 1 && !pair) {
      E(w, `${cs.length} duet containers (${roles.join(", ") || "none"}): one, or a prefill and a decode, expected`);
      continue;
    }
    const pod = { w, ns: w.metadata.namespace, labels, roles: new Set(roles), daemons: [] };
    pods.push(pod);
    cs.forEach((c, i) => {
      const d = { w, c, role: roles[i], labels, pair, pod, args: parseArgs((c.args || []).map(String)) };
      if (d.role !== "router") pod.daemons.push(d);
      found.push(d);
    });
  }
  for (const d of found) {
    if (d.role === "router") checkRouter(objects, d, opts, ctx, E);
    else checkDaemon(objects, d, opts, ctx, E);
  }
  for (const pod of pods) if (pod.daemons.length === 2) checkPair(objects, pod, E);
  const cms = new Set(found.filter((d) => d.cfg).map((d) => d.cfg.cm));
  if (cms.size > 1) errors.push(`the pods read ${cms.size} different cluster configs (${[...cms].join(", ")}): one is expected`);
  const cfgDaemon = found.find((d) => d.cfg);
  if (cfgDaemon) {
    for (const role of ["prefill", "decode"]) {
      for (const e of cfgDaemon.cfg.json[role] || []) {
        const ws = ctx.used[role].get(e.name) || [];
        if (ws.length === 0) errors.push(`config ${role} entry ${e.name}: no workload runs --name ${e.name} (its discover name resolves to nothing)`);
        if (ws.length > 1) errors.push(`config ${role} entry ${e.name}: run by ${ws.map(id).join(" and ")}`);
      }
    }
  }
  if (!found.some((d) => d.role === "router")) errors.push("no duet-router workload");
  for (const r of ["prefill", "decode"]) if (!found.some((d) => d.role === r)) errors.push(`no duet-${r} workload`);
  checkNetworkPolicy(objects, pods, E);
  // a pod's two daemons share the workload-level checks: say each once
  return { errors: [...new Set(errors)], notes: [...new Set(notes)] };
}
