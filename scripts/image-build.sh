#!/usr/bin/env bash
# The container image's build steps without a container engine: parses the Dockerfile (so what is
# checked is what the image does) and runs its builder's steps in a staging directory.
#   scripts/image-build.sh --check        cheap checks, no build (CI: scripts/check-deploy.sh)
#   scripts/image-build.sh                the builder's clean release build in a staging directory,
#                                         then the runtime checks on its binaries (long: ~30+ min
#                                         on 2 cores; --target-dir DIR reuses a cargo cache)
#   scripts/image-build.sh --smoke DIR    the runtime checks on binaries already built in DIR
# Details: deploy/tools/image_build.py --help.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 deploy/tools/image_build.py "$@"
