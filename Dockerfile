# Stagedoor checkout: one image with both binaries, each built apart: the
# service without the embedded Payrail sandbox (it cannot fake a charge), and
# `payrail-sandbox` from its own crate for compose.
#   docker build -t stagedoor-checkout .
# ENTRYPOINT is the service (`serve` by default); the compose file runs
# `payrail-sandbox` from the same image by overriding the entrypoint.
#
# Stages: chef (the toolchain + cargo-chef) -> planner (a recipe of the
# dependencies) -> builder (dependencies first, in a layer that only changes
# with Cargo.toml/Cargo.lock, then our code) -> runtime (slim, non-root).

# The toolchain this project is built and tested with (rustc 1.95).
FROM rust:1.95.0-slim-bookworm AS chef
# A debug build: cargo-chef only plans and drives cargo, which a debug build
# does as well, and it compiles in less time than a release one.
RUN cargo install cargo-chef --debug --locked --version 0.1.78
WORKDIR /app

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /app/recipe.json recipe.json
# Dependencies only: cached until a Cargo.toml or Cargo.lock changes. Cooked
# for exactly the packages and features built below, so that the build
# reuses every one of them.
RUN cargo chef cook --release --locked --no-default-features \
    -p stagedoor-checkout -p payrail-sandbox --recipe-path recipe.json
COPY . .
RUN cargo build --release --locked --no-default-features \
    -p stagedoor-checkout -p payrail-sandbox --bin stagedoor-checkout --bin payrail-sandbox

FROM debian:bookworm-slim AS runtime
# ca-certificates: the roots that Payrail's HTTPS certificate is checked
# against. curl is for the HEALTHCHECK and nothing else. Versions are left to
# the bookworm security archive (pinned versions disappear from it), hence
# DL3008.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin stagedoor \
    && install -d -o 10001 -g 10001 -m 0755 /app/secrets
# /app/secrets is where docker-compose.yml mounts the stack's generated
# secrets: a fresh volume takes this directory's owner, so that the service's
# user can write them. Empty in the image, which holds no secret.
WORKDIR /app
COPY --from=builder /app/target/release/stagedoor-checkout /app/target/release/payrail-sandbox /usr/local/bin/
# The service reads ./config (WORKDIR) or STAGEDOOR_CONFIG_DIR; no file there
# holds a secret (config/local.toml, the development layer, is left out by
# .dockerignore): they come from the environment or files it names (see
# docs/OPERATIONS.md, Deploy).
COPY config ./config
ENV STAGEDOOR_ENV=production \
    STAGEDOOR_CONFIG_DIR=/app/config
# stagedoor, numeric so that an orchestrator's runAsNonRoot can verify it.
USER 10001:10001
# No EXPOSE: two programs run from this image on two ports, the service on
# server.port (8080) and payrail-sandbox on its --port (8081 in
# docker-compose.yml). Every container of an image inherits the image's
# EXPOSE and nothing at run time can remove it, so an EXPOSE 8080 here
# would have the sandbox's container advertise a port it never listens on.
# Each container declares its own instead: `expose:`/`ports:` in
# docker-compose.yml, `-p 8080:8080` with docker run, containerPort in a pod.
# SIGTERM: stop accepting, drain in-flight requests, stop the jobs, exit 0.
STOPSIGNAL SIGTERM
# No image sets its open-files limit: the runtime does (`ulimits: nofile` in
# docker-compose.yml, `--ulimit nofile=65536:65536` with docker run, the
# node's limits in a pod). `serve` raises its soft limit to that hard one
# at start and logs both (`open files: ...`).
# Liveness on /healthz (no database involved) of the default program, the
# service on 8080. Whoever moves server.port overrides this too, as
# docker-compose.yml does for payrail-sandbox.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["stagedoor-checkout"]
CMD ["serve"]
