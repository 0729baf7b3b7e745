# shellcheck shell=bash
# Common settings for the Flotilla e2e harness. Sourced by every script here;
# it only defines variables and functions and never starts anything.
#
# Environment (all optional):
#   FLOTILLA_CACHE    root of the build cache          (default: $HOME/.cache/flotilla)
#   FLOTILLA_E2E_DIR  where kubeconfigs and state go   (default: ${TMPDIR:-/tmp}/flotilla-e2e)
#   FLOTILLA_K8S_VERSION / FLOTILLA_ETCD_VERSION / FLOTILLA_KWOK_VERSION
#                     override versions.env

HARNESS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${HARNESS_DIR}/versions.env"

FLOTILLA_CACHE="${FLOTILLA_CACHE:-${HOME}/.cache/flotilla}"
FLOTILLA_BUILD_DIR="${FLOTILLA_CACHE}/k8s-${FLOTILLA_K8S_VERSION}-etcd-${FLOTILLA_ETCD_VERSION}-kwok-${FLOTILLA_KWOK_VERSION}"
FLOTILLA_BIN_DIR="${FLOTILLA_BUILD_DIR}/bin"
FLOTILLA_E2E_DIR="${FLOTILLA_E2E_DIR:-${TMPDIR:-/tmp}/flotilla-e2e}"

# Every binary build.sh produces; up.sh refuses to start without all of them.
FLOTILLA_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl)

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }

# kwokctl/kubectl from the cache, never whatever happens to be on PATH.
kwokctl() { "${FLOTILLA_BIN_DIR}/kwokctl" "$@"; }
# (its discovery cache goes under FLOTILLA_E2E_DIR, not ~/.kube/cache, as ports
# are reused by later clusters)
kubectl() { KUBECACHEDIR="${FLOTILLA_E2E_DIR}/kubectl-cache" "${FLOTILLA_BIN_DIR}/kubectl" "$@"; }

require_binaries() {
  local b
  for b in "${FLOTILLA_BINARIES[@]}"; do
    [[ -x "${FLOTILLA_BIN_DIR}/${b}" ]] || die "missing ${FLOTILLA_BIN_DIR}/${b}; run ${HARNESS_DIR}/build.sh first"
  done
}

# Point kwokctl's binary runtime at the locally built binaries so that it never
# downloads anything (each KWOK_* variable is the default of the matching
# kwokctl option; see kwokctl_configuration_types.go in sigs.k8s.io/kwok).
# Also keep kwokctl's own state under FLOTILLA_E2E_DIR instead of ~/.kwok.
kwok_env() {
  export KWOK_WORKDIR="${FLOTILLA_E2E_DIR}/kwok"
  export KUBECACHEDIR="${FLOTILLA_E2E_DIR}/kubectl-cache"
  export KWOK_RUNTIME=binary
  export KWOK_KUBE_VERSION="${FLOTILLA_K8S_VERSION}"
  export KWOK_ETCD_VERSION="${FLOTILLA_ETCD_VERSION#v}"
  export KWOK_VERSION="${FLOTILLA_KWOK_VERSION}"
  export KWOK_KUBE_APISERVER_BINARY="${FLOTILLA_BIN_DIR}/kube-apiserver"
  export KWOK_KUBE_CONTROLLER_MANAGER_BINARY="${FLOTILLA_BIN_DIR}/kube-controller-manager"
  export KWOK_KUBE_SCHEDULER_BINARY="${FLOTILLA_BIN_DIR}/kube-scheduler"
  export KWOK_KUBECTL_BINARY="${FLOTILLA_BIN_DIR}/kubectl"
  export KWOK_ETCD_BINARY="${FLOTILLA_BIN_DIR}/etcd"
  export KWOK_CONTROLLER_BINARY="${FLOTILLA_BIN_DIR}/kwok"
}
