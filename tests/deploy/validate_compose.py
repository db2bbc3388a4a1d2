#!/usr/bin/python3
"""Offline checks of the compose files, with no Docker engine:
deploy/docker-compose.yml alone (the project network), with the
deploy/docker-compose.hostnet.yml override layered on it (host networking),
and with deploy/docker-compose.replicas.yml on top of both (one etcd member,
two coordinator replicas on it: --etcd names that member, the replicas share
one run configuration, workers name both replicas).

Merges the override the way compose does for the keys the files use,
interpolates ${VAR:-default} with the defaults (as with an empty
environment), then checks that every flag handed to a binary is one of its
flags, that the coordinators' run config file (--config, deploy/run.yaml) is
mounted read-only and accepted by `shoal-coordinator --check_config` with
their flags (the replicas with the same effective config), that published ports and addresses agree with the --listen and
--metrics_listen flags (also through the network holder whose namespace the coordinator and the
store share), that no service started with host networking publishes ports
(docker-compose 1.29 refuses that), that workers can be scaled (no fixed
name or port) and advertise an address their peers reach, that data
directories are named volumes, and that the image's HEALTHCHECK ports apply.
When docker-compose is installed, `docker-compose config -q` must accept the
base file and the pair too.

  /usr/bin/python3 tests/deploy/validate_compose.py --repo=. --bin_dir=build/bin
"""

import argparse
import os
import re
import shlex
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

# The image's HEALTHCHECK probes these ports unless SHOAL_HEALTH_PORT says otherwise.
HEALTH_DEFAULT_PORT = {"shoal-coordinator": 50051, "shoal-checkpoint": 50052, "shoal-worker": 50060,
                       "etcd": 2379}
# Flags that differ between coordinator replicas by nature (addresses); every
# other flag is the run's configuration and must be the same on all of them.
PER_REPLICA_FLAGS = {"listen", "metrics_listen", "http_listen", "advertise"}
ADDR_PLACEHOLDER = "CONTAINER_ADDRESS"


def interpolate(value, where, c):
    """Compose's variable substitution with every variable unset."""
    if isinstance(value, dict):
        return {k: interpolate(v, where, c) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, where, c) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("plain")
        if m.group("op") is not None:
            if m.group("op") in (":?", "?"):
                c.fail(f"{where}: ${{{name}}} is required (no default)")
                return ""
            return m.group("default")
        c.fail(f"{where}: ${name} has no default (${{{name}:-default}})")
        return ""

    return re.sub(r"\$\$|\$\{(?P<braced>\w+)(?:(?P<op>:-|-|:\?|\?)(?P<default>[^}]*))?\}"
                  r"|\$(?P<plain>\w+)", sub, value)


def command_of(svc, where, c):
    """(binary, argv after it, via_shell) of a service's command."""
    cmd = svc.get("command")
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    if not c.ok(isinstance(cmd, list) and cmd, f"{where}: no command"):
        return None, [], False
    if os.path.basename(cmd[0]) in ("sh", "bash") and len(cmd) >= 3 and cmd[1] == "-c":
        # $(...) is the container's own address at run time.
        script = re.sub(r"\$\([^)]*\)", ADDR_PLACEHOLDER, cmd[2])
        words = shlex.split(script)
        c.ok(words and words[0] == "exec",
             f"{where}: the shell must exec the binary (so SIGTERM reaches it): {cmd[2]!r}")
        if words and words[0] == "exec":
            words = words[1:]
        return (os.path.basename(words[0]) if words else None), words[1:], True
    return os.path.basename(cmd[0]), cmd[1:], False


def parse_port(entry):
    """(host_ip, host_port, container_port) of a short-syntax ports entry."""
    if isinstance(entry, dict):
        return entry.get("host_ip", ""), entry.get("published"), entry.get("target")
    parts = str(entry).split("/")[0].split(":")
    if len(parts) == 1:
        return "", None, int(parts[0])
    if len(parts) == 2:
        return "", int(parts[0]), int(parts[1])
    return parts[0], int(parts[1]), int(parts[2])


