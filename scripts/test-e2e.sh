#!/usr/bin/env bash
# End-to-end tests on real API servers. Builds the Kubernetes binaries once (cached under
# ${FLOTILLA_CACHE:-~/.cache/flotilla}; minutes on a fresh machine, nothing afterwards), then
# runs the tests marked `#[ignore = "needs the e2e harness ..."]`; each test starts and tears
# down its own clusters (tests/e2e/harness). A harness that cannot start fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
bin_dir=$(bash tests/e2e/harness/build.sh)
echo "e2e: Kubernetes binaries in ${bin_dir} ($(( $(date +%s) - start )) s)"
# The tests render the chart's controller RBAC with it (tests/e2e/README.md, "Identities").
helm=$(bash tests/helm/build-helm.sh)
echo "e2e: helm ${helm} ($(( $(date +%s) - start )) s)"

# One test binary at a time, one test at a time: each brings up several clusters. `--workspace`
# keeps the feature set of the main `cargo test --workspace`, so nothing is built twice (the
# first call builds; the others find everything fresh).
# Each binary gets a bound (FLOTILLA_E2E_TEST_TIMEOUT seconds, default 900; the slowest takes about
# 300): a test that hangs instead of failing is stopped, with its process group, and named, so
# one stuck test costs the run minutes, not the CI's whole limit.
limit="${FLOTILLA_E2E_TEST_TIMEOUT:-900}"
failed=()
for t in e2e_apply e2e_cluster e2e_deployment e2e_cache e2e_gateway e2e_claim e2e_datapath e2e_cli; do
  rc=0
  timeout --kill-after=30 "${limit}" cargo test --workspace --locked --test "${t}" -- --ignored --test-threads=1 || rc=$?
  if (( rc == 124 || rc == 137 )); then
    echo "e2e: ${t} did not finish within ${limit} s (FLOTILLA_E2E_TEST_TIMEOUT): stopped" >&2
    failed+=("${t} (timed out)")
  elif (( rc != 0 )); then
    failed+=("${t}")
  fi
done
if (( ${#failed[@]} > 0 )); then
  echo "e2e: failed: ${failed[*]}" >&2
  exit 1
fi
echo "e2e: all passed in $(( $(date +%s) - start )) s"
