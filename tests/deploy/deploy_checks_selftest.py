#!/usr/bin/python3
"""The deployment checks catch what they claim to: each case copies deploy/
(and the Dockerfile the compose files build from) to a temporary directory,
breaks one thing in the replica set-up, and expects validate_k8s.py or
validate_compose.py to exit 1 naming it. The unbroken copy must pass.

  /usr/bin/python3 tests/deploy/deploy_checks_selftest.py --repo=. --bin_dir=build/bin
"""

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# In-process, so that the binaries' --helpfull (seconds each: the worker loads
# LibTorch) runs once for all the cases, not once per case.
import validate_compose  # noqa: E402
import validate_k8s  # noqa: E402

VALIDATORS = {"k8s": validate_k8s, "compose": validate_compose}

# (validator, file under deploy/, text to replace, replacement, expected message part)
CASES = [
    ("k8s", "k8s/coordinator.yaml", "  replicas: 2\n", "  replicas: 1\n",
     "replicas must be 2"),
    ("k8s", "k8s/coordinator.yaml", "              service: shoal.v1.Coordinator\n", "",
     "readinessProbe asks for service ''"),
    ("k8s", "k8s/coordinator.yaml",
     "          livenessProbe:\n            grpc:\n              port: 50051\n",
     "          livenessProbe:\n            grpc:\n              port: 50051\n"
     "              service: shoal.v1.Coordinator\n",
     "livenessProbe asks for service 'shoal.v1.Coordinator'"),
    ("k8s", "k8s/coordinator.yaml", "      maxUnavailable: 100%\n", "      maxUnavailable: 1\n",
     "rollout would never end"),
    ("k8s", "k8s/coordinator.yaml", ",shoal-etcd-2.shoal-etcd:2379", "",
     "should name each of the 3 members once"),
    ("k8s", "k8s/coordinator.yaml", "shoal-etcd-0.shoal-etcd:2379", "shoal-etcd-0.shoal-etcd:2380",
     "is not an etcd member's name and client port"),
    ("k8s", "k8s/coordinator.yaml", "--advertise=$(POD_IP):50051", "--advertise=$(POD_IP):50052",
     "--advertise port 50052"),
    ("k8s", "k8s/etcd.yaml", "  replicas: 3\n", "  replicas: 2\n", "replicas must be 3"),
    ("k8s", "k8s/worker.yaml", "fieldPath: metadata.labels['topology.kubernetes.io/zone']",
     "fieldPath: spec.nodeName", "must come from the pod's label topology.kubernetes.io/zone"),
    ("k8s", "k8s/worker.yaml", "--zone=$(SHOAL_ZONE)", "--zone=EU//paris",
     "is not a zone path"),
    ("k8s", "k8s/etcd.yaml", "  publishNotReadyAddresses: true\n", "",
     "publishNotReadyAddresses must be true"),
    ("k8s", "k8s/etcd.yaml",
     ",shoal-etcd-2=http://shoal-etcd-2.shoal-etcd.$(POD_NAMESPACE).svc.cluster.local:2380", "",
     "--initial-cluster="),
    ("k8s", "k8s/etcd.yaml", "- --logger=zap", "- --loger=zap", "--loger is not a flag of etcd"),
    ("compose", "docker-compose.replicas.yml",
     "--coordinator=127.0.0.1:${SHOAL_COORDINATOR_PORT:-50051},"
     "127.0.0.1:${SHOAL_COORDINATOR_B_PORT:-50053}",
     "--coordinator=127.0.0.1:${SHOAL_COORDINATOR_PORT:-50051}", "expected the 2 replicas"),
    ("compose", "docker-compose.replicas.yml",
     "      - --listen=127.0.0.1:${SHOAL_COORDINATOR_B_PORT:-50053}\n"
     "      - --metrics_listen=127.0.0.1:${SHOAL_COORDINATOR_B_METRICS_PORT:-9093}\n"
     "      - --http_listen=127.0.0.1:${SHOAL_COORDINATOR_B_METRICS_PORT:-9093}\n"
     "      - --etcd=127.0.0.1:${SHOAL_ETCD_PORT:-2379}\n",
     "      - --listen=127.0.0.1:${SHOAL_COORDINATOR_B_PORT:-50053}\n"
     "      - --metrics_listen=127.0.0.1:${SHOAL_COORDINATOR_B_METRICS_PORT:-9093}\n"
     "      - --http_listen=127.0.0.1:${SHOAL_COORDINATOR_B_METRICS_PORT:-9093}\n"
     "      - --etcd=127.0.0.1:2381\n",
     "expected the etcd members' client addresses"),
    # A run flag on the first of the two replicas only.
    ("compose", "docker-compose.replicas.yml",
     "      - --checkpoint_store=127.0.0.1:${SHOAL_CHECKPOINT_PORT:-50052}\n",
     "      - --checkpoint_store=127.0.0.1:${SHOAL_CHECKPOINT_PORT:-50052}\n      - --rounds=5\n",
     "run different configurations: --rounds"),
    # The run config file (docs/CONFIG.md): a key the coordinator does not
    # know, a value its validator refuses, a file that is not mounted.
    ("k8s", "k8s/run.yaml", "  local_steps: 50\n", "  local_stepz: 50\n",
     "unknown key 'training.local_stepz'"),
    ("compose", "run.yaml", "  min_participants: 3\n", "  min_participants: 0\n",
     "sync.min_participants (--min_participants) must be > 0"),
    ("compose", "docker-compose.yml", "      - ${SHOAL_RUN_CONFIG:-./run.yaml}:/etc/shoal/run.yaml:ro\n",
     "", "--config=/etc/shoal/run.yaml is not a file mounted read-only"),
    ("compose", "docker-compose.replicas.yml",
     "      - --data-dir=/var/lib/shoal/etcd\n", "      - --data-dir=/var/lib/etcd-elsewhere\n",
     "is not on a named volume or a tmpfs"),
    ("compose", "docker-compose.replicas.yml",
     "      - --etcd=127.0.0.1:${SHOAL_ETCD_PORT:-2379}\n"
     "      - --lease_ttl=${SHOAL_LEASE_TTL:-3s}\n"
     "      - --run_id=${SHOAL_RUN_ID:-shoal-compose}\n",
     "      - --etcd=127.0.0.1:${SHOAL_ETCD_PORT:-2379}\n"
     "      - --lease_ttl=${SHOAL_LEASE_TTL:-3s}\n"
     "      - --run_id=${SHOAL_RUN_ID:-shoal-compose}\n"
     "      - --state_dir=/var/lib/shoal/coordinator\n",
     "--state_dir and --etcd exclude each other"),
]


