// The validation must reject broken manifests and Dockerfiles: each test
// breaks one thing in a rendered overlay (or a Dockerfile, or the
// kustomize sources) and expects the specific error.  The unbroken
// overlays pass first, so a rejection is the mutation's doing.
//
//   DUET_BINARY_DIR=build/deploy node --test tests/deploy/test/
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import test from "node:test";
import { fileURLToPath } from "node:url";

import { checkRendered } from "../lib/crosscheck.mjs";
import { depsProblem } from "../lib/deps.mjs";
import { checkDockerfile } from "../lib/dockerfile.mjs";
import { imageInfos } from "../lib/images.mjs";
import { render } from "../lib/render.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const problem = depsProblem(path.join(here, ".."));
if (problem) throw new Error(problem);
const repo = path.resolve(process.env.DUET_SOURCE_DIR || path.join(here, "..", "..", ".."));
const build = process.env.DUET_BINARY_DIR;
if (!build || !fs.existsSync(path.join(build, "prefill", "duet-prefill")))
  throw new Error(`DUET_BINARY_DIR must be a build with duet-prefill and duet-decode (got ${build})`);
const { images } = imageInfos(repo);
const overlay = (n) => path.join(repo, "deploy", "k8s", "overlays", n);
const rendered = Object.fromEntries(
  ["p2d4", "mixed", "p2d4-rdma", "cpu", "p1d2-same-node"].map((n) => [n, render(overlay(n))]),
);

const errorsOf = (objs, r = repo) => checkRendered(objs, { build, repo: r, images }).errors;
const obj = (objs, kind, name) => {
  const o = objs.find((x) => x.kind === kind && x.metadata.name === name);
  assert.ok(o, `${kind}/${name} not rendered`);
  return o;
};
const daemon = (objs, name) => obj(objs, "StatefulSet", name).spec.template.spec.containers[0];
const podSpec = (objs) => obj(objs, "StatefulSet", "duet-pd").spec.template.spec;
const pdContainer = (objs, name) => podSpec(objs).containers.find((c) => c.name === name);
const setEnv = (c, name, value) => {
  c.env = c.env.map((e) => (e.name === name ? { name, value } : e));
};
const cfgMap = (objs) => objs.find((x) => x.kind === "ConfigMap");
const editConfig = (objs, fn) => {
  const cm = cfgMap(objs);
  const j = JSON.parse(cm.data["cluster.json"]);
  fn(j);
  cm.data["cluster.json"] = JSON.stringify(j);
};

function rejects(name, base, mutate, want) {
  test(name, () => {
    const objs = structuredClone(rendered[base]);
    mutate(objs);
    const errs = errorsOf(objs);
    assert.ok(errs.some((e) => want.test(e)), `expected ${want} among:\n  ${errs.join("\n  ") || "(no errors)"}`);
  });
}

test("the unbroken overlays pass", () => {
  for (const [n, objs] of Object.entries(rendered)) assert.deepEqual(errorsOf(objs), [], n);
});

test("scaling a StatefulSet needs no config change", () => {
  for (const n of ["p2d4", "mixed", "p1d2-same-node"]) {
    const objs = structuredClone(rendered[n]);
    for (const o of objs) if (o.kind === "StatefulSet") o.spec.replicas = 5;
    assert.deepEqual(errorsOf(objs), [], n);
  }
});

// GPUs, grace period, drain
rejects("GPU limit differs from the entry's tp", "p2d4",
  (o) => { daemon(o, "duet-decode").resources.limits["nvidia.com/gpu"] = 2; },
  /limits nvidia.com\/gpu is 2 but decode has tp 4/);
rejects("tp raised in the config only", "p2d4",
  (o) => editConfig(o, (j) => { j.decode[0].tp = 8; }),
  /limits nvidia.com\/gpu is 4 but decode has tp 8/);
rejects("tp not allowed by the model (real binary's error)", "p2d4",
  (o) => editConfig(o, (j) => { j.prefill[0].tp = 3; }),
  /tp 3: num_attention_heads 8 is not divisible by tp/);
rejects("grace period shorter than the drain", "p2d4",
  (o) => { obj(o, "StatefulSet", "duet-prefill").spec.template.spec.terminationGracePeriodSeconds = 30; },
  /terminationGracePeriodSeconds 30 <= drain_timeout_ms 30000/);
rejects("drain_timeout_ms raised in the config only", "p2d4",
  (o) => editConfig(o, (j) => { j.decode[0].drain_timeout_ms = 60000; }),
  /terminationGracePeriodSeconds 45 <= drain_timeout_ms 60000/);
