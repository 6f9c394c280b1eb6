// The images the manifests may use: every deploy/docker/*.Dockerfile,
// statically checked, keyed by its org.opencontainers.image.title.
// texts: repository files to read from this map instead (rel -> text).
import fs from "node:fs";
import path from "node:path";
import { checkDockerfile } from "./dockerfile.mjs";

export function dockerfiles(repo) {
  const dir = path.join(repo, "deploy", "docker");
  return fs.readdirSync(dir).filter((f) => f.endsWith(".Dockerfile")).sort().map((f) => `deploy/docker/${f}`);
}

export function imageInfos(repo, texts = new Map()) {
  const images = new Map();
  const errors = [];
  for (const rel of dockerfiles(repo)) {
    const info = checkDockerfile(repo, rel, texts.get(rel) ?? null, texts);
    errors.push(...info.errors);
    if (info.title) {
      if (images.has(info.title)) errors.push(`${rel}: image title ${info.title} is used twice`);
      images.set(info.title, info);
    }
  }
  return { images, errors };
}
