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
import { checkDockerfile } from "../lib/dockerfile.mjs";
import { imageInfos } from "../lib/images.mjs";
import { render } from "../lib/render.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(process.env.DUET_SOURCE_DIR || path.join(here, "..", "..", ".."));
const build = process.env.DUET_BINARY_DIR;
if (!build || !fs.existsSync(path.join(build, "prefill", "duet-prefill")))
  throw new Error(`DUET_BINARY_DIR must be a build with duet-prefill and duet-decode (got ${build})`);
const { images } = imageInfos(repo);
const overlay = (n) => path.join(repo, "deploy", "k8s", "overlays", n);
const rendered = Object.fromEntries(["p2d4", "mixed", "p2d4-rdma", "cpu"].map((n) => [n, render(overlay(n))]));

const errorsOf = (objs, r = repo) => checkRendered(objs, { build, repo: r, images }).errors;
const obj = (objs, kind, name) => {
  const o = objs.find((x) => x.kind === kind && x.metadata.name === name);
  assert.ok(o, `${kind}/${name} not rendered`);
  return o;
};
const daemon = (objs, name) => obj(objs, "StatefulSet", name).spec.template.spec.containers[0];
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
  for (const n of ["p2d4", "mixed"]) {
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
  (o) => { daemon(o, "duet-prefill").livenessProbe.grpc.port = 9200; },
  /livenessProbe: probes port 9200, duet-prefill listens on 9100/);
rejects("HTTP probe on a gRPC daemon", "p2d4",
  (o) => { daemon(o, "duet-prefill").startupProbe = { httpGet: { path: "/", port: 9100 } }; },
  /startupProbe: not a native gRPC probe/);
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
dockerRejects("a -dev package in the final stage", "deploy/docker/gpu.Dockerfile", "ucx-utils libcap2-bin", "ucx-utils libcap2-bin libucx-dev", /installs build tool libucx-dev/);
dockerRejects("final stage on the devel image", "deploy/docker/gpu.Dockerfile", "FROM nvidia/cuda:13.0.2-runtime-ubuntu24.04", "FROM nvidia/cuda:13.0.2-devel-ubuntu24.04", /final stage is based on a build image/);
dockerRejects("COPY of a missing path", "deploy/docker/cpu.Dockerfile", "COPY models/stories260K", "COPY models/stories999K", /COPY models\/stories999K: no such path/);
dockerRejects("a script that does not exist", "deploy/docker/gpu.Dockerfile", "deploy/docker/runtime-packages.sh", "deploy/docker/runtime-pkgs.sh", /runtime-pkgs.sh, which does not exist/);
dockerRejects("not the CI build script", "deploy/docker/cpu.Dockerfile", "scripts/build.sh", "cmake --build build/image", /does not run scripts\/build.sh/);
dockerRejects("a binary CMake does not build", "deploy/docker/cpu.Dockerfile", "build/image/router/duet-router", "build/image/router/duet-routr", /no add_executable\(duet-routr\)/);
dockerRejects("apt-get install with recommends", "deploy/docker/gpu.Dockerfile", " --no-install-recommends --no-upgrade", " --no-upgrade", /without --no-install-recommends/);
dockerRejects("apt lists left in the image", "deploy/docker/cpu.Dockerfile", " && rm -rf /var/lib/apt/lists/* \\\n && groupadd", " && groupadd", /without removing \/var\/lib\/apt\/lists/);
dockerRejects("the whole context in the final stage", "deploy/docker/cpu.Dockerfile", "COPY models/stories260K /models/stories260K", "COPY . /src", /copies the whole build context/);

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
