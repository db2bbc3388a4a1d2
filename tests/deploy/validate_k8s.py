#!/usr/bin/python3
"""Offline checks of the Kubernetes manifests (deploy/k8s).

Renders the kustomize base with `kubectl kustomize` and checks what a cluster
would only show at run time: the objects, that every flag handed to a binary
(in args or in the ConfigMap's flag files) is one of that binary's flags,
that the coordinator's run config file (--config, in the ConfigMap) is one
`shoal-coordinator --check_config` accepts with its flags, that ports,
probes and Services agree with the --listen addresses (and the
metrics ports with --metrics_listen and the prometheus.io annotations), and that
workers advertise their headless-Service DNS names and find the coordinator
and the checkpoint store at their Services.

Coordinator replicas (docs/REPLICAS.md): an etcd StatefulSet of 3 members
(flags from `etcd --help`, peer and client URLs by pod DNS name through its
headless Service, an --initial-cluster naming every member, data on a
volumeClaimTemplate), a coordinator Deployment of 2 replicas whose --etcd
names every member, that advertise their pod IP, whose readiness asks for the
health of shoal.v1.Coordinator (the leader only) and whose liveness and
startup probes ask for the overall health (a standby is alive), with a
rollout strategy that can end although only one pod is ever Ready.

  /usr/bin/python3 tests/deploy/validate_k8s.py --repo=. --bin_dir=build/bin
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_check as dc  # noqa: E402

try:
    import yaml
except ImportError:  # pragma: no cover
    dc.die("python3-yaml is missing: apt-get install python3-yaml (scripts/install-deps.sh)")


def render(kubectl, k8s_dir):
    proc = subprocess.run([kubectl, "kustomize", k8s_dir], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120, check=False)
    if proc.returncode != 0:
        dc.die(f"`{kubectl} kustomize {k8s_dir}` failed:\n{proc.stderr.decode()}")
    return proc.stdout.decode()


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


class Workload:
    def __init__(self, obj):
        self.obj = obj
        self.kind = obj["kind"]
        self.name = obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        self.spec = spec
        self.template = spec.get("template") or {}
        self.pod = self.template.get("spec") or {}
        self.labels = (self.template.get("metadata") or {}).get("labels") or {}
        self.containers = self.pod.get("containers") or []

    def __str__(self):
        return f"{self.kind}/{self.name}"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, help="repository root")
    ap.add_argument("--bin_dir", required=True, help="directory with the built binaries")
    ap.add_argument("--kubectl", default=os.environ.get("KUBECTL", ""),
                    help="kubectl to render with (default: $KUBECTL, then PATH)")
    args = ap.parse_args()

    kubectl = args.kubectl or shutil.which("kubectl")
    if not kubectl:
        dc.die("kubectl not found: `kubectl kustomize` renders deploy/k8s. Install Debian's "
               "kubernetes-client (scripts/install-deps.sh installs it), or set KUBECTL.")
    c = dc.Checker("K8sManifests")
    k8s_dir = os.path.join(args.repo, "deploy", "k8s")
    text = render(kubectl, k8s_dir)

    # ---- every object parses and is a Kubernetes object ----
    objs = []
    try:
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                objs.append(doc)
    except yaml.YAMLError as e:
        dc.die(f"the rendered manifests do not parse: {e}")
    for o in objs:
        c.ok(isinstance(o, dict) and o.get("apiVersion") and o.get("kind")
             and (o.get("metadata") or {}).get("name"),
             f"object without apiVersion/kind/metadata.name: {str(o)[:200]}")
    objs = [o for o in objs if isinstance(o, dict) and o.get("kind")]
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    print(f"rendered {len(objs)} objects: "
          + ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in objs))

    configmaps = {o["metadata"]["name"]: o for o in by_kind.get("ConfigMap", [])}
    services = by_kind.get("Service", [])
    workloads = [Workload(o) for o in by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])]

    # ---- which workload runs which binary ----
    role = {}  # binary -> (workload, container)
    etcd_ws = []  # (workload, container) running etcd
    for w in workloads:
        c.ok(len(w.containers) == 1, f"{w}: expected one container, has {len(w.containers)}")
        for ct in w.containers:
            cmd = ct.get("command") or []
            binary = os.path.basename(cmd[0]) if cmd else ""
            if binary == "etcd" and len(cmd) == 1:
                etcd_ws.append((w, ct))
                continue
            # The binary itself is PID 1: SIGTERM reaches it (the worker's Leave path).
            if not c.ok(binary in dc.SERVERS and len(cmd) == 1,
                        f"{w}: command must be exactly one of {dc.SERVERS} (PID 1, gets SIGTERM), "
                        f"is {cmd}"):
                continue
            c.ok(binary not in role, f"{w}: a second workload runs {binary}")
            role[binary] = (w, ct)

    for binary in dc.SERVERS:
        c.ok(binary in role, f"no workload runs {binary}")
    if not all(b in role for b in dc.SERVERS):
        return c.finish()

    coord_w, coord_c = role["shoal-coordinator"]
    ckpt_w, ckpt_c = role["shoal-checkpoint"]
    work_w, work_c = role["shoal-worker"]
    c.ok(coord_w.kind == "Deployment", f"the coordinator must be a Deployment, is {coord_w.kind}")
    coord_replicas = coord_w.spec.get("replicas", 1)
    c.ok(coord_replicas == 2,
         f"{coord_w}: replicas must be 2 (a leader and a standby on etcd), is {coord_replicas}")
    # Only the leader is ever Ready: a RollingUpdate must be allowed to take
    # every old pod down, or the rollout waits forever for a second Ready pod.
    strategy = coord_w.spec.get("strategy") or {}
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        mu = (strategy.get("rollingUpdate") or {}).get("maxUnavailable", "25%")
        can_end = (mu == "100%" if isinstance(mu, str) else mu >= coord_replicas)
        c.ok(can_end, f"{coord_w}: rollingUpdate.maxUnavailable {mu}: with the leader the only "
                      f"Ready pod a rollout would never end; use 100% (or Recreate)")
    c.ok(len(etcd_ws) == 1, f"expected one etcd workload, found {[str(w) for w, _ in etcd_ws]}")
    c.ok(ckpt_w.kind == "StatefulSet", f"the checkpoint store must be a StatefulSet, is {ckpt_w.kind}")
    c.ok(work_w.kind == "StatefulSet", f"the workers must be a StatefulSet, is {work_w.kind}")
    c.ok(ckpt_w.spec.get("volumeClaimTemplates"), f"{ckpt_w}: no volumeClaimTemplates")
    c.ok(ckpt_w.spec.get("replicas", 1) == 1, f"{ckpt_w}: one store per data directory: replicas 1")
    c.ok(configmaps, "no ConfigMap")
    c.ok(any((s.get("spec") or {}).get("clusterIP") == "None" for s in services),
         "no headless Service (clusterIP: None)")

    images = {ct.get("image") for w in workloads for ct in w.containers}
    c.ok(len(images) == 1, f"every container should run the one Shoal image, found {images}")

    # ---- per container: flags, ports, probes, resources, volumes ----
    listen = {}  # binary -> port
    values = {}  # binary -> {flag: value} ($(VAR) unexpanded)
    run_config = None  # the coordinator's effective run config (docs/CONFIG.md)
    for binary, (w, ct) in role.items():
        where = f"{w} container {ct.get('name')}"
        known = dc.binary_flags(args.bin_dir, binary)
        env = {e["name"]: e for e in ct.get("env") or []}
        mounts = ct.get("volumeMounts") or []
        volumes = {v["name"]: v for v in w.pod.get("volumes") or []}
        vct = {t["metadata"]["name"] for t in w.spec.get("volumeClaimTemplates") or []}

        def mount_of(path):
            best = None
            for m in mounts:
                mp = m["mountPath"].rstrip("/")
                if path == mp or path.startswith(mp + "/"):
                    if best is None or len(mp) > len(best["mountPath"].rstrip("/")):
                        best = m
            return best

        def flagfile_text(path):
            m = mount_of(path)
            if m is None:
                return None, f"no volume is mounted at {path}"
            vol = volumes.get(m["name"])
            if vol is None or "configMap" not in vol:
                return None, f"{path} is not in a ConfigMap volume"
            cm = configmaps.get(vol["configMap"]["name"])
            if cm is None:
                return None, f"ConfigMap {vol['configMap']['name']} is not in the manifests"
            rel = os.path.relpath(path, m["mountPath"])
            key = rel
            for item in vol["configMap"].get("items") or []:
                if item["path"] == rel:
                    key = item["key"]
            data = (cm.get("data") or {}).get(key)
            if data is None:
                return None, f"ConfigMap {cm['metadata']['name']} has no key {key}"
            return data, None

        # absl reads a --flagfile where it stands; later flags override.
        flags = []
        for name, value in dc.flag_tokens(ct.get("args") or []):
            if name is None:
                c.fail(f"{where}: argument '{value}' is not a --flag")
                continue
            if name == "flagfile":
                for path in (value or "").split(","):
                    data, err = flagfile_text(path)
                    if not c.ok(err is None, f"{where}: --flagfile={path}: {err}"):
                        continue
                    tokens, trailing = dc.flagfile_tokens(data)
                    c.ok(not trailing, f"{where}: {path} lines {trailing} end in white space "
                                       f"(absl keeps it in the value)")
                    for fname, fvalue in dc.flag_tokens(tokens):
                        if fname is None:
                            c.fail(f"{where}: {path}: '{fvalue}' is not a --flag")
                            continue
                        c.ok(fname in known, f"{where}: --{fname} (in {path}) is not a flag of "
                                             f"{binary} (see {binary} --helpfull)")
                        flags.append((fname, fvalue))
                continue
            c.ok(name in known,
                 f"{where}: --{name} is not a flag of {binary} (see {binary} --helpfull)")
            flags.append((name, value))
        vals = dc.last_values(flags)
        values[binary] = vals

        # The coordinator's run config file (--config): in the ConfigMap, and
        # the coordinator accepts it with these flags (--check_config).
        if binary == "shoal-coordinator":
            path = vals.get("config")
            data, err = flagfile_text(path) if path else (None, "no --config (the run config)")
            if c.ok(err is None, f"{where}: --config={path}: {err}"):
                run_config, err = dc.effective_run_config(args.bin_dir, data, vals)
                c.ok(err is None, f"{where}: shoal-coordinator --check_config refuses "
                                  f"--config={path} with its flags: {err}")

        # $(VAR) in args must name env vars of the container (else Kubernetes leaves it as is).
        for a in ct.get("args") or []:
            for var in re.findall(r"\$\((\w+)\)", a):
                c.ok(var in env, f"{where}: {a} uses $({var}), which is not in env")

        # --listen: reachable from other pods, on the declared container port.
        hp = dc.split_hostport(vals.get("listen"))
        ports = [p["containerPort"] for p in ct.get("ports") or []]
        if c.ok(hp is not None, f"{where}: --listen={vals.get('listen')} is not host:port"):
            host, port = hp
            listen[binary] = port
            c.ok(host in ("0.0.0.0", "[::]", "::"),
                 f"{where}: --listen host {host} is not reachable from other pods (use 0.0.0.0)")
            grpc_ports = [p["containerPort"] for p in ct.get("ports") or []
                          if p.get("name") != "metrics"]
            c.ok(grpc_ports == [port],
                 f"{where}: containerPort {grpc_ports} != --listen port {port}")
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = ct.get(kind)
                if probe is None:
                    c.ok(kind == "startupProbe", f"{where}: no {kind}")
                    continue
                handlers = [h for h in ("grpc", "httpGet", "tcpSocket", "exec") if h in probe]
                c.ok(handlers == ["grpc"], f"{where}: {kind} must be a gRPC probe, has {handlers}")
                if "grpc" in probe:
                    c.ok(probe["grpc"].get("port") == port,
                         f"{where}: {kind} probes port {probe['grpc'].get('port')}, the server "
                         f"listens on {port}")
                    asked = probe["grpc"].get("service") or ""
                    if binary == "shoal-coordinator" and kind == "readinessProbe":
                        # Ready = leads: the Service routes to the leader alone.
                        c.ok(asked == dc.COORDINATOR_HEALTH_NAME,
                             f"{where}: readinessProbe asks for service '{asked}'; it must ask "
                             f"for '{dc.COORDINATOR_HEALTH_NAME}' (SERVING on the leader only)")
                    else:
                        # Liveness on the leader's name would restart every standby.
                        c.ok(not asked,
                             f"{where}: {kind} asks for service '{asked}'; it must ask for the "
                             f"overall health (empty service name)")

        # --metrics_listen: served to other pods on the port named "metrics",
        # which the pod's prometheus.io annotations point the scraper at.
        mhp = dc.split_hostport(vals.get("metrics_listen"))
        if c.ok(mhp is not None,
                f"{where}: --metrics_listen={vals.get('metrics_listen')} is not host:port"):
            mhost, mport = mhp
            c.ok(mhost in ("0.0.0.0", "[::]", "::"),
                 f"{where}: --metrics_listen host {mhost} is not reachable from other pods")
            named = {p.get("name"): p["containerPort"] for p in ct.get("ports") or []}
            c.ok(named.get("metrics") == mport,
                 f"{where}: containerPort 'metrics' {named.get('metrics')} != --metrics_listen "
                 f"port {mport}")
            ann = (w.template.get("metadata") or {}).get("annotations") or {}
            c.ok(ann.get("prometheus.io/scrape") == "true",
                 f"{w}: pod annotation prometheus.io/scrape is not \"true\"")
            c.ok(ann.get("prometheus.io/port") == str(mport),
                 f"{w}: pod annotation prometheus.io/port {ann.get('prometheus.io/port')} != "
                 f"--metrics_listen port {mport}")
            c.ok(ann.get("prometheus.io/path") == "/metrics",
                 f"{w}: pod annotation prometheus.io/path is not /metrics")

        res = ct.get("resources") or {}
        for part in ("requests", "limits"):
            for r in ("cpu", "memory"):
                c.ok((res.get(part) or {}).get(r), f"{where}: no resources.{part}.{r}")
        sc_pod = w.pod.get("securityContext") or {}
        sc = ct.get("securityContext") or {}
        c.ok(sc.get("runAsNonRoot", sc_pod.get("runAsNonRoot")) is True,
             f"{where}: runAsNonRoot is not set")
        grace = w.pod.get("terminationGracePeriodSeconds", 30)
        c.ok(grace >= 5, f"{w}: terminationGracePeriodSeconds {grace} < 5 s")

        # Directories the server writes must be volumes (the root file system is read-only).
        for flag in ("state_dir", "data_dir"):
            if flag not in vals or binary == "shoal-worker":
                continue
            m = mount_of(vals[flag])
            if c.ok(m is not None and m["mountPath"].rstrip("/") == vals[flag].rstrip("/"),
                    f"{where}: --{flag}={vals[flag]} is not a mounted volume"):
                if binary == "shoal-checkpoint":
                    c.ok(m["name"] in vct, f"{where}: --data_dir is on volume {m['name']}, not on "
                                           f"a volumeClaimTemplate ({sorted(vct)})")

    # ---- Services: selectors and target ports ----
    def service_for(workload, binary):
        """Services that select `workload` with a port reaching its --listen port."""
        found = []
        ct = role[binary][1]
        named = {p.get("name"): p["containerPort"] for p in ct.get("ports") or []}
        for s in services:
            spec = s.get("spec") or {}
            if not labels_match(spec.get("selector"), workload.labels):
                continue
            for p in spec.get("ports") or []:
                target = p.get("targetPort", p.get("port"))
                target = named.get(target, target)
                if target == listen.get(binary):
                    found.append((s, p["port"]))
        return found

    for s in services:
        spec = s.get("spec") or {}
        c.ok(any(labels_match(spec.get("selector"), w.labels) for w in workloads),
             f"Service/{s['metadata']['name']} selects no workload")

    coord_svcs = service_for(coord_w, "shoal-coordinator")
    ckpt_svcs = service_for(ckpt_w, "shoal-checkpoint")
    work_svcs = service_for(work_w, "shoal-worker")
    c.ok(coord_svcs, "no Service reaches the coordinator's port")
    c.ok(ckpt_svcs, "no Service reaches the checkpoint store's port")

    # The store's governing Service.
    c.ok(any(s["metadata"]["name"] == ckpt_w.spec.get("serviceName") for s, _ in ckpt_svcs),
         f"{ckpt_w}: serviceName {ckpt_w.spec.get('serviceName')} is not a Service selecting it")

    # ---- workers: stable DNS names through the headless Service ----
    svc_name = work_w.spec.get("serviceName")
    headless = [s for s, _ in work_svcs if s["metadata"]["name"] == svc_name]
    if c.ok(headless, f"{work_w}: serviceName {svc_name} is not a Service selecting the workers "
                      f"on their peer port"):
        c.ok((headless[0].get("spec") or {}).get("clusterIP") == "None",
             f"Service/{svc_name} must be headless (clusterIP: None) for per-pod DNS names")
        c.ok((headless[0].get("spec") or {}).get("publishNotReadyAddresses") is True,
             f"Service/{svc_name}: publishNotReadyAddresses should be true (peers resolve a "
             f"worker before it is Ready)")
    wv = values["shoal-worker"]
    env = {e["name"]: e for e in work_c.get("env") or []}
    adv = wv.get("advertise") or ""
    m = re.fullmatch(r"\$\((\w+)\)\.([a-z0-9-]+)\.\$\((\w+)\)\.svc\.cluster\.local:(\d+)", adv)
    if c.ok(m, f"{work_w}: --advertise={adv} is not "
               f"$(POD_NAME).<headless service>.$(POD_NAMESPACE).svc.cluster.local:<port>"):
        def field_of(var):
            return ((env.get(var) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        c.ok(field_of(m.group(1)) == "metadata.name",
             f"{work_w}: $({m.group(1)}) must come from the downward API (metadata.name)")
        c.ok(field_of(m.group(3)) == "metadata.namespace",
             f"{work_w}: $({m.group(3)}) must come from the downward API (metadata.namespace)")
        c.ok(m.group(2) == svc_name,
             f"{work_w}: --advertise names Service {m.group(2)}, serviceName is {svc_name}")
        c.ok(int(m.group(4)) == listen.get("shoal-worker"),
             f"{work_w}: --advertise port {m.group(4)} != --listen port "
             f"{listen.get('shoal-worker')}")

    # ---- workers: the zone from the pod's topology label (docs/SUPERNODES.md) ----
    # A Pod cannot read its node's labels with fieldRef; its own labels it
    # can, and topology.kubernetes.io/zone is put on the pod by the
    # PodTopologyLabels admission plugin (Kubernetes 1.33+), a per-zone
    # StatefulSet or a webhook. A missing label reads as "" (the root zone).
    zone = wv.get("zone")
    if zone is not None:
        zm = re.fullmatch(r"\$\((\w+)\)", zone)
        if zm:
            var = zm.group(1)
            path = ((env.get(var) or {}).get("valueFrom") or {}).get("fieldRef", {}).get(
                "fieldPath")
            c.ok(path in ("metadata.labels['topology.kubernetes.io/zone']",
                          "metadata.labels['topology.kubernetes.io/region']"),
                 f"{work_w}: --zone=$({var}): $({var}) must come from the pod's label "
                 f"topology.kubernetes.io/zone (or /region) through the downward API, is {path}")
        else:
            c.ok(re.fullmatch(r"[a-z0-9._-]{1,63}(/[a-z0-9._-]{1,63}){0,7}", zone)
                 and ".." not in zone.split("/") and "." not in zone.split("/"),
                 f"{work_w}: --zone={zone} is not a zone path (common/zone.h)")

    def names_service(value, svcs, what):
        hp = dc.split_hostport(value)
        if not c.ok(hp is not None, f"{what}={value} is not host:port"):
            return
        host, port = hp
        ok = False
        for s, sport in svcs:
            n = s["metadata"]["name"]
            dns = re.fullmatch(re.escape(n) + r"(\.[a-z0-9-]+|\.\$\(\w+\))?(\.svc(\.cluster\.local)?)?",
                               host)
            if dns and port == sport:
                ok = True
        c.ok(ok, f"{what}={value} is not the name and port of a Service in front of it "
                 f"({[(s['metadata']['name'], p) for s, p in svcs]})")

    names_service(wv.get("coordinator"), coord_svcs, f"{work_w}: --coordinator")
    cv = values["shoal-coordinator"]
    if run_config is not None:
        store = (run_config.get("checkpoints") or {}).get("store")
        if c.ok(store, f"{coord_w}: no checkpoints.store (--checkpoint_store) in its run config"):
            names_service(store, ckpt_svcs, f"{coord_w}: checkpoints.store (--checkpoint_store)")

    # ---- coordinator replicas on etcd ----
    c.ok("state_dir" not in cv, f"{coord_w}: --state_dir and --etcd exclude each other")
    cenv = {e["name"]: e for e in coord_c.get("env") or []}
    adv = cv.get("advertise") or ""
    m = re.fullmatch(r"\$\((\w+)\):(\d+)", adv)
    if c.ok(m, f"{coord_w}: --advertise={adv} should be $(POD_IP):<port> (the leader hint "
               f"standbys give; the --listen address 0.0.0.0 reaches nobody)"):
        field = ((cenv.get(m.group(1)) or {}).get("valueFrom") or {}).get("fieldRef", {})
        c.ok(field.get("fieldPath") == "status.podIP",
             f"{coord_w}: $({m.group(1)}) must come from the downward API (status.podIP)")
        c.ok(int(m.group(2)) == listen.get("shoal-coordinator"),
             f"{coord_w}: --advertise port {m.group(2)} != --listen port "
             f"{listen.get('shoal-coordinator')}")
    if etcd_ws:
        members = check_etcd(etcd_ws[0], services, c)
        if members is not None:
            check_etcd_flag(coord_w, cv.get("etcd"), members, c)
    return c.finish()


def check_etcd(workload, services, c):
    """The etcd StatefulSet. Returns (client port, [(pod name, headless Service)]) or None."""
    w, ct = workload
    where = f"{w} container {ct.get('name')}"
    c.ok(w.kind == "StatefulSet", f"{w}: etcd must be a StatefulSet (stable names, own volumes)")
    replicas = w.spec.get("replicas", 1)
    c.ok(replicas == 3, f"{w}: replicas must be 3 (a quorum that survives one lost member), "
                        f"is {replicas}")
    c.ok(w.spec.get("podManagementPolicy") == "Parallel",
         f"{w}: podManagementPolicy must be Parallel (an ordered start waits for member 0 to be "
         f"Ready, which it cannot be without a quorum)")
    known = dc.etcd_flags()
    env = {e["name"]: e for e in ct.get("env") or []}
    flags = []
    for name, value in dc.flag_tokens(ct.get("args") or []):
        if not c.ok(name is not None, f"{where}: argument '{value}' is not a --flag"):
            continue
        c.ok(name in known, f"{where}: --{name} is not a flag of etcd (see etcd --help)")
        flags.append((name, value))
    vals = dc.last_values(flags)
    for a in ct.get("args") or []:
        for var in re.findall(r"\$\((\w+)\)", a):
            c.ok(var in env, f"{where}: {a} uses $({var}), which is not in env")

    def field_of(var):
        return ((env.get(var) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")

    named = {p.get("name"): p["containerPort"] for p in ct.get("ports") or []}
    client, peer = named.get("client"), named.get("peer")
    if not c.ok(client and peer, f"{where}: needs container ports named client and peer"):
        return None
    for flag, port in (("listen-client-urls", client), ("listen-peer-urls", peer)):
        c.ok(dc.url_hostport(vals.get(flag)) == ("0.0.0.0", port),
             f"{where}: --{flag}={vals.get(flag)}, expected http://0.0.0.0:{port}")

    # The governing Service: headless, published before Ready, both ports.
    svc_name = w.spec.get("serviceName")
    svc = [s for s in services if s["metadata"]["name"] == svc_name]
    if not c.ok(svc, f"{w}: serviceName {svc_name} is not a Service"):
        return None
    spec = svc[0].get("spec") or {}
    c.ok(labels_match(spec.get("selector"), w.labels), f"Service/{svc_name} does not select {w}")
    c.ok(spec.get("clusterIP") == "None",
         f"Service/{svc_name} must be headless (clusterIP: None) for per-member DNS names")
    c.ok(spec.get("publishNotReadyAddresses") is True,
         f"Service/{svc_name}: publishNotReadyAddresses must be true (the members find each "
         f"other before any is Ready)")
    targets = {named.get(p.get("targetPort"), p.get("targetPort", p.get("port")))
               for p in spec.get("ports") or []}
    c.ok({client, peer} <= targets, f"Service/{svc_name} does not reach ports {client} and {peer}")

    # Each member's name and URLs come from its pod's name, through the headless Service.
    name_var = re.fullmatch(r"\$\((\w+)\)", vals.get("name") or "")
    if not c.ok(name_var and field_of(name_var.group(1)) == "metadata.name",
                f"{where}: --name={vals.get('name')} must be $(POD_NAME) from the downward API"):
        return None
    pod_var = name_var.group(1)
    url_re = (r"http://\$\(" + pod_var + r"\)\." + re.escape(svc_name)
              + r"(\.\$\((\w+)\)\.svc\.cluster\.local|\.\$\((\w+)\)\.svc|\.\$\((\w+)\))?:(\d+)")
    templates = {}
    for flag, port in (("advertise-client-urls", client), ("initial-advertise-peer-urls", peer)):
        value = vals.get(flag) or ""
        m = re.fullmatch(url_re, value)
        if c.ok(m, f"{where}: --{flag}={value} is not http://$({pod_var}).{svc_name}"
                   f"[.$(POD_NAMESPACE).svc.cluster.local]:{port}"):
            ns_var = m.group(2) or m.group(3) or m.group(4)
            if ns_var:
                c.ok(field_of(ns_var) == "metadata.namespace",
                     f"{where}: $({ns_var}) must come from the downward API (metadata.namespace)")
            c.ok(int(m.group(5)) == port, f"{where}: --{flag} port {m.group(5)} != {port}")
            templates[flag] = value
    members = [f"{w.name}-{i}" for i in range(replicas)]
    peer_tpl = templates.get("initial-advertise-peer-urls")
    if peer_tpl:
        want = {mem: peer_tpl.replace(f"$({pod_var})", mem) for mem in members}
        got = {}
        for entry in (vals.get("initial-cluster") or "").split(","):
            k, _, url = entry.partition("=")
            got[k] = url
        c.ok(got == want, f"{where}: --initial-cluster={vals.get('initial-cluster')} should name "
                          f"the {replicas} members with their peer URLs: "
                          + ",".join(f"{k}={v}" for k, v in want.items()))
    c.ok(vals.get("initial-cluster-state", "new") == "new",
         f"{where}: --initial-cluster-state should be new (a member with data ignores it)")

    # Data on the member's own claim.
    data = (vals.get("data-dir") or "").rstrip("/")
    vct = {t["metadata"]["name"] for t in w.spec.get("volumeClaimTemplates") or []}
    mounted = [mt for mt in ct.get("volumeMounts") or []
               if data == mt["mountPath"].rstrip("/")
               or data.startswith(mt["mountPath"].rstrip("/") + "/")]
    c.ok(data and any(mt["name"] in vct for mt in mounted),
         f"{where}: --data-dir={vals.get('data-dir')} is not on a volumeClaimTemplate "
         f"({sorted(vct)}): a member that loses its data cannot rejoin")

    # Probes: Ready with a quorum; alive whether or not it has one.
    c.ok(ct.get("readinessProbe"), f"{where}: no readinessProbe")
    live = ct.get("livenessProbe") or {}
    c.ok(live, f"{where}: no livenessProbe")
    c.ok("httpGet" not in live or "/health" not in live["httpGet"].get("path", ""),
         f"{where}: a liveness probe on /health restarts every member that lost the quorum, "
         f"which does not bring it back")
    res = ct.get("resources") or {}
    for part in ("requests", "limits"):
        for r in ("cpu", "memory"):
            c.ok((res.get(part) or {}).get(r), f"{where}: no resources.{part}.{r}")
    sc_pod = w.pod.get("securityContext") or {}
    sc = ct.get("securityContext") or {}
    c.ok(sc.get("runAsNonRoot", sc_pod.get("runAsNonRoot")) is True,
         f"{where}: runAsNonRoot is not set")
    c.ok(sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem is not set")
    return client, [(mem, svc_name) for mem in members]


def check_etcd_flag(coord_w, value, etcd, c):
    """The coordinators' --etcd names every member by its DNS name and client port."""
    client, members = etcd
    endpoints = (value or "").split(",")
    if not c.ok(value, f"{coord_w}: no --etcd (the replicas' run record and election)"):
        return
    found = set()
    for ep in endpoints:
        hp = dc.split_hostport(ep)
        ok = False
        for mem, svc in members:
            dns = (re.escape(mem) + r"\." + re.escape(svc)
                   + r"(\.[a-z0-9-]+|\.\$\(\w+\))?(\.svc(\.cluster\.local)?)?")
            if hp and re.fullmatch(dns, hp[0]) and hp[1] == client:
                ok = True
                found.add(mem)
        c.ok(ok, f"{coord_w}: --etcd entry {ep} is not an etcd member's name and client port "
                 f"({', '.join(f'{m}.{s}:{client}' for m, s in members)})")
    c.ok(len(endpoints) == len(members) and found == {m for m, _ in members},
         f"{coord_w}: --etcd={value} should name each of the {len(members)} members once")


if __name__ == "__main__":
    sys.exit(main())
