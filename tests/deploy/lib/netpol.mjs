// NetworkPolicies of the daemon pods: only the router (and decode, which
// calls Prefill.Bootstrap/Prefill/Abort) reaches a daemon's gRPC port, and
// only the other role's daemons reach its UCX port range.  A pod that runs
// a prefill and a decode daemon (lib/pair.mjs) is a source of either role.
import { id, podTemplate, selects } from "./k8s.mjs";

const GRPC_FROM = { prefill: ["router", "decode"], decode: ["router"] };
const OTHER = { prefill: "decode", decode: "prefill" };

// The port a NetworkPolicy names in a pod: a number, or a container port
// name that exactly one port number of the pod's containers has.
function podPort(t, p) {
  if (typeof p === "number" || /^\d+$/.test(String(p))) return Number(p);
  const hits = new Set(
    t.spec.containers.flatMap((c) => (c.ports || []).filter((x) => x.name === p).map((x) => x.containerPort)),
  );
  return hits.size === 1 ? [...hits][0] : null;
}

// pods: [{ w, ns, labels, roles: Set, daemons: [{ role, port, range }] }]
export function checkNetworkPolicy(objects, pods, E) {
  const pols = objects.filter((o) => o.kind === "NetworkPolicy");
  for (const pod of pods) {
    const ds = pod.daemons.filter((d) => d.port !== undefined && d.range);
    if (ds.length === 0) continue;
    const { w } = pod;
    const t = podTemplate(w);
    const mine = pols.filter(
      (p) => p.metadata.namespace === pod.ns && selects(p.spec.podSelector, pod.labels) &&
        (p.spec.policyTypes || ["Ingress"]).includes("Ingress"),
    );
    if (mine.length === 0) {
      E(w, "no NetworkPolicy selects its pods: every pod can reach its gRPC and UCX ports");
      continue;
    }
    const grpcReach = new Map(ds.map((d) => [d, new Set()]));
    const ucxReach = new Map(ds.map((d) => [d, []]));
    for (const p of mine) {
      for (const [i, rule] of (p.spec.ingress || []).entries()) {
        const where = `${id(p)} ingress[${i}]`;
        if (!rule.from || rule.from.length === 0) {
          E(w, `${where} allows every source`);
          continue;
        }
        if (!rule.ports || rule.ports.length === 0) {
          E(w, `${where} allows every port`);
          continue;
        }
        const sources = [];
        for (const peer of rule.from) {
          if (peer.ipBlock || peer.namespaceSelector) {
            E(w, `${where} allows sources outside the duet pods (ipBlock/namespaceSelector)`);
            continue;
          }
          const hit = pods.filter((x) => x.ns === pod.ns && selects(peer.podSelector, x.labels));
          if (hit.length === 0) E(w, `${where} has a peer that selects no duet pod`);
          sources.push(...hit);
        }
        for (const port of rule.ports) {
          const lo = podPort(t, port.port);
          const hi = port.endPort ?? lo;
          if (lo === null) {
            E(w, `${where} names port ${port.port}, which no container of its pods has (or two have)`);
            continue;
          }
          const grpcOf = ds.find((d) => lo === d.port && hi === d.port);
          const ucxOf = ds.filter((d) => lo >= d.range[0] && hi <= d.range[1]);
          if (grpcOf) {
            const allowed = GRPC_FROM[grpcOf.role];
            for (const src of sources) {
              const ok = [...src.roles].filter((r) => allowed.includes(r));
              if (ok.length === 0) E(w, `${where} lets ${[...src.roles].join("+")} pods reach the gRPC port ${grpcOf.port}`);
              for (const r of ok) grpcReach.get(grpcOf).add(r);
            }
          } else if (ucxOf.length) {
            for (const src of sources) {
              const ok = ucxOf.filter((d) => src.roles.has(OTHER[d.role]));
              if (ok.length === 0) E(w, `${where} lets ${[...src.roles].join("+")} pods reach the UCX transfer ports`);
              for (const d of ok) ucxReach.get(d).push([lo, hi]);
            }
          } else {
            const known = ds.map((d) => `gRPC ${d.port}, UCX_TCP_PORT_RANGE ${d.range.join("-")}`).join("; ");
            E(w, `${where} opens ${lo}${hi !== lo ? "-" + hi : ""}, none of its daemons' ports (${known})`);
          }
        }
      }
    }
    for (const d of ds) {
      for (const r of GRPC_FROM[d.role])
        if (!grpcReach.get(d).has(r)) E(w, `no NetworkPolicy lets ${r} pods reach the gRPC port ${d.port}`);
      // the allowed ranges must cover the whole UCX range
      let next = d.range[0];
      for (const [lo, hi] of ucxReach.get(d).sort((x, y) => x[0] - y[0])) if (lo <= next) next = Math.max(next, hi + 1);
      if (next <= d.range[1])
        E(w, `no NetworkPolicy lets ${OTHER[d.role]} pods reach UCX ports ${next}-${d.range[1]} (UCX_TCP_PORT_RANGE ${d.range.join("-")})`);
    }
  }
}
