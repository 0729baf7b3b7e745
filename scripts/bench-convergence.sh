#!/usr/bin/env bash
# Convergence benchmark of the controllers on real API servers (not a test): 200
# ModelDeployments over 5 kwok member clusters. Prints one Markdown table row; copy it into
# docs/benchmarks.md ("Controllers" section) together with the date and the machine's load.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/e2e/harness/build.sh >/dev/null
cargo test --workspace --locked --test bench_convergence -- --ignored --nocapture 2>&1 | grep '^| ' || {
  echo "the benchmark did not finish; rerun with --nocapture to see why" >&2
  exit 1
}