def seconds(duration):
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", str(duration or ""))
    if not m or not duration:
        return 10  # Docker's default
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


def load(path, c):
    with open(path) as f:
        raw = yaml.safe_load(f)
    if not c.ok(isinstance(raw, dict) and isinstance(raw.get("services"), dict),
                f"{path}: no services"):
        return None
    return raw


def merge_override(base, override):
    """docker-compose's merge of an override file, for the keys Shoal's files
    use: a service's scalars, command and healthcheck are replaced,
    environment and other mappings merged, ports/profiles/lists unioned."""
    out = dict(base)
    out["services"] = {k: dict(v) for k, v in base["services"].items()}
    for svc_name, over in override["services"].items():
        svc = out["services"].setdefault(svc_name, {})
        for key, value in over.items():
            if key in ("command", "healthcheck", "entrypoint") or not isinstance(
                    svc.get(key), (dict, list)):
                svc[key] = value
            elif isinstance(value, dict):
                svc[key] = {**svc[key], **value}
            else:
                svc[key] = svc[key] + [v for v in value if v not in svc[key]]
    for key in ("volumes", "networks"):
        if override.get(key):
            out[key] = {**(out.get(key) or {}), **override[key]}
    return out


def service_env(svc):
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env if "=" in e)
    return env


def service_mounts(svc):
    """mount path -> source (a named volume) of a service's volumes."""
    mounts = {}
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            src, _, rest = v.partition(":")
            mounts[rest.split(":")[0]] = src
        else:
            mounts[v.get("target")] = v.get("source")
    return mounts


def check_etcd(where, svc, argv, host_mode, declared_volumes, c):
    """An etcd member of the compose file. Returns (name, client (host, port),
    peer (host, port), initial cluster {name: peer URL}) or None."""
    known = dc.etcd_flags()
    flags = []
    for fname, fvalue in dc.flag_tokens(argv):
        if not c.ok(fname is not None, f"{where}: argument '{fvalue}' is not a --flag"):
            continue
        c.ok(fname in known, f"{where}: --{fname} is not a flag of etcd (see etcd --help)")
        flags.append((fname, fvalue))
    vals = dc.last_values(flags)
    member = vals.get("name")
    c.ok(member, f"{where}: no --name (the member's name in --initial-cluster)")
    client = dc.url_hostport(vals.get("listen-client-urls"))
    peer = dc.url_hostport(vals.get("listen-peer-urls"))
    if not c.ok(client and peer, f"{where}: --listen-client-urls and --listen-peer-urls must each "
                                 f"be one http://host:port"):
        return None
    if host_mode:
        c.ok(client[0] == "127.0.0.1" and peer[0] == "127.0.0.1",
             f"{where}: etcd should listen on 127.0.0.1 on the host's network")
    c.ok(client[1] != peer[1], f"{where}: client and peer ports are both {client[1]}")
    c.ok(dc.url_hostport(vals.get("advertise-client-urls")) == client,
         f"{where}: --advertise-client-urls={vals.get('advertise-client-urls')} is not the "
         f"client address {client}")
    c.ok(dc.url_hostport(vals.get("initial-advertise-peer-urls")) == peer,
         f"{where}: --initial-advertise-peer-urls={vals.get('initial-advertise-peer-urls')} is "
         f"not the peer address {peer}")
    cluster = {}
    for entry in (vals.get("initial-cluster") or "").split(","):
        k, _, url = entry.partition("=")
        cluster[k] = url
    c.ok(cluster.get(member) == vals.get("initial-advertise-peer-urls"),
         f"{where}: --initial-cluster={vals.get('initial-cluster')} does not give member "
         f"{member} its --initial-advertise-peer-urls")
    # Its data: a named volume (kept across `down`) or a tmpfs (a throwaway run).
    data = (vals.get("data-dir") or "").rstrip("/")
    mounts = service_mounts(svc)
    tmpfs = [t.split(":")[0] for t in svc.get("tmpfs") or []]
    on_volume = any(data == m or data.startswith(m.rstrip("/") + "/")
                    for m, src in mounts.items() if src in declared_volumes)
    on_tmpfs = any(data == t or data.startswith(t.rstrip("/") + "/") for t in tmpfs)
    c.ok(data and (on_volume or on_tmpfs),
         f"{where}: --data-dir={vals.get('data-dir')} is not on a named volume or a tmpfs")
    c.ok(svc.get("restart") in ("unless-stopped", "always"),
         f"{where}: etcd should restart unless-stopped")
    if svc.get("read_only"):
        c.ok("/tmp" in tmpfs or "/tmp" in mounts, f"{where}: read_only without a writable /tmp")
    hc = svc.get("healthcheck") or {}
    if not hc.get("disable") and hc.get("test") != ["NONE"] and "test" not in hc:
        health_port = int(service_env(svc).get("SHOAL_HEALTH_PORT", HEALTH_DEFAULT_PORT["etcd"]))
        c.ok(health_port == client[1], f"{where}: the image's health check probes port "
                                       f"{health_port}, etcd serves clients on {client[1]}")
    return member, client, peer, cluster


