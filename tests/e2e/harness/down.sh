#!/usr/bin/env bash
# Tear down clusters started by up.sh:
#   down.sh NAME...   the named clusters
#   down.sh           every cluster under ${FLOTILLA_E2E_DIR}
# Runs `kwokctl delete cluster`, then makes sure every process kwokctl had
# recorded for the cluster (its pids/*.pid files) is gone, killing a straggler
# by its pid if needed, and removes the cluster's kubeconfig and state.
# Exits non-zero if a process survives.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

kwok_env
clusters_dir="${KWOK_WORKDIR}/clusters"

if [[ $# -eq 0 ]]; then
  names=()
  if [[ -d "${clusters_dir}" ]]; then
    for d in "${clusters_dir}"/*/; do
      [[ -d "${d}" ]] && names+=("$(basename "${d}")")
    done
  fi
  [[ ${#names[@]} -gt 0 ]] || { log "no clusters under ${clusters_dir}"; exit 0; }
  set -- "${names[@]}"
fi

# alive PID: PID is running one of our binaries (guards against pid reuse).
alive() {
  local exe
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  [[ "${exe}" == "${FLOTILLA_BIN_DIR}/"* ]]
}

failed=0
for name in "$@"; do
  dir="${clusters_dir}/${name}"
  pids=()
  if [[ -d "${dir}/pids" ]]; then
    for f in "${dir}"/pids/*.pid; do
      [[ -f "${f}" ]] && pids+=("$(cat "${f}")")
    done
  fi
  log "${name}: deleting cluster (pids: ${pids[*]:-none})"
  if [[ -d "${dir}" ]]; then
    if [[ -x "${FLOTILLA_BIN_DIR}/kwokctl" ]]; then
      # --kubeconfig: kwokctl would otherwise edit ~/.kube/config (and it
      # rejects an empty value here, unlike on create).
      kwokctl delete cluster --name "${name}" --kubeconfig "${KWOK_WORKDIR}/discard.kubeconfig" \
        >"${FLOTILLA_E2E_DIR}/${name}.delete.log" 2>&1 \
        || { cat "${FLOTILLA_E2E_DIR}/${name}.delete.log" >&2; log "${name}: kwokctl delete failed; killing its processes directly"; }
    fi
  fi
  # Whatever kwokctl left running gets SIGTERM, 10s to exit, then SIGKILL.
  for pid in "${pids[@]}"; do
    alive "${pid}" || continue
    log "${name}: pid ${pid} still running; sending SIGTERM"
    kill -TERM "${pid}" 2>/dev/null || true
    for _ in $(seq 1 20); do alive "${pid}" || break; sleep 0.5; done
    if alive "${pid}"; then
      log "${name}: pid ${pid} still running; sending SIGKILL"
      kill -KILL "${pid}" 2>/dev/null || true
      sleep 0.5
    fi
    if alive "${pid}"; then
      log "${name}: pid ${pid} survived SIGKILL"
      failed=1
    fi
  done
  rm -rf "${dir}"
  rm -f "${FLOTILLA_E2E_DIR}/${name}.kubeconfig" "${FLOTILLA_E2E_DIR}/${name}.create.log" \
        "${FLOTILLA_E2E_DIR}/${name}.delete.log"
  if [[ -f "${FLOTILLA_E2E_DIR}/clusters.tsv" ]]; then
    { grep -v "^${name}	" "${FLOTILLA_E2E_DIR}/clusters.tsv" || true; } >"${FLOTILLA_E2E_DIR}/clusters.tsv.tmp"
    mv "${FLOTILLA_E2E_DIR}/clusters.tsv.tmp" "${FLOTILLA_E2E_DIR}/clusters.tsv"
  fi
  log "${name}: deleted"
done
[[ ${failed} -eq 0 ]] || die "some cluster processes are still running"
