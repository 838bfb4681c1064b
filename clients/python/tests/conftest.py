"""Fixtures: a scripted OpenAI-compatible backend, the whole mesh (`assay up --backend openai`) on
free ports against it, and a TCP proxy that can drop its connections.

The `assay` binary comes from $ASSAY_BIN, else the workspace's target/release or target/debug.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
TOKEN = "client-tests-token"
Handler = Callable[[Dict[str, Any], str], Any]


def leaves_answers(request: Dict[str, Any], prompt: str) -> Any:
    """The batch judge: YES to a question mentioning leaves when the response mentions leaves,
    YES to every other question. Targets containing "slow" are answered after 150 ms."""
    questions = re.findall(r"Q(\d+): (.*)", prompt)
    response = prompt.split("Q1:")[0]
    answers = []
    for index, question in questions:
        yes = "leaves" in response if "leaves" in question.lower() else True
        answers.append({"question_index": int(index), "answer": "YES" if yes else "NO"})
    if "slow" in response:
        time.sleep(0.15)
    return {"answers": answers}


class ScriptedLlm:
    """An OpenAI-compatible HTTP server answering chat/completions by the JSON schema's name
    (``handlers[name](request, last user message)`` -> a JSON value or text) and /v1/embeddings.

    Each chat reply reports ``usage`` (prompt and completion tokens) when set, else a quarter of
    the prompt's and the reply's characters."""

    def __init__(self, usage: Optional[Dict[str, int]] = None) -> None:
        self.handlers: Dict[str, Handler] = {"checklist_answers": leaves_answers}
        self.usage = usage
        self.requests: List[str] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        llm = self

        class Http(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
                if self.path.endswith("/embeddings"):
                    texts = body.get("input")
                    texts = [texts] if isinstance(texts, str) else texts
                    data = [{"object": "embedding", "index": i, "embedding": embed(t)} for i, t in enumerate(texts)]
                    self.reply(200, {"object": "list", "data": data, "model": body.get("model", ""),
                                     "usage": {"prompt_tokens": 1, "total_tokens": 1}})
                    return
                name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name", "text")
                user = [m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user"]
                prompt = user[-1] if user else ""
                if isinstance(prompt, list):
                    prompt = " ".join(part.get("text", "") for part in prompt)
                with llm._lock:
                    llm.requests.append(name)
                handler = llm.handlers.get(name)
                llm._local.connection = self.connection
                if handler is None:
                    self.reply(400, {"error": {"message": f"scripted backend: no handler for {name!r}"}})
                    return
                answer = handler(body, prompt)
                content = answer if isinstance(answer, str) else json.dumps(answer)
                self.reply(200, {
                    "id": "scripted", "object": "chat.completion", "model": body.get("model", "scripted"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": content}}],
                    "usage": llm.usage_of(prompt, content),
                })

            def reply(self, status: int, value: Any) -> None:
                data = json.dumps(value).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the mesh gave up on the call (a cancelled run)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Http)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def usage_of(self, prompt: str, content: str) -> Dict[str, int]:
        """The usage a chat reply reports."""
        if self.usage is not None:
            prompt_tokens, completion_tokens = self.usage["prompt_tokens"], self.usage["completion_tokens"]
        else:
            prompt_tokens, completion_tokens = len(prompt) // 4 + 1, len(content) // 4 + 1
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def reset(self) -> None:
        """Forget the calls counted so far."""
        with self._lock:
            self.requests.clear()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def connection(self) -> socket.socket:
        """The socket of the chat call the calling handler is answering (to see the mesh drop it)."""
        conn: socket.socket = self._local.connection
        return conn

    def calls(self, name: str) -> int:
        with self._lock:
            return self.requests.count(name)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def embed(text: str) -> List[float]:
    """A deterministic 8-dimensional bag-of-letters vector."""
    vector = [0.0] * 8
    for ch in text.lower():
        vector[ord(ch) % 8] += 1.0
    norm = sum(v * v for v in vector) ** 0.5 or 1.0
    return [v / norm for v in vector]


def assay_binary() -> str:
    for candidate in (os.environ.get("ASSAY_BIN"), REPO / "target/release/assay", REPO / "target/debug/assay"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    pytest.fail("the assay binary is missing: build it (cargo build --release -p assay-cli) or set ASSAY_BIN")


class Mesh:
    """`assay up --backend openai` on free ports, a temp store and the scripted backend."""

    def __init__(self, llm: ScriptedLlm, token: str, extra_env: Optional[Dict[str, str]] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="assay-client-tests-")
        env = dict(os.environ)
        env.update({
            "OPENAI_BASE_URL": llm.base_url,
            "OPENAI_API_KEY": "scripted",
            "OPENAI_MODEL": "scripted",
            "ASSAY__GATEWAY__STORE": os.path.join(self.dir, "runs.db"),
            "ASSAY__CACHE__ENABLED": "false",
            "ASSAY__AUTH_TOKEN": token,
            "RUST_LOG": "warn",
            "NO_COLOR": "1",
        })
        for port in ("GATEWAY", "GENERATOR", "REFINERS", "SCORER", "ARBITER", "DELTA_JUDGE", "DEBATE", "ADMIN"):
            env[f"ASSAY__PORTS__{port}"] = "0"
        env.update(extra_env or {})
        self.log: List[str] = []
        self.process = subprocess.Popen(
            [assay_binary(), "up", "--backend", "openai"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        found = threading.Event()
        self.address = ""

        def drain() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.log.append(line)
                match = re.search(r"gateway on (\S+)", line)
                if match and not self.address:
                    self.address = match.group(1)
                    found.set()
            found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(60) or not self.address:
            self.stop()
            raise RuntimeError("assay up printed no gateway address:\n" + "".join(self.log))
        self.address = self.address.removeprefix("http://").removeprefix("https://")

    def wait_serving(self, channel: grpc.Channel) -> None:
        """Wait until the gateway's health says SERVING (health needs no token)."""
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 60
        while True:
            try:
                status = health.Check(
                    health_pb2.HealthCheckRequest(service="assay.gateway.v1.GatewayService"),
                    timeout=5, wait_for_ready=True,
                ).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway never became SERVING")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=35)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Proxy:
    """A TCP proxy on a free port to ``target``; :meth:`drop` closes every open connection (the
    listener stays up, so clients reconnect)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._conns: List[socket.socket] = []
        self._lock = threading.Lock()
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        raise OSError("closed")
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def drop(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.dropped += 1

    def close(self) -> None:
        self.listener.close()
        self.drop()


@pytest.fixture(scope="session")
def llm() -> Iterator[ScriptedLlm]:
    server = ScriptedLlm()
    yield server
    server.stop()


def serving_mesh(llm: ScriptedLlm, env: Optional[Dict[str, str]] = None) -> Iterator[Mesh]:
    """`assay up` against `llm` (with `env` added), yielded once SERVING, stopped afterwards."""
    m = Mesh(llm, TOKEN, env)
    try:
        channel = grpc.insecure_channel(m.address)
        m.wait_serving(channel)
        channel.close()
        yield m
    finally:
        m.stop()


@pytest.fixture(scope="session")
def mesh(llm: ScriptedLlm) -> Iterator[Mesh]:
    yield from serving_mesh(llm)


@pytest.fixture()
def proxy(mesh: Mesh) -> Iterator[Proxy]:
    p = Proxy(mesh.address)
    yield p
    p.close()
