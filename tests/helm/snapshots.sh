#!/usr/bin/env bash
# Chart checks that need no cluster: `helm lint --strict` and `helm template` for each values
# file in tests/helm/values/ (plus the defaults), diffed against the rendered YAML committed
# in tests/helm/snapshots/<case>.yaml; every file in tests/helm/invalid/ must be rejected
# with the message its first line names (`# expect: ...`).
#
# Usage: snapshots.sh [--update]     (--update rewrites the snapshots instead of diffing)
# Environment: HELM (default: the binary tests/helm/build-helm.sh builds or finds cached).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
chart="${root}/charts/flotilla"
HELM="${HELM:-$(bash "${here}/build-helm.sh")}"
update=0
[[ "${1:-}" == "--update" ]] && update=1

fail=0
tmp=$(mktemp -d)
trap 'rm -rf "${tmp}"' EXIT

render() { # case values-args...
  local name="$1"
  shift
  "${HELM}" lint --strict --quiet "${chart}" --namespace flotilla-system "$@" >"${tmp}/${name}.lint" 2>&1 || {
    echo "FAIL ${name}: helm lint"; cat "${tmp}/${name}.lint"; fail=1; return
  }
  "${HELM}" template flotilla "${chart}" --namespace flotilla-system "$@" >"${tmp}/${name}.yaml" 2>"${tmp}/${name}.err" || {
    echo "FAIL ${name}: helm template"; cat "${tmp}/${name}.err"; fail=1; return
  }
  local snap="${here}/snapshots/${name}.yaml"
  if ((update)); then
    cp "${tmp}/${name}.yaml" "${snap}"
    echo "updated ${snap#"${root}"/}"
  elif ! diff -u "${snap}" "${tmp}/${name}.yaml" >"${tmp}/${name}.diff"; then
    echo "FAIL ${name}: rendered manifests differ from ${snap#"${root}"/} (run tests/helm/snapshots.sh --update and review the diff)"
    head -n 80 "${tmp}/${name}.diff"
    fail=1
  else
    echo "ok   ${name}: lint, template = snapshot ($(grep -c '^kind:' "${tmp}/${name}.yaml") objects)"
  fi
}

render default
for v in "${here}"/values/*.yaml; do
  render "$(basename "${v}" .yaml)" -f "${v}"
done

# The CRDs ship in crds/ (installed by helm on first install) and are exactly the generated ones.
crds=$("${HELM}" template flotilla "${chart}" --include-crds | grep -c '^kind: CustomResourceDefinition' || true)
if [[ "${crds}" == 6 ]]; then echo "ok   crds: 6 CustomResourceDefinitions with --include-crds"
else echo "FAIL crds: expected 6 CustomResourceDefinitions, got ${crds}"; fail=1; fi

# Values the schema (or a required value) must refuse, each with the message it names.
for v in "${here}"/invalid/*.yaml; do
  name=$(basename "${v}" .yaml)
  want=$(sed -n '1s/^# expect: //p' "${v}")
  if out=$("${HELM}" template flotilla "${chart}" --namespace flotilla-system -f "${v}" 2>&1); then
    echo "FAIL invalid/${name}: accepted"; fail=1
  elif [[ "${out}" != *"${want}"* ]]; then
    echo "FAIL invalid/${name}: refused, but without \"${want}\":"; echo "${out}"; fail=1
  else
    echo "ok   invalid/${name}: refused ($want)"
  fi
done
exit "${fail}"
