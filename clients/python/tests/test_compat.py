"""The automatic check of the server's protos: once per client, before its first RPC; a newer
server warns once, a failed check never fails the call."""

from __future__ import annotations

import asyncio
import logging
import warnings
from typing import Any, Iterator, List

import grpc
import pytest
from google.protobuf import descriptor_pb2

from assay_client import Assay, AssayError, AsyncAssay, ServerNewerWarning, _compat, checklist_eval
from conftest import TOKEN, Mesh

QUESTIONS = ["Mentions leaves?"]
RECORDS = [{"id": "a", "input": "Describe autumn.", "target": "red leaves"}]


class Counter:
    """Wraps one of ``_compat``'s reflection functions and counts its calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.calls = 0
        real = getattr(_compat, name)
        if asyncio.iscoroutinefunction(real):

            async def counted_async(*args: Any) -> Any:
                self.calls += 1
                return await real(*args)

            monkeypatch.setattr(_compat, name, counted_async)
        else:

            def counted(*args: Any) -> Any:
                self.calls += 1
                return real(*args)

            monkeypatch.setattr(_compat, name, counted)


@pytest.fixture()
def newer_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's gateway.proto as reflection serves it, plus a field ``Run.owner = 99``: what a
    newer server (a v1 that grew) looks like to this client."""
    real = _compat.files_of

    def grown(responses: Any) -> List[descriptor_pb2.FileDescriptorProto]:
        files = real(responses)
        gateway = next(f for f in files if f.name == "assay/gateway/v1/gateway.proto")
        run = next(m for m in gateway.message_type if m.name == "Run")
        run.field.add(name="owner", number=99, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING)
        return files

    monkeypatch.setattr(_compat, "files_of", grown)


@pytest.fixture()
def caught() -> Iterator[List[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen


def newer_warnings(seen: List[warnings.WarningMessage]) -> List[warnings.WarningMessage]:
    return [w for w in seen if issubclass(w.category, ServerNewerWarning)]


def test_a_current_server_is_checked_once_without_a_warning(
    mesh: Mesh, monkeypatch: pytest.MonkeyPatch, caught: List[warnings.WarningMessage]
) -> None:
    reflect = Counter(monkeypatch, "reflect")
    with Assay(mesh.address, token=TOKEN, timeout=60) as client:
        ev = client.evaluate(RECORDS, checklist=QUESTIONS)
        client.get_run(ev.run_id)
        client.list_runs(limit=1)
        assert client.run(checklist_eval(RECORDS, checklist_given=QUESTIONS)).wait() is not None
    assert reflect.calls == 1, "one reflection check per client, before its first RPC"
    assert newer_warnings(caught) == []


def test_a_newer_server_warns_once_across_calls(
    mesh: Mesh, newer_server: None, monkeypatch: pytest.MonkeyPatch, caught: List[warnings.WarningMessage]
) -> None:
    reflect = Counter(monkeypatch, "reflect")
    with Assay(mesh.address, token=TOKEN, timeout=60) as client:
        ev = client.evaluate(RECORDS, checklist=QUESTIONS)
        assert ev.mean_score == 1.0, "the call itself is unaffected"
        client.get_run(ev.run_id)
        client.list_runs(limit=1)
        run = client.run(checklist_eval(RECORDS, checklist_given=QUESTIONS))
        assert run.wait() is not None and run.state_name == "succeeded"
        assert [e.kind for e in client.watch(run.run_id)][-1] == "completed"
    assert reflect.calls == 1
    found = newer_warnings(caught)
    assert len(found) == 1, [str(w.message) for w in found]
    assert "field assay.gateway.v1.Run.owner = 99" in str(found[0].message)
    assert found[0].filename == __file__, "the warning points at the caller's line"
    # A second client warns again (once per client).
    with Assay(mesh.address, token=TOKEN) as again:
        again.list_runs(limit=1)
        again.list_runs(limit=1)
    assert len(newer_warnings(caught)) == 2


def test_check_server_false_makes_no_check(
    mesh: Mesh, newer_server: None, monkeypatch: pytest.MonkeyPatch, caught: List[warnings.WarningMessage]
) -> None:
    reflect = Counter(monkeypatch, "reflect")
    with Assay(mesh.address, token=TOKEN, check_server=False) as client:
        client.evaluate(RECORDS, checklist=QUESTIONS)
        client.list_runs(limit=1)
        # The explicit check still reports.
        assert client.check_server() == ["field assay.gateway.v1.Run.owner = 99"]
    assert reflect.calls == 1
    assert len(newer_warnings(caught)) == 1


def test_a_server_without_reflection_never_fails_the_call(
    mesh: Mesh, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, caught: List[warnings.WarningMessage]
) -> None:
    # A reflection path the server does not serve: UNIMPLEMENTED, as from a server without it.
    monkeypatch.setattr(_compat, "REFLECTION", "/grpc.reflection.v1alpha.ServerReflection/Missing")
    reflect = Counter(monkeypatch, "reflect")
    caplog.set_level(logging.DEBUG, logger="assay_client")
    with Assay(mesh.address, token=TOKEN, timeout=60) as client:
        assert client.evaluate(RECORDS, checklist=QUESTIONS).mean_score == 1.0
        assert client.list_runs(limit=1)
        with pytest.raises(AssayError) as err:
            client.check_server()
        assert err.value.code == grpc.StatusCode.UNIMPLEMENTED, "the explicit check does raise"
    assert reflect.calls == 2, "the automatic check is not retried after UNIMPLEMENTED"
    failed = [r for r in caplog.records if "server check failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.DEBUG
    assert "UNIMPLEMENTED" in failed[0].getMessage()
    assert newer_warnings(caught) == []


def test_an_unreachable_server_fails_the_call_not_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    reflect = Counter(monkeypatch, "reflect")
    listener = __import__("socket").socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens on the port now
    with Assay(f"127.0.0.1:{port}", token=TOKEN, timeout=5) as client:
        for _ in range(4):
            with pytest.raises(AssayError) as err:
                client.list_runs()
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert reflect.calls == _compat.AUTO_CHECK_ATTEMPTS, "tried again on the next calls, a bounded number of times"


async def test_asyncio_checks_once_across_concurrent_calls(
    mesh: Mesh, newer_server: None, monkeypatch: pytest.MonkeyPatch, caught: List[warnings.WarningMessage]
) -> None:
    reflect = Counter(monkeypatch, "reflect")
    async with AsyncAssay(mesh.address, token=TOKEN, timeout=60) as client:
        evaluations = await asyncio.gather(*(client.evaluate(RECORDS, checklist=QUESTIONS) for _ in range(3)))
        assert [e.mean_score for e in evaluations] == [1.0, 1.0, 1.0]
        events = [e.kind async for e in client.run(checklist_eval(RECORDS, checklist_given=QUESTIONS))]
        assert events[-1] == "completed"
        await client.list_runs(limit=1)
    assert reflect.calls == 1
    found = newer_warnings(caught)
    assert len(found) == 1 and "Run.owner = 99" in str(found[0].message)
    async with AsyncAssay(mesh.address, token=TOKEN, check_server=False) as quiet:
        await quiet.list_runs(limit=1)
    assert reflect.calls == 1 and len(newer_warnings(caught)) == 1
