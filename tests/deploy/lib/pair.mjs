// A pod that runs a prefill and a decode daemon (the same-node layout,
// deploy/k8s/overlays/p1d2-same-node): KV moves between their GPUs with
// UCX's cuda_ipc, which maps the other process's GPU memory, so both
// containers must see every GPU of the pod.  Device-plugin GPUs
// (nvidia.com/gpu) are one container's; a Dynamic Resource Allocation claim
// that both containers name is the pod's.  Its GPU count is the two TPs'
// sum, and the config's `devices` give each daemon its own GPUs of it.
// The two daemons also share one network namespace: their gRPC ports
// differ and their UCX TCP listeners fit the port range together.
import { podTemplate, UCX_TCP_DEVICES } from "./k8s.mjs";

// The CUDA device of each rank: the --devices flag (JSON), the config
// entry's devices, else 0..tp-1 (the daemons' default).
export function daemonDevices(entry, args, tp) {
  let devs = entry?.devices;
  if (args.has("--devices")) {
    try {
      devs = JSON.parse(args.get("--devices"));
    } catch {
      devs = undefined;
    }
  }
  return Array.isArray(devs) && devs.length ? devs.map(Number) : [...Array(tp).keys()];
}

// pod: { w, ns, daemons: [prefill, decode] } after checkDaemon filled in
// tp, backend, devices, port, range and listeners.
export function checkPair(objects, pod, E) {
  const { w } = pod;
  const ds = pod.daemons;
  if (ds.some((d) => d.tp === undefined)) return; // --check-config failed: reported
  const [p, q] = ds;
  if (p.port === q.port) E(w, `prefill and decode both listen on port ${p.port} of the pod`);
  for (const d of ds)
    for (const o of ds)
      if (d !== o && o.range && d.port >= o.range[0] && d.port <= o.range[1])
        E(w, `the ${o.role} container's UCX_TCP_PORT_RANGE ${o.range.join("-")} contains the ${d.role} gRPC port ${d.port}`);
  if (p.range && q.range && p.range[0] <= q.range[1] && q.range[0] <= p.range[1]) {
    const lo = Math.min(p.range[0], q.range[0]);
    const hi = Math.max(p.range[1], q.range[1]);
    const need = p.listeners + q.listeners;
    if (hi - lo + 1 < 2 * need)
      E(w, `UCX_TCP_PORT_RANGE ${lo}-${hi} has ${hi - lo + 1} ports for the ${need} listeners of the pod's two daemons (tp ${p.tp} + ${q.tp} x ${UCX_TCP_DEVICES} devices, x2 headroom)`);
  }
  if (!ds.every((d) => d.backend === "cuda")) return;

  const t = podTemplate(w);
  const claimsOf = (d) => d.c.resources?.claims || [];
  for (const d of ds) {
    if (claimsOf(d).length === 0) E(w, `container ${d.c.name} names no resourceClaim: it sees no GPU`);
    for (const cl of claimsOf(d))
      if (cl.request)
        E(w, `container ${d.c.name} takes only request ${cl.request} of claim ${cl.name}: it would not see the other daemon's GPUs, which cuda_ipc maps`);
  }
  const shared = claimsOf(p).map((x) => x.name).filter((n) => claimsOf(q).some((x) => x.name === n));
  if (shared.length === 0) {
    E(w, "its prefill and decode containers name no common resourceClaim: each would see only its own GPUs, and cuda_ipc could not map the other's memory");
    return;
  }
  let count = 0;
  for (const n of shared) {
    const pc = (t.spec.resourceClaims || []).find((x) => x.name === n);
    if (!pc) {
      E(w, `its containers name resourceClaim ${n}, which the pod does not declare`);
      return;
    }
    if (!pc.resourceClaimTemplateName) {
      E(w, `resourceClaim ${n}: ${pc.resourceClaimName ? `resourceClaimName ${pc.resourceClaimName} is one claim for every replica` : "no template"}; use resourceClaimTemplateName (a claim per pod)`);
      return;
    }
    const tmpl = objects.find(
      (o) => o.kind === "ResourceClaimTemplate" && o.metadata.name === pc.resourceClaimTemplateName && o.metadata.namespace === pod.ns,
    );
    if (!tmpl) {
      E(w, `resourceClaim ${n}: ResourceClaimTemplate ${pc.resourceClaimTemplateName} is not in the manifests`);
      return;
    }
    for (const r of tmpl.spec?.spec?.devices?.requests || []) {
      if (!r.exactly) {
        E(w, `ResourceClaimTemplate ${tmpl.metadata.name} request ${r.name} has no exactly: the pod's GPU count is not fixed`);
        return;
      }
      if (r.exactly.allocationMode === "All") {
        E(w, `ResourceClaimTemplate ${tmpl.metadata.name} request ${r.name}: allocationMode All gives the pod every GPU of its node`);
        return;
      }
      count += r.exactly.count ?? 1;
    }
  }
  if (count !== p.tp + q.tp)
    E(w, `its claim gives the pod ${count} GPUs but its daemons have tp ${p.tp} + ${q.tp} = ${p.tp + q.tp} (one GPU per rank)`);
  for (const d of ds) {
    const out = d.devices.filter((x) => !(x >= 0 && x < count));
    if (out.length) E(w, `${d.role} devices [${d.devices}]: the pod has ${count} GPUs, ${out.join(", ")} is none of them`);
  }
  const both = p.devices.filter((x) => q.devices.includes(x));
  if (both.length)
    E(w, `prefill devices [${p.devices}] and decode devices [${q.devices}] share GPU ${both.join(", ")}: one GPU per rank (set each entry's devices)`);
}