rejects("drain_timeout_ms raised by a flag", "p2d4",
  (o) => { daemon(o, "duet-prefill").args.push("--drain-timeout-ms", "50000"); },
  /terminationGracePeriodSeconds 45 <= drain_timeout_ms 50000/);

// ports and probes against what the daemon listens on
rejects("container port is not the listen port", "p2d4",
  (o) => { daemon(o, "duet-prefill").ports[0].containerPort = 9101; },
  /container port grpc is 9101 but duet-prefill listens on 9100/);
rejects("--listen changed in the args only", "p2d4",
  (o) => { const a = daemon(o, "duet-decode").args; a[a.indexOf("--listen") + 1] = "0.0.0.0:9300"; },
  /readinessProbe: probes port 9200, duet-decode listens on 9300/);
rejects("listen bound to one address", "p2d4",
  (o) => { const a = daemon(o, "duet-decode").args; a[a.indexOf("--listen") + 1] = "127.0.0.1:9200"; },
  /listens on 127.0.0.1:9200: one address of the pod/);
rejects("probe on another port", "p2d4",
  (o) => { const c = daemon(o, "duet-prefill").livenessProbe.exec.command; c[c.indexOf("--target") + 1] = "127.0.0.1:9200"; },
  /livenessProbe: probes port 9200, duet-prefill listens on 9100/);
rejects("HTTP probe on a gRPC daemon", "p2d4",
  (o) => { daemon(o, "duet-prefill").startupProbe = { httpGet: { path: "/", port: 9100 } }; },
  /startupProbe: auth.ca turns TLS on: not an exec probe of duet-client --health/);
rejects("native gRPC probe of a TLS daemon (kubelet speaks plaintext)", "p2d4",
  (o) => { daemon(o, "duet-decode").readinessProbe = { grpc: { port: 9200 } }; },
  /readinessProbe: auth.ca turns TLS on: not an exec probe/);
rejects("exec probe without the config's auth", "p2d4",
  (o) => { const c = daemon(o, "duet-decode").startupProbe.exec.command; c.splice(c.indexOf("--config"), 2); },
  /startupProbe: duet-client --config \(none\)/);
rejects("probe binary the image lacks", "p2d4",
  (o) => { daemon(o, "duet-prefill").readinessProbe.exec.command[0] = "duet-probe"; },
  /readinessProbe: \/usr\/local\/bin\/duet-probe is not in image duet-gpu/);
rejects("auth off: probes must be native gRPC again", "cpu",
  (o) => editConfig(o, (j) => { j.auth = { insecure: true }; }),
  /startupProbe: not a native gRPC probe/);
rejects("auth off on 0.0.0.0 without auth.insecure (real binary's error)", "cpu",
  (o) => editConfig(o, (j) => { delete j.auth; }),
  /listen \(decode decode\): 0.0.0.0:9200 is not a loopback address and TLS is off: .*auth.insecure: true/);

// authentication material: from Secrets, mounted read-only
rejects("auth file on no mount", "p2d4",
  (o) => editConfig(o, (j) => { j.auth.ca = "/etc/elsewhere/ca.crt"; }),
  /config auth.ca \/etc\/elsewhere\/ca.crt is on no volumeMount/);
rejects("auth files on an emptyDir, not a Secret", "p2d4",
  (o) => { const v = obj(o, "StatefulSet", "duet-decode").spec.template.spec.volumes.find((x) => x.name === "tls"); delete v.secret; v.emptyDir = {}; },
  /config auth.ca \/etc\/duet-tls\/ca.crt is on volume tls, not a Secret/);
rejects("secret mount writable", "p2d4",
  (o) => { daemon(o, "duet-prefill").volumeMounts.find((m) => m.name === "cluster-secret").readOnly = false; },
  /volumeMount cluster-secret \(auth.secret_file\) is not readOnly/);
// identities (docs/security.md "Identities and roles"): every workload
// mounts the Secret of a cert-manager Certificate naming its own identity
const tlsVol = (o, kind, name, vol = "tls") =>
  obj(o, kind, name).spec.template.spec.volumes.find((x) => x.name === vol).secret;
rejects("decode mounts the prefill's certificate", "p2d4",
  (o) => { tlsVol(o, "StatefulSet", "duet-decode").secretName = "duet-tls-prefill"; },
  /Secret duet-tls-prefill \(Certificate duet-tls-prefill\) names spiffe:\/\/duet\/prefill\/prefill, the process runs as spiffe:\/\/duet\/decode\/decode/);
