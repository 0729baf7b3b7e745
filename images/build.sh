#!/usr/bin/env bash
# Builds Flotilla's images — flotilla-controller, flotilla-gateway, flotilla-stage (the ones the
# chart installs) and flotilla-member-router (examples/member-router/) — as OCI image-layout archives, without a container engine (images/oci_image.py; docs/development.md,
# "Images"). Prints the output directory; it holds <name>.oci.tar and digests.tsv.
#
#   images/build.sh                 # the test build's binaries (debug profile), as the tests use
#   images/build.sh --release       # cargo build --release first: what the release workflow ships
#   images/build.sh --out DIR       # copy the archives to DIR as well
#
# The binaries come from cargo's target directory (built with --workspace unless FLOTILLA_PREBUILT=1
# says the test build already made them). Reproducible: version (the workspace's), revision
# (git HEAD) and time (the commit's, as SOURCE_DATE_EPOCH) are inputs, so one commit's binaries
# always give the same digests. Cached under ~/.cache/flotilla/images by a hash of every input.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=debug
out=""
while (($#)); do
  case "$1" in
    --release) profile=release ;;
    --out) out="$2"; shift ;;
    *) echo "images/build.sh: unknown argument $1 (use --release, --out DIR)" >&2; exit 64 ;;
  esac
  shift
done

target="${CARGO_TARGET_DIR:-target}"
bins=(flotilla-controller flotilla-gateway flotilla-stage flotilla-member-router)
if [[ "${profile}" == release ]]; then
  cargo build --release --locked --workspace --bins >&2
elif [[ "${FLOTILLA_PREBUILT:-0}" != 1 ]]; then
  cargo build --locked --workspace --bins >&2
fi
paths=()
for b in "${bins[@]}"; do
  p="${target}/${profile}/${b}"
  [[ -x "${p}" ]] || { echo "images/build.sh: ${p} is missing; build it (cargo build --workspace)" >&2; exit 1; }
  paths+=("${p}")
done

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[[ -n "${version}" ]] || { echo "images/build.sh: no version in Cargo.toml [workspace.package]" >&2; exit 1; }
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]] || revision="${revision}-dirty"
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

key=$( { printf '%s\n' "${version}" "${revision}" "${epoch}"; cat images/oci_image.py "${paths[@]}" /etc/ssl/certs/ca-certificates.crt; } | sha256sum | cut -c1-32)
cache="${HOME}/.cache/flotilla/images"
dir="${cache}/${profile}-${key}"
if [[ ! -s "${dir}/digests.tsv" ]]; then
  mkdir -p "${cache}"
  # Keep the newest few builds only: each is some tens of MiB.
  find "${cache}" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\n' | sort -rn | tail -n +6 | cut -d' ' -f2- | xargs -r rm -rf
  python3 images/oci_image.py --out-dir "${dir}.part" --version "${version}" --revision "${revision}" \
    --source-date-epoch "${epoch}" "${paths[@]}" >&2
  rm -rf "${dir}" && mv "${dir}.part" "${dir}"
fi
if [[ -n "${out}" ]]; then
  mkdir -p "${out}" && cp "${dir}"/* "${out}/"
  echo "${out}"
else
  echo "${dir}"
fi
