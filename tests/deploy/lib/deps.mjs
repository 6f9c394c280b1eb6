// Are the pinned validators installed, and can this Node load them?  The
// schema modules of kubernetes-models 5 are ES modules that lib/schema.mjs
// loads with require() (Node >= 20.19, or >= 22.12).  A node_modules left
// from an older package-lock.json is reported, not used: npm ci refreshes it.
import fs from "node:fs";
import path from "node:path";

export function depsProblem(dir) {
  const [major, minor] = process.versions.node.split(".").map(Number);
  if (!(major > 22 || (major === 22 && minor >= 12) || (major === 20 && minor >= 19)))
    return `node ${process.versions.node} cannot require() ES modules: tests/deploy needs Node >= 20.19 (or >= 22.12)`;
  if (!fs.existsSync(path.join(dir, "node_modules", ".package-lock.json")))
    return `${dir}/node_modules is missing: run npm ci there (scripts/install-deps.sh does)`;
  const want = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).dependencies;
  const stale = [];
  for (const [name, version] of Object.entries(want)) {
    const f = path.join(dir, "node_modules", name, "package.json");
    const have = fs.existsSync(f) ? JSON.parse(fs.readFileSync(f, "utf8")).version : "none";
    if (have !== version) stale.push(`${name} ${have} (package.json pins ${version})`);
  }
  if (stale.length) return `${dir}/node_modules is stale: ${stale.join(", ")}: run npm ci there`;
  return null;
}
