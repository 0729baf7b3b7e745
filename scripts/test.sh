#!/usr/bin/env bash
# The project's test command (README, CI). Runs every tier that exists:
#   1. formatting, then lints (clippy with the workspace's deny lints, run by the test build),
#   2. unit, property, snapshot and integration tests of every crate (cargo test),
#   3. end-to-end tests on real API servers started by tests/e2e/harness (scripts/test-e2e.sh).
# Anything a tier needs is installed by scripts/setup.sh, which this calls first.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

step() { printf '\n==> %s (at %d s)\n' "$*" "$SECONDS"; }

# Property tests draw new random cases on every run (set PROPTEST_RNG_SEED to repeat one); a
# failure names its fleet (`GenSpec`). A deep run:
# PROPTEST_RNG_SEED=$RANDOM PROPTEST_CASES=2000 cargo test -p flotilla-placement --test properties

# The Go-built tools of the later tiers (kube-apiserver & co., etcd, kwok for the e2e harness;
# helm, kube-state-metrics, the rule checker for the chart tests, actionlint) build in the background while
# cargo compiles: on a fresh machine their module downloads and builds overlap the Rust build;
# on a warm one each is cached and this takes about a second. Tests run only after it is done,
# so no test shares the cores with a build.
prebuild_log=$(mktemp)
(
  bash tests/e2e/harness/build.sh >/dev/null
  bash tests/helm/build-helm.sh >/dev/null
  bash tests/helm/build-ksm.sh >/dev/null
  bash tests/helm/build-rulecheck.sh >/dev/null
  bash tests/images/build-actionlint.sh >/dev/null
  bash scripts/build-llama-server.sh >/dev/null  # the real engine of tests/gateway/test_real_engine.py
) >"${prebuild_log}" 2>&1 &
prebuild=$!
wait_prebuild() {
  if ! wait "${prebuild}"; then
    echo "test.sh: building the Go tools failed:" >&2
    cat "${prebuild_log}" >&2
    exit 1
  fi
}

step "cargo fmt --check"
cargo fmt --all -- --check

# clippy's lints run inside the test build: clippy-driver is the workspace's rustc wrapper, as
# `cargo clippy` itself sets it, with warnings as errors (`cargo clippy -- -D warnings` passes the
# same CLIPPY_ARGS). `cargo clippy` on its own would compile every dependency a second time,
# metadata only (the AWS SDK among them): on a fresh machine that was a quarter of the run. The
# dependencies are compiled by plain rustc, as cargo clippy does. Every later cargo command of
# this script keeps the wrapper, so nothing is built twice.
export RUSTC_WORKSPACE_WRAPPER="${RUSTC_WORKSPACE_WRAPPER:-$(rustc --print sysroot)/bin/clippy-driver}"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

step "cargo clippy (warnings are errors) and the test build: cargo test --workspace --all-targets --no-run"
cargo test --workspace --all-targets --locked --no-run

step "cargo test --workspace"
# The binaries the later tiers run (controller, gateway, simulator, fleetctl) are built now with
# the workspace's feature set; scripts that would build them again with `-p` (another feature
# set: aws-sdk-ec2 and friends compiled a second time) use these instead.
export FLOTILLA_PREBUILT=1
wait_prebuild
cargo test --workspace --locked

step "gateway: the official openai Python client against the gateway"
bash scripts/gateway-pytest.sh

bash scripts/test-ship.sh  # Helm chart, Argo CD health checks, GitOps examples, chart RBAC on a harness cluster
step "end-to-end tests on real API servers (tests/e2e/harness)"
bash scripts/test-e2e.sh

step "the local fleet demo, unattended, kept running (FLOTILLA_DEMO_KEEP=1), its transcript in docs/quickstart.md; then checked and stopped"
# The kept fleet must run and answer (eu-fra-1 started again), and `--stop` must leave nothing
# of it running; the default mode tears down with the same code at its end.
demo=0
{ FLOTILLA_DEMO_KEEP=1 bash scripts/demo.sh --check-docs && bash scripts/demo.sh --check-kept; } || demo=$?
bash scripts/demo.sh --stop
(( demo == 0 )) || exit "${demo}"

step "fleetctl validate + plan on examples/fleet (the README's main command)"
cargo run -q --locked -p fleetctl -- validate -f examples/fleet
# (exit 2: the example's search team is over its FleetQuota on purpose, one replica unplaced)
plan_rc=0
cargo run -q --locked -p fleetctl -- plan -f examples/fleet || plan_rc=$?
(( plan_rc == 2 )) || { echo "fleetctl plan -f examples/fleet: exit ${plan_rc}, expected 2 (one replica held back by a quota)" >&2; exit 1; }
