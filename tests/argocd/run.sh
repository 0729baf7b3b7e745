#!/usr/bin/env bash
# The Argo CD health checks for every flotilla.dev kind
# (examples/gitops/argocd/health/flotilla.dev_<Kind>.lua):
#   1. run against every fixture in tests/argocd/fixtures/ (cases.tsv says the expected health
#      and message) under Lua 5.1 (what Argo CD's gopher-lua implements) and Lua 5.4;
#   2. use nothing Argo CD's sandbox lacks (no os, io, require, load);
#   3. are byte for byte the scripts in examples/gitops/argocd/argocd-cm-flotilla-health.yaml,
#      the argocd-cm patch users apply (run.sh --update regenerates it from the .lua files).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
health="${root}/examples/gitops/argocd/health"
cm="${root}/examples/gitops/argocd/argocd-cm-flotilla-health.yaml"
bash "${here}/setup-lua.sh"
fail=0

for lua in lua5.1 lua5.4; do
  if out=$("${lua}" "${here}/run.lua" "${root}" 2>&1); then
    echo "ok   health scripts under ${lua}: $(tail -n 1 <<<"${out}")"
  else
    echo "${out}" | grep -v '^ok ' || true
    echo "FAIL health scripts under ${lua}"
    fail=1
  fi
done

if grep -nE '\b(os|io|debug|package)\.|\brequire\b|\bload(string|file)?\b|\bdofile\b' "${health}"/*.lua; then
  echo "FAIL health scripts use something Argo CD's Lua sandbox does not offer (above)"; fail=1
else
  echo "ok   health scripts use only base, string, table and math"
fi

generate() {
  cat <<'HEAD'
# Argo CD health checks for Flotilla's kinds: merge into the argocd-cm ConfigMap (kustomize
# patch, `kubectl -n argocd patch configmap argocd-cm --patch-file ...`, or the argo-cd Helm
# chart's configs.cm). GENERATED from examples/gitops/argocd/health/*.lua by
# `tests/argocd/run.sh --update`; edit the .lua files, not this file. docs/gitops.md.
apiVersion: v1
kind: ConfigMap
metadata:
  name: argocd-cm
  namespace: argocd
data:
HEAD
  local f kind
  for f in "${health}"/flotilla.dev_*.lua; do
    kind=$(basename "${f}" .lua)
    echo "  resource.customizations.health.${kind}: |"
    sed -e 's/^/    /' -e 's/^    $//' "${f}"
  done
}
if [[ "${1:-}" == "--update" ]]; then
  generate >"${cm}"
  echo "updated ${cm#"${root}"/}"
elif diff -u "${cm}" <(generate) >/dev/null; then
  echo "ok   argocd-cm-flotilla-health.yaml embeds exactly the 6 .lua scripts"
else
  diff -u "${cm}" <(generate) | head -n 40
  echo "FAIL argocd-cm-flotilla-health.yaml differs from the .lua scripts (tests/argocd/run.sh --update)"
  fail=1
fi
exit "${fail}"