def check_doc(name, raw, host_mode, base_dir, bin_dir, c, replicas=1):
    """name: what to call it in messages; raw: the (merged) file as parsed;
    base_dir: the directory build contexts are relative to; replicas: how
    many coordinators it must run (more than one: on one etcd member)."""
    doc = interpolate(raw, name, c)
    c.ok(str(doc.get("version", "")).startswith("3."),
         f"{name}: version should be 3.x (docker-compose 1.29 and docker compose)")
    # Services with a profile are not started by a plain `up`.
    services = {k: v for k, v in doc["services"].items() if not v.get("profiles")}
    declared_volumes = set((doc.get("volumes") or {}).keys())
    for svc_name in ("coordinator", "checkpoint", "worker"):
        c.ok(svc_name in services, f"{name}: no service {svc_name} (or it has a profile)")

    # Network holders: services whose network namespace others join
    # (network_mode: service:NAME). They publish the ports of their guests.
    guests = {}
    for svc_name, svc in services.items():
        mode = str(svc.get("network_mode", ""))
        if mode.startswith("service:"):
            holder = mode[len("service:"):]
            guests.setdefault(holder, []).append(svc_name)
            c.ok(holder in services, f"{name}: {svc_name} joins the network of {holder}, "
                                     f"which is not started")

    info = {}  # service -> (binary, flags dict, listen (host, port))
    run_configs = {}  # coordinator service -> its effective run config (docs/CONFIG.md)
    etcd = {}  # service -> check_etcd's answer
    for svc_name, svc in services.items():
        where = f"{name}: {svc_name}"
        c.ok(raw["services"][svc_name].get("image") == "${SHOAL_IMAGE:-shoal:latest}",
             f"{where}: image should be ${{SHOAL_IMAGE:-shoal:latest}}")
        build = svc.get("build")
        if c.ok(isinstance(build, dict), f"{where}: no build section"):
            ctx = os.path.normpath(os.path.join(base_dir, build.get("context", ".")))
            df = os.path.join(ctx, build.get("dockerfile", "Dockerfile"))
            c.ok(os.path.isfile(df), f"{where}: build context {ctx} has no {df}")
        if host_mode:
            c.ok(svc.get("network_mode") == "host", f"{where}: network_mode should be host")
            c.ok(not svc.get("ports"), f"{where}: published ports do not go with "
                                       f"network_mode: host (docker-compose 1.29 refuses them)")
        if svc_name in guests:
            # A holder runs no server; it must outlive its guests and stop on SIGTERM.
            c.ok(svc.get("restart") in ("unless-stopped", "always"),
                 f"{where}: holds the network of {guests[svc_name]} and should restart "
                 f"unless-stopped")
            hc = svc.get("healthcheck") or {}
            c.ok(hc.get("disable") or hc.get("test") == ["NONE"],
                 f"{where}: runs no server, its health check should be disabled")
            cmd = svc.get("command")
            c.ok(isinstance(cmd, list) and "trap" in " ".join(map(str, cmd)),
                 f"{where}: as PID 1 the shell ignores SIGTERM unless it traps it")
            continue
        binary, argv, via_shell = command_of(svc, where, c)
        if binary == "etcd":
            member = check_etcd(where, svc, argv, host_mode, declared_volumes, c)
            if member:
                etcd[svc_name] = member
            continue
        if not c.ok(binary in dc.SERVERS,
                    f"{where}: runs {binary}, not one of {dc.SERVERS} or etcd"):
            continue
        known = dc.binary_flags(bin_dir, binary)
        flags = []
        for fname, fvalue in dc.flag_tokens(argv):
            if not c.ok(fname is not None, f"{where}: argument '{fvalue}' is not a --flag"):
                continue
            c.ok(fname in known, f"{where}: --{fname} is not a flag of {binary} "
                                 f"(see {binary} --helpfull)")
            flags.append((fname, fvalue))
        vals = dc.last_values(flags)
        hp = dc.split_hostport(vals.get("listen"))
        if not c.ok(hp is not None, f"{where}: --listen={vals.get('listen')} is not host:port"):
            continue
        info[svc_name] = (binary, vals, hp)
        host, port = hp
        ports = [parse_port(p) for p in svc.get("ports") or []]
        env = service_env(svc)

        # The coordinator's run config file (--config): a file of the
        # repository bind-mounted read-only, that the coordinator accepts
        # with these flags (--check_config).
        if binary == "shoal-coordinator":
            path = vals.get("config")
            if c.ok(path, f"{where}: no --config (the run config, docs/CONFIG.md)"):
                src = service_mounts(svc).get(path)
                mounted = [v for v in svc.get("volumes") or []
                           if isinstance(v, str) and v.split(":")[1:2] == [path]]
                if c.ok(src and mounted and mounted[0].endswith(":ro"),
                        f"{where}: --config={path} is not a file mounted read-only "
                        f"(SOURCE:{path}:ro)"):
                    host_file = os.path.normpath(os.path.join(base_dir, src))
                    if c.ok(os.path.isfile(host_file),
                            f"{where}: --config={path} is mounted from {src}, which is not a "
                            f"file next to the compose file"):
                        with open(host_file) as f:
                            text = f.read()
                        cfg, err = dc.effective_run_config(bin_dir, text, vals)
                        if c.ok(err is None, f"{where}: shoal-coordinator --check_config refuses "
                                             f"{src} with its flags: {err}"):
                            run_configs[svc_name] = cfg

        if host_mode:
            c.ok(host == "127.0.0.1", f"{where}: --listen should be on 127.0.0.1, is {host}")
        else:
            mode = str(svc.get("network_mode", ""))
            c.ok(mode == "" or mode.startswith("service:"),
                 f"{where}: network_mode {mode} on the project network")
            c.ok(host == "0.0.0.0", f"{where}: --listen host {host}: other containers cannot "
                                    f"reach it (use 0.0.0.0)")
            c.ok(not (ports and mode), f"{where}: publishes ports in another's network")
            for _, _, target in ports:
                c.ok(target == port, f"{where}: publishes container port {target}, the server "
                                     f"listens on {port}")

        # --metrics_listen: on the address --listen uses, on a port of its own.
        mhp = dc.split_hostport(vals.get("metrics_listen"))
        if c.ok(mhp is not None,
                f"{where}: --metrics_listen={vals.get('metrics_listen')} is not host:port"):
            c.ok(mhp[0] == host, f"{where}: --metrics_listen host {mhp[0]} != --listen host {host}")
            c.ok(mhp[1] != port or port == 0,
                 f"{where}: --metrics_listen and --listen share port {port}")

        # The image's HEALTHCHECK (per PID 1) must probe the port the server listens on.
        hc = svc.get("healthcheck") or {}
        if not hc.get("disable") and hc.get("test") != ["NONE"] and "test" not in hc:
            health_port = int(env.get("SHOAL_HEALTH_PORT", HEALTH_DEFAULT_PORT[binary]))
            c.ok(health_port == port, f"{where}: the image's health check probes port "
                                      f"{health_port}, the server listens on {port} (set "
                                      f"SHOAL_HEALTH_PORT or disable the check)")

        # Directories the server writes must be named volumes (read_only root).
        mounts = service_mounts(svc)
        for flag in ("state_dir", "data_dir"):
            if flag in vals and binary != "shoal-worker":
                src = mounts.get(vals[flag].rstrip("/"))
                c.ok(src in declared_volumes, f"{where}: --{flag}={vals[flag]} is not a named "
                                              f"volume (declared: {sorted(declared_volumes)})")
        if svc.get("read_only"):
            c.ok("/tmp" in (svc.get("tmpfs") or []) or "/tmp" in mounts,
                 f"{where}: read_only without a writable /tmp")

        if binary == "shoal-worker":
            c.ok("container_name" not in svc and "hostname" not in svc,
                 f"{where}: a fixed container_name/hostname prevents --scale")
            c.ok(not ports, f"{where}: published ports prevent --scale")
            c.ok(svc.get("restart") in ("on-failure", "unless-stopped", "always"),
                 f"{where}: restart should be on-failure (the worker exits non-zero when the "
                 f"coordinator stays unreachable)")
            c.ok(seconds(svc.get("stop_grace_period")) >= 10,
                 f"{where}: stop_grace_period {svc.get('stop_grace_period')} leaves no time for "
                 f"Leave")
            if host_mode:
                c.ok(port == 0, f"{where}: --listen port should be 0 so scaled workers never "
                                f"collide, is {port}")
                c.ok("advertise" not in vals, f"{where}: --advertise is not needed on 127.0.0.1")
            else:
                c.ok(vals.get("advertise") == f"{ADDR_PLACEHOLDER}:{port}",
                     f"{where}: --advertise should be $(hostname -i):{port} (its own address on "
                     f"the project network), is {vals.get('advertise')}")
                c.ok(via_shell, f"{where}: needs a shell to compute its address")

    if not all(s in info for s in ("coordinator", "checkpoint", "worker")):
        return
    coordinators = sorted(s for s, (b, _, _) in info.items() if b == "shoal-coordinator")
    c.ok(len(coordinators) == replicas,
         f"{name}: {len(coordinators)} coordinators ({coordinators}), expected {replicas}")
    c.ok(len(etcd) == (1 if replicas > 1 else 0),
         f"{name}: {len(etcd)} etcd members ({sorted(etcd)}), expected "
         f"{1 if replicas > 1 else 0}")
    if replicas > 1:
        check_replicas(name, services, info, coordinators, etcd, c)
        if all(s in run_configs for s in coordinators):
            first = coordinators[0]
            for other in coordinators[1:]:
                diff = sorted(k for k in set(run_configs[first]) | set(run_configs[other])
                              if run_configs[first].get(k) != run_configs[other].get(k))
                c.ok(not diff, f"{name}: {first} and {other} run different run configs: "
                               f"{', '.join(diff)} differ")

    def published(svc_name):
        """Container ports published for a service (by itself or its holder)."""
        svc = services[svc_name]
        mode = str(svc.get("network_mode", ""))
        owner = services.get(mode[len("service:"):], {}) if mode.startswith("service:") else svc
        return [parse_port(p)[2] for p in owner.get("ports") or []]

    def reachable_as(svc_name):
        """Names other containers reach a service by on the project network."""
        svc = services[svc_name]
        mode = str(svc.get("network_mode", ""))
        if not mode.startswith("service:"):
            return {svc_name}
        nets = services.get(mode[len("service:"):], {}).get("networks") or {}
        names = set()
        for net in (nets.values() if isinstance(nets, dict) else []):
            names.update((net or {}).get("aliases") or [])
        return names

    coord_port = info["coordinator"][2][1]
    ckpt_port = info["checkpoint"][2][1]
    worker_vals = info["worker"][1]
    if host_mode:
        want_coord = f"127.0.0.1:{coord_port}"
        want_ckpt = f"127.0.0.1:{ckpt_port}"
        c.ok(coord_port != ckpt_port and 0 not in (coord_port, ckpt_port),
             f"{name}: coordinator and store need distinct fixed ports")
    else:
        want_coord = f"coordinator:{coord_port}"
        want_ckpt = f"checkpoint:{ckpt_port}"
        c.ok(coord_port in published("coordinator"),
             f"{name}: the coordinator's port is not published (grpcurl from the host)")
        c.ok(ckpt_port in published("checkpoint"),
             f"{name}: the store's port is not published (shoalctl checkpoints from the host)")
        for svc_name in ("coordinator", "checkpoint"):
            c.ok(svc_name in reachable_as(svc_name),
                 f"{name}: other containers cannot reach {svc_name} by that name (its network "
                 f"holder needs the alias)")
        if guests:
            c.ok(ckpt_port != coord_port, f"{name}: the coordinator and the store share a "
                                          f"network namespace and need distinct ports")
        for svc_name in ("coordinator", "checkpoint"):
            mhp = dc.split_hostport(info[svc_name][1].get("metrics_listen"))
            if mhp is not None:
                c.ok(mhp[1] in published(svc_name),
                     f"{name}: the {svc_name}'s metrics port {mhp[1]} is not published")
    # The coordinator and the store share a network (namespace or the host's):
    # all four of their ports must differ.
    # (With etcd, on the host's network, its ports too.)
    fixed = [info[s][2][1] for s in coordinators + ["checkpoint"]]
    for svc_name in coordinators + ["checkpoint"]:
        mhp = dc.split_hostport(info[svc_name][1].get("metrics_listen"))
        if mhp is not None:
            fixed.append(mhp[1])
    for _, client, peer, _ in etcd.values():
        fixed += [client[1], peer[1]]
    c.ok(len(set(fixed)) == len(fixed) and 0 not in fixed,
         f"{name}: the coordinators', the store's and etcd's ports {fixed} must be "
         f"fixed and distinct")
    if replicas > 1:
        # Workers (and operators) name every replica: a dead first one is skipped.
        want = {f"127.0.0.1:{info[s][2][1]}" if host_mode else f"{s}:{info[s][2][1]}"
                for s in coordinators}
        got = (worker_vals.get("coordinator") or "").split(",")
        c.ok(set(got) == want and len(got) == len(want),
             f"{name}: worker --coordinator={worker_vals.get('coordinator')}, expected the "
             f"{len(want)} replicas {sorted(want)}")
    else:
        c.ok(worker_vals.get("coordinator") == want_coord,
             f"{name}: worker --coordinator={worker_vals.get('coordinator')}, expected "
             f"{want_coord}")
    deps = services["worker"].get("depends_on") or []
    for svc_name in coordinators:
        checkpoints = (run_configs.get(svc_name) or {}).get("checkpoints") or {}
        if svc_name in run_configs:
            c.ok(checkpoints.get("store") == want_ckpt,
                 f"{name}: {svc_name} checkpoints.store (--checkpoint_store) is "
                 f"{checkpoints.get('store')}, expected {want_ckpt}")
            c.ok(checkpoints.get("every", 0) > 0,
                 f"{name}: {svc_name} checkpoints.every (--checkpoint_every) is 0: no checkpoints")
        c.ok(svc_name in deps, f"{name}: worker should depend on {svc_name}")


