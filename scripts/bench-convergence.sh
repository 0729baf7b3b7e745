#!/usr/bin/env bash
# Scale benchmark of the controllers on real API servers (not a test): ModelDeployments over
# kwok member clusters (controllers/tests/bench_convergence.rs says what it measures), in two
# phases on the same members in one run:
#   1. the baseline (controllers/tests/bench/baseline.rs): the very objects Flotilla would
#      render (the controller's solver on the capacity its inventory code reads, render.rs, its
#      writer), applied straight to the members with the controller's parallelism, until their
#      pods are Ready; then the member phase 2 stops is stopped and what a re-plan without it
#      moves is applied, until Ready elsewhere; then every baseline object is deleted (and
#      waited for) and the member started again;
#   2. Flotilla: the ModelDeployments applied to the control cluster, the controller running,
#      until all Ready; ModelCaches staged; a steady window with inventory churn (node labels,
#      ResourceSlice republications) on some members; the same member's outage; its recovery.
# Prints the Markdown rows for docs/benchmarks.md ("The controller at fleet scale"): the ratio
# row (Flotilla's convergence and outage as multiples of the baseline's, the controller's CPU
# seconds per 1,000 deployments, its LISTs and writes per minute in the steady window), the
# baseline's row, the windows, the cores, the outage and the steady window's LISTs and writes
# per minute per API server. Copy them with the date and the machine's load. The whole output
# (every LIST and write per API server, the timelines) stays in the log it names.
#
# Scale, by environment (defaults: the issue's full scale, 21 API servers at once):
#   FLOTILLA_BENCH_MEMBERS=20 FLOTILLA_BENCH_DEPLOYMENTS=1000 FLOTILLA_BENCH_NODES=50
#   FLOTILLA_BENCH_STEADY_SECONDS=300 FLOTILLA_BENCH_SETTLE_SECONDS=30
#   FLOTILLA_BENCH_POLL_SECONDS=10 FLOTILLA_BENCH_TIMEOUT_SECONDS=900
#   FLOTILLA_BENCH_DEPLOYMENT_CONCURRENCY=32 (the controller's --deployment-concurrency, and the
#   baseline's: that many deployments written at a time)
#   FLOTILLA_BENCH_CACHES=4 (ModelCaches, two members each, Ready before the steady window)
#   FLOTILLA_BENCH_CHURN_MEMBERS=2 FLOTILLA_BENCH_CHURN_SECONDS=5 (inventory churn in the steady
#   window: one node label and one ResourceSlice's pool generation per member and period)
#   FLOTILLA_BENCH_PROFILE=release (default) builds the controller optimised, as a release is,
#   without the AWS provider (cargo feature `aws` off: the SDK is not compiled; the benchmark
#   uses no cloud); `debug` uses
#   the workspace's debug build with every feature (the figures before 2026-12-04).
#   FLOTILLA_BENCH_LEAN=1 (default) starts the harness's clusters lean (FLOTILLA_E2E_LEAN in
#   tests/e2e/harness/up.sh: only the controller-manager's controllers the members need, etcd
#   without fsync), so that 21 clusters on one machine leave it cores for the controller;
#   0 starts them as the e2e tests do (the figures before 2026-12-06).
# The full scale, on a machine with nothing else running:
#   FLOTILLA_BENCH_MEMBERS=20 FLOTILLA_BENCH_DEPLOYMENTS=1000 FLOTILLA_BENCH_NODES=50 \
#     FLOTILLA_BENCH_DEPLOYMENT_CONCURRENCY=128 FLOTILLA_BENCH_STEADY_SECONDS=60 \
#     scripts/bench-convergence.sh
# A small development run (a few minutes; the debug build the tests already made):
#   FLOTILLA_BENCH_MEMBERS=3 FLOTILLA_BENCH_DEPLOYMENTS=60 FLOTILLA_BENCH_NODES=20 \
#     FLOTILLA_BENCH_STEADY_SECONDS=60 FLOTILLA_BENCH_PROFILE=debug scripts/bench-convergence.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/e2e/harness/build.sh >/dev/null
log="${FLOTILLA_BENCH_LOG:-${TMPDIR:-/tmp}/flotilla-bench-convergence.log}"
echo "full output: ${log}" >&2
case "${FLOTILLA_BENCH_PROFILE:-release}" in
  release) build=(--release --no-default-features) ;;
  debug) build=() ;;
  *) echo "FLOTILLA_BENCH_PROFILE: release or debug, not ${FLOTILLA_BENCH_PROFILE}" >&2; exit 2 ;;
esac
# Built before the clusters start, so no compile shares the cores with the measurement.
CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" cargo test "${build[@]}" -p flotilla-controllers --locked \
  --test bench_convergence --no-run
echo "# controller build: ${FLOTILLA_BENCH_PROFILE:-release} (${build[*]:-debug, default features})" >"${log}"
case "${FLOTILLA_BENCH_LEAN:-1}" in
  1) export FLOTILLA_E2E_LEAN=1; echo "# clusters: lean (FLOTILLA_E2E_LEAN)" >>"${log}" ;;
  0) unset FLOTILLA_E2E_LEAN; echo "# clusters: as in the e2e tests" >>"${log}" ;;
  *) echo "FLOTILLA_BENCH_LEAN: 1 or 0, not ${FLOTILLA_BENCH_LEAN}" >&2; exit 2 ;;
esac
cargo test "${build[@]}" -p flotilla-controllers --locked --test bench_convergence \
  -- --ignored --nocapture >>"${log}" 2>&1 || true
grep -E '^(\| |# )' "${log}" || true
grep -q '^| member stopped' "${log}" && grep -q '^| baseline: the same objects' "${log}" || {
  echo "the benchmark did not finish; see ${log}" >&2
  exit 1
}
