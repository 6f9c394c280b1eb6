#!/usr/bin/env node
// Offline validation of duet's container images and Kubernetes manifests.
//
//   node tests/deploy/validate.mjs --build BUILD_DIR [--source REPO]
//
// 1. Dockerfiles: static checks (no Docker engine here).
// 2. deploy/docker/runtime-packages.sh on the binaries of BUILD_DIR: the
//    package list a final image installs resolves for the real binaries.
// 3. Every kustomization (base, overlays/*) rendered with the pinned
//    kustomize, every object validated against the Kubernetes schemas
//    (kubernetes-models@5.1.0) including unknown fields, and cross-checked
//    against duet-prefill/duet-decode (--check-config of each pod's own
//    command line) and the config (lib/crosscheck.mjs).
// Ends with "N passed, N failed"; exit status 1 if anything failed.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const { depsProblem } = await import("./lib/deps.mjs");
const problem = depsProblem(here);
if (problem) {
  console.error(`validate.mjs: ${problem}`);
  process.exit(1);
}
const { checkRendered } = await import("./lib/crosscheck.mjs");
const { imageInfos } = await import("./lib/images.mjs");
const { kustomizations, render } = await import("./lib/render.mjs");
const argv = process.argv.slice(2);
const opt = (k, d) => (argv.includes(k) ? argv[argv.indexOf(k) + 1] : d);
const repo = path.resolve(opt("--source", path.join(here, "..", "..")));
const build = opt("--build", process.env.DUET_BINARY_DIR);
if (!build) {
  console.error("usage: validate.mjs --build BUILD_DIR [--source REPO]");
  process.exit(2);
}

let passed = 0;
let failed = 0;
function report(name, errors, notes = []) {
  for (const n of notes) console.log(`  ${n}`);
  if (errors.length === 0) {
    passed++;
    console.log(`ok   ${name}`);
  } else {
    failed++;
    console.log(`FAIL ${name}`);
    for (const e of errors) console.log(`     ${e}`);
  }
}

const { images, errors: dockerErrors } = imageInfos(repo);
report(`dockerfiles (${[...images.keys()].join(", ")})`, dockerErrors);

const bins = ["prefill/duet-prefill", "decode/duet-decode"].map((b) => path.join(build, b));
const missing = bins.filter((b) => !fs.existsSync(b));
if (missing.length) {
  report("runtime packages", [`not built: ${missing.join(", ")}`]);
} else {
  const r = spawnSync(path.join(repo, "deploy", "docker", "runtime-packages.sh"), bins, { encoding: "utf8" });
  const pkgs = (r.stdout || "").split("\n").filter(Boolean);
  const errs = [];
  if (r.status !== 0) errs.push(`runtime-packages.sh: ${(r.stderr || "").trim()}`);
  else if (!pkgs.includes("libucx0")) errs.push(`runtime-packages.sh found no libucx0 in ${pkgs.join(" ")}`);
  report(`runtime packages (${pkgs.join(" ")})`, errs);
}

for (const dir of kustomizations(repo)) {
  const name = path.relative(repo, dir);
  let objects;
  try {
    objects = render(dir);
  } catch (e) {
    report(name, [e.message]);
    continue;
  }
  const { errors, notes } = checkRendered(objects, { build, repo, images });
  report(`${name} (${objects.length} objects)`, errors, notes);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
