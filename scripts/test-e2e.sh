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
# keeps the feature set of the main `cargo test --workspace`, so nothing is built twice.
cargo test --workspace --locked --test e2e_apply --test e2e_cluster --test e2e_deployment --test e2e_cache --test e2e_gateway --test e2e_claim --test e2e_datapath --test e2e_cli -- --ignored --test-threads=1