def check_replicas(name, services, info, coordinators, etcd, c):
    """Coordinator replicas: on the etcd member(s) of the file, with no
    --state_dir, one run configuration."""
    clients = {f"{h}:{p}" for _, (h, p), _, _ in etcd.values()}
    members = {m for m, _, _, _ in etcd.values()}
    for _, _, _, cluster in etcd.values():
        c.ok(set(cluster) == members, f"{name}: etcd --initial-cluster names {sorted(cluster)}, "
                                      f"the file runs {sorted(members)}")
    for svc_name in coordinators:
        vals = info[svc_name][1]
        where = f"{name}: {svc_name}"
        endpoints = (vals.get("etcd") or "").split(",")
        c.ok(vals.get("etcd") and set(endpoints) == clients,
             f"{where}: --etcd={vals.get('etcd')}, expected the etcd members' client "
             f"addresses {sorted(clients)}")
        c.ok("state_dir" not in vals, f"{where}: --state_dir and --etcd exclude each other")
        c.ok(services[svc_name].get("restart") in ("unless-stopped", "always"),
             f"{where}: a replica should restart unless-stopped")
        deps = services[svc_name].get("depends_on") or []
        c.ok(all(e in deps for e in etcd), f"{where}: should depend on {sorted(etcd)}")
    first = coordinators[0]
    config = {k: v for k, v in info[first][1].items() if k not in PER_REPLICA_FLAGS}
    for svc_name in coordinators[1:]:
        other = {k: v for k, v in info[svc_name][1].items() if k not in PER_REPLICA_FLAGS}
        diff = sorted(k for k in set(config) | set(other) if config.get(k) != other.get(k))
        c.ok(not diff, f"{name}: {first} and {svc_name} run different configurations: "
                       + ", ".join(f"--{k}={config.get(k)} vs {other.get(k)}" for k in diff))



