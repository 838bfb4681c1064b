#!/usr/bin/env bash
# The container image's build steps without a container engine. Reads the Dockerfile, so what is
# checked here is what the image does.
#   scripts/image-build.sh --check   cheap: every binary the runtime stage copies is a [[bin]] of
#                                    the workspace built by the builder's cargo command, and the
#                                    builder's packages exist (CI runs this)
#   scripts/image-build.sh           the builder's cargo command itself, then each copied binary
#                                    is checked to be a runnable executable (`assay --help` runs)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-full}
python3 - "$mode" <<'PY'
import json, re, shlex, subprocess, sys
mode = sys.argv[1]
text = open("Dockerfile").read().replace("\\\n", " ")
lines = [l.strip() for l in text.splitlines()]
build = [l for l in lines if l.startswith("RUN cargo build")]
copy = [l for l in lines if l.startswith("COPY --from=build")]
if len(build) != 1 or len(copy) != 1:
    sys.exit(f"Dockerfile: expected one `RUN cargo build` and one `COPY --from=build`, found {len(build)} and {len(copy)}")
cmd = shlex.split(build[0][len("RUN "):])
for flag in ("--release", "--locked", "--bins"):
    if flag not in cmd:
        sys.exit(f"Dockerfile: the cargo build must use {flag}")
packages = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-p"]
copied = shlex.split(copy[0])[2:-1]
meta = json.loads(subprocess.check_output(["cargo", "metadata", "--no-deps", "--format-version", "1", "--locked"]))
bins = {t["name"]: p["name"] for p in meta["packages"] for t in p["targets"] if "bin" in t["kind"]}
names = {p["name"] for p in meta["packages"]}
errors = [f"package {p} (cargo build -p) is not in the workspace" for p in packages if p not in names]
for src in copied:
    m = re.fullmatch(r"/src/target/release/([\w-]+)", src)
    if not m:
        errors.append(f"COPY source {src} is not a release binary")
    elif m.group(1) not in bins:
        errors.append(f"{m.group(1)} is not a [[bin]] of the workspace")
    elif bins[m.group(1)] not in packages:
        errors.append(f"{m.group(1)} (package {bins[m.group(1)]}) is copied but not built by the builder")
service_bins = {b for b, p in bins.items() if p.startswith("assay-") and p not in ("assay-testkit", "assay-tests")}
missing = service_bins - {s.rsplit("/", 1)[-1] for s in copied}
errors += [f"{b} is a service binary the image does not ship" for b in sorted(missing)]
if errors:
    sys.exit("Dockerfile:\n  " + "\n  ".join(errors))
print(f"Dockerfile: {len(copied)} binaries from {len(packages)} packages, every one a workspace [[bin]] built by the builder")
if mode == "--check":
    sys.exit(0)
print("running the builder's command:", " ".join(cmd))
subprocess.run(cmd, check=True)
for src in copied:
    path = "target/release/" + src.rsplit("/", 1)[-1]
    out = subprocess.run(["file", "-b", path], capture_output=True, text=True).stdout if subprocess.run(["which", "file"], capture_output=True).returncode == 0 else "present"
    print(f"  {path}: {out.strip()[:60]}")
subprocess.run(["target/release/assay", "--help"], check=True, stdout=subprocess.DEVNULL)
print("image build steps: ok")
PY
