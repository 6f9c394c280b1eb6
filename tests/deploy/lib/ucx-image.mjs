// The UCX an image carries.  A CUDA image must bring the pinned UCX that
// scripts/build_ucx.sh builds with CUDA transports (the distributions'
// UCX has none, so KV could not move GPU to GPU), and every step from the
// checked download to the final stage's loader must hold: the script pins
// the release and checks its sha256 before unpacking, the build stage has
// rdma-core's headers (the RDMA transports), duet is built against it,
// runtime-packages.sh knows its libraries ship in the image, and the final
// stage carries them where the daemons' run path points and registers
// them with the loader (the cap_ipc_lock copies ignore LD_LIBRARY_PATH).
import fs from "node:fs";
import path from "node:path";

export const UCX_SCRIPT = "scripts/build_ucx.sh";

// Functions a shell script defines, with their bodies ("name() { ... }" on
// one line, or up to a line holding only "}").
function shellFunctions(text) {
  const fns = new Map();
  const re = /^(\w+)\(\)\s*\{(.*?)\}\s*$|^(\w+)\(\)\s*\{\s*\n([\s\S]*?)\n\}/gm;
  let m;
  while ((m = re.exec(text)) !== null) fns.set(m[1] ?? m[3], m[2] ?? m[4]);
  return fns;
}

