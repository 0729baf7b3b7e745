#!/usr/bin/env bash
# Build, once, actionlint (GitHub Actions workflow linter) from its Go module, CGO_ENABLED=0, into
#   ${FLOTILLA_CACHE:-$HOME/.cache/flotilla}/actionlint-<version>/actionlint
# and print its path. A cached binary is reused (milliseconds); a fresh build takes about a minute.
set -euo pipefail
version="${FLOTILLA_ACTIONLINT_VERSION:-v1.7.12}"
FLOTILLA_CACHE="${FLOTILLA_CACHE:-${HOME}/.cache/flotilla}"
dir="${FLOTILLA_CACHE}/actionlint-${version}"
if [[ ! -x "${dir}/actionlint" ]]; then
  command -v go >/dev/null || { echo "build-actionlint: go is not on PATH" >&2; exit 1; }
  mkdir -p "${dir}"
  tmp=$(mktemp -d "${dir}/.tmp.XXXXXX")
  trap 'rm -rf "${tmp}"' EXIT
  echo "build-actionlint: go install github.com/rhysd/actionlint/cmd/actionlint@${version} (once)" >&2
  CGO_ENABLED=0 GOBIN="${tmp}" go install -trimpath -ldflags "-s -w" "github.com/rhysd/actionlint/cmd/actionlint@${version}"
  mv "${tmp}/actionlint" "${dir}/actionlint"
fi
echo "${dir}/actionlint"
