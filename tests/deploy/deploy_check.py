"""Shared helpers of the deployment checks (validate_k8s.py, validate_compose.py).

Plain Python 3 plus Debian's python3-yaml; run with /usr/bin/python3.
"""

import os
import re
import shutil
import subprocess
import sys

SERVERS = ("shoal-coordinator", "shoal-worker", "shoal-checkpoint")

# The coordinator's readiness on the leader alone (docs/REPLICAS.md, "Health").
COORDINATOR_HEALTH_NAME = "shoal.v1.Coordinator"

# absl flags every binary has, whether or not --helpfull lists them.
ABSL_BUILTIN = {"help", "helpfull", "helpshort", "helppackage", "version", "only_check_args",
                "flagfile", "fromenv", "tryfromenv", "undefok"}


class Checker:
    """Collects results; exit code 1 when anything failed."""

    def __init__(self, name):
        self.name = name
        self.failures = []
        self.passed = 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failures.append(what)
            print(f"FAIL: {what}", flush=True)
        return cond

    def fail(self, what):
        return self.ok(False, what)

    def finish(self):
        status = "FAILED" if self.failures else "OK"
        print(f"{self.name}: {status}: {self.passed} checks passed, {len(self.failures)} failed")
        return 1 if self.failures else 0


_HELP_CACHE = {}


def binary_flags(bin_dir, binary):
    """Names of the flags `binary --helpfull` lists (plus absl's built-ins)."""
    if binary in _HELP_CACHE:
        return _HELP_CACHE[binary]
    path = os.path.join(bin_dir, binary)
    if not os.access(path, os.X_OK):
        raise SystemExit(f"error: {path} not found or not executable; build first (make build), "
                         f"then pass the build's bin directory")
    # --helpfull exits 1 by absl's convention; only the text matters.
    proc = subprocess.run([path, "--helpfull"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=120, check=False)
    text = proc.stdout.decode("utf-8", "replace")
    names = set(re.findall(r"^\s+--([A-Za-z0-9_]+) \(", text, re.M))
    if "listen" not in names:
        raise SystemExit(f"error: `{path} --helpfull` printed no --listen flag; output:\n{text}")
    _HELP_CACHE[binary] = names | ABSL_BUILTIN
    return _HELP_CACHE[binary]


_ETCD_FLAGS = None


def etcd_flags():
    """Names of the flags `etcd --help` lists (Debian's etcd-server)."""
    global _ETCD_FLAGS
    if _ETCD_FLAGS is not None:
        return _ETCD_FLAGS
    path = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.access(path, os.X_OK):
        raise SystemExit("error: etcd not found: the etcd members' flags are checked against "
                         "`etcd --help`. Install Debian's etcd-server (scripts/install-deps.sh "
                         "installs it).")
    proc = subprocess.run([path, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=60, check=False)
    text = proc.stdout.decode("utf-8", "replace")
    names = set(re.findall(r"^\s+--([a-z0-9-]+)", text, re.M))
    if "initial-cluster" not in names:
        raise SystemExit(f"error: `{path} --help` printed no --initial-cluster flag; "
                         f"output:\n{text}")
    _ETCD_FLAGS = names
    return names


def url_hostport(url):
    """('host', port) of http://host:port (no path); None otherwise."""
    m = re.fullmatch(r"http://([^/:]+):(\d+)/?", url or "")
    return (m.group(1), int(m.group(2))) if m else None


def flag_tokens(tokens):
    """[(name, value or None)] of `--name=value` / `--name` tokens; others are returned as
    (None, token) so the caller can report them."""
    out = []
    for t in tokens:
        m = re.fullmatch(r"--?([A-Za-z0-9_][A-Za-z0-9_-]*)(?:=(.*))?", t, re.S)
        if not m:
            out.append((None, t))
        else:
            out.append((m.group(1), m.group(2)))
    return out


def flagfile_tokens(text):
    """Tokens of an absl flag file and the lines with trailing white space (absl keeps it in
    the value)."""
    tokens, trailing = [], []
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line != line.rstrip():
            trailing.append(n)
        tokens.append(line.lstrip())
    return tokens, trailing


def split_hostport(value):
    """('host', port) of host:port; None when malformed."""
    if value is None:
        return None
    m = re.fullmatch(r"(.+):(\d+)", value)
    if not m:
        return None
    port = int(m.group(2))
    if port > 65535:
        return None
    return m.group(1), port


def last_values(flags):
    """name -> last value (absl: the last occurrence wins)."""
    values = {}
    for name, value in flags:
        if name is not None:
            values[name] = value
    return values


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(1)


# Flags that never go to `--check_config` (paths of the container, and the
# file itself, which is handed over separately).
_NOT_FOR_CHECK = {"flagfile", "config", "check_config"}


def effective_run_config(bin_dir, text, flags):
    """The run config the coordinator builds from the run config file `text`
    (docs/CONFIG.md) and `flags` ({name: value}, the container's), by running
    `shoal-coordinator --config=FILE --check_config` on them: (dict, None), or
    (None, the coordinator's message) when it refuses them. Flags whose value
    is only known in the container ($(VAR), the container's address) are
    left out."""
    import json
    import tempfile
    path = os.path.join(bin_dir, "shoal-coordinator")
    args = [path]
    for name, value in sorted(flags.items()):
        if name in _NOT_FOR_CHECK or (value is not None and ("$(" in value
                                                             or "CONTAINER_ADDRESS" in value)):
            continue
        args.append(f"--{name}" if value is None else f"--{name}={value}")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="run-config-") as f:
        f.write(text)
        f.flush()
        proc = subprocess.run(args + [f"--config={f.name}", "--check_config"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120,
                              check=False)
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, (err[-1] if err else f"exit code {proc.returncode}")
    try:
        return json.loads(proc.stdout.decode()), None
    except ValueError as e:
        return None, f"--check_config printed no JSON: {e}"