// Problems with build_ucx.sh's pin of the release it downloads: the
// version, an https URL naming it, a sha256, and a check of that sha256,
// aborting the script, before the tarball is unpacked.
export function checkUcxScript(text) {
  const errs = [];
  const ver = /^UCX_VERSION=(\d+\.\d+\.\d+)\s*$/m.exec(text)?.[1];
  if (!ver) errs.push("pins no UCX_VERSION=X.Y.Z");
  const url = /^UCX_URL=(\S+)\s*$/m.exec(text)?.[1];
  if (!url) errs.push("has no UCX_URL (the release it downloads)");
  else {
    const u = url.replace(/\$\{?UCX_VERSION\}?/g, ver ?? "");
    if (!u.startsWith("https://")) errs.push(`UCX_URL ${url} is not an https URL`);
    if (ver && !u.includes(ver)) errs.push(`UCX_URL ${url} does not name release ${ver}`);
  }
  const sha = /^UCX_URL_SHA256=(\S*)\s*$/m.exec(text)?.[1];
  if (!sha || !/^[0-9a-f]{64}$/.test(sha)) errs.push(`UCX_URL_SHA256=${sha ?? ""} is not a pinned sha256 (64 hex digits)`);
  if (!/\$\{?UCX_URL_SHA256\}?/.test(text)) errs.push("never compares anything with UCX_URL_SHA256");

  // UCX >= 1.20 builds GDA-KI (GPU-initiated verbs) with CUDA and mlx5; it
  // needs DOCA GPUNetIO headers from a git submodule, empty in the 1.22.0
  // export, and duet does not use it
  if (/--with-cuda\b/.test(text) && /--with-mlx5\b/.test(text) && !/--without-gda\b/.test(text))
    errs.push("configures CUDA and mlx5 without --without-gda: the gdaki module needs DOCA GPUNetIO headers (a git submodule, empty in the 1.22.0 export) and fails the build");

  const lines = text.split("\n");
  const tarAt = lines.findIndex((l) => /^\s*tar\s+(-\w*x|x)/.test(l));
  if (tarAt < 0) {
    errs.push("unpacks no tarball (tar -x)");
    return errs;
  }
  const checkers = [...shellFunctions(text)].filter(([, body]) => /sha256sum\s+(-c|--check)\b/.test(body)).map(([n]) => n);
  const check = new RegExp(`(sha256sum\\s+(-c|--check)\\b${checkers.map((n) => `|\\b${n}\\b`).join("")})`);
  const verified = lines.slice(0, tarAt).some((l, i) => {
    if (!check.test(l) || /^\s*\w+\(\)\s*\{/.test(l)) return false;
    const after = lines.slice(i, Math.min(i + 4, tarAt)).join("\n");
    return /\|\||\bif\s+!/.test(l) && /\bexit\s+[1-9]/.test(after);
  });
  if (!verified)
    errs.push(`does not check the tarball's sha256 (and stop on a mismatch) before unpacking it at line ${tarAt + 1}`);
  return errs;
}

function aptInstalls(run) {
  const pkgs = [];
  const re = /\bapt(?:-get)?\s+install\b([^;&|]*)/g;
  let m;
  while ((m = re.exec(run)) !== null)
    for (const w of m[1].trim().split(/\s+/)) if (w && !w.startsWith("-")) pkgs.push(w.replace(/[:=].*$/, ""));
  return pkgs;
}

// ctx: { repo, rel, stages, final, err, files: Map rel -> text overrides }.
// Returns the image's UCX: { pinned, prefix, version, cuda }.
export function checkImageUcx(ctx, cuda) {
  const { repo, stages, final, err, files } = ctx;
  const buildStages = stages.slice(0, -1);
  const ucx = { pinned: false, prefix: null, version: null, cuda: false };
  let at = null;
  for (const st of buildStages)
    for (const ins of st.insns)
      if (ins.cmd === "RUN" && ins.args.includes(UCX_SCRIPT) && !at) at = { st, ins };
  if (!at) {
    if (cuda)
      err(buildStages[0].line, `the build stage does not run ${UCX_SCRIPT}: a CUDA image needs UCX with CUDA transports (the distribution's has none)`);
    return ucx;
  }
  const { st, ins } = at;
  const prefix = new RegExp(`${UCX_SCRIPT.replace(/\./g, "\\.")}\\s+(?:\\S+\\s+)*?--prefix\\s+(/\\S+)`).exec(ins.args)?.[1];
  if (!prefix) {
    err(ins.line, `${UCX_SCRIPT} without --prefix /DIR`);
    return ucx;
  }
  ucx.pinned = true;
  ucx.prefix = prefix.replace(/\/$/, "");
  ucx.cuda = true; // the script fails when configure leaves the cuda transports out
  const scriptText = files.get(UCX_SCRIPT) ?? (fs.existsSync(path.join(repo, UCX_SCRIPT)) ? fs.readFileSync(path.join(repo, UCX_SCRIPT), "utf8") : null);
  if (scriptText !== null) {
    ucx.version = /^UCX_VERSION=(\d+\.\d+\.\d+)\s*$/m.exec(scriptText)?.[1] ?? null;
    for (const e of checkUcxScript(scriptText)) err(ins.line, `${UCX_SCRIPT} ${e}`);
  }
  // rdma-core's headers by the time the script runs, in its stage
  const upTo = st.insns.slice(0, st.insns.indexOf(ins) + 1).filter((i) => i.cmd === "RUN");
  const installed = new Set(upTo.flatMap((r) => aptInstalls(r.args)));
  for (const p of ["libibverbs-dev", "librdmacm-dev"])
    if (!installed.has(p)) err(ins.line, `${UCX_SCRIPT} runs without ${p}: it builds no RDMA transports (GPUDirect RDMA between nodes)`);
  // duet against it, and the package list aware of it
  const buildRuns = buildStages.flatMap((s) => s.insns.filter((i) => i.cmd === "RUN"));
  const pc = `${ucx.prefix}/lib/pkgconfig`;
  for (const r of buildRuns.filter((r) => r.args.includes("scripts/build.sh"))) {
    const m = /\bPKG_CONFIG_PATH=(\S+)/.exec(r.args);
    if (!m || !m[1].split(":").includes(pc))
      err(r.line, `scripts/build.sh runs without PKG_CONFIG_PATH=${pc}: duet links the distribution's UCX, not ${ucx.prefix}'s`);
  }
  for (const r of buildRuns.filter((r) => r.args.includes("runtime-packages.sh"))) {
    if (!new RegExp(`runtime-packages\\.sh\\s+(?:\\S+\\s+)*?--bundled\\s+${ucx.prefix}/?(\\s|$)`).test(r.args))
      err(r.line, `runtime-packages.sh without --bundled ${ucx.prefix}: its libraries are no package's, and its transport modules' packages go unlisted`);
  }
  // the final stage: the libraries at the prefix, known to the loader, alone
  const copied = final.insns.some((i) => {
    if (i.cmd !== "COPY" || !/--from=/.test(i.args)) return false;
    const toks = i.args.split(/\s+/).filter((t) => !t.startsWith("--"));
    return toks[toks.length - 1].replace(/\/$/, "") === ucx.prefix;
  });
  if (!copied) err(final.line, `the final stage copies nothing to ${ucx.prefix} (where the daemons' run path finds UCX)`);
  const lib = `${ucx.prefix}/lib`.replace(/\//g, "\\/");
  if (!final.insns.some((i) => i.cmd === "RUN" && new RegExp(`\\becho\\s+${lib}\\s*>>?\\s*/etc/ld\\.so\\.conf\\.d/\\S+\\.conf\\b[\\s\\S]*\\bldconfig\\b`).test(i.args)))
    err(final.line, `the final stage does not register ${ucx.prefix}/lib with ldconfig (the cap_ipc_lock copies ignore LD_LIBRARY_PATH)`);
  for (const i of final.insns.filter((x) => x.cmd === "RUN"))
    for (const p of aptInstalls(i.args))
      if (/^(libucx\d*|libucx-dev|ucx-utils)$/.test(p))
        err(i.line, `the final stage installs ${p}: the distribution's UCX next to ${ucx.prefix}'s`);
  return ucx;
}
