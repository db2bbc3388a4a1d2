# Shoal: the two commands are `make demo` and `make test`.
# Sanitizer builds (docs/SECURITY.md, "Sanitizers"):
#   make test SANITIZE=address,undefined   (ON is an alias) in build-asan
#   make test-unit test-integration SANITIZE=thread               in build-tsan
# Each in a build directory of its own unless BUILD is given.
SANITIZE   ?= OFF
ifeq ($(SANITIZE),ON)
override SANITIZE := address,undefined
endif
ifeq ($(SANITIZE),OFF)
BUILD      ?= build
else ifneq ($(findstring thread,$(SANITIZE)),)
BUILD      ?= build-tsan
else
BUILD      ?= build-asan
endif
BUILD_TYPE ?= RelWithDebInfo
ifneq ($(SANITIZE),OFF)
# No leak report at exit: Debian's uninstrumented gRPC and LibTorch keep
# process-lifetime allocations. UBSan stops at its first report (it only
# prints by default, and the test would pass).
export ASAN_OPTIONS  ?= detect_leaks=0
export UBSAN_OPTIONS ?= halt_on_error=1:print_stacktrace=1
# ThreadSanitizer: the suppressions (one reason each) cover reports inside
# uninstrumented Debian libraries only; OpenMP's barriers are invisible to
# it, so Torch runs its kernels on one thread.
export TSAN_OPTIONS  ?= suppressions=$(CURDIR)/tests/sanitizers/tsan.supp second_deadlock_stack=1 halt_on_error=0
ifneq ($(findstring thread,$(SANITIZE)),)
export OMP_NUM_THREADS ?= 1
endif
endif
CMAKE_FLAGS ?=

.PHONY: all deps configure build config-doc demo test test-unit test-integration test-e2e test-deploy chaos soak bench results fuzz format clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DSHOAL_SANITIZE=$(SANITIZE) $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 || \
	  { cat $(BUILD).configure.log; exit 1; }

build: configure
	@ninja -C $(BUILD)

# docs/CONFIG.md's tables of keys and refusals, rewritten from RunConfig's
# `setting` options (protos/shoal/v1/coordinator.proto) and the validator's
# table; run_config_settings_test fails while the file is stale.
config-doc: configure
	@ninja -C $(BUILD) shoal-config-gen
	@$(BUILD)/bin/shoal-config-gen doc docs/CONFIG.md

# Coordinator + 3 workers on 127.0.0.1, Fashion-MNIST, progress per round,
# one summary line with test_accuracy=... at the end.
demo: build
	@bash scripts/demo.sh $(BUILD)/bin

# Every tier: unit, integration, e2e (e2e tests run one at a time).
test: build
	@cd $(BUILD) && ctest --output-on-failure -j2 --timeout 900

test-unit: build
	@cd $(BUILD) && ctest --output-on-failure -j2 -L unit

test-integration: build
	@cd $(BUILD) && ctest --output-on-failure -j2 -L integration

test-e2e: build
	@cd $(BUILD) && ctest --output-on-failure -L e2e

# The image, docker-compose on host networking with two coordinator replicas on
# etcd, a killed and an added worker, a killed leader (scripts/test-deploy.sh). Needs root; starts and stops its own Docker engine;
# 5-10 minutes (base image + image build): not part of `make test`; .ci/run
# runs it after `make test`.
test-deploy:
	@BUILD=$(BUILD) bash scripts/test-deploy.sh

# Random kills, stops, joins and coordinator restarts for CHAOS_SECONDS
# (default 180) with 6 workers; prints rounds, longest stall, agreement.
CHAOS_SECONDS ?= 180
chaos: build
	@$(BUILD)/bin/shoal-chaos --bin_dir=$(BUILD)/bin --seconds=$(CHAOS_SECONDS)

# Every feature at once under a fault schedule drawn from SOAK_SEED for
# SOAK_MINUTES (default 60; docs/SOAK.md): TLS + token, replicas on a 3-member
# etcd, two sites in network namespaces (zones, hierarchy, relay, a worker
# behind NAT), int8 + Nesterov, checkpoints. Needs root. Ends with one
# `soak: ... result=PASS|FAIL` line; the report goes to SOAK_OUT (default a new
# /tmp/shoal-soak-report-XXXXXX).
SOAK_MINUTES ?= 60
SOAK_SEED    ?= 1
SOAK_OUT     ?=
soak: build
	@bash scripts/install-deps.sh --soak
	@/usr/bin/python3 tests/soak/soak.py --bin=$(BUILD)/bin --minutes=$(SOAK_MINUTES) \
	  --seed=$(SOAK_SEED) $(if $(SOAK_OUT),--out=$(SOAK_OUT))

# Benchmarks (issue #6): stream, exchange, latejoin, coordinator, micro,
# demo; tables and `NAME: ... ratio=...` lines. Each arm's last line is
# recorded in bench/results.jsonl and bench/RESULTS.md's table rendered again.
# About 10 minutes on 2 cores. One benchmark: bash bench/run.sh NAME.
bench: build
	@BUILD=$(BUILD) bash bench/run.sh all

# bench/RESULTS.md's table, rendered again from bench/results.jsonl (after
# editing a record or a goal in bench/results.py).
results:
	@/usr/bin/python3 bench/results.py render

# libFuzzer targets of every decoder of untrusted bytes (tests/fuzz,
# docs/SECURITY.md): a clang build in $(FUZZ_BUILD), each target run for
# FUZZ_SECONDS (default 60) from its committed corpus; prints executions
# and crashes per target. FUZZ_JOBS=2 runs two targets at once (one core
# each); FUZZ_MERGE=1 merges the new inputs into tests/fuzz/corpus. Not part
# of `make test`.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
fuzz:
	@bash scripts/install-deps.sh --fuzz
	@cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=clang++ -DSHOAL_FUZZ=ON -DSHOAL_TEST_TIERS= \
	  > $(FUZZ_BUILD).configure.log 2>&1 || { cat $(FUZZ_BUILD).configure.log; exit 1; }
	@ninja -C $(FUZZ_BUILD) fuzzers
	@bash tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

format:
	@clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
