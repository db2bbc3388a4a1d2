#!/usr/bin/env bash
# make test-deploy: the Docker image and docker-compose, live, on host networking,
# with the coordinator replicated on etcd (deploy/docker-compose.replicas.yml).
#
#  1. installs docker.io, docker-compose and debootstrap when missing;
#  2. uses the running Docker engine, or starts one (data root in a temp dir,
#     private socket, no bridge, no iptables) and stops it at the end;
#  3. base image debian:bookworm: present, else `docker pull`, else built
#     offline by scripts/build-base-image.sh (debootstrap + docker import);
#  4. docker build of the image;
#  5. bad input: containers with a wrong coordinator address, no volume on a
#     read-only root, a bad run configuration must exit non-zero with a clear message;
#  6. docker-compose -f deploy/docker-compose.yml -f deploy/docker-compose.hostnet.yml
#     -f deploy/docker-compose.replicas.yml up (unique project name, free ports):
#     one etcd member, two coordinator replicas, the store, 3 workers;
#     waits for 3 completed rounds, checks the image's health checks; kills a
#     worker (SIGKILL) and sees rounds go on; scales the workers up by one and
#     sees the new one take part with the run's model hash; exports a
#     checkpoint through the store's port; stops a worker (SIGTERM: Leave, exit 0);
#     finds the leading coordinator, kills its container (SIGKILL) and sees the
#     other replica lead, 2 more rounds complete and the workers' hashes agree;
#  7. tears everything down (always), stops the engine if it started one.
#
# Needs root (apt, dockerd, debootstrap) unless an engine is already usable.
# Environment: BUILD (build dir with bin/shoalctl, default build), SHOAL_IMAGE
# (tag to build, default shoal:latest), SHOAL_DOCKER_DATA_ROOT (keep the
# engine's images between runs in this directory instead of a temp dir),
# SHOAL_DEPLOY_BUILD_TIMEOUT (s, default 3600), SHOAL_DEPLOY_WAIT (s, per wait, default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BUILD="${BUILD:-build}"
IMAGE="${SHOAL_IMAGE:-shoal:latest}"
BASE_IMAGE=debian:bookworm
BUILD_TIMEOUT="${SHOAL_DEPLOY_BUILD_TIMEOUT:-3600}"
WAIT="${SHOAL_DEPLOY_WAIT:-300}"
PY=/usr/bin/python3
# The base file with the host-network and replica overrides, exactly as the
# README shows them.
COMPOSE_FILES=(-f "$ROOT/deploy/docker-compose.yml" -f "$ROOT/deploy/docker-compose.hostnet.yml"
  -f "$ROOT/deploy/docker-compose.replicas.yml")
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0

START=$(date +%s)
WORK="$(mktemp -d /tmp/shoal-test-deploy.XXXXXX)"
DOCKERD_PID=""
ENGINE_DIR=""
PROJECT=""
RESULT=1
declare -A TIMES=()

log() { printf 'test-deploy: [%4ds] %s\n' "$(($(date +%s) - START))" "$*"; }
fail() {
  log "FAIL: $*"
  exit 1
}
# elapsed NAME SINCE: records a phase's duration for the summary.
elapsed() { TIMES[$1]=$(($(date +%s) - $2)); }

