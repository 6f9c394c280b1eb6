// deploy/docker/runtime-packages.sh with libraries an image ships itself
// (--bundled: the GPU image's /opt/ucx) and with the NVIDIA driver's
// libraries, which no build stage has and the container runtime mounts.
//
//   DUET_BINARY_DIR=build/deploy node --test tests/deploy/test/
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import test from "node:test";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(process.env.DUET_SOURCE_DIR || path.join(here, "..", "..", ".."));
const build = process.env.DUET_BINARY_DIR;
const script = path.join(repo, "deploy", "docker", "runtime-packages.sh");
const prefill = path.join(build || "", "prefill", "duet-prefill");
if (!build || !fs.existsSync(prefill)) throw new Error(`DUET_BINARY_DIR must be a build with duet-prefill (got ${build})`);

const sh = (cmd) => spawnSync("sh", ["-c", cmd], { encoding: "utf8" });
const lddPath = (bin, lib) => sh(`ldd '${bin}' | awk '/${lib}/ {print $3}'`).stdout.trim();
const runScript = (args, env = {}) => spawnSync(script, args, { encoding: "utf8", env: { ...process.env, ...env } });

test("--bundled: a shipped library is no package's, its modules' packages are listed", () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "duet-rtp-"));
  try {
    // a bundled library the binary loads (found first through LD_LIBRARY_PATH)
    const cjson = lddPath(prefill, "libcjson");
    assert.ok(cjson, "duet-prefill does not link libcjson");
    fs.copyFileSync(cjson, path.join(tmp, path.basename(cjson)));
    // a transport module under it, as UCX keeps them (lib/ucx/): Debian's
    // UCX verbs module, which links libibverbs
    const uct = lddPath(prefill, "libuct");
    const ib = path.join(path.dirname(uct), "ucx", "libuct_ib.so.0");
    assert.ok(fs.existsSync(ib), `no ${ib} (Debian's libucx0 ships it)`);
    fs.mkdirSync(path.join(tmp, "ucx"));
    fs.copyFileSync(ib, path.join(tmp, "ucx", "libuct_ib.so.0"));

    const without = runScript([prefill], { LD_LIBRARY_PATH: tmp });
    assert.notEqual(without.status, 0);
    assert.match(without.stderr, /libcjson\.so\.1 belongs to no package/);

    const r = runScript(["--bundled", tmp, prefill], { LD_LIBRARY_PATH: tmp });
    assert.equal(r.status, 0, r.stderr);
    const pkgs = r.stdout.trim().split("\n");
    assert.ok(!pkgs.includes("libcjson1"), `the bundled libcjson counted as a package: ${pkgs.join(" ")}`);
    assert.ok(pkgs.includes("libibverbs1"), `the module's libibverbs1 is not listed: ${pkgs.join(" ")}`);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test("the NVIDIA driver's libraries may be missing, no other library may", () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "duet-rtp-"));
  try {
    const stubs = path.join(tmp, "stubs");
    const mods = path.join(tmp, "bundle", "ucx");
    fs.mkdirSync(stubs);
    fs.mkdirSync(mods, { recursive: true });
    const cc = (args) => {
      const r = spawnSync("cc", args, { encoding: "utf8" });
      assert.equal(r.status, 0, `cc ${args.join(" ")}: ${r.stderr}`);
    };
    fs.writeFileSync(path.join(tmp, "empty.c"), "int duet_stub;\n");
    for (const so of ["libcuda.so.1", "libnvidia-ml.so.1", "libduetmissing.so.1"])
      cc(["-shared", "-fPIC", "-o", path.join(stubs, so), `-Wl,-soname,${so}`, path.join(tmp, "empty.c")]);
    // modules linked against the stubs, which then go away (as in a build stage)
    cc(["-shared", "-fPIC", "-o", path.join(mods, "libmod_cuda.so.0"), path.join(tmp, "empty.c"), "-Wl,--no-as-needed",
      `-L${stubs}`, "-l:libcuda.so.1", "-l:libnvidia-ml.so.1"]);
    cc(["-shared", "-fPIC", "-o", path.join(mods, "libmod_other.so.0"), path.join(tmp, "empty.c"), "-Wl,--no-as-needed",
      `-L${stubs}`, "-l:libduetmissing.so.1"]);
    fs.rmSync(stubs, { recursive: true });

    const r = runScript(["--bundled", path.join(tmp, "bundle"), prefill]);
    assert.notEqual(r.status, 0, r.stdout);
    assert.match(r.stderr, /libmod_other\.so\.0: libduetmissing\.so\.1 not found/);
    assert.match(r.stderr, /libmod_cuda\.so\.0: libcuda\.so\.1: the NVIDIA driver's, mounted by the container runtime/);
    assert.doesNotMatch(r.stderr, /libcuda\.so\.1 not found|libnvidia-ml\.so\.1 not found/);

    fs.rmSync(path.join(mods, "libmod_other.so.0"));
    const ok = runScript(["--bundled", path.join(tmp, "bundle"), prefill]);
    assert.equal(ok.status, 0, ok.stderr);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});
