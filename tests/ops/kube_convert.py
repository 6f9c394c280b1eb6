"""The test-side conversion of rendered Kubernetes manifests for
`podman kube play` (podman 4.3), used by test_kube_play.py and documented
in docs/deploy.md ("Played for real").  Only what podman lacks is changed:

* StatefulSet -> one Pod per replica from its pod template, named
  <statefulset>-<ordinal> (hostname too), as the StatefulSet controller
  names them;
* Service -> hostAliases in every pod: every name of the Service (<svc>,
  <svc>.<ns>.svc, <svc>.<ns>.svc.cluster.local) maps to the addresses of
  the pods its selector matches (a headless Service's DNS answer), so the
  config's `discover` names resolve unchanged in the router and in the
  daemons (decode checks a prefill target against them); the pods get
  static addresses on the test's network (kube play --ip) to make that
  possible;
* Secret volumes -> read-only hostPath volumes holding the same files
  (ca.crt, tls.crt, tls.key; secret), 0440 and group 10001 as defaultMode
  and fsGroup make them: podman 4.3 writes a Secret's `data` into the
  volume still base64-encoded, ignores `stringData`, and crashes on a
  secret volume without `optional` (containers/podman#16636);
* containers' `ports` lists dropped: podman 4.3 publishes every
  containerPort on the host (0.0.0.0:<port>), so the two router replicas
  (and anything else on the host) would collide; in Kubernetes the list is
  informational;
* nothing else: the test's client reaches the router pods at their
  addresses on the podman network (as the router Service would), checking
  the certificate's name duet.duet.svc;
* dropped, as podman has no such kinds: Namespace, Service (above),
  PodDisruptionBudget, NetworkPolicy (their enforcement is not checked).
"""
import copy

DROPPED = ("Namespace", "Service", "PodDisruptionBudget", "NetworkPolicy")


def _unpublish(spec):
    for c in spec.get("containers") or []:
        c.pop("ports", None)


def _secret_to_hostpath(spec, secret_dirs):
    for v in spec.get("volumes") or []:
        sec = v.get("secret")
        if sec is not None:
            name = sec["secretName"]
            if name not in secret_dirs:
                raise KeyError("no files for Secret %s" % name)
            del v["secret"]
            v["hostPath"] = {"path": secret_dirs[name], "type": "Directory"}


def _pods_of_statefulset(sts, secret_dirs):
    pods = []
    for i in range(sts["spec"].get("replicas", 1)):
        t = copy.deepcopy(sts["spec"]["template"])
        name = "%s-%d" % (sts["metadata"]["name"], i)
        meta = dict(t.get("metadata") or {})
        meta["name"] = name
        meta["labels"] = dict(meta.get("labels") or {},
                              **{"statefulset.kubernetes.io/pod-name": name})
        spec = t["spec"]
        spec["hostname"] = name
        spec["subdomain"] = sts["spec"].get("serviceName", sts["metadata"]["name"])
        _secret_to_hostpath(spec, secret_dirs)
        _unpublish(spec)
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
    return pods


def split(objs):
    """Rendered objects -> (configmaps, statefulsets, deployments, services, dropped kinds)."""
    out = {"ConfigMap": [], "StatefulSet": [], "Deployment": [], "Service": []}
    dropped = []
    for o in objs:
        k = o.get("kind")
        if k in out:
            out[k].append(o)
        if k in DROPPED:
            dropped.append("%s/%s" % (k, o["metadata"]["name"]))
        elif k not in out:
            raise ValueError("kind %s: no conversion for podman kube play" % k)
    return out, dropped


def _selects(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def host_aliases(parts, pod_ips):
    """pod_ips: {pod name: (labels, ip)} -> hostAliases for the Services."""
    aliases = {}
    for svc in parts["Service"]:
        ns = svc["metadata"].get("namespace", "default")
        n = svc["metadata"]["name"]
        for pod, (labels, ip) in sorted(pod_ips.items()):
            if _selects(svc["spec"].get("selector"), labels):
                names = aliases.setdefault(ip, [])
                names += [n, "%s.%s.svc" % (n, ns), "%s.%s.svc.cluster.local" % (n, ns)]
    return [{"ip": ip, "hostnames": names} for ip, names in sorted(aliases.items())]


def convert(parts, secret_dirs, addresses):
    """-> (daemon docs, daemon pod IPs in play order, router docs, router
    pod IPs).  addresses: an iterator of free addresses on the network."""
    pods, pod_ips = [], {}
    for sts in parts["StatefulSet"]:
        for p in _pods_of_statefulset(sts, secret_dirs):
            pods.append(p)
            pod_ips[p["metadata"]["name"]] = (p["metadata"]["labels"], next(addresses))
    routers, rips = [], []
    for dep in parts["Deployment"]:
        d = copy.deepcopy(dep)
        spec = d["spec"]["template"]["spec"]
        _secret_to_hostpath(spec, secret_dirs)
        _unpublish(spec)
        labels = d["spec"]["template"]["metadata"].get("labels") or {}
        for i in range(d["spec"].get("replicas", 1)):
            ip = next(addresses)
            pod_ips["%s-pod-%d" % (d["metadata"]["name"], i)] = (labels, ip)
            rips.append(ip)
        routers.append(d)
    aliases = host_aliases(parts, pod_ips)
    for p in pods:
        p["spec"]["hostAliases"] = aliases
    for d in routers:
        d["spec"]["template"]["spec"]["hostAliases"] = aliases
    dips = [pod_ips[p["metadata"]["name"]][1] for p in pods]
    return list(parts["ConfigMap"]) + pods, dips, list(parts["ConfigMap"]) + routers, rips