rejects("router mounts a decode certificate", "cpu",
  (o) => { tlsVol(o, "Deployment", "duet-router").secretName = "duet-tls-decode"; },
  /names spiffe:\/\/duet\/decode\/decode, the process runs as spiffe:\/\/duet\/router\/router/);
rejects("mixed: decode-tp4 with decode-tp2's certificate", "mixed",
  (o) => { tlsVol(o, "StatefulSet", "duet-decode-tp4").secretName = "duet-tls-decode-tp2"; },
  /the process runs as spiffe:\/\/duet\/decode\/decode-tp4/);
rejects("same-node pair: decode container on the prefill's Secret", "p1d2-same-node",
  (o) => { pdContainer(o, "decode").volumeMounts.find((m) => m.name === "tls-decode").name = "tls"; },
  /names spiffe:\/\/duet\/prefill\/prefill, the process runs as spiffe:\/\/duet\/decode\/decode/);
rejects("a Secret no Certificate issues (the old shared duet-tls)", "p2d4",
  (o) => { tlsVol(o, "StatefulSet", "duet-prefill").secretName = "duet-tls"; },
  /Secret duet-tls \(auth.cert\) is issued by no Certificate in deploy\/k8s\/cert-manager/);

rejects("router HTTPS probed over HTTP", "p2d4",
  (o) => { delete obj(o, "Deployment", "duet-router").spec.template.spec.containers[0].livenessProbe.httpGet.scheme; },
  /livenessProbe: scheme HTTP, the router serves HTTPS/);
rejects("a --name the config does not have (real binary's error)", "p2d4",
  (o) => { const a = daemon(o, "duet-prefill").args; a[a.indexOf("--name") + 1] = "prefill-x"; },
  /has no prefill instance named 'prefill-x'/);
rejects("an unknown instance flag (real binary's error)", "p2d4",
  (o) => { daemon(o, "duet-decode").args.push("--n-pagez", "12"); },
  /--n-pagez: unknown flag/);

// identity: headless Service, discover name, one workload per entry
rejects("discover names another namespace", "p2d4",
  (o) => editConfig(o, (j) => { j.prefill[0].discover = "duet-prefill.default.svc.cluster.local:9100"; }),
  /discover is duet-prefill.default.svc.cluster.local:9100, the headless Service is duet-prefill.duet.svc.cluster.local:9100/);
rejects("an entry with a fixed address", "p2d4",
  (o) => editConfig(o, (j) => { j.decode[0].address = "10.0.0.7:9200"; }),
  /address 10.0.0.7:9200 names one pod/);
rejects("governing Service not headless", "p2d4",
  (o) => { delete obj(o, "Service", "duet-decode").spec.clusterIP; },
  /Service\/duet-decode: governs a StatefulSet but is not headless/);
rejects("config entry nobody runs", "p2d4",
  (o) => editConfig(o, (j) => { j.decode.push({ ...j.decode[0], name: "decode-extra", discover: "x.duet.svc.cluster.local:9200" }); }),
  /config decode entry decode-extra: no workload runs --name decode-extra/);
rejects("headless Service selecting two entries", "mixed",
  (o) => { delete obj(o, "Service", "duet-prefill-tp1").spec.selector["duet-entry"]; },
  /selector also selects the pods of StatefulSet\/duet-prefill-tp2/);
rejects("anti-affinity that does not match the pods", "mixed",
  (o) => {
    const t = obj(o, "StatefulSet", "duet-decode-tp4").spec.template.spec.affinity.podAntiAffinity;
    t.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.labelSelector.matchLabels["duet-entry"] = "decode";
  },
  /StatefulSet\/duet-decode-tp4: no podAntiAffinity term/);
rejects("no PodDisruptionBudget", "p2d4",
  (o) => o.splice(o.indexOf(obj(o, "PodDisruptionBudget", "duet-decode")), 1),
  /StatefulSet\/duet-decode: 0 PodDisruptionBudgets select its pods/);

// schemas
rejects("unknown field (the schemas alone accept it)", "p2d4",
  (o) => { daemon(o, "duet-prefill").imagePullPolcy = "Always"; },
  /containers\[0\]\.imagePullPolcy: unknown field/);
rejects("wrong type", "p2d4",
  (o) => { obj(o, "StatefulSet", "duet-decode").spec.replicas = "two"; },
  /spec.replicas: must be integer/);
