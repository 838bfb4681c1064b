"""Build hook: generate the gRPC stubs from the Assay protos with grpcio-tools.

The protos come from ``proto/`` next to this file (inside an sdist) or from ``../../proto`` (the
repository checkout). Generated modules land in ``assay_client/_proto`` with their imports
rewritten to that package, so nothing generated is checked in and nothing named ``assay`` is
installed at the top level.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PACKAGE = "assay_client"
GENERATED = "_proto"


def proto_root() -> Path:
    """The directory holding ``assay/<service>/v1/*.proto``."""
    for candidate in (HERE / "proto", HERE.parent.parent / "proto"):
        if (candidate / "assay" / "gateway" / "v1" / "gateway.proto").is_file():
            return candidate
    raise RuntimeError(
        "assay protos not found: expected proto/assay/... next to setup.py or ../../proto "
        "(build from the repository checkout or from an sdist)"
    )


def tools_versions() -> tuple[str, str]:
    """(grpcio-tools version, protobuf version) of the build environment."""
    from importlib.metadata import version

    return version("grpcio-tools"), version("protobuf")


def generate(out_root: Path) -> None:
    """Run protoc over every Assay proto into ``out_root/assay_client/_proto``."""
    import grpc_tools
    from grpc_tools import protoc

    root = proto_root()
    protos = sorted(str(p.relative_to(root)) for p in root.rglob("*.proto"))
    dest = out_root / PACKAGE / GENERATED
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{well_known}",
        f"--python_out={dest}",
        f"--pyi_out={dest}",
        f"--grpc_python_out={dest}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {root}")
    # Imports of generated modules: `from assay.x.v1 import y_pb2` -> the package's copy.
    pattern = re.compile(r"^(\s*)(from|import) assay\.", re.MULTILINE)
    for path in dest.rglob("*.py*"):
        text = path.read_text()
        path.write_text(pattern.sub(rf"\1\2 {PACKAGE}.{GENERATED}.assay.", text))
    for directory in [dest, *(p for p in dest.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()
    # Keep the protos beside the stubs: the wire contract the client was generated from.
    for rel in protos:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)


class BuildWithStubs(build_py):
    """build_py that generates the stubs into the build directory first."""

    def run(self) -> None:
        generate(Path(self.build_lib))
        super().run()
        # Editable/develop installs import from src/: generate there too.
        if getattr(self, "editable_mode", False):
            generate(HERE / "src")


class SdistWithProtos(sdist):
    """sdist that carries a copy of the protos, so it builds away from the repository."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        dest = Path(base_dir) / "proto"
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(proto_root(), dest)


def dependencies() -> list[str]:
    """Runtime lower bounds: at least the versions the stubs were generated with."""
    try:
        tools, protobuf = tools_versions()
    except Exception:  # metadata-only hooks may run without grpcio-tools
        tools, protobuf = "1.62.0", "4.25.0"
    major_minor = ".".join(tools.split(".")[:2])
    return [
        f"grpcio>={tools}",
        f"grpcio-status>={major_minor}",
        f"grpcio-reflection>={major_minor}",
        f"protobuf>={protobuf},<{int(protobuf.split('.')[0]) + 1}",
    ]


setup(
    install_requires=dependencies(),
    cmdclass={"build_py": BuildWithStubs, "sdist": SdistWithProtos},
)
