"""The client over TLS: a mesh serving a test certificate (signed by a throwaway CA)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from assay_client import TLS, Assay, AssayError
from conftest import Mesh, ScriptedLlm


def make_certs(directory: Path) -> None:
    """ca.pem, and server.pem / server.key for 127.0.0.1 and localhost, with openssl."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=assay-client-tests CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost")
    (directory / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
        "basicConstraints=CA:FALSE\n"
    )
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")


@pytest.fixture(scope="module")
def tls_mesh(llm: ScriptedLlm) -> Iterator[tuple]:
    directory = Path(tempfile.mkdtemp(prefix="assay-client-tls-"))
    make_certs(directory)
    env = {
        "ASSAY__TLS__CERT": str(directory / "server.pem"),
        "ASSAY__TLS__KEY": str(directory / "server.key"),
        "ASSAY__TLS__CA": str(directory / "ca.pem"),
    }
    mesh = Mesh(llm, "", env)
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=(directory / "ca.pem").read_bytes())
        channel = grpc.secure_channel(mesh.address, creds)
        mesh.wait_serving(channel)
        channel.close()
        yield mesh, directory
    finally:
        mesh.stop()


def test_tls_with_a_test_certificate(tls_mesh: tuple) -> None:
    mesh, directory = tls_mesh
    with Assay(mesh.address, tls=TLS(ca=str(directory / "ca.pem"))) as client:
        ev = client.evaluate([{"id": "t", "target": "leaves"}], checklist=["Mentions leaves?"])
        assert ev.mean_score == 1.0
        run = client.run({"checklist_eval": {
            "source": {"checklist": {"items": [{"id": "a", "question": "Mentions leaves?"}]}},
            "records": [{"id": "u", "target": "stones"}],
        }})
        assert run.wait().checklist_eval.results[0].score.pass_rate == 0.0
    # The CA as bytes and a server-name override work the same.
    with Assay(mesh.address, tls=TLS(ca=(directory / "ca.pem").read_bytes(), server_name="localhost")) as client:
        assert client.get_run(ev.run_id).run_id == ev.run_id
    # Plaintext, or TLS trusting only the system roots, cannot talk to it.
    for tls in (None, True):
        with Assay(mesh.address, tls=tls, timeout=5) as wrong:
            with pytest.raises(AssayError) as caught:
                wrong.evaluate([{"target": "leaves"}], checklist=["Mentions leaves?"])
            assert caught.value.code == grpc.StatusCode.UNAVAILABLE
