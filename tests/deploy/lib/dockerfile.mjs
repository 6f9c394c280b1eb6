// Static checks of the Dockerfiles (no Docker engine here): what hadolint
// would say about pinning and users, plus what only this repository can
// tell — the scripts and paths they use exist, the final stage carries no
// build tools, and which binaries each image provides (the manifests'
// commands are checked against that).
import fs from "node:fs";
import path from "node:path";

import { checkImageUcx } from "./ucx-image.mjs";

// Instructions with their line numbers; continuation lines joined and
// comment lines dropped as Docker does.
export function parseDockerfile(text) {
  const out = [];
  const lines = text.split("\n");
  let cur = null;
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i];
    const t = raw.trim();
    if (cur === null && (t === "" || t.startsWith("#"))) continue;
    if (cur !== null && t.startsWith("#")) continue;
    const cont = /\\\s*$/.test(raw);
    const body = cont ? raw.replace(/\\\s*$/, "") : raw;
    if (cur === null) cur = { line: i + 1, text: body.trim() };
    else cur.text += " " + body.trim();
    if (!cont) {
      const m = /^(\S+)\s*(.*)$/.exec(cur.text);
      out.push({ line: cur.line, cmd: m[1].toUpperCase(), args: m[2] });
      cur = null;
    }
  }
  if (cur !== null) out.push({ line: cur.line, cmd: "ERROR", args: "unterminated continuation" });
  return out;
}

function splitStages(insns) {
  const stages = [];
  for (const ins of insns) {
    if (ins.cmd === "FROM") {
      const toks = ins.args.split(/\s+/).filter((t) => !t.startsWith("--"));
      const m = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(toks.join(" "));
      stages.push({ image: m ? m[1] : toks[0], name: m && m[2] ? m[2] : null, line: ins.line, insns: [] });
    } else if (stages.length) {
      stages[stages.length - 1].insns.push(ins);
    }
  }
  return stages;
}

// .dockerignore semantics: patterns relative to the context, ** any depth,
// * and ? within a path element, later patterns win, ! re-includes; a
// pattern that matches a directory excludes everything under it.
export function dockerignoreMatcher(text) {
  const rules = [];
  for (let line of text.split("\n")) {
    line = line.trim();
    if (!line || line.startsWith("#")) continue;
    const neg = line.startsWith("!");
    let pat = path.posix.normalize((neg ? line.slice(1) : line).trim()).replace(/^\/+|\/+$/g, "");
    let re = "";
    for (let i = 0; i < pat.length; i++) {
      const c = pat[i];
      if (c === "*" && pat[i + 1] === "*") {
        re += pat[i + 2] === "/" ? "(?:.*/)?" : ".*";
        i += pat[i + 2] === "/" ? 2 : 1;
      } else if (c === "*") re += "[^/]*";
      else if (c === "?") re += "[^/]";
      else re += c.replace(/[.+^${}()|[\]\\]/g, "\\$&");
    }
    rules.push({ neg, re: new RegExp(`^${re}$`) });
  }
  return (rel) => {
    const parts = path.posix.normalize(rel).replace(/^\.\/?/, "").split("/").filter(Boolean);
    let ignored = false;
    for (const r of rules) {
      for (let n = 1; n <= parts.length; n++) {
        if (r.re.test(parts.slice(0, n).join("/"))) {
          ignored = !r.neg;
          break;
        }
      }
    }
    return ignored;
  };
}

const BUILD_TOOL =
  /^(build-essential|gcc(-\d+)?|g\+\+(-\d+)?|clang(-\d+)?|cmake|make|ninja-build|pkg-config|pkgconf|git|autoconf|automake|libtool|nvidia-cuda-toolkit|cuda-nvcc(-[\d-]+)?|cuda-toolkit(-[\d-]+)?|cuda-compiler(-[\d-]+)?|protobuf-compiler(-grpc)?|protobuf-c-compiler|[a-z0-9.+-]+-dev)(:[a-z0-9]+)?(=\S+)?$/;
const DEVEL_IMAGE = /(^|[-:/])(devel|sdk|buildpack-deps|gcc|golang)([-:]|$)/;

function isPinned(image) {
  if (image.includes("@sha256:")) return true;
  const last = image.split("/").pop();
  const i = last.indexOf(":");
  if (i < 0) return false;
  const tag = last.slice(i + 1);
  return tag !== "" && tag !== "latest" && !tag.includes("$");
}