rejects("missing required field", "p2d4",
  (o) => { delete obj(o, "Deployment", "duet-router").spec.selector; },
  /required field selector is missing/);

// UCX, /dev/shm, NetworkPolicy
rejects("UCX port range not pinned", "p2d4",
  (o) => { const c = daemon(o, "duet-decode"); c.env = c.env.filter((e) => e.name !== "UCX_TCP_PORT_RANGE"); },
  /UCX_TCP_PORT_RANGE is not set/);
rejects("UCX port range too small for the ranks", "p2d4",
  (o) => { daemon(o, "duet-decode").env.find((e) => e.name === "UCX_TCP_PORT_RANGE").value = "20000-20009"; },
  /has 10 ports for 8 listeners/);
rejects("UCX_TLS unset", "p2d4",
  (o) => { const c = daemon(o, "duet-prefill"); c.env = c.env.filter((e) => e.name !== "UCX_TLS"); },
  /UCX_TLS is unset/);
rejects("NetworkPolicy and UCX range disagree", "p2d4",
  (o) => { daemon(o, "duet-decode").env.find((e) => e.name === "UCX_TCP_PORT_RANGE").value = "21000-21999"; },
  /no NetworkPolicy lets prefill pods reach UCX ports 21000-21999/);
rejects("NetworkPolicy opening the gRPC port to the other daemons", "p2d4",
  (o) => { obj(o, "NetworkPolicy", "duet-decode").spec.ingress[0].from.push({ podSelector: { matchLabels: { "app.kubernetes.io/component": "prefill" } } }); },
  /lets prefill pods reach the gRPC port 9200/);
rejects("NetworkPolicy rule without sources", "p2d4",
  (o) => { delete obj(o, "NetworkPolicy", "duet-prefill").spec.ingress[1].from; },
  /ingress\[1\] allows every source/);
rejects("no NetworkPolicy for a role", "p2d4",
  (o) => o.splice(o.indexOf(obj(o, "NetworkPolicy", "duet-prefill")), 1),
  /StatefulSet\/duet-prefill: no NetworkPolicy selects its pods/);
rejects("/dev/shm on disk", "p2d4",
  (o) => { delete obj(o, "StatefulSet", "duet-decode").spec.template.spec.volumes.find((v) => v.name === "shm").emptyDir.medium; },
  /\/dev\/shm is not an emptyDir with medium Memory/);
rejects("/dev/shm larger than the memory limit", "p2d4",
  (o) => { obj(o, "StatefulSet", "duet-decode").spec.template.spec.volumes.find((v) => v.name === "shm").emptyDir.sizeLimit = "200Gi"; },
  /does not cover \/dev\/shm 200Gi/);

// images, security, router
rejects("image :latest", "p2d4",
  (o) => { daemon(o, "duet-prefill").image = "duet-gpu:latest"; },
  /image duet-gpu:latest is not pinned/);
rejects("image no Dockerfile builds", "p2d4",
  (o) => { daemon(o, "duet-prefill").image = "vllm:0.9"; },
  /image vllm is built by no Dockerfile/);
rejects("cuda backend on the CPU image", "p2d4",
  (o) => { daemon(o, "duet-decode").image = "duet-cpu:0.1.0"; },
  /backend cuda in image duet-cpu, which is not built with CUDA/);
rejects("runs as root", "p2d4",
  (o) => { obj(o, "StatefulSet", "duet-prefill").spec.template.spec.securityContext.runAsUser = 0; },
  /must run as non-root/);
rejects("RDMA device without the IPC_LOCK binaries", "p2d4-rdma",
  (o) => { daemon(o, "duet-prefill").command = ["duet-prefill"]; },
  /runs duet-prefill, not a copy with cap_ipc_lock/);
rejects("cpu backend with automatic threads", "cpu",
  (o) => editConfig(o, (j) => { delete j.decode[0].threads; }),
  /threads is 0/);
rejects("cpu backend asking for a GPU", "cpu",
  (o) => { daemon(o, "duet-prefill").resources.limits["nvidia.com/gpu"] = 1; },
  /backend cpu but the pod asks for nvidia.com\/gpu/);
rejects("router metrics annotation on the wrong port", "p2d4",
  (o) => { obj(o, "Deployment", "duet-router").spec.template.metadata.annotations["prometheus.io/port"] = "8001"; },
  /prometheus.io\/port 8001 is not the HTTP port 8000/);
