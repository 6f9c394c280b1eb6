// Offline schema validation of rendered Kubernetes objects with the JSON
// schemas compiled into kubernetes-models@5.1.0 (Kubernetes 1.34 APIs,
// resource.k8s.io/v1 included; ajv standalone code from
// @kubernetes-models/validate@5.0.2).
//
// Those schemas do not reject unknown fields (no additionalProperties), so
// a typo such as `imagePullPolcy` passes them.  The unknown-field check
// reuses the same compiled schemas: it validates a Proxy of the object
// and records, per object node, which property names the schema code
// looked up.  A schema reads every property it declares (`data.x ===
// undefined || validate(data.x)`), and iterates (for...in) only maps
// (additionalProperties: labels, annotations, resources.limits, ConfigMap
// data).  So a key the schema never looked up, in a node it did not
// iterate, is not in the schema: an unknown field.
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
// The schema modules are ES modules, loaded synchronously by path with
// require() (Node >= 20.19 or 22.12: tests/deploy/lib/deps.mjs checks).
const schemaDir = path.join(path.dirname(fileURLToPath(import.meta.resolve("kubernetes-models"))), "_schemas");

function schemaModuleName(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const g = group === "" ? "Core" : group.split(".")[0];
  const cap = (s) => s.charAt(0).toUpperCase() + s.slice(1);
  return `IoK8sApi${cap(g)}${cap(version)}${kind}`;
}

export function schemaFor(apiVersion, kind) {
  const name = schemaModuleName(apiVersion, kind);
  try {
    return require(path.join(schemaDir, `${name}.js`)).validate;
  } catch {
    return null;
  }
}

// Wrap obj so every node records its looked-up keys and whether it was
// iterated.  Returns [proxy, nodes] where nodes maps path -> record.
function track(obj, path, nodes) {
  if (obj === null || typeof obj !== "object") return obj;
  const rec = { path, target: obj, read: new Set(), iterated: false };
  nodes.push(rec);
  const children = new Map();
  return new Proxy(obj, {
    get(t, key, recv) {
      if (typeof key === "string") rec.read.add(key);
      const v = Reflect.get(t, key, recv);
      if (typeof key !== "string" || v === null || typeof v !== "object") return v;
      if (!children.has(key)) {
        const sub = Array.isArray(t) ? `${path}[${key}]` : path ? `${path}.${key}` : key;
        children.set(key, track(v, sub, nodes));
      }
      return children.get(key);
    },
    has(t, key) {
      if (typeof key === "string") rec.read.add(key);
      return Reflect.has(t, key);
    },
    ownKeys(t) {
      rec.iterated = true;
      return Reflect.ownKeys(t);
    },
  });
}

function formatAjvError(e) {
  const where = e.instancePath ? e.instancePath.replace(/^\//, "").replace(/\//g, ".") : "(object)";
  let what = e.message || e.keyword;
  if (e.keyword === "required") what = `required field ${e.params.missingProperty} is missing`;
  else if (e.keyword === "type") what = `must be ${e.params.type}`;
  else if (e.keyword === "enum") what = `must be one of ${e.params.allowedValues.join(", ")}`;
  else if (e.keyword === "format") what = `must be format ${e.params.format}`;
  return `${where}: ${what}`;
}

// Every problem with obj against its schema, as strings ("spec.replicas:
// must be integer", "spec.template.spec.containers[0].imagePullPolcy:
// unknown field").  Fails closed for kinds without a schema.
export function validateObject(obj) {
  if (!obj || typeof obj !== "object" || !obj.apiVersion || !obj.kind)
    return ["(object): not a Kubernetes object (apiVersion and kind are required)"];
  const validate = schemaFor(obj.apiVersion, obj.kind);
  if (!validate) return [`(object): no schema for ${obj.apiVersion} ${obj.kind}`];
  const nodes = [];
  const proxy = track(obj, "", nodes);
  const ok = validate(proxy);
  const errors = ok ? [] : (validate.errors || []).map(formatAjvError);
  for (const rec of nodes) {
    if (rec.iterated || Array.isArray(rec.target)) continue;
    for (const key of Object.keys(rec.target)) {
      if (!rec.read.has(key)) errors.push(`${rec.path ? rec.path + "." : ""}${key}: unknown field`);
    }
  }
  return errors;
}