def compose_config(files, name, c):
    """`docker-compose config -q` on the files, when docker-compose is installed."""
    compose = shutil.which("docker-compose")
    if compose:
        args = [compose]
        for f in files:
            args += ["-f", f]
        proc = subprocess.run(args + ["config", "-q"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=120, check=False,
                              env={k: v for k, v in os.environ.items()
                                   if not k.startswith("SHOAL_")})
        c.ok(proc.returncode == 0, f"{name}: docker-compose config rejects it:\n"
                                   f"{proc.stdout.decode()}")
    else:
        print(f"{name}: docker-compose not installed, its own schema check skipped")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, help="repository root")
    ap.add_argument("--bin_dir", required=True, help="directory with the built binaries")
    args = ap.parse_args()
    c = dc.Checker("ComposeFiles")
    deploy = os.path.join(args.repo, "deploy")
    base_path = os.path.join(deploy, "docker-compose.yml")
    host_path = os.path.join(deploy, "docker-compose.hostnet.yml")
    replicas_path = os.path.join(deploy, "docker-compose.replicas.yml")
    base, override = load(base_path, c), load(host_path, c)
    replicas = load(replicas_path, c)
    base_name = "deploy/docker-compose.yml"
    pair_name = base_name + " + deploy/docker-compose.hostnet.yml"
    triple_name = pair_name + " + deploy/docker-compose.replicas.yml"
    if base:
        check_doc(base_name, base, False, deploy, args.bin_dir, c)
        compose_config([base_path], base_name, c)
    if base and override:
        c.ok(not any(svc.get("ports") for svc in override["services"].values()),
             "deploy/docker-compose.hostnet.yml: an override cannot remove ports, only add")
        check_doc(pair_name, merge_override(base, override), True, deploy, args.bin_dir, c)
        compose_config([base_path, host_path], pair_name, c)
    if base and override and replicas:
        c.ok(not any(svc.get("ports") for svc in replicas["services"].values()),
             "deploy/docker-compose.replicas.yml: an override cannot remove ports, only add")
        check_doc(triple_name, merge_override(merge_override(base, override), replicas), True,
                  deploy, args.bin_dir, c, replicas=2)
        compose_config([base_path, host_path, replicas_path], triple_name, c)
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
