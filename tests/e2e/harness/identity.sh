#!/usr/bin/env bash
# A least-privilege identity for the e2e tests: applies MANIFEST (a ServiceAccount and its RBAC;
# `-` reads it from stdin) to the cluster ADMIN_KUBECONFIG names, asks the TokenRequest API for a
# token of ServiceAccount NAMESPACE/NAME (`kubectl create token`, 2 h), and writes a kubeconfig
# with that token (the admin kubeconfig's server and CA, nothing of its client certificate) to
# OUT. NAMESPACE is created first when it does not exist; an existing one is left as it is.
#
# The Rust harness calls it with the chart's rendered controller RBAC for the control cluster
# and examples/member-rbac/flotilla-member.yaml for each member (tests/e2e/README.md,
# "Identities").
#
# Usage: identity.sh ADMIN_KUBECONFIG MANIFEST NAMESPACE NAME OUT
#        identity.sh ADMIN_KUBECONFIG MANIFEST      (only applies MANIFEST: more rights for an
#                                                     identity made before, e.g. sim-cloud.yaml)
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -eq 5 || $# -eq 2 ]] || die "usage: identity.sh ADMIN_KUBECONFIG MANIFEST [NAMESPACE NAME OUT]"
admin="$1" manifest="$2"
require_binaries
k() { kubectl --kubeconfig "${admin}" "$@"; }
if [[ $# -eq 2 ]]; then
  k apply -f "${manifest}" >/dev/null
  exit 0
fi
ns="$3" sa="$4" out="$5"

k get namespace "${ns}" >/dev/null 2>&1 || k create namespace "${ns}" >/dev/null
if [[ "${manifest}" == - ]]; then
  k apply -f - >/dev/null
else
  k apply -f "${manifest}" >/dev/null
fi
token=$(k -n "${ns}" create token "${sa}" --duration 2h)
[[ -n "${token}" ]] || die "no token for ServiceAccount ${ns}/${sa}"
server=$(k config view --raw --minify -o 'jsonpath={.clusters[0].cluster.server}')
ca=$(k config view --raw --minify -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}')
tmp="${out}.tmp.$$"
cat >"${tmp}" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: cluster, cluster: {server: "${server}", certificate-authority-data: "${ca}"}}]
users: [{name: ${sa}, user: {token: "${token}"}}]
contexts: [{name: ${sa}, context: {cluster: cluster, user: ${sa}}}]
current-context: ${sa}
EOF
chmod 600 "${tmp}"
mv "${tmp}" "${out}"