rejects("router grace shorter than preStop + --grace-ms", "p2d4",
  (o) => { obj(o, "Deployment", "duet-router").spec.template.spec.terminationGracePeriodSeconds = 35; },
  /terminationGracePeriodSeconds 35 <= preStop 5s \+ --grace-ms 30000/);

// same-node layout: a prefill and a decode container in one pod on GPUs
// both see (lib/pair.mjs)
const pd = "p1d2-same-node";
rejects("same-node: a container asks for a device-plugin GPU", pd,
  (o) => { pdContainer(o, "prefill").resources.limits["nvidia.com/gpu"] = 1; },
  /container prefill asks for nvidia.com\/gpu: device-plugin GPUs are visible to that container only/);
rejects("same-node: the claim's GPU count is not the TPs' sum", pd,
  (o) => { obj(o, "ResourceClaimTemplate", "duet-pd-gpus").spec.spec.devices.requests[0].exactly.count = 2; },
  /its claim gives the pod 2 GPUs but its daemons have tp 1 \+ 2 = 3/);
rejects("same-node: decode tp raised in the config only", pd,
  (o) => editConfig(o, (j) => { j.decode[0].tp = 4; j.decode[0].devices = [1, 2, 3, 4]; }),
  /its claim gives the pod 3 GPUs but its daemons have tp 1 \+ 4 = 5/);
rejects("same-node: both daemons on the default devices", pd,
  (o) => editConfig(o, (j) => { delete j.prefill[0].devices; delete j.decode[0].devices; }),
  /prefill devices \[0\] and decode devices \[0,1\] share GPU 0/);
rejects("same-node: a device beyond the pod's GPUs", pd,
  (o) => editConfig(o, (j) => { j.decode[0].devices = [1, 3]; }),
  /decode devices \[1,3\]: the pod has 3 GPUs, 3 is none of them/);
rejects("same-node: devices set by a flag", pd,
  (o) => { pdContainer(o, "prefill").args.push("--devices", "[1]"); },
  /prefill devices \[1\] and decode devices \[1,2\] share GPU 1/);
rejects("same-node: a container without the claim", pd,
  (o) => { delete pdContainer(o, "decode").resources.claims; },
  /container decode names no resourceClaim/);
rejects("same-node: a container limited to one request of the claim", pd,
  (o) => { pdContainer(o, "prefill").resources.claims[0].request = "gpus"; },
  /container prefill takes only request gpus of claim gpus/);
rejects("same-node: one claim for every replica", pd,
  (o) => { podSpec(o).resourceClaims[0] = { name: "gpus", resourceClaimName: "duet-gpus" }; },
  /resourceClaimName duet-gpus is one claim for every replica/);
rejects("same-node: the claim template is missing", pd,
  (o) => o.splice(o.indexOf(obj(o, "ResourceClaimTemplate", "duet-pd-gpus")), 1),
  /ResourceClaimTemplate duet-pd-gpus is not in the manifests/);