# ---------------------------------------------------------------- teardown --
cleanup() {
  local rc=$?
  set +e
  if [[ -n "$PROJECT" ]]; then
    if [[ $RESULT -ne 0 ]]; then
      log "logs of the cluster (last lines per container):"
      timeout 60 $COMPOSE -p "$PROJECT" "${COMPOSE_FILES[@]}" logs --no-color --tail=25 2>&1 |
        sed 's/^/    /' | tail -n 200
    fi
    log "tearing down compose project $PROJECT"
    timeout 180 $COMPOSE -p "$PROJECT" "${COMPOSE_FILES[@]}" down -v --remove-orphans -t 20 \
      >"$WORK/down.log" 2>&1 || { log "compose down failed:"; tail -n 20 "$WORK/down.log"; }
  fi
  if [[ -n "$DOCKERD_PID" ]]; then
    log "stopping the Docker engine this script started (pid $DOCKERD_PID)"
    kill -TERM "$DOCKERD_PID" 2>/dev/null
    for _ in $(seq 1 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$DOCKERD_PID" 2>/dev/null; then
      log "dockerd still running after 30 s: SIGKILL"
      kill -KILL "$DOCKERD_PID" 2>/dev/null
    fi
    wait "$DOCKERD_PID" 2>/dev/null
    # The containerd it started, if it outlived it.
    local cpid
    cpid="$(cat "$ENGINE_DIR/exec/containerd/containerd.pid" 2>/dev/null)"
    if [[ -n "$cpid" ]] && kill -0 "$cpid" 2>/dev/null; then
      kill -TERM "$cpid" 2>/dev/null; sleep 2; kill -KILL "$cpid" 2>/dev/null
    fi
    # Mounts left behind by a killed engine, deepest first.
    awk -v d="$ENGINE_DIR" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r |
      xargs -r -n1 umount -l 2>/dev/null
  fi
  rm -rf --one-file-system "$WORK" 2>/dev/null
  if [[ $RESULT -eq 0 ]]; then
    log "PASS"
  else
    log "FAILED (exit $rc)"
  fi
  exit $(( RESULT == 0 ? 0 : (rc == 0 ? 1 : rc) ))
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- packages --
missing=()
for p in docker.io docker-compose debootstrap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  [[ $(id -u) -eq 0 ]] || fail "needs root to install ${missing[*]}"
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 900 apt-get update -qq >"$WORK/apt.log" 2>&1 || { tail "$WORK/apt.log"; fail "apt-get update"; }
  timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null \
    >>"$WORK/apt.log" 2>&1 || { tail "$WORK/apt.log"; fail "apt-get install ${missing[*]}"; }
fi
# Debian's client matches Debian's engine; another `docker` may come first on PATH.
DOCKER="${DOCKER:-$( [[ -x /usr/bin/docker ]] && echo /usr/bin/docker || command -v docker )}"
if command -v docker-compose >/dev/null 2>&1; then
  COMPOSE="docker-compose"
else
  COMPOSE="$DOCKER compose"
fi
export DOCKER

# ------------------------------------------------------------------ engine --
if timeout 20 "$DOCKER" info >/dev/null 2>&1; then
  log "using the running Docker engine (${DOCKER_HOST:-default socket})"
else
  [[ $(id -u) -eq 0 ]] || fail "no Docker engine is usable and starting one needs root"
  ENGINE_DIR="$WORK/engine"
  mkdir -p "$ENGINE_DIR/exec"
  DATA_ROOT="${SHOAL_DOCKER_DATA_ROOT:-$ENGINE_DIR/data}"
  mkdir -p "$DATA_ROOT"
  log "starting dockerd (data root $DATA_ROOT)"
  dockerd --data-root "$DATA_ROOT" --exec-root "$ENGINE_DIR/exec" \
    --pidfile "$ENGINE_DIR/dockerd.pid" -H "unix://$ENGINE_DIR/docker.sock" \
    --bridge=none --iptables=false --ip-masq=false >"$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  export DOCKER_HOST="unix://$ENGINE_DIR/docker.sock"
  deadline=$(($(date +%s) + 60))
  until "$DOCKER" info >/dev/null 2>&1; do
    if ! kill -0 "$DOCKERD_PID" 2>/dev/null; then
      tail -n 30 "$WORK/dockerd.log"
      DOCKERD_PID=""
      fail "dockerd exited at start (log above)"
    fi
    [[ $(date +%s) -lt $deadline ]] || { tail -n 30 "$WORK/dockerd.log"; fail "dockerd not ready in 60 s"; }
    sleep 1
  done
  log "dockerd $("$DOCKER" version -f '{{.Server.Version}}') ready"
fi

# -------------------------------------------------------------- base image --
t=$(date +%s)
if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  log "base image $BASE_IMAGE present"
  BASE_HOW="present"
elif timeout 300 "$DOCKER" pull "$BASE_IMAGE" >"$WORK/pull.log" 2>&1; then
  log "pulled $BASE_IMAGE"
  BASE_HOW="docker pull"
else
  log "docker pull $BASE_IMAGE failed ($(tail -n1 "$WORK/pull.log")); building it with debootstrap"
  [[ $(id -u) -eq 0 ]] || fail "debootstrap needs root"
  timeout 1800 bash scripts/build-base-image.sh "$BASE_IMAGE" || fail "scripts/build-base-image.sh"
  BASE_HOW="debootstrap"
fi
elapsed base "$t"

# ------------------------------------------------------------------- image --
t=$(date +%s)
log "docker build -t $IMAGE . (log: build.log; timeout ${BUILD_TIMEOUT}s)"
COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if ! timeout "$BUILD_TIMEOUT" "$DOCKER" build --network host -t "$IMAGE" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg SHOAL_COMMIT="$COMMIT" . >"$WORK/build.log" 2>&1; then
  tail -n 40 "$WORK/build.log"
  fail "docker build"
fi
elapsed build "$t"
# The image's binaries name the commit they were built from.
version=$(timeout 60 "$DOCKER" run --rm --network host "$IMAGE" shoalctl --version) ||
  fail "shoalctl --version in the image"
log "image: $version"
[[ "$version" == *"commit $COMMIT"* ]] || fail "the image's shoalctl --version does not name $COMMIT: $version"
IMAGE_BYTES=$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")
log "built $IMAGE: $((IMAGE_BYTES / 1000000)) MB in ${TIMES[build]}s"
"$DOCKER" run --rm --network none "$IMAGE" id -u | grep -qx 10001 || fail "the image does not run as uid 10001"

# --------------------------------------------------------- host's shoalctl --
case "$BUILD" in /*) BUILD_DIR="$BUILD" ;; *) BUILD_DIR="$ROOT/$BUILD" ;; esac
SHOALCTL="$BUILD_DIR/bin/shoalctl"
if [[ ! -x "$SHOALCTL" || ! -x "$BUILD_DIR/bin/shoal-reflect-call" ]]; then
  log "building $BUILD_DIR/bin/shoalctl and shoal-reflect-call"
  make --no-print-directory configure BUILD="$BUILD_DIR" >/dev/null
  timeout 1800 ninja -C "$BUILD_DIR" shoalctl shoal-reflect-call >"$WORK/shoalctl-build.log" 2>&1 ||
    { tail -n 30 "$WORK/shoalctl-build.log"; fail "building shoalctl"; }
fi

# --------------------------------------------------------------- bad input --
# expect_exit WANT_CODE WANT_TEXT DOCKER_RUN_ARGS...: the container must exit
# with WANT_CODE and print WANT_TEXT.
expect_exit() {
  local want="$1" text="$2" rc=0
  shift 2
  timeout 180 "$DOCKER" run --rm --network none "$@" >"$WORK/bad.log" 2>&1 || rc=$?
  if [[ $rc -ne $want ]] || ! grep -qF -- "$text" "$WORK/bad.log"; then
    sed 's/^/    /' "$WORK/bad.log" | tail -n 5
    fail "docker run $*: exit $rc (want $want), output should contain '$text'"
  fi
  log "  ok: exit $rc, '$(grep -F -m1 -- "$text" "$WORK/bad.log" | cut -c1-150)'"
}
log "bad input: each container must exit non-zero with a clear message"
expect_exit 1 "cannot join the run at coordinator 127.0.0.1:9" "$IMAGE" \
  shoal-worker --coordinator=127.0.0.1:9 --listen=127.0.0.1:0 --connect_timeout=3s
expect_exit 1 "DNS resolution failed for no-such-coordinator:50051" "$IMAGE" \
  shoal-worker --coordinator=no-such-coordinator:50051 --listen=127.0.0.1:0 --connect_timeout=3s
expect_exit 2 "Read-only file system" --read-only "$IMAGE" \
  shoal-checkpoint --listen=127.0.0.1:0 --data_dir=/var/lib/shoal/checkpoints
expect_exit 2 "--data_dir is required" "$IMAGE" shoal-checkpoint --listen=127.0.0.1:0
expect_exit 2 "is not writable" --read-only "$IMAGE" \
  shoal-coordinator --listen=127.0.0.1:0 --state_dir=/var/lib/shoal/coordinator
expect_exit 2 "model.name (--model) must be mlp, cnn, torchscript or module" "$IMAGE" \
  shoal-coordinator --listen=127.0.0.1:0 --model=resnet
expect_exit 2 "unknown flag --min_participant (did you mean --min_participants?)" "$IMAGE" \
  shoal-coordinator --listen=127.0.0.1:0 --min_participant=3
expect_exit 1 "Illegal value 'three' specified for flag 'min_participants'" "$IMAGE" \
  shoal-coordinator --listen=127.0.0.1:0 --min_participants=three

# ----------------------------------------------------------------- cluster --
# free_ports N: N distinct ports free on 127.0.0.1 (all bound at once, then released).
free_ports() {
  "$PY" -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}
# Every server is on the host's network: every port is chosen here, so that
# nothing else on the machine (another run of this script) collides with it.
read -r CPORT CPORT_B KPORT ETCD_PORT ETCD_PEER_PORT CMPORT CMPORT_B KMPORT <<<"$(free_ports 8)"
PROJECT="shoal-test-deploy-$$-$(date +%s)"
# The run config (docs/CONFIG.md): deploy/run.yaml with 2 participants and a
# checkpoint every 5 rounds.
cat >"$WORK/run.yaml" <<'RUN'
model: {name: mlp}
training: {local_steps: 50}
sync: {min_participants: 2, rounds: 0}
checkpoints: {store: "checkpoint:50052", every: 5}
RUN
export SHOAL_IMAGE="$IMAGE" SHOAL_COORDINATOR_PORT="$CPORT" SHOAL_COORDINATOR_B_PORT="$CPORT_B" \
  SHOAL_CHECKPOINT_PORT="$KPORT" SHOAL_ETCD_PORT="$ETCD_PORT" SHOAL_ETCD_PEER_PORT="$ETCD_PEER_PORT" \
  SHOAL_COORDINATOR_METRICS_PORT="$CMPORT" SHOAL_COORDINATOR_B_METRICS_PORT="$CMPORT_B" \
  SHOAL_CHECKPOINT_METRICS_PORT="$KMPORT" SHOAL_LEASE_TTL=3s \
  SHOAL_RUN_ID="$PROJECT" SHOAL_RUN_CONFIG="$WORK/run.yaml" SHOAL_CHECKPOINT_RETAIN=3
COMPOSE_P=($COMPOSE -p "$PROJECT" "${COMPOSE_FILES[@]}")
COORDINATORS="127.0.0.1:$CPORT,127.0.0.1:$CPORT_B"

# The leader's status (shoalctl asks both replicas and prefers the leader's
# answer; a standby's view from the run record when none leads).
status_json() { "$SHOALCTL" status --coordinator="$COORDINATORS" --json --rpc_timeout=5s 2>/dev/null; }
# field EXPR: a Python expression over the status `s` (None when unreachable).
field() {
  status_json | "$PY" -c '
import json, sys
try:
    s = json.load(sys.stdin)
except Exception:
    s = None
print(eval(sys.argv[1]) if s is not None else "")' "$1" 2>/dev/null || true
}
last_round() { local r; r=$(field 'int(s["last_completed_round"])'); echo "${r:-0}"; }
# wait_for DESCRIPTION COMMAND...: until COMMAND succeeds, at most $WAIT s.
wait_for() {
  local what="$1" deadline=$(($(date +%s) + WAIT))
  shift
  until "$@"; do
    [[ $(date +%s) -lt $deadline ]] || fail "timed out after ${WAIT}s: $what"
    sleep 1
  done
}
rounds_at_least() { [[ $(last_round) -ge $1 ]]; }
worker_ids() { "$DOCKER" ps -q --no-trunc --filter "label=com.docker.compose.project=$PROJECT" \
  --filter label=com.docker.compose.service=worker | sort; }
health_of() { "$DOCKER" inspect -f '{{.State.Health.Status}}' "$1" 2>/dev/null; }
service_container() { "${COMPOSE_P[@]}" ps -q "$1" 2>/dev/null | head -n1; }
# The worker id (w1, w2, ...) a container's log says it joined as.
joined_as() { "$DOCKER" logs "$1" 2>&1 | sed -n 's/.* as \(w[0-9][0-9]*\) data_rank=.*/\1/p' | tail -n1; }

t=$(date +%s)
log "compose up: project $PROJECT, etcd 127.0.0.1:$ETCD_PORT, coordinators $COORDINATORS, store 127.0.0.1:$KPORT, 3 workers"
timeout 300 "${COMPOSE_P[@]}" up -d --no-build >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; fail "compose up"; }
wait_for "3 completed rounds" rounds_at_least 3
elapsed rounds3 "$t"
log "3 rounds completed ${TIMES[rounds3]}s after compose up; $(field '"%s workers, model %s" % (s["members"], s["model_hash"][:12])')"
[[ $(worker_ids | wc -l) -eq 3 ]] || fail "expected 3 worker containers"
[[ -z $(service_container net) ]] || fail "the base file's network holder started with the host-network override"

# Round status through server reflection alone, as grpcurl does it (grpcurl is
# not packaged in Debian; shoal-reflect-call carries no Shoal protos).
REFLECT="$BUILD_DIR/bin/shoal-reflect-call"
timeout 30 "$REFLECT" "127.0.0.1:$CPORT" shoal.v1.Coordinator/GetRunStatus >"$WORK/status.json" 2>&1 ||
  { cat "$WORK/status.json"; fail "GetRunStatus through reflection"; }
grep -q '"lastCompletedRound"' "$WORK/status.json" || { cat "$WORK/status.json"; fail "no lastCompletedRound in GetRunStatus"; }
log "GetRunStatus through reflection: $(grep -o '"lastCompletedRound": *"*[0-9]*"*' "$WORK/status.json")"
if command -v grpcurl >/dev/null 2>&1; then
  timeout 30 grpcurl -plaintext "127.0.0.1:$CPORT" shoal.v1.Coordinator/GetRunStatus >/dev/null ||
    fail "grpcurl GetRunStatus"
  log "grpcurl GetRunStatus: ok"
fi

# The image's HEALTHCHECK (shoalctl against the coordinators and the store,
# etcd's /health): a standby is alive, so healthy too.
COORD_C=$(service_container coordinator)
COORD_B_C=$(service_container coordinator-b)
STORE_C=$(service_container checkpoint)
ETCD_C=$(service_container etcd)
[[ -n "$COORD_C" && -n "$COORD_B_C" && -n "$ETCD_C" ]] || fail "expected containers for etcd, coordinator and coordinator-b"
healthy() {
  local c
  for c in "$COORD_C" "$COORD_B_C" "$STORE_C" "$ETCD_C"; do [[ $(health_of "$c") == healthy ]] || return 1; done
}
wait_for "etcd, both coordinators and the store healthy" healthy
log "health checks: etcd $(health_of "$ETCD_C"), coordinator $(health_of "$COORD_C"), coordinator-b $(health_of "$COORD_B_C"), store $(health_of "$STORE_C")"

# ------------------------------------------------------ kill one worker -9 --
VICTIM=$(worker_ids | head -n1)
VICTIM_ID=$(joined_as "$VICTIM")
SURVIVORS=$(for c in $(worker_ids); do [[ $c == "$VICTIM" ]] || joined_as "$c"; done | xargs)
R=$(last_round)
t=$(date +%s)
log "docker kill (SIGKILL) worker ${VICTIM:0:12} ($VICTIM_ID) at round $R"
"$DOCKER" kill "$VICTIM" >/dev/null
wait_for "3 more rounds after the kill" rounds_at_least $((R + 3))
elapsed after_kill "$t"
[[ "$("$DOCKER" inspect -f '{{.State.Running}}' "$VICTIM")" == false ]] || fail "the killed worker runs again"
# The survivors go on in the same run (MEMBERSHIP.md: re-plan among them), not evicted.
SURVIVOR_STATES=$(field "' '.join('%s=%s' % (w['id'], w['state']) for w in s['workers'] if w['id'] in '$SURVIVORS'.split())")
[[ -n "$SURVIVOR_STATES" && "$SURVIVOR_STATES" != *left* && "$SURVIVOR_STATES" != *lost* &&
  "$SURVIVOR_STATES" != *evicted* ]] ||
  fail "the workers that survived the kill were removed: $SURVIVOR_STATES ($(field "'; '.join('%s: %s' % (w['id'], w['reason']) for w in s['workers'] if w['reason'])"))"
log "rounds went on: $(last_round) completed, ${TIMES[after_kill]}s for 3 rounds; $VICTIM_ID is $(field "[w['state'] for w in s['workers'] if w['id'] == '$VICTIM_ID'][0]"), survivors $SURVIVOR_STATES"
"$DOCKER" rm "$VICTIM" >/dev/null

# ------------------------------------------------------ scale up by one --
BEFORE=$(worker_ids)
N=$(($(echo "$BEFORE" | wc -l) + 1))
t=$(date +%s)
log "compose up --scale worker=$N"
timeout 300 "${COMPOSE_P[@]}" up -d --no-build --no-recreate --scale worker=$N >"$WORK/scale.log" 2>&1 ||
  { cat "$WORK/scale.log"; fail "compose up --scale"; }
NEW=$(comm -13 <(echo "$BEFORE") <(worker_ids))
[[ $(echo "$NEW" | grep -c .) -eq 1 ]] || fail "expected exactly one new worker container, got: $NEW"
has_joined() { NEW_ID=$(joined_as "$NEW"); [[ -n "$NEW_ID" ]]; }
wait_for "the new worker to join" has_joined
JOIN_ROUND=$(last_round)
in_step() {
  [[ "$(field "any(w['id'] == '$NEW_ID' and w['state'] not in ('left', 'lost', 'finished', 'evicted')
                   and int(w['model_round']) == int(s['last_completed_round']) > $JOIN_ROUND
                   and w['model_hash'] == s['model_hash'] for w in s['workers'])")" == True ]]
}
wait_for "new worker $NEW_ID to complete a round with the run's model hash" in_step
elapsed scale "$t"
log "new worker $NEW_ID (${NEW:0:12}) joined at round $JOIN_ROUND and holds the run's model (round $(last_round), hash $(field 's["model_hash"][:12]'), ${TIMES[scale]}s)"
log "the workers now: $(field "' '.join('%s=%s' % (w['id'], w['state']) for w in s['workers'])")"

# --------------------------------------------------------- a checkpoint --
has_checkpoint() {
  "$SHOALCTL" checkpoints list --store="127.0.0.1:$KPORT" --run_id="$PROJECT" --json \
    >"$WORK/ckpts.json" 2>/dev/null &&
    CKPT=$("$PY" -c 'import json,sys; l=json.load(open(sys.argv[1])); print(l[0]["id"] if l else "")' \
      "$WORK/ckpts.json") && [[ -n "$CKPT" ]]
}
# One every 5 rounds, so seconds apart; 120 s means uploads do not happen.
deadline=$(($(date +%s) + 120))
until has_checkpoint; do
  [[ $(date +%s) -lt $deadline ]] || fail "no checkpoint of $PROJECT in the store after 120 s \
(coordinator: last checkpoint '$(field 's["checkpoint_id"]')', upload pending: \
'$(field 's["checkpoint_pending"]')', round $(last_round))"
  sleep 1
done
"$SHOALCTL" checkpoints export --store="127.0.0.1:$KPORT" --id="$CKPT" --out="$WORK/model.pt" \
  >"$WORK/export.log" 2>&1 || { cat "$WORK/export.log"; fail "shoalctl checkpoints export"; }
[[ -s "$WORK/model.pt" ]] || fail "the exported checkpoint is empty"
log "checkpoint $CKPT exported through 127.0.0.1:$KPORT ($(stat -c %s "$WORK/model.pt") bytes)"

# ----------------------------------------- SIGTERM: Leave, then exit 0 --
LEAVER=$(worker_ids | head -n1)
LEAVER_ID=$(joined_as "$LEAVER")
log "docker stop (SIGTERM) worker ${LEAVER:0:12} ($LEAVER_ID)"
timeout 60 "$DOCKER" stop -t 30 "$LEAVER" >/dev/null || fail "docker stop"
CODE=$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$LEAVER")
[[ "$CODE" == 0 ]] || fail "a worker stopped with SIGTERM exited $CODE, want 0"
"$DOCKER" logs "$LEAVER" 2>&1 | grep -q "leaving the run" || fail "the stopped worker did not log its Leave"
left() { [[ "$(field "[w['state'] for w in s['workers'] if w['id'] == '$LEAVER_ID']")" == "['left']" ]]; }
wait_for "$LEAVER_ID to show as left" left
log "SIGTERM: $LEAVER_ID left the run and exited 0"

# ------------------------------------------- kill the leading coordinator --
# role_at PORT: the replica_role ("leader" or "standby") the coordinator on
# 127.0.0.1:PORT reports for itself; empty when it does not answer.
role_at() {
  "$SHOALCTL" status --coordinator="127.0.0.1:$1" --json --rpc_timeout=3s 2>/dev/null | "$PY" -c '
import json, sys
try:
    print(json.load(sys.stdin).get("replica_role", ""))
except Exception:
    print("")' 2>/dev/null || true
}
one_leader() {
  ROLE_A=$(role_at "$CPORT")
  ROLE_B=$(role_at "$CPORT_B")
  [[ "$ROLE_A $ROLE_B" == "leader standby" || "$ROLE_A $ROLE_B" == "standby leader" ]]
}
wait_for "one leader and one standby among the coordinators" one_leader
if [[ $ROLE_A == leader ]]; then
  LEADER_C=$COORD_C LEADER_SVC=coordinator LEADER_PORT=$CPORT OTHER_SVC=coordinator-b OTHER_PORT=$CPORT_B
else
  LEADER_C=$COORD_B_C LEADER_SVC=coordinator-b LEADER_PORT=$CPORT_B OTHER_SVC=coordinator OTHER_PORT=$CPORT
fi
# The grpc.health.v1 answer Kubernetes' readiness probe relies on: SERVING
# for shoal.v1.Coordinator on the leader only.
HEALTH_REQ='{"service": "shoal.v1.Coordinator"}'
health_at() {
  timeout 15 "$REFLECT" "127.0.0.1:$1" grpc.health.v1.Health/Check "$HEALTH_REQ" 2>&1 |
    grep -o 'NOT_SERVING\|SERVING' | head -n1
}
[[ $(health_at "$LEADER_PORT") == SERVING && $(health_at "$OTHER_PORT") == NOT_SERVING ]] ||
  fail "health of shoal.v1.Coordinator: leader $(health_at "$LEADER_PORT"), standby $(health_at "$OTHER_PORT") (want SERVING, NOT_SERVING)"
R=$(last_round)
log "leader: $LEADER_SVC (127.0.0.1:$LEADER_PORT, ${LEADER_C:0:12}), standby: $OTHER_SVC; health SERVING / NOT_SERVING; round $R"
KILL_NS=$(date +%s%N)
"$DOCKER" kill "$LEADER_C" >/dev/null
log "docker kill (SIGKILL) the leading coordinator $LEADER_SVC at round $R"
# Polled every 0.2 s (a shoalctl call each), so the failover time is this
# coarse: the first answer "leader" after the kill.
deadline=$(($(date +%s) + WAIT))
until [[ $(role_at "$OTHER_PORT") == leader ]]; do
  [[ $(date +%s) -lt $deadline ]] || fail "timed out after ${WAIT}s: $OTHER_SVC did not take over as leader"
  sleep 0.2
done
LEAD_NS=$(date +%s%N)
wait_for "2 more rounds after the leader was killed" rounds_at_least $((R + 2))
ROUNDS_NS=$(date +%s%N)
[[ "$("$DOCKER" inspect -f '{{.State.Running}}' "$LEADER_C")" == false ]] || fail "the killed coordinator runs again"
[[ $(health_at "$OTHER_PORT") == SERVING ]] || fail "the new leader does not report shoal.v1.Coordinator SERVING"
# Every worker still in the run holds the run's model of the last completed
# round: the same hash everywhere (the replicas' promise: no repeat, no fork).
# AGREED keeps the one status that showed it, for the log.
RUNNING_WORKERS=$(worker_ids | wc -l)
hashes_agree() {
  AGREED=$(status_json | "$PY" -c '
import json, sys
s = json.load(sys.stdin)
act = [w for w in s["workers"] if w["state"] not in ("left", "lost", "finished", "evicted")]
last = int(s["last_completed_round"])
if len(act) == int(sys.argv[1]) and all(
        int(w["model_round"]) == last and w["model_hash"] == s["model_hash"] for w in act):
    print("round %d, %s" % (last, " ".join("%s=%s" % (w["id"], w["model_hash"][:12]) for w in act)))
' "$RUNNING_WORKERS" 2>/dev/null || true)
  [[ -n "$AGREED" ]]
}
wait_for "the $RUNNING_WORKERS workers to hold the run's model after the failover" hashes_agree
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
TIMES[failover]=$(secs "$KILL_NS" "$LEAD_NS")
TIMES[failover_rounds]=$(secs "$KILL_NS" "$ROUNDS_NS")
log "the workers agree (one status): $AGREED"
log "failover: $OTHER_SVC leads ${TIMES[failover]}s after the leader was killed (lease ttl $SHOAL_LEASE_TTL); round $((R + 2)) completed ${TIMES[failover_rounds]}s after the kill (now $(last_round))"

RESULT=0
log "summary: base image (${BASE_HOW}) ${TIMES[base]}s, image build ${TIMES[build]}s, image $((IMAGE_BYTES / 1000000)) MB, up to round 3 ${TIMES[rounds3]}s, 3 rounds after kill ${TIMES[after_kill]}s, scale-up to in-step ${TIMES[scale]}s, leader failover ${TIMES[failover]}s (2 rounds ${TIMES[failover_rounds]}s), total $(($(date +%s) - START))s"
