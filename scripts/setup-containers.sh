#!/usr/bin/env bash
# Makes a Debian host able to build and run the Assay image with podman, offline from any container
# registry (scripts/image.sh, tests/tests/containers.rs). Idempotent; run as root (CI does).
#   - packages: podman, the runc runtime, debootstrap (the local base images are Debian rootfs);
#   - /etc/containers/containers.conf: the runc runtime (crun fails on hosts whose cgroups are
#     hybrid v1/v2), no per-container ulimits (refused in such sandboxes: `default_ulimits = []`),
#     cgroupfs and a file event log (no systemd needed), host networking for builds and pods;
#   - the services' fixed ports kept out of the ephemeral range (ip_local_reserved_ports).
# Prints what it changed and `podman info`'s runtime line.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "setup-containers: run as root (it installs packages and writes /etc/containers)" >&2
  exit 1
fi

PACKAGES=(podman runc debootstrap)
missing=()
for p in "${PACKAGES[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-containers: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # --no-install-recommends leaves out what podman needs to run a container on Debian 12.
  apt-get install -y -qq --no-install-recommends conmon containernetworking-plugins \
    fuse-overlayfs slirp4netns uidmap catatonit >/dev/null
fi

CONF=/etc/containers/containers.conf
want=$(cat <<'EOF'
# Written by scripts/setup-containers.sh (Assay): podman on a host with hybrid cgroups, as root.
[containers]
# Per-container ulimits are refused on such hosts.
default_ulimits = []
# Pods use the host's network (scripts/image.sh builds with --network=host too).
netns = "host"

[engine]
# crun cannot create containers on hybrid (v1 + v2) cgroups; runc can.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
)
mkdir -p /etc/containers
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$want" ]; then
  if [ -f "$CONF" ] && ! grep -q 'scripts/setup-containers.sh' "$CONF"; then
    cp "$CONF" "$CONF.before-assay"
    echo "setup-containers: kept the previous $CONF as $CONF.before-assay"
  fi
  printf '%s\n' "$want" >"$CONF"
  echo "setup-containers: wrote $CONF"
fi

# The pods run on the host's network with the services' fixed ports (50051-50057; 50061 for the
# second gateway of tests/tests/containers.rs), which lie in Linux's ephemeral range: reserved, no
# client socket or port-0 server of another process is given one while a pod needs it.
RESERVED=50051-50061
reserved=/proc/sys/net/ipv4/ip_local_reserved_ports
current=$(cat "$reserved" 2>/dev/null || true)
if [[ ",$current," != *",$RESERVED,"* ]]; then
  if printf '%s\n' "${current:+$current,}$RESERVED" >"$reserved" 2>/dev/null; then
    echo "setup-containers: reserved ports $RESERVED (net.ipv4.ip_local_reserved_ports)"
  else
    echo "setup-containers: could not reserve ports $RESERVED; another process may take one while a pod needs it" >&2
  fi
fi

podman info --format 'setup-containers: podman {{.Version.Version}}, runtime {{.Host.OCIRuntime.Name}}, cgroups {{.Host.CgroupsVersion}} ({{.Host.CgroupManager}}), storage {{.Store.GraphDriverName}}'
