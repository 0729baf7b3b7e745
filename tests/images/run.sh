#!/usr/bin/env bash
# The images the chart installs (issue #39): built by images/build.sh (cached), then
#   1. each run from its own filesystem as its own user: --version, --help, and the gateway
#      serving a chat completion (tests/images/check.py, which unpacks with Debian's umoci);
#   2. reproducible: the same inputs written again, bypassing the cache, give the same digests;
#   3. the chart rendered with the built digests pulls exactly those (controller, gateway and the
#      staging Jobs' --stage-image), and by default the tag of the release version.
# Also lints the GitHub workflows (the release workflow, the GitOps example's) with actionlint.
# Needs root (chroot) and umoci (Debian's package, installed by scripts/setup.sh).
# Environment: HELM (default: tests/helm/build-helm.sh), CARGO_TARGET_DIR, FLOTILLA_PREBUILT.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
cd "${root}"
HELM="${HELM:-$(bash tests/helm/build-helm.sh)}"
target="${CARGO_TARGET_DIR:-target}"

command -v umoci >/dev/null || { echo "FAIL umoci is missing: run scripts/setup.sh (Debian's umoci)" >&2; exit 1; }
ACTIONLINT=$(bash tests/images/build-actionlint.sh)
"${ACTIONLINT}" .github/workflows/*.yaml examples/gitops/.github/workflows/*.yaml
echo "ok actionlint: .github/workflows and examples/gitops/.github/workflows"

images=$(bash images/build.sh)
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
chart_version=$(sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/flotilla/Chart.yaml)
[[ "${chart_version}" == "${version}" ]] || {
  echo "FAIL charts/flotilla/Chart.yaml appVersion ${chart_version} is not the workspace version ${version}" >&2; exit 1; }

python3 tests/images/check.py "${images}" "${version}" "${target}/debug/flotilla-enginesim"

tmp=$(mktemp -d)
trap 'rm -rf "${tmp}"' EXIT
# The inputs the cached build used are in its annotations; write the images again from them.
manifest_annotation() { # archive key
  tar -xOf "$1" index.json | python3 -c '
import json, subprocess, sys
digest = json.load(sys.stdin)["manifests"][0]["digest"][7:]
manifest = json.loads(subprocess.run(["tar", "-xOf", sys.argv[1], "blobs/sha256/" + digest], capture_output=True, check=True).stdout)
print(manifest["annotations"][sys.argv[2]])' "$1" "$2"
}
archive="${images}/flotilla-gateway.oci.tar"
revision=$(manifest_annotation "${archive}" org.opencontainers.image.revision)
created=$(manifest_annotation "${archive}" org.opencontainers.image.created)
python3 images/oci_image.py --out-dir "${tmp}/again" --version "${version}" --revision "${revision}" \
  --source-date-epoch "$(date -u -d "${created}" +%s)" \
  "${target}/debug/flotilla-controller" "${target}/debug/flotilla-gateway" "${target}/debug/flotilla-stage" \
  "${target}/debug/flotilla-member-router" >/dev/null
diff <(cut -f1,2 "${images}/digests.tsv") <(cut -f1,2 "${tmp}/again/digests.tsv") >/dev/null || {
  echo "FAIL the images are not reproducible: the same inputs gave other digests" >&2
  diff "${images}/digests.tsv" "${tmp}/again/digests.tsv" >&2; exit 1; }
echo "ok reproducible: the same inputs give the same four digests"

digest() { awk -F'\t' -v n="$1" '$1 == n { print $2 }' "${images}/digests.tsv"; }
"${HELM}" template flotilla charts/flotilla --namespace flotilla-system --set gateway.enabled=true \
  --set "controller.image.digest=$(digest flotilla-controller)" \
  --set "gateway.image.digest=$(digest flotilla-gateway)" \
  --set "controller.staging.image.digest=$(digest flotilla-stage)" >"${tmp}/digests.yaml"
"${HELM}" template flotilla charts/flotilla --namespace flotilla-system --set gateway.enabled=true >"${tmp}/tags.yaml"
for name in flotilla-controller flotilla-gateway flotilla-stage; do
  grep -q "ghcr.io/flotilla-dev/${name}@$(digest "${name}")" "${tmp}/digests.yaml" || {
    echo "FAIL the chart rendered with the built digest of ${name} does not pull it" >&2; exit 1; }
  grep -q "ghcr.io/flotilla-dev/${name}:${version}" "${tmp}/tags.yaml" || {
    echo "FAIL the chart's default ${name} image is not tagged ${version}" >&2; exit 1; }
done
if grep -E 'ghcr.io/flotilla-dev/[a-z-]+:' "${tmp}/digests.yaml"; then
  echo "FAIL the chart rendered with digests still pulls an image by tag (above)" >&2; exit 1
fi
echo "ok the chart pulls the built digests, and by default the tags of release ${version}"
