#!/usr/bin/env bash
# Installs the Debian packages Shoal needs to build, test and run.
# Idempotent and non-interactive; everything comes from Debian's apt archive.
#   scripts/install-deps.sh           build + test + demo packages
#   scripts/install-deps.sh --bench   also what the benchmarks compare against
#   scripts/install-deps.sh --image   only what building the binaries needs (Dockerfile)
#   scripts/install-deps.sh --fuzz    also clang and its libFuzzer runtime (make fuzz)
#   scripts/install-deps.sh --soak    also matplotlib for the soak's plot (make soak)
# Flags combine: scripts/install-deps.sh --fuzz --soak installs both sets.
set -euo pipefail

FLAGS=("$@")
for f in "${FLAGS[@]}"; do
  case "$f" in
    --bench | --image | --fuzz | --soak) ;;
    *)
      echo "install-deps: unknown flag '$f' (--bench, --image, --fuzz, --soak)" >&2
      exit 2
      ;;
  esac
done
# True when the flag was given (anywhere among the arguments).
want() {
  local f
  for f in "${FLAGS[@]}"; do [[ "$f" == "$1" ]] && return 0; done
  return 1
}

PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libssl-dev zlib1g-dev
  libtorch-dev libopenblas0-pthread libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist python3-torch
  clang-format iproute2 procps grpc-proto
  python3-yaml
  prometheus-cpp-dev
  # The coordinator's run config file (--config, docs/CONFIG.md): YAML and JSON.
  libyaml-cpp-dev
  # The HTTP endpoint of /metrics and the coordinator's web page
  # (common/http_endpoint.h): cpp-httplib built with OpenSSL.
  libcpp-httplib-dev
  # etcd's v3 API .proto files (and the two packages of protos they import):
  # the coordinator's etcd client is generated from them at build time.
  golang-etcd-server-dev golang-github-gogo-protobuf-dev golang-github-grpc-ecosystem-grpc-gateway-dev
)
# Servers the tests start (a real Prometheus scrapes the metrics e2e test);
# the image build (Dockerfile: --image) does not need them.
if ! want --image; then
  PKGS+=(prometheus)
  # Real etcd members (and etcdctl) for the coordinator-replica tests.
  PKGS+=(etcd-server etcd-client)
  # Headless Chromium loads the coordinator's web page in its e2e test.
  PKGS+=(chromium)
  # The Python module (python/, docs/PYTHON.md), its tests, and the char LM
  # example's text.
  PKGS+=(pybind11-dev python3-dev python3-pytest fortunes)
  # `pip install --no-build-isolation .` offline (pyproject.toml, setup.py),
  # into a venv too, and `python3 -m build --wheel --no-isolation`.
  PKGS+=(python3-pip python3-venv python3-setuptools python3-wheel python3-build)
  # The NAT router of tests/support/two_sites.sh --nat (supernode_netns_test,
  # make soak) and the soak's blackholed peer port.
  PKGS+=(iptables)
fi
# `kubectl kustomize` renders deploy/k8s in the tests. Debian's kubernetes-client
# provides kubectl; it cannot be installed over another package's kubectl
# (dpkg refuses to overwrite /usr/bin/kubectl), and any kubectl with kustomize will do.
if ! command -v kubectl >/dev/null 2>&1; then
  PKGS+=(kubernetes-client)
fi
if want --bench; then
  # bench/scale's plot (bench/run.sh scale) with Debian's matplotlib.
  PKGS+=(linux-perf valgrind python3-matplotlib)
fi
# bookworm's clang is clang 14; libclang-rt-14-dev ships libFuzzer
# (libclang_rt.fuzzer*.a) and the sanitizer runtimes.
if want --fuzz; then
  PKGS+=(clang libclang-rt-14-dev)
fi
# The soak's report plots (tests/soak/soak.py) with Debian's matplotlib for
# /usr/bin/python3, and reads etcd's /metrics inside the namespace with curl.
if want --soak; then
  PKGS+=(python3-matplotlib curl)
fi

# INSTALL_DEPS_LIST=1: print the packages these flags select, one a line, and
# install nothing (tests/soak/test_soak_tools.py checks the flags with it).
if [[ "${INSTALL_DEPS_LIST:-0}" == "1" ]]; then
  printf '%s\n' "${PKGS[@]}"
  exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null

# LibTorch on CPU must use OpenBLAS: Debian's reference BLAS is ~20x slower.
if [[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ]]; then
  $SUDO update-alternatives --set libblas.so.3-x86_64-linux-gnu \
    /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 >/dev/null 2>&1 || true
  $SUDO update-alternatives --set liblapack.so.3-x86_64-linux-gnu \
    /usr/lib/x86_64-linux-gnu/openblas-pthread/liblapack.so.3 >/dev/null 2>&1 || true
fi
echo "install-deps: done"
