# Shoal: one image with shoal-coordinator, shoal-worker, shoal-checkpoint and
# shoalctl, plus Debian's etcd (the store of coordinator replicas,
# docs/REPLICAS.md), so that no other image is needed (deploy/README.md).
# Classic-builder compatible (no BuildKit-only syntax), so docker 20.10 and
# docker-compose 1.29 build it as well.
#
#   docker build -t shoal:latest .
#   docker run --rm -p 50051:50051 shoal:latest            # a coordinator
#   docker run --rm shoal:latest shoal-worker --help        # any binary
#
# BASE_IMAGE must be Debian bookworm (the runtime packages are bookworm's);
# scripts/build-base-image.sh builds one offline when Docker Hub is out of reach.
ARG BASE_IMAGE=debian:bookworm

# ---- build: the project's own install-deps.sh, then only the four binaries ----
FROM ${BASE_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# Its own layer: rebuilt only when the package list changes.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh --image && rm -rf /var/lib/apt/lists/*
COPY . .
ARG BUILD_TYPE=RelWithDebInfo
# What --version names: the image has no git history (.dockerignore), so the
# build passes the commit (scripts/test-deploy.sh does).
ARG SHOAL_COMMIT=unknown
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE} \
      -DSHOAL_TEST_TIERS= -DSHOAL_PYTHON=OFF -DCCACHE_PROGRAM=OFF -DSHOAL_COMMIT=${SHOAL_COMMIT} \
 && ninja -C /build shoal-coordinator shoal-worker shoal-checkpoint shoalctl \
 && mkdir -p /out \
 && for b in shoal-coordinator shoal-worker shoal-checkpoint shoalctl; do \
      strip --strip-unneeded -o /out/$b /build/bin/$b; \
    done

# ---- runtime: Debian's runtime libraries, the binaries, Fashion-MNIST ----
FROM ${BASE_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
# OpenBLAS first, so that it (not the reference BLAS, ~20x slower) provides
# libblas.so.3 / liblapack.so.3 for LibTorch.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libopenblas0-pthread \
 && apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libtorch1.13 zlib1g libssl3 \
      libprometheus-cpp-core1.0 libyaml-cpp0.7 libcpp-httplib0.11 \
      dataset-fashion-mnist \
      etcd-server \
 && update-alternatives --set libblas.so.3-x86_64-linux-gnu \
      /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
 && update-alternatives --set liblapack.so.3-x86_64-linux-gnu \
      /usr/lib/x86_64-linux-gnu/openblas-pthread/liblapack.so.3 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log

# Non-root. /var/lib/shoal/{coordinator,checkpoints,etcd} belong to it so that
# a named volume mounted there starts out writable (etcd wants its data
# directory private: 0700).
RUN groupadd --system --gid 10001 shoal \
 && useradd --system --uid 10001 --gid shoal --home-dir /var/lib/shoal \
      --no-create-home --shell /usr/sbin/nologin shoal \
 && install -d -o shoal -g shoal -m 0750 /var/lib/shoal /var/lib/shoal/coordinator \
      /var/lib/shoal/checkpoints \
 && install -d -o shoal -g shoal -m 0700 /var/lib/shoal/etcd

COPY --from=build /out/ /usr/local/bin/
# Fails the build when a runtime library is missing.
RUN ! ldd /usr/local/bin/shoal-coordinator /usr/local/bin/shoal-worker \
        /usr/local/bin/shoal-checkpoint /usr/local/bin/shoalctl | grep 'not found' \
 && shoal-coordinator --version >/dev/null && shoal-worker --version >/dev/null \
 && etcd --version >/dev/null \
 && test -s /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

USER 10001:10001
WORKDIR /var/lib/shoal
# coordinator, checkpoint store, worker peer service, etcd client and peer
EXPOSE 50051 50052 50060 2379 2380

# Checks whichever server is PID 1 on its default port (override with
# SHOAL_HEALTH_PORT): the coordinator and the store through shoalctl (a real
# gRPC call; a standby coordinator answers too, it is alive), a worker by
# connecting to its peer port, etcd by its /health (true only with a quorum).
HEALTHCHECK --interval=10s --timeout=6s --start-period=60s --retries=3 \
  CMD case "$(cat /proc/1/comm)" in \
        shoal-worker) exec bash -c "exec 3<>/dev/tcp/127.0.0.1/${SHOAL_HEALTH_PORT:-50060}" ;; \
        shoal-checkpoi*) exec shoalctl checkpoints list --store=127.0.0.1:${SHOAL_HEALTH_PORT:-50052} --rpc_timeout=5s >/dev/null ;; \
        etcd) exec bash -c "exec 3<>/dev/tcp/127.0.0.1/${SHOAL_HEALTH_PORT:-2379} && printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q '\"health\":\"true\"' <&3" ;; \
        *) exec shoalctl status --coordinator=127.0.0.1:${SHOAL_HEALTH_PORT:-50051} --rpc_timeout=5s >/dev/null ;; \
      esac

CMD ["shoal-coordinator", "--listen=0.0.0.0:50051", "--state_dir=/var/lib/shoal/coordinator"]