function aptPackages(run) {
  // the words after "apt-get install" / "apt install" up to the next && ; |
  const pkgs = [];
  const re = /\bapt(?:-get)?\s+install\b([^;&|]*)/g;
  let m;
  while ((m = re.exec(run)) !== null) {
    for (const w of m[1].trim().split(/\s+/)) if (w && !w.startsWith("-")) pkgs.push(w);
  }
  return pkgs;
}

// The executables a CMake directory declares (add_executable(NAME ...)).
function cmakeExecutables(repo, dir) {
  const f = path.join(repo, dir, "CMakeLists.txt");
  if (!fs.existsSync(f)) return null;
  const names = new Set();
  const re = /add_executable\(\s*([A-Za-z0-9_.-]+)/g;
  let m;
  const text = fs.readFileSync(f, "utf8");
  while ((m = re.exec(text)) !== null) names.add(m[1]);
  return names;
}

// Check one Dockerfile (path relative to repo, context = repo root).
// files: repository files to read from this map instead (rel -> text).
// Returns { errors, title, binaries: Set of absolute paths in the final
// image, capBinaries: Map path -> capability, dataPaths: [paths], cuda,
// ucx: { pinned, prefix, version, cuda } (lib/ucx-image.mjs) }.
export function checkDockerfile(repo, rel, text = null, files = new Map()) {
  const errors = [];
  const file = path.join(repo, rel);
  const src = text ?? fs.readFileSync(file, "utf8");
  const err = (line, msg) => errors.push(`${rel}:${line}: ${msg}`);
  const insns = parseDockerfile(src);
  for (const ins of insns) if (ins.cmd === "ERROR") err(ins.line, ins.args);
  const stages = splitStages(insns);
  const info = { errors, title: null, binaries: new Set(), capBinaries: new Map(), dataPaths: [] };
  if (stages.length < 2) {
    err(1, "not a multi-stage build (a build stage and a runtime stage are expected)");
    return info;
  }
  const ignoreFile = file + ".dockerignore";
  const ignored = fs.existsSync(ignoreFile)
    ? dockerignoreMatcher(fs.readFileSync(ignoreFile, "utf8"))
    : () => false;
  const names = new Set();
  for (const st of stages) {
    if (!names.has(st.image) && !isPinned(st.image))
      err(st.line, `base image ${st.image} is not pinned to a tag or digest (and not :latest)`);
    if (st.name) names.add(st.name);
  }
  const final = stages[stages.length - 1];
  const buildStages = stages.slice(0, -1);
  // a CUDA image: CUDA's runtime libraries at run time, nvcc at build time
  info.cuda = /^(nvcr\.io\/)?nvidia\/cuda:/.test(final.image) &&
    buildStages.some((s) => /^(nvcr\.io\/)?nvidia\/cuda:.*devel/.test(s.image));
  if (DEVEL_IMAGE.test(final.image) || buildStages.some((s) => s.image === final.image))
    err(final.line, `final stage is based on a build image (${final.image})`);
  info.ucx = checkImageUcx({ repo, rel, stages, final, err, files }, info.cuda);

  // the CI scripts, called by the build stage
  const buildRuns = buildStages.flatMap((s) => s.insns.filter((i) => i.cmd === "RUN"));
  for (const script of ["scripts/install-deps.sh", "scripts/build.sh"]) {
    if (!buildRuns.some((r) => r.args.includes(script)))
      err(buildStages[0].line, `the build stage does not run ${script} (the script CI runs)`);
  }
  // every script a RUN names exists and is executable
  for (const st of stages) {
    for (const ins of st.insns.filter((i) => i.cmd === "RUN")) {
      const re = /(?:^|[\s;&|(])((?:scripts|deploy|tests|tools)\/[\w./-]+\.(?:sh|py|mjs))\b/g;
      let m;
      while ((m = re.exec(ins.args)) !== null) {
        const p = path.join(repo, m[1]);
        if (!fs.existsSync(p)) err(ins.line, `RUN calls ${m[1]}, which does not exist`);
        else if ((fs.statSync(p).mode & 0o111) === 0) err(ins.line, `RUN calls ${m[1]}, which is not executable`);
      }
    }
  }
  // COPY/ADD from the context: the source exists and is not .dockerignored
  for (const st of stages) {
    for (const ins of st.insns.filter((i) => i.cmd === "COPY" || i.cmd === "ADD")) {
      const toks = ins.args.split(/\s+/);
      const flags = toks.filter((t) => t.startsWith("--"));
      const rest = toks.filter((t) => !t.startsWith("--"));
      if (flags.some((f) => f.startsWith("--from="))) continue;
      for (const s of rest.slice(0, -1)) {
        if (/^https?:/.test(s)) {
          err(ins.line, `${ins.cmd} ${s}: remote sources are not pinned`);
          continue;
        }
        if (s === ".") continue;
        if (!fs.existsSync(path.join(repo, s))) err(ins.line, `${ins.cmd} ${s}: no such path in the build context`);
        else if (ignored(s)) err(ins.line, `${ins.cmd} ${s}: excluded by ${path.basename(ignoreFile)}`);
      }
      if (st === final) {
        if (rest.slice(0, -1).includes("."))
          err(ins.line, "the final stage copies the whole build context (sources, not runtime files)");
        else info.dataPaths.push(rest[rest.length - 1].replace(/\/$/, ""));
      }
    }
  }
  // final stage: no build tools, a non-root USER, no sources
  for (const ins of final.insns) {
    if (ins.cmd === "RUN") {
      for (const p of aptPackages(ins.args))
        if (BUILD_TOOL.test(p)) err(ins.line, `the final stage installs build tool ${p}`);
      if (/\bapt(-get)?\s+install\b/.test(ins.args)) {
        if (!/--no-install-recommends/.test(ins.args))
          err(ins.line, "apt-get install without --no-install-recommends (pulls in recommended build tools)");
        if (!/rm -rf \/var\/lib\/apt\/lists/.test(ins.args))
          err(ins.line, "apt-get install without removing /var/lib/apt/lists in the same RUN");
      }
      if (/\b(cmake|make|gcc|cc|nvcc)\s/.test(ins.args.replace(/apt(-get)?\s+install[^;&|]*/g, "")))
        err(ins.line, "the final stage runs a compiler or build tool");
    }
    if (ins.cmd === "LABEL") {
      const m = /org\.opencontainers\.image\.title="?([^"\s]+)"?/.exec(ins.args);
      if (m) info.title = m[1];
    }
  }
  const users = final.insns.filter((i) => i.cmd === "USER");
  if (users.length === 0) err(final.line, "the final stage has no USER (it would run as root)");
  else {
    const u = users[users.length - 1];
    const who = u.args.trim().split(":")[0];
    if (who === "root" || who === "0") err(u.line, `the final stage runs as ${u.args.trim()}`);
  }
  if (!info.title) err(final.line, "no LABEL org.opencontainers.image.title (the image name the manifests use)");

  // binaries: installed into /out/bin by the build stage, copied by the final stage
  const staged = new Map(); // name -> build path
  for (const r of buildRuns) {
    const m = /\binstall\s+((?:\S+\s+)+)\/out\/bin\/?(?:\s|$)/.exec(r.args);
    if (!m) continue;
    const toks = m[1].trim().split(/\s+/);
    for (let k = 0; k < toks.length; k++) {
      const f = toks[k];
      if (["-m", "-o", "-g", "--mode", "--owner", "--group"].includes(f)) {
        k++;
        continue;
      }
      if (f.startsWith("-")) continue;
      staged.set(path.posix.basename(f), f);
      const mm = /^build\/[^/]+\/(.+)\/([^/]+)$/.exec(f);
      if (!mm) {
        err(r.line, `${f}: not a build output path (build/<dir>/<source dir>/<target>)`);
        continue;
      }
      const exes = cmakeExecutables(repo, mm[1]);
      if (exes === null) err(r.line, `${f}: ${mm[1]}/CMakeLists.txt does not exist`);
      else if (!exes.has(mm[2])) err(r.line, `${f}: ${mm[1]}/CMakeLists.txt has no add_executable(${mm[2]})`);
    }
  }
  for (const ins of final.insns.filter((i) => i.cmd === "COPY")) {
    const m = /--from=(\S+)\s+\/out\/bin\/?\s+(\S+)/.exec(ins.args);
    if (!m) continue;
    const dest = m[2].replace(/\/$/, "");
    for (const n of staged.keys()) info.binaries.add(`${dest}/${n}`);
  }
  if (info.binaries.size === 0) err(final.line, "the final stage copies no binaries from /out/bin");
  for (const ins of final.insns.filter((i) => i.cmd === "RUN")) {
    const re = /\bsetcap\s+(\S+)\s+(\/\S+)/g;
    let m;
    while ((m = re.exec(ins.args)) !== null) {
      const target = m[2];
      const base = path.posix.basename(target);
      if (!staged.has(base)) err(ins.line, `setcap on ${target}: no such binary is built`);
      else if (!new RegExp(`\\bcp\\b[^;&|]*\\b${base}\\b[^;&|]*${path.posix.dirname(target)}`).test(ins.args))
        err(ins.line, `setcap on ${target}: the RUN does not put ${base} there`);
      info.capBinaries.set(target, m[1]);
      info.binaries.add(target);
    }
  }
  return info;
}
