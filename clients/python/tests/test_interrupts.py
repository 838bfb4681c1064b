"""Deadlines and Ctrl-C: a deadline is DEADLINE_EXCEEDED and drops the work; Ctrl-C during
`evaluate` drops the call and its work; Ctrl-C while iterating a run drops the stream only (the run
goes on in the gateway) unless the Run was made with ``cancel_on_interrupt=True``."""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import grpc
import pytest

from assay_client import Assay, AssayError, Run, checklist_eval, pb
from conftest import TOKEN, Mesh, ScriptedLlm

QUESTIONS = ["Mentions leaves?"]


class Hold:
    """A checklist_answers handler that holds every call whose prompt contains ``marker`` until
    :meth:`release`, or until the mesh drops the call (then ``dropped`` is set)."""

    def __init__(self, llm: ScriptedLlm, marker: str) -> None:
        self.llm = llm
        self.marker = marker
        self.inner = llm.handlers["checklist_answers"]
        self.arrived = threading.Event()
        self.dropped = threading.Event()
        self._released, self._release = socket.socketpair()

    def __call__(self, request: Dict[str, Any], prompt: str) -> Any:
        if self.marker in prompt:
            conn = self.llm.connection()
            self.arrived.set()
            ready, _, _ = select.select([conn, self._released], [], [], 60)
            # The request was read whole: the mesh's side becoming readable means it hung up.
            if conn in ready and conn.recv(1, socket.MSG_PEEK) == b"":
                self.dropped.set()
        return self.inner(request, prompt)

    def release(self) -> None:
        """Let held calls (and every later one) through."""
        self._release.send(b"x")

    def close(self) -> None:
        self.release()
        self._release.close()


@pytest.fixture()
def hold(llm: ScriptedLlm, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Hold]:
    h = Hold(llm, f"HOLD-{request.node.name}")
    monkeypatch.setitem(llm.handlers, "checklist_answers", h)
    yield h
    h.close()


@pytest.fixture()
def client(mesh: Mesh) -> Iterator[Assay]:
    with Assay(mesh.address, token=TOKEN, timeout=60) as c:
        yield c


def ctrl_c_once(*ready: threading.Event, inside: Optional[Callable[..., Any]] = None) -> None:
    """Send this process SIGINT (Ctrl-C) once every ``ready`` event is set and, with ``inside``,
    once the main thread is blocked in that function (where a user's Ctrl-C lands)."""
    main = threading.main_thread().ident
    code = getattr(inside, "__code__", None)

    def blocked_inside() -> bool:
        frame = sys._current_frames().get(main or 0)
        while frame is not None:
            if frame.f_code is code:
                return True
            frame = frame.f_back
        return False

    def interrupt() -> None:
        deadline = time.monotonic() + 60
        if not all(e.wait(60) for e in ready):
            return
        tick = threading.Event()
        while code is not None and not blocked_inside() and time.monotonic() < deadline:
            tick.wait(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()


def held_records(hold: Hold, n: int = 3) -> List[dict]:
    return [{"id": f"h{i}", "input": "Describe autumn.", "target": f"leaves {hold.marker} {i}"} for i in range(n)]


def test_a_deadline_is_deadline_exceeded_and_the_work_is_dropped(client: Assay, mesh: Mesh, hold: Hold) -> None:
    with pytest.raises(AssayError) as caught:
        client.evaluate(held_records(hold), checklist=QUESTIONS, timeout=0.5)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert hold.arrived.is_set(), "the deadline expired while the model call was held"
    assert hold.dropped.wait(30), "the gateway dropped the model call"
    # The client's default deadline (Assay(timeout=...)) applies the same way.
    with Assay(mesh.address, token=TOKEN, timeout=0.5) as short:
        with pytest.raises(AssayError) as caught:
            short.evaluate(held_records(hold), checklist=QUESTIONS)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_ctrl_c_during_evaluate_drops_the_call_and_its_work(client: Assay, hold: Hold) -> None:
    ctrl_c_once(hold.arrived)
    with pytest.raises(KeyboardInterrupt):
        client.evaluate(held_records(hold), checklist=QUESTIONS)
    assert hold.dropped.wait(30), "the gateway dropped the model call of the interrupted evaluate"
    hold.release()
    assert client.evaluate([{"target": "leaves"}], checklist=QUESTIONS).mean_score == 1.0, "the client still works"


def interrupted_run(client: Assay, hold: Hold, **options: Any) -> Tuple[Run, List[str]]:
    """A run whose first model call is held, interrupted by Ctrl-C while its iteration waits for
    the next event (after ``started`` and ``checklist_ready``, the events before any model call)."""
    before_the_model = threading.Event()
    kinds: List[str] = []
    ctrl_c_once(hold.arrived, before_the_model, inside=Run.__next__)
    run = client.run(checklist_eval(held_records(hold), checklist_given=QUESTIONS, record_concurrency=1), **options)
    with pytest.raises(KeyboardInterrupt):
        for event in run:
            kinds.append(event.kind)
            if event.kind == "checklist_ready":
                before_the_model.set()
    return run, kinds


def test_ctrl_c_while_iterating_a_run_leaves_the_run_going(client: Assay, hold: Hold) -> None:
    run, kinds = interrupted_run(client, hold)
    assert kinds == ["started", "checklist_ready"] and run.run_id
    with pytest.raises(StopIteration):
        next(run)  # the stream is dropped
    assert client.get_run(run.run_id).state == pb.gateway.RUN_STATE_RUNNING, "not cancelled in the gateway"
    assert not hold.dropped.is_set(), "the held model call goes on"
    hold.release()
    watched = client.watch(run.run_id)
    assert watched.wait() is not None and watched.state_name == "succeeded"
    assert watched.evaluation is not None and len(watched.evaluation) == 3


def test_ctrl_c_with_cancel_on_interrupt_cancels_the_run(client: Assay, hold: Hold) -> None:
    run, kinds = interrupted_run(client, hold, cancel_on_interrupt=True)
    assert kinds == ["started", "checklist_ready"] and run.run_id
    stored = client.get_run(run.run_id)
    assert stored.state == pb.gateway.RUN_STATE_CANCELLED
    assert any(a.action == "cancel" and "interrupted" in a.detail for a in stored.audit_log), stored.audit_log
    assert hold.dropped.wait(30), "the cancelled run dropped its model call"