def run(validator, repo, bin_dir, schema=True):
    """(exit code, output) of the validator's main() on `repo`; schema=False
    skips `docker-compose config` (the broken copies test Shoal's checks)."""
    out = io.StringIO()
    argv = sys.argv
    compose_config = validate_compose.compose_config
    if not schema:
        validate_compose.compose_config = lambda *args: None
    sys.argv = [f"validate_{validator}.py", f"--repo={repo}", f"--bin_dir={bin_dir}"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = VALIDATORS[validator].main()
    except SystemExit as e:  # dc.die and friends
        rc = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv
        validate_compose.compose_config = compose_config
    return rc, out.getvalue()


def copy_deploy(repo, dest):
    shutil.copytree(os.path.join(repo, "deploy"), os.path.join(dest, "deploy"))
    shutil.copy(os.path.join(repo, "Dockerfile"), os.path.join(dest, "Dockerfile"))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--bin_dir", required=True)
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="shoal-deploy-selftest-") as tmp:
        clean = os.path.join(tmp, "clean")
        copy_deploy(args.repo, clean)
        for validator in ("k8s", "compose"):
            rc, out = run(validator, clean, args.bin_dir)
            if rc != 0:
                print(f"FAIL: the unchanged files fail validate_{validator}.py:\n{out}")
                failures += 1
        for n, (validator, rel, old, new, want) in enumerate(CASES):
            case = os.path.join(tmp, f"case{n}")
            copy_deploy(args.repo, case)
            path = os.path.join(case, "deploy", rel)
            with open(path) as f:
                text = f.read()
            if text.count(old) < 1:
                print(f"FAIL: case {n}: deploy/{rel} no longer contains {old!r}; update the case")
                failures += 1
                continue
            with open(path, "w") as f:
                f.write(text.replace(old, new, 1))
            rc, out = run(validator, case, args.bin_dir, schema=False)
            caught = rc == 1 and any(want in line for line in out.splitlines()
                                     if line.startswith("FAIL:"))
            print(f"{'ok' if caught else 'FAIL'}: case {n} ({rel}: expect '{want}'): exit {rc}")
            if not caught:
                print(out)
                failures += 1
    print(f"DeployChecksSelfTest: {'FAILED' if failures else 'OK'}: {len(CASES)} broken copies, "
          f"{failures} not caught")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