rejects("same-node: UCX_TLS without cuda_ipc", pd,
  (o) => setEnv(pdContainer(o, "decode"), "UCX_TLS", "cuda_copy,tcp"),
  /UCX_TLS cuda_copy,tcp: no cuda_ipc, so this pod's prefill and decode cannot put KV GPU to GPU/);
rejects("same-node: UCX_TLS without cuda_copy", pd,
  (o) => setEnv(pdContainer(o, "prefill"), "UCX_TLS", "cuda_ipc,tcp"),
  /no cuda_copy, so UCX does not recognise GPU memory/);
rejects("same-node: the shared UCX range too small for both daemons", pd,
  (o) => { for (const n of ["prefill", "decode"]) setEnv(pdContainer(o, n), "UCX_TCP_PORT_RANGE", "20000-20010"); },
  /UCX_TCP_PORT_RANGE 20000-20010 has 11 ports for the 6 listeners of the pod's two daemons/);
rejects("same-node: one daemon's UCX range holds the other's gRPC port", pd,
  (o) => setEnv(pdContainer(o, "decode"), "UCX_TCP_PORT_RANGE", "9000-9150"),
  /the decode container's UCX_TCP_PORT_RANGE 9000-9150 contains the prefill gRPC port 9100/);
rejects("same-node: the pods reach decode's gRPC port", pd,
  (o) => { obj(o, "NetworkPolicy", "duet-pd").spec.ingress[1].from.push({ podSelector: { matchLabels: { "app.kubernetes.io/component": "prefill-decode" } } }); },
  /lets prefill\+decode pods reach the gRPC port 9200/);
rejects("same-node: UCX ports closed between the pods", pd,
  (o) => { obj(o, "NetworkPolicy", "duet-pd").spec.ingress.splice(2, 1); },
  /no NetworkPolicy lets decode pods reach UCX ports 20000-20999/);
rejects("same-node: both gRPC ports named grpc", pd,
  (o) => { for (const n of ["prefill", "decode"]) pdContainer(o, n).ports[0].name = "grpc"; },
  /container prefill: no container port named grpc-prefill/);
rejects("same-node: the decode daemon on the CPU image", pd,
  (o) => { pdContainer(o, "decode").image = "duet-cpu:0.1.0"; },
  /UCX_PROTO_INFO "\*ucp_put\*cuda\*" needs UCX >= 1.16; image duet-cpu's UCX \(the distribution's\)/);
rejects("same-node: the node's IPC namespace", pd,
  (o) => { podSpec(o).hostIPC = true; },
  /StatefulSet\/duet-pd: hostIPC: true: the pod joins the node's namespace/);
rejects("same-node: a third duet container", pd,
  (o) => { podSpec(o).containers.push({ ...structuredClone(pdContainer(o, "decode")), name: "decode2" }); },
  /3 duet containers \(prefill, decode, decode\)/);
rejects("cuda transports on the CPU image's UCX", "cpu",
  (o) => setEnv(daemon(o, "duet-decode"), "UCX_TLS", "cuda_copy,tcp"),
  /UCX_TLS cuda_copy,tcp names cuda_copy but image duet-cpu has the distribution's UCX/);
rejects("separate pods: devices beyond the container's GPUs", "p2d4",
  (o) => editConfig(o, (j) => { j.prefill[0].devices = [2, 3]; }),
  /prefill devices \[2,3\]: the container sees 2 GPUs \(nvidia.com\/gpu\), 2, 3 is none of them/);

// the kustomize sources, rendered: a broken patch is caught end to end
function withSources(edit) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "duet-k8s-"));
  fs.cpSync(path.join(repo, "deploy", "k8s"), path.join(tmp, "deploy", "k8s"), { recursive: true });
  edit(path.join(tmp, "deploy", "k8s"));
  return tmp;
}
test("source: an overlay patch with the wrong GPU count", () => {
  const tmp = withSources((k) => {
    const f = path.join(k, "overlays", "p2d4", "decode-gpus.yaml");
    fs.writeFileSync(f, fs.readFileSync(f, "utf8").replace(/nvidia.com\/gpu: 4/g, "nvidia.com/gpu: 3"));
  });
  const errs = errorsOf(render(path.join(tmp, "deploy", "k8s", "overlays", "p2d4")));
  fs.rmSync(tmp, { recursive: true, force: true });
  assert.ok(errs.some((e) => /limits nvidia.com\/gpu is 3 but decode has tp 4/.test(e)), errs.join("\n"));
});
test("source: a mixed-fleet entry whose Service was not renamed", () => {
  const tmp = withSources((k) => {
    const f = path.join(k, "overlays", "mixed", "cluster.json");
    fs.writeFileSync(f, fs.readFileSync(f, "utf8").replace("duet-decode-tp4.duet.svc", "duet-decode.duet.svc"));
  });
  const errs = errorsOf(render(path.join(tmp, "deploy", "k8s", "overlays", "mixed")));
  fs.rmSync(tmp, { recursive: true, force: true });
  assert.ok(errs.some((e) => /discover is duet-decode.duet.svc.cluster.local:9200, the headless Service is duet-decode-tp4/.test(e)), errs.join("\n"));
});
test("source: the same-node config with overlapping devices", () => {
  const tmp = withSources((k) => {
    const f = path.join(k, "overlays", "p1d2-same-node", "cluster.json");
    fs.writeFileSync(f, fs.readFileSync(f, "utf8").replace('"devices": [1, 2]', '"devices": [0, 1]'));
  });
  const errs = errorsOf(render(path.join(tmp, "deploy", "k8s", "overlays", "p1d2-same-node")));
  fs.rmSync(tmp, { recursive: true, force: true });
  assert.ok(errs.some((e) => /prefill devices \[0\] and decode devices \[0,1\] share GPU 0/.test(e)), errs.join("\n"));
});
test("source: a kustomization naming a missing patch does not render", () => {
  const tmp = withSources((k) => {
    const f = path.join(k, "overlays", "p4d2", "kustomization.yaml");
    fs.writeFileSync(f, fs.readFileSync(f, "utf8").replace("decode-gpus.yaml", "decode-gpu.yaml"));
  });
  assert.throws(() => render(path.join(tmp, "deploy", "k8s", "overlays", "p4d2")), /kustomize build/);
  fs.rmSync(tmp, { recursive: true, force: true });
});

// Dockerfiles
function dockerRejects(name, rel, from, to, want) {
  test(`dockerfile: ${name}`, () => {
    const text = fs.readFileSync(path.join(repo, rel), "utf8");
    assert.ok(text.includes(from), `${rel} has no "${from}"`);
    const errs = checkDockerfile(repo, rel, text.replaceAll(from, to)).errors;
    assert.ok(errs.some((e) => want.test(e)), `expected ${want} among:\n  ${errs.join("\n  ") || "(no errors)"}`);
  });
}
test("dockerfiles: the unbroken ones pass", () => {
  assert.deepEqual(imageInfos(repo).errors, []);
});
dockerRejects("base image without a tag", "deploy/docker/cpu.Dockerfile", "FROM debian:12.11-slim", "FROM debian", /base image debian is not pinned/);
dockerRejects("base image :latest", "deploy/docker/gpu.Dockerfile", "FROM nvidia/cuda:13.0.2-devel-ubuntu24.04 AS build", "FROM nvidia/cuda:latest AS build", /nvidia\/cuda:latest is not pinned/);
dockerRejects("runs as root", "deploy/docker/gpu.Dockerfile", "USER 10001:10001", "USER root", /runs as root/);
dockerRejects("no USER", "deploy/docker/cpu.Dockerfile", "USER 10001:10001", "", /no USER/);
dockerRejects("build tools in the final stage", "deploy/docker/cpu.Dockerfile", "ucx-utils libcap2-bin", "ucx-utils libcap2-bin build-essential", /installs build tool build-essential/);
dockerRejects("a -dev package in the final stage", "deploy/docker/gpu.Dockerfile", "ibverbs-providers libcap2-bin", "ibverbs-providers libcap2-bin libcjson-dev", /installs build tool libcjson-dev/);
dockerRejects("final stage on the devel image", "deploy/docker/gpu.Dockerfile", "FROM nvidia/cuda:13.0.2-runtime-ubuntu24.04", "FROM nvidia/cuda:13.0.2-devel-ubuntu24.04", /final stage is based on a build image/);
dockerRejects("COPY of a missing path", "deploy/docker/cpu.Dockerfile", "COPY models/stories260K", "COPY models/stories999K", /COPY models\/stories999K: no such path/);
dockerRejects("a script that does not exist", "deploy/docker/gpu.Dockerfile", "deploy/docker/runtime-packages.sh", "deploy/docker/runtime-pkgs.sh", /runtime-pkgs.sh, which does not exist/);
dockerRejects("not the CI build script", "deploy/docker/cpu.Dockerfile", "scripts/build.sh", "cmake --build build/image", /does not run scripts\/build.sh/);
dockerRejects("a binary CMake does not build", "deploy/docker/cpu.Dockerfile", "build/image/router/duet-router", "build/image/router/duet-routr", /no add_executable\(duet-routr\)/);
dockerRejects("apt-get install with recommends", "deploy/docker/gpu.Dockerfile", " --no-install-recommends --no-upgrade", " --no-upgrade", /without --no-install-recommends/);
dockerRejects("apt lists left in the image", "deploy/docker/cpu.Dockerfile", " && rm -rf /var/lib/apt/lists/* \\\n && groupadd", " && groupadd", /without removing \/var\/lib\/apt\/lists/);
dockerRejects("the whole context in the final stage", "deploy/docker/cpu.Dockerfile", "COPY models/stories260K /models/stories260K", "COPY . /src", /copies the whole build context/);

// the GPU image's UCX: scripts/build_ucx.sh's pinned, checked release
// (lib/ucx-image.mjs); broken in the Dockerfile or in the script
const gpuDf = "deploy/docker/gpu.Dockerfile";
dockerRejects("GPU image on the distribution's UCX", gpuDf, " \\\n && scripts/build_ucx.sh --prefix /opt/ucx", "", /does not run scripts\/build_ucx.sh: a CUDA image needs UCX with CUDA transports/);
dockerRejects("UCX built without rdma-core's headers", gpuDf, "libibverbs-dev librdmacm-dev ", "", /build_ucx.sh runs without libibverbs-dev: it builds no RDMA transports/);
dockerRejects("duet built against Ubuntu's UCX", gpuDf, "PKG_CONFIG_PATH=/opt/ucx/lib/pkgconfig ", "", /scripts\/build.sh runs without PKG_CONFIG_PATH=\/opt\/ucx\/lib\/pkgconfig/);
dockerRejects("runtime packages blind to the bundled UCX", gpuDf, "runtime-packages.sh --bundled /opt/ucx", "runtime-packages.sh", /runtime-packages.sh without --bundled \/opt\/ucx/);
dockerRejects("final stage without the bundled UCX", gpuDf, "COPY --from=build /out/ucx/ /opt/ucx/", "COPY --from=build /out/ucx/ /usr/local/ucx/", /the final stage copies nothing to \/opt\/ucx/);
dockerRejects("bundled UCX not registered with the loader", gpuDf, " \\\n && echo /opt/ucx/lib > /etc/ld.so.conf.d/000-duet-ucx.conf && ldconfig \\\n && ln -s", " \\\n && ln -s", /does not register \/opt\/ucx\/lib with ldconfig/);
dockerRejects("Ubuntu's UCX next to the bundled one", gpuDf, "ibverbs-providers libcap2-bin", "ibverbs-providers libcap2-bin ucx-utils", /the final stage installs ucx-utils: the distribution's UCX next to \/opt\/ucx's/);
function ucxScriptRejects(name, from, to, want) {
  test(`build_ucx.sh: ${name}`, () => {
    const text = fs.readFileSync(path.join(repo, "scripts", "build_ucx.sh"), "utf8");
    assert.ok(from.test ? from.test(text) : text.includes(from), `build_ucx.sh has no ${from}`);
    const files = new Map([["scripts/build_ucx.sh", text.replace(from, to)]]);
    const errs = checkDockerfile(repo, gpuDf, null, files).errors;
    assert.ok(errs.some((e) => want.test(e)), `expected ${want} among:\n  ${errs.join("\n  ") || "(no errors)"}`);
  });
}
ucxScriptRejects("the checksum check removed", /if ! sha_ok [^\n]*\n[^\n]*\n[^\n]*exit 1\nfi\n/, "",
  /does not check the tarball's sha256 \(and stop on a mismatch\) before unpacking it/);
ucxScriptRejects("a mismatch only warned about", /if ! sha_ok [^\n]*\n[^\n]*\n[^\n]*exit 1\nfi\n/, 'sha_ok "$source" "$want" || echo "sha256 mismatch" >&2\n',
  /does not check the tarball's sha256/);
ucxScriptRejects("GDA-KI left in with CUDA and mlx5", " --without-gda", "",
  /configures CUDA and mlx5 without --without-gda: the gdaki module needs DOCA GPUNetIO headers/);
ucxScriptRejects("the sha256 not pinned", /^UCX_URL_SHA256=[0-9a-f]+$/m, "UCX_URL_SHA256=", /UCX_URL_SHA256= is not a pinned sha256/);
ucxScriptRejects("the release over http", "UCX_URL=https://", "UCX_URL=http://", /UCX_URL http:\/\/\S+ is not an https URL/);

// deploy/docker/runtime-packages.sh decides what a final image installs
test("runtime-packages.sh: the daemons' libraries map to packages, UCX's included", () => {
  const bins = ["prefill/duet-prefill", "decode/duet-decode"].map((b) => path.join(build, b));
  const r = spawnSync(path.join(repo, "deploy", "docker", "runtime-packages.sh"), bins, { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  const pkgs = r.stdout.trim().split("\n");
  assert.ok(pkgs.includes("libucx0") && pkgs.includes("libcjson1"), pkgs.join(" "));
  assert.ok(!pkgs.some((p) => /-dev$/.test(p)), pkgs.join(" "));
});
test("runtime-packages.sh: a library no package provides is an error", () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "duet-rtp-"));
  const lib = spawnSync("sh", ["-c", `ldd '${path.join(build, "prefill", "duet-prefill")}' | awk '/libcjson/ {print $3}'`], { encoding: "utf8" }).stdout.trim();
  assert.ok(lib, "duet-prefill does not link libcjson");
  fs.copyFileSync(lib, path.join(tmp, path.basename(lib)));
  const r = spawnSync(path.join(repo, "deploy", "docker", "runtime-packages.sh"), [path.join(build, "prefill", "duet-prefill")],
    { encoding: "utf8", env: { ...process.env, LD_LIBRARY_PATH: tmp } });
  fs.rmSync(tmp, { recursive: true, force: true });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /libcjson\.so\.1 belongs to no package/);
});
