// Small helpers over rendered Kubernetes objects: quantities, label
// selectors, ports, pod templates.

export function parseQuantity(q) {
  if (typeof q === "number") return q;
  const m = /^([0-9.]+)([a-zA-Z]*)$/.exec(String(q));
  if (!m) return NaN;
  const mult = {
    "": 1, m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12,
    Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4,
  }[m[2]];
  return mult === undefined ? NaN : Number(m[1]) * mult;
}

// Does a LabelSelector (matchLabels + matchExpressions) select labels?
// An empty selector selects everything.
export function selects(selector, labels) {
  labels = labels || {};
  if (!selector) return false;
  for (const [k, v] of Object.entries(selector.matchLabels || {})) if (labels[k] !== v) return false;
  for (const e of selector.matchExpressions || []) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    const vals = e.values || [];
    if (e.operator === "In" && !(has && vals.includes(labels[e.key]))) return false;
    if (e.operator === "NotIn" && has && vals.includes(labels[e.key])) return false;
    if (e.operator === "Exists" && !has) return false;
    if (e.operator === "DoesNotExist" && has) return false;
  }
  return true;
}

// A Service's plain map selector.
export function mapSelects(sel, labels) {
  if (!sel || Object.keys(sel).length === 0) return false;
  return Object.entries(sel).every(([k, v]) => (labels || {})[k] === v);
}

export function hostPort(s) {
  const m = /^(\[[^\]]*\]|[^:]*):(\d+)$/.exec(s || "");
  return m ? { host: m[1], port: Number(m[2]) } : null;
}

// A container port given by number or name.
export function resolvePort(container, p) {
  if (typeof p === "number") return p;
  if (/^\d+$/.test(String(p))) return Number(p);
  const cp = (container.ports || []).find((x) => x.name === p);
  return cp ? cp.containerPort : null;
}

// UCX's TCP listeners per rank in a pod: one per network device (lo, eth0)
export const UCX_TCP_DEVICES = 2;

export const id = (o) => `${o.kind}/${o.metadata?.name}`;

export function podTemplate(w) {
  return w.spec?.template;
}

// "--key value" pairs and lone flags of a daemon's args.
export function parseArgs(args, lone = ["--check-config"]) {
  const out = new Map();
  for (let i = 0; i < args.length; i++) {
    const a = String(args[i]);
    if (lone.includes(a)) out.set(a, true);
    else if (a.startsWith("--")) {
      out.set(a, String(args[i + 1]));
      i++;
    }
  }
  return out;
}
