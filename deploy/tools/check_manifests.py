#!/usr/bin/env python3
"""Checks rendered Kubernetes manifests (`kubectl kustomize deploy/k8s/...`) against the code they
deploy, beyond schema validation (run by scripts/check-deploy.sh):

- each container runs a binary the image ships (Dockerfile), as the image's non-root uid; each
  Deployment's server is `assay serve <stage>` for a stage of the table (services/mesh), and every
  stage has a Deployment;
- ports, probes and the readiness probe's service name are the service's own (shared/config
  default.toml, shared/proto service_names); startup, liveness and readiness probes are native gRPC;
- every ASSAY__SECTION__KEY variable names a real configuration key, every other ASSAY_* variable
  one the code reads, and every assay.toml in a ConfigMap parses with real keys;
- terminationGracePeriodSeconds covers the preStop pause plus drain_seconds (as configured);
- pod and container security: runAsNonRoot, seccomp RuntimeDefault, no privilege escalation,
  read-only root filesystem with a writable /tmp, every capability dropped, no service account token;
- resources: CPU and memory requests, a memory limit;
- every referenced ConfigMap, ServiceAccount, PVC and volume exists; each Deployment has its Service
  (selector and port), PodDisruptionBudget and, when it may run several pods, HPA (autoscaling/v2);
- the gateway: on SQLite one pod (Recreate, no HPA) with its store on a PVC; on a shared PostgreSQL
  store (from a Secret) at least two pods; its upstreams are the stages' Services;
- a models directory a stage loads from is mounted, read-only when an init container fills it.

usage: check_manifests.py NAME RENDERED.yaml
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import image_build  # noqa: E402

ROOT = image_build.ROOT
# Secrets the operator creates (README): referenced, never rendered.
EXTERNAL_SECRETS = {"assay-auth", "assay-openai", "assay-postgres"}
# Configuration sections whose keys are open (maps by name).
OPEN_MAPS = {("backends",), ("models", "phases")}
# Variables read outside the ASSAY_ prefix scheme that the manifests may set.
OTHER_ENV = re.compile(r"^(HOME|OPENAI_(BASE_URL|API_KEY|MODEL|EMBEDDING_MODEL)|OTEL_[A-Z_]+|RUST_LOG|PIP_[A-Z_]+)$")


def defaults() -> dict:
    return tomllib.loads((ROOT / "shared/config/default.toml").read_text())


def code_env_names() -> set[str]:
    names: set[str] = set()
    for d in ("shared", "services"):
        for f in (ROOT / d).rglob("*.rs"):
            names |= set(re.findall(r'"(ASSAY_[A-Z0-9_]+)"', f.read_text()))
    return names


def config_key_ok(path: tuple[str, ...], tree: dict) -> bool:
    node = tree
    for i, part in enumerate(path):
        if path[:i] in OPEN_MAPS:
            return True
        if not isinstance(node, dict):
            return False
        if part not in node:
            # ports.admin is the one key with no value in default.toml (off unless set).
            return path == ("ports", "admin")
        node = node[part]
    return True


def toml_keys(tree: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for k, v in tree.items():
        if isinstance(v, dict) and (prefix + (k,)) not in OPEN_MAPS:
            out += toml_keys(v, prefix + (k,))
        else:
            out.append(prefix + (k,))
    return out


def served_stage(container: dict) -> str | None:
    """The stage a container serves: its command is `/usr/local/bin/assay serve <stage>`."""
    match container.get("command", []):
        case ["/usr/local/bin/assay", "serve", stage]:
            return stage
        case _:
            return None


class Checker:
    def __init__(self, name: str, docs: list[dict]):
        self.name, self.errors = name, []
        self.objects = {(d["kind"], d["metadata"]["name"]): d for d in docs}
        self.defaults = defaults()
        self.env_names = code_env_names()
        stages = image_build.parse_dockerfile(image_build.DOCKERFILE.read_text())
        self.binaries = set()
        for c in stages[-1].all("COPY"):
            if c.args.startswith("--from="):
                self.binaries |= {w.rsplit("/", 1)[-1] for w in c.args.split()[1:-1]}
        user = (stages[-1].all("USER") or [None])[-1]
        self.image_uid = int(user.args.split(":")[0]) if user else 0
        self.service_names = image_build.service_names()
        self.stages = image_build.serve_stages()

    def err(self, where: str, message: str) -> None:
        self.errors.append(f"{self.name}: {where}: {message}")

    def get(self, kind: str, name: str) -> dict | None:
        return self.objects.get((kind, name))

    def configmap_env(self, container: dict, where: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for src in container.get("envFrom", []):
            ref = src.get("configMapRef")
            if ref is None:
                self.err(where, f"envFrom {src}: only ConfigMaps are expected")
                continue
            cm = self.get("ConfigMap", ref["name"])
            if cm is None:
                self.err(where, f"envFrom ConfigMap {ref['name']} does not exist")
                continue
            env.update(cm.get("data", {}))
        return env

    def check_env_name(self, name: str, where: str) -> None:
        if name.startswith("ASSAY__"):
            path = tuple(p.lower() for p in name.removeprefix("ASSAY__").split("__"))
            if not config_key_ok(path, self.defaults):
                self.err(where, f"{name} is no configuration key ({'.'.join(path)} not in shared/config/default.toml)")
        elif name.startswith("ASSAY_"):
            if name not in self.env_names:
                self.err(where, f"{name}: no code reads this variable")
        elif not OTHER_ENV.match(name):
            self.err(where, f"{name}: unexpected variable")

    def check_config_files(self) -> None:
        for (kind, name), cm in self.objects.items():
            if kind != "ConfigMap":
                continue
            for key, text in cm.get("data", {}).items():
                if not key.endswith(".toml"):
                    continue
                try:
                    tree = tomllib.loads(text)
                except tomllib.TOMLDecodeError as e:
                    self.err(f"ConfigMap {name}", f"{key} does not parse: {e}")
                    continue
                for path in toml_keys(tree):
                    if not config_key_ok(path, self.defaults):
                        self.err(f"ConfigMap {name}", f"{key}: {'.'.join(path)} is no configuration key")

    def drain_seconds(self, env: dict[str, str], config_files: list[dict]) -> int:
        if "ASSAY__DRAIN_SECONDS" in env:
            return int(env["ASSAY__DRAIN_SECONDS"])
        for tree in config_files:
            if "drain_seconds" in tree:
                return int(tree["drain_seconds"])
        return int(self.defaults["drain_seconds"])

    def check_container_security(self, c: dict, where: str) -> None:
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            self.err(where, "allowPrivilegeEscalation must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            self.err(where, "readOnlyRootFilesystem must be true")
        if sc.get("privileged"):
            self.err(where, "privileged")
        if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("capabilities", {}).get("add"):
            self.err(where, "capabilities must drop ALL and add none")
        if sc.get("runAsUser", self.image_uid) == 0 or sc.get("runAsNonRoot") is False:
            self.err(where, "runs as root")
        if not any(m["mountPath"] == "/tmp" and not m.get("readOnly") for m in c.get("volumeMounts", [])):
            self.err(where, "no writable /tmp (the root filesystem is read-only; HOME and pip use /tmp)")
        res = c.get("resources", {})
        for k in ("cpu", "memory"):
            if k not in res.get("requests", {}):
                self.err(where, f"no {k} request")
        if "memory" not in res.get("limits", {}):
            self.err(where, "no memory limit")
        cmd = c.get("command", [])
        binaries = [w for w in cmd if w.startswith("/usr/local/bin/")]
        if not binaries:
            self.err(where, f"command {cmd} runs no binary of the image")
        for b in binaries:
            if b.removeprefix("/usr/local/bin/") not in self.binaries:
                self.err(where, f"{b} is not in the image (Dockerfile COPY)")

    def check_deployment(self, d: dict) -> None:
        name = d["metadata"]["name"]
        where = f"Deployment {name}"
        spec, pod = d["spec"], d["spec"]["template"]["spec"]
        labels = d["spec"]["template"]["metadata"].get("labels", {})
        selector = spec["selector"].get("matchLabels", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            self.err(where, "selector does not match the pod labels")

        # Pod security and identity.
        psc = pod.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True:
            self.err(where, "runAsNonRoot must be true")
        if psc.get("runAsUser") != self.image_uid:
            self.err(where, f"runAsUser {psc.get('runAsUser')} is not the image's uid {self.image_uid}")
        if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            self.err(where, "seccompProfile must be RuntimeDefault")
        if pod.get("automountServiceAccountToken") is not False:
            self.err(where, "automountServiceAccountToken must be false (the services call no Kubernetes API)")
        sa = pod.get("serviceAccountName")
        if not sa or self.get("ServiceAccount", sa) is None:
            self.err(where, f"ServiceAccount {sa} does not exist")

        # Volumes and what they reference.
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        config_files = []
        for v in volumes.values():
            if "configMap" in v:
                cm = self.get("ConfigMap", v["configMap"]["name"])
                if cm is None:
                    self.err(where, f"volume {v['name']}: ConfigMap {v['configMap']['name']} does not exist")
                else:
                    config_files += [tomllib.loads(t) for k, t in cm.get("data", {}).items() if k.endswith(".toml")]
            if "persistentVolumeClaim" in v and self.get("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]) is None:
                self.err(where, f"volume {v['name']}: PVC {v['persistentVolumeClaim']['claimName']} does not exist")
        containers = pod.get("containers", [])
        inits = pod.get("initContainers", [])
        for c in containers + inits:
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    self.err(f"{where} container {c['name']}", f"mounts volume {m['name']}, which the pod does not have")
            for e in c.get("env", []):
                self.check_env_name(e["name"], f"{where} container {c['name']}")
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["name"] not in EXTERNAL_SECRETS and self.get("Secret", ref["name"]) is None:
                    self.err(where, f"{e['name']}: Secret {ref['name']} is neither rendered nor a documented one")
            self.check_container_security(c, f"{where} container {c['name']}")

        if len(containers) != 1:
            self.err(where, f"{len(containers)} containers; expected one server")
            return
        c = containers[0]
        cwhere = f"{where} container {c['name']}"
        env = self.configmap_env(c, cwhere)
        for k in env:
            self.check_env_name(k, f"{cwhere} (envFrom)")
        env.update({e["name"]: e.get("value", "<from " + next(iter(e.get("valueFrom", {"?": 0}))) + ">")
                    for e in c.get("env", [])})
        stage = served_stage(c)
        if stage not in self.stages:
            self.err(cwhere, f"command {c.get('command')} is not `/usr/local/bin/assay serve <stage>` for a stage of "
                             f"{self.stages}")
            return
        what = f"assay serve {stage}"
        key = stage.replace("-", "_")
        port = self.defaults["ports"].get(key)
        if "ASSAY__PORTS__" + key.upper() in env:
            port = int(env["ASSAY__PORTS__" + key.upper()])
        if port is None:
            self.err(cwhere, f"{what} has no port in shared/config default.toml")
            return
        if env.get("ASSAY__BIND") != "0.0.0.0":
            self.err(cwhere, "ASSAY__BIND must be 0.0.0.0 (the default binds loopback: probes and Services fail)")
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        if ports.get("grpc") != port:
            self.err(cwhere, f"port grpc is {ports.get('grpc')}; {what} listens on {port}")

        # Probes: native gRPC on the service's port; readiness on its own health name.
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            p = c.get(probe)
            if p is None or "grpc" not in p:
                self.err(cwhere, f"no gRPC {probe}")
            elif p["grpc"].get("port") != port:
                self.err(cwhere, f"{probe} on port {p['grpc'].get('port')}; {what} listens on {port}")
        ready = c.get("readinessProbe", {}).get("grpc", {}).get("service")
        expected = self.service_names.get(key)
        if ready != expected:
            self.err(cwhere, f"readinessProbe asks health for {ready!r}; {what} reports {expected!r}")

        # Shutdown: preStop pause, then SIGTERM and drain_seconds; the grace period covers both.
        pre = c.get("lifecycle", {}).get("preStop", {})
        pause = 0
        if "exec" in pre and pre["exec"]["command"][:1] == ["/bin/sleep"]:
            pause = int(pre["exec"]["command"][1])
        elif "sleep" in pre:
            pause = int(pre["sleep"]["seconds"])
        else:
            self.err(cwhere, "no preStop pause (endpoints must drop the pod before it stops accepting calls)")
        drain = self.drain_seconds(env, config_files)
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace < pause + drain:
            self.err(where, f"terminationGracePeriodSeconds {grace} < preStop {pause} + drain_seconds {drain}")
        elif grace > pause + drain + 30:
            self.err(where, f"terminationGracePeriodSeconds {grace} is far above preStop {pause} + drain_seconds {drain}")

        # Service, PDB, HPA.
        svc = self.get("Service", name)
        if svc is None:
            self.err(where, f"no Service {name}")
        else:
            sel = svc["spec"].get("selector", {})
            if not sel or any(labels.get(k) != v for k, v in sel.items()):
                self.err(f"Service {name}", "selector does not match the pods")
            sp = [p for p in svc["spec"]["ports"] if p.get("targetPort") in ("grpc", port)]
            if not sp or sp[0]["port"] != port:
                self.err(f"Service {name}", f"does not expose grpc on {port}")
        pdbs = [o for (k, _), o in self.objects.items() if k == "PodDisruptionBudget"
                and all(labels.get(a) == b for a, b in o["spec"]["selector"].get("matchLabels", {}).items())]
        if len(pdbs) != 1:
            self.err(where, f"{len(pdbs)} PodDisruptionBudgets select its pods; expected one")
        hpas = [o for (k, _), o in self.objects.items() if k == "HorizontalPodAutoscaler"
                and o["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}]
        for h in hpas:
            if h["apiVersion"] != "autoscaling/v2":
                self.err(f"HPA {h['metadata']['name']}", "use autoscaling/v2")
        min_pods = hpas[0]["spec"].get("minReplicas", 1) if hpas else spec.get("replicas", 1)

        # Models: a local backend loads from ASSAY_MODELS_DIR, which must be a mount.
        if stage != "gateway" and env.get("ASSAY__MODELS__DEFAULT__BACKEND", "local") == "local":
            models = env.get("ASSAY_MODELS_DIR", "")
            mount = next((m for m in c.get("volumeMounts", []) if m["mountPath"] == models), None)
            if mount is None:
                self.err(cwhere, f"local models in ASSAY_MODELS_DIR={models!r}, which is not a mount")
            fetchers = [i for i in inits if "fetch" in i.get("command", []) and "models" in i.get("command", [])]
            for i in fetchers:
                im = next((m for m in i.get("volumeMounts", []) if m["mountPath"] == "/models"), None)
                ienv = {e["name"]: e.get("value") for e in i.get("env", [])}
                if im is None or im.get("readOnly") or im["name"] != (mount or {}).get("name"):
                    self.err(f"{where} init {i['name']}", "must mount the stage's models volume writable at /models")
                if ienv.get("ASSAY_MODELS_DIR") != "/models":
                    self.err(f"{where} init {i['name']}", "ASSAY_MODELS_DIR must be /models")
            if fetchers and mount is not None and not mount.get("readOnly"):
                self.err(cwhere, "the models an init container fetched are mounted writable; mount them read-only")
            if not fetchers and mount is not None and mount.get("readOnly"):
                self.err(cwhere, "models mounted read-only but nothing fetches them")
        if not hpas and stage != "gateway":
            self.err(where, "no HorizontalPodAutoscaler")

        # The gateway: its store decides how many pods it may run.
        if stage == "gateway":
            store = env.get("ASSAY__GATEWAY__STORE", "")
            shared = store.startswith("<from secretKeyRef") or store.startswith(("postgres://", "postgresql://"))
            if shared:
                if min_pods < 2 or spec.get("replicas", 1) < 2:
                    self.err(where, "on a shared PostgreSQL store, run at least two gateways")
                if spec.get("strategy", {}).get("type") == "Recreate":
                    self.err(where, "on a shared store, roll updates (not Recreate)")
            else:
                if spec.get("replicas", 1) != 1 or hpas:
                    self.err(where, "on SQLite, exactly one gateway pod and no HPA")
                if spec.get("strategy", {}).get("type") != "Recreate":
                    self.err(where, "on SQLite, strategy Recreate (two pods must not open the file)")
                data = env.get("ASSAY__GATEWAY__DATA_DIR") or env.get("ASSAY_DATA_DIR", "")
                m = next((m for m in c.get("volumeMounts", []) if m["mountPath"] == data), None)
                if store not in ("", ":memory:") or m is None:
                    self.err(cwhere, f"the SQLite store (data dir {data!r}) must be on a mounted volume")
                elif "persistentVolumeClaim" not in volumes[m["name"]]:
                    self.err(cwhere, "the SQLite store is not on a PersistentVolumeClaim: runs are lost with the pod")
            for stage in ("generator", "refiners", "scorer", "arbiter", "delta_judge", "debate"):
                target = env.get(f"ASSAY__UPSTREAMS__{stage.upper()}", "")
                m = re.fullmatch(r"(dns:///|https?://)?([a-z0-9-]+):(\d+)", target)
                if not m:
                    self.err(cwhere, f"upstream {stage} is {target!r}; expected <service>:<port> or dns:///<service>:<port>")
                    continue
                s = self.get("Service", m.group(2))
                if s is None or int(m.group(3)) not in [p["port"] for p in s["spec"]["ports"]]:
                    self.err(cwhere, f"upstream {stage} {target}: no such Service port")
                    continue
                # dns:/// is resolved to one address per pod and balanced per call: the Service must
                # be headless (else it resolves to one virtual IP) and select the stage's pods.
                pods = "assay-" + stage.replace("_", "-")
                if m.group(1) == "dns:///" and (
                    s["spec"].get("clusterIP") != "None"
                    or s["spec"].get("selector", {}).get("app.kubernetes.io/name") != pods
                ):
                    self.err(cwhere, f"upstream {stage} {target}: a headless Service selecting {pods} pods is needed")

    def run(self) -> int:
        self.check_config_files()
        deployments = [o for (k, _), o in self.objects.items() if k == "Deployment"]
        for d in deployments:
            self.check_deployment(d)
        for (k, name), o in self.objects.items():
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") != "assay":
                self.err(f"{k} {name}", "no label app.kubernetes.io/part-of=assay")
            if k == "HorizontalPodAutoscaler" and self.get("Deployment", o["spec"]["scaleTargetRef"]["name"]) is None:
                self.err(f"{k} {name}", "scales a Deployment that does not exist")
        served = {served_stage(d["spec"]["template"]["spec"]["containers"][0]) for d in deployments}
        missing = [s for s in self.stages if s not in served]
        if missing:
            self.errors.append(f"{self.name}: no Deployment serves {missing} (`assay serve <stage>`)")
        return len(deployments)


def main() -> int:
    name, path = sys.argv[1], sys.argv[2]
    docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    checker = Checker(name, docs)
    n = checker.run()
    if checker.errors:
        print("\n".join(checker.errors), file=sys.stderr)
        return 1
    print(f"overlay {name}: {n} Deployments match the code (ports, probes, config keys, drain, security, store)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
