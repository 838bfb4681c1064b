"""The client against a real mesh (`assay up --backend openai` on the scripted backend)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Iterator, List

import grpc
import pytest

from assay_client import Assay, AssayError, AsyncAssay, Evaluation, Event, checklist_eval, pb
from conftest import TOKEN, Mesh, Proxy, ScriptedLlm

QUESTIONS = ["Mentions leaves?", "Is it short?"]


def leaves_records(n: int, prefix: str = "r", slow: bool = False) -> List[dict]:
    """n records; every third one mentions leaves (pass rate 1.0, else 0.5)."""
    tag = " slow" if slow else ""
    return [
        {"id": f"{prefix}{i}", "input": "Describe autumn.", "target": (f"leaves {i}" if i % 3 == 0 else f"stones {i}") + tag}
        for i in range(n)
    ]


@pytest.fixture()
def client(mesh: Mesh) -> Assay:
    with Assay(mesh.address, token=TOKEN, timeout=60) as c:
        yield c


def test_evaluate_with_a_checklist_scores_every_record(client: Assay, llm: ScriptedLlm) -> None:
    @dataclass
    class Row:
        id: str
        input: str
        target: str

    before = llm.calls("checklist_answers")
    records = [Row("a", "Describe autumn.", "red leaves"), {"id": "b", "input": "Describe autumn.", "target": "grey stones"}]
    ev = client.evaluate(records, checklist=QUESTIONS)
    assert isinstance(ev, Evaluation)
    assert ev.run_id
    assert [(r.record_id, r.score.pass_rate) for r in ev.results] == [("a", 1.0), ("b", 0.5)]
    assert ev.mean_score == pytest.approx(0.75)
    assert ev.usage.calls == 2 and llm.calls("checklist_answers") - before == 2
    rows = ev.to_records()
    assert [(r["record_id"], r["pass_rate"], r["item:q1"], r["item:q2"]) for r in rows] == [
        ("a", 1.0, "YES", "YES"),
        ("b", 0.5, "NO", "YES"),
    ]
    pandas = pytest.importorskip("pandas")
    frame = ev.to_dataframe()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame["pass_rate"]) == [1.0, 0.5]


def test_a_streamed_run_yields_typed_events_in_sequence_and_the_result(client: Assay) -> None:
    run = client.run(checklist_eval(leaves_records(6), checklist_given=QUESTIONS), label="stream")
    events = list(run)
    assert all(isinstance(e, Event) for e in events)
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert events[0].kind == "started" and events[-1].kind == "completed"
    scored = [e.payload for e in events if e.kind == "record_scored"]
    assert sorted((r.record_id, r.score.pass_rate) for r in scored) == sorted(
        (f"r{i}", 1.0 if i % 3 == 0 else 0.5) for i in range(6)
    )
    assert run.state_name == "succeeded"
    assert run.evaluation is not None and len(run.evaluation) == 6
    assert run.evaluation.mean_score == pytest.approx((2 * 1.0 + 4 * 0.5) / 6)
    stored = client.get_run(run.run_id)
    assert stored.state == pb.gateway.RUN_STATE_SUCCEEDED and stored.label == "stream"
    assert stored.last_sequence == events[-1].sequence
    listed = client.list_runs(kind="checklist_eval", state="succeeded")
    assert run.run_id in [r.run_id for r in listed]


def test_cancel_from_the_client_ends_the_run_cancelled(client: Assay) -> None:
    records = leaves_records(40, slow=True)
    run = client.run(checklist_eval(records, checklist_given=QUESTIONS, record_concurrency=1), label="cancel")
    scored = 0
    for event in run:
        if event.kind == "record_scored":
            scored += 1
            if scored == 1:
                cancelled = run.cancel(reason="enough", actor="pytest")
                assert cancelled.run_id == run.run_id
    assert run.state_name == "cancelled"
    assert scored < len(records), "the run stopped before scoring every record"
    stored = client.get_run(run.run_id)
    assert stored.state == pb.gateway.RUN_STATE_CANCELLED
    assert any(a.action == "cancel" and a.actor == "pytest" for a in stored.audit_log), stored.audit_log


def test_a_finished_run_is_deleted_and_then_not_found(client: Assay) -> None:
    done = client.evaluate([{"target": "leaves"}], checklist=QUESTIONS)
    deleted = client.delete_run(done.run_id)
    assert deleted.run_id == done.run_id and deleted.state == pb.gateway.RUN_STATE_SUCCEEDED
    for call in (client.get_run, client.delete_run):
        with pytest.raises(AssayError) as caught:
            call(done.run_id)
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
    assert all(r.run_id != done.run_id for r in client.list_runs(limit=500))
    run = client.run(checklist_eval(leaves_records(40, slow=True), checklist_given=QUESTIONS, record_concurrency=1))
    refused = None
    for event in run:
        if event.kind == "record_scored" and refused is None:
            with pytest.raises(AssayError) as caught:
                client.delete_run(run.run_id)
            refused = caught.value
            run.cancel(reason="done")
    assert refused is not None and refused.code == grpc.StatusCode.FAILED_PRECONDITION
    assert client.delete_run(run.run_id).state == pb.gateway.RUN_STATE_CANCELLED


def test_a_refusal_is_an_assay_error_with_field_violations(client: Assay) -> None:
    with pytest.raises(AssayError) as caught:
        client.evaluate([{"input": "x" * 300_000, "target": "y"}], checklist=QUESTIONS)
    err = caught.value
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.fields == {"pipeline.records[0].input": "is 300000 bytes; the limit is 262144 bytes"}
    with pytest.raises(AssayError) as caught:
        client.evaluate([{"target": "t"}], max_items=1000)
    assert set(caught.value.fields) == {"pipeline.max_items", "pipeline.records[0].input"}
    assert "between 1 and 500" in caught.value.fields["pipeline.max_items"]
    # A refused stream fails the same way.
    with pytest.raises(AssayError) as caught:
        list(client.run({"checklist_eval": {"records": []}}))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT and "pipeline.records" in "".join(
        caught.value.fields
    ) + caught.value.message


def test_bearer_auth_is_required(mesh: Mesh) -> None:
    for token in (None, "wrong-token"):
        with Assay(mesh.address, token=token) as anonymous:
            with pytest.raises(AssayError) as caught:
                anonymous.evaluate([{"target": "t"}], checklist=QUESTIONS)
            assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(AssayError) as caught:
                anonymous.list_runs()
            assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
    with Assay(mesh.address, token=TOKEN) as ok:
        assert ok.evaluate([{"target": "leaves"}], checklist=QUESTIONS).mean_score == 1.0


def test_compare_two_runs(client: Assay) -> None:
    baseline = client.evaluate(
        [{"id": f"c{i}", "target": f"stones {i}"} for i in range(10)], checklist=QUESTIONS
    )
    candidate = client.evaluate(
        [{"id": f"c{i}", "target": f"leaves {i}" if i < 6 else f"stones {i}"} for i in range(10)],
        checklist=QUESTIONS,
    )
    cmp = client.compare(baseline, candidate, metric="pass_rate", min_effect=0.05)
    assert cmp.baseline_run_id == baseline.run_id and cmp.candidate_run_id == candidate.run_id
    assert cmp.paired and cmp.n_pairs == 10
    assert cmp.mean_baseline == pytest.approx(0.5) and cmp.mean_candidate == pytest.approx(0.8)
    assert cmp.diff == pytest.approx(0.3)
    assert cmp.HasField("gate") and not cmp.gate.regressed
    with pytest.raises(AssayError) as caught:
        client.compare(baseline, "no-such-run")
    assert caught.value.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)


def test_a_dropped_watch_is_reattached_from_its_last_sequence(client: Assay, proxy: Proxy) -> None:
    run = client.run(checklist_eval(leaves_records(12, slow=True), checklist_given=QUESTIONS, record_concurrency=1))
    first = next(run)
    run.close()  # the run goes on without a watcher
    with Assay(proxy.address, token=TOKEN) as through_proxy:
        watch = through_proxy.watch(first.run_id, after=first.sequence)
        seen = [first]
        for event in watch:
            seen.append(event)
            if len(seen) == 4:
                proxy.drop()
        assert proxy.dropped == 1 and watch.reattached >= 1
        assert [e.sequence for e in seen] == list(range(1, len(seen) + 1)), "no gap and no repeat"
        assert seen[-1].kind == "completed" and watch.state_name == "succeeded"
        assert len([e for e in seen if e.kind == "record_scored"]) == 12


def test_a_dropped_run_stream_is_reattached(client: Assay, mesh: Mesh, proxy: Proxy) -> None:
    with Assay(proxy.address, token=TOKEN) as through_proxy:
        run = through_proxy.run(checklist_eval(leaves_records(8, slow=True), checklist_given=QUESTIONS, record_concurrency=1))
        seen = []
        for event in run:
            seen.append(event)
            if len(seen) == 3:
                proxy.drop()
        assert run.reattached >= 1
        assert [e.sequence for e in seen] == list(range(1, len(seen) + 1))
        assert run.evaluation is not None and len(run.evaluation) == 8


def test_pause_and_resume(client: Assay) -> None:
    run = client.run(checklist_eval(leaves_records(10, slow=True), checklist_given=QUESTIONS, record_concurrency=1))
    states = []
    for event in run:
        if event.kind == "record_scored" and not states:
            states.append(client.pause(run.run_id, reason="look").state)
        if event.kind == "state_changed" and event.payload.state == pb.gateway.RUN_STATE_PAUSED:
            states.append(client.resume(run.run_id).state)
    assert states[0] in (pb.gateway.RUN_STATE_PAUSED, pb.gateway.RUN_STATE_RUNNING)
    assert run.state_name == "succeeded" and len(run.evaluation or []) == 10
    actions = [a.action for a in client.get_run(run.run_id).audit_log]
    assert "pause" in actions and "resume" in actions, actions


async def test_asyncio_evaluate_run_and_watch(mesh: Mesh) -> None:
    async with AsyncAssay(mesh.address, token=TOKEN, timeout=60) as client:
        ev = await client.evaluate([{"id": "x", "target": "leaves"}], checklist=QUESTIONS)
        assert ev.mean_score == 1.0
        run = client.run(checklist_eval(leaves_records(3), checklist_given=QUESTIONS))
        events = [e async for e in run]
        assert events[-1].kind == "completed" and run.evaluation is not None and len(run.evaluation) == 3
        replay = [e.sequence async for e in client.watch(run.run_id, after=1)]
        assert replay == [e.sequence for e in events][1:]
        with pytest.raises(AssayError) as caught:
            await client.evaluate([], checklist=QUESTIONS)
        assert list(caught.value.fields) == ["pipeline.records"]
        assert caught.value.fields["pipeline.records"].startswith("must not be empty"), caught.value.fields
        stored = await client.get_run(run.run_id)
        assert stored.state == pb.gateway.RUN_STATE_SUCCEEDED


def test_the_server_protos_match_and_a_newer_server_is_reported(client: Assay, mesh: Mesh) -> None:
    import warnings

    from google.protobuf import descriptor_pb2

    from assay_client import ServerNewerWarning
    from assay_client._compat import differences

    from assay_client import _compat

    channel = grpc.insecure_channel(mesh.address)
    call = channel.stream_stream(_compat.REFLECTION)
    files = _compat.files_of(call(iter([_compat.request_bytes()]), metadata=(("authorization", f"Bearer {TOKEN}"),)))
    channel.close()
    assert "assay/gateway/v1/gateway.proto" in [f.name for f in files], "reflection serves the gateway's protos"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert client.check_server() == []
    with Assay(mesh.address) as anonymous:
        with pytest.raises(AssayError) as caught:
            anonymous.check_server()
        assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
    # A server whose Run has one more field, and one more RPC and enum value.
    newer = descriptor_pb2.FileDescriptorProto()
    pb.gateway.DESCRIPTOR.CopyToProto(newer)
    run = next(m for m in newer.message_type if m.name == "Run")
    run.field.add(name="owner", number=99, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING)
    newer.service[0].method.add(name="ArchiveRun", input_type=".assay.gateway.v1.GetRunRequest",
                                output_type=".assay.gateway.v1.GetRunResponse")
    state = next(e for e in newer.enum_type if e.name == "RunState")
    state.value.add(name="RUN_STATE_ARCHIVED", number=42)
    assert differences([newer]) == [
        "field assay.gateway.v1.Run.owner = 99",
        "enum value assay.gateway.v1.RunState.RUN_STATE_ARCHIVED = 42",
        "method assay.gateway.v1.GatewayService.ArchiveRun",
    ]
    assert issubclass(ServerNewerWarning, UserWarning)


async def test_asyncio_check_server(mesh: Mesh) -> None:
    async with AsyncAssay(mesh.address, token=TOKEN) as client:
        assert await client.check_server() == []


def test_the_sync_client_works_from_threads_and_inside_a_running_event_loop(mesh: Mesh) -> None:
    """The sync client runs its calls on an event loop of its own: it works from threads that have
    no event loop (several at once on one client) and from a coroutine (a running loop, as in a
    notebook)."""
    records = leaves_records(3, "t")
    with Assay(mesh.address, token=TOKEN, timeout=60) as client:
        scores: List[float] = []
        threads = [
            threading.Thread(target=lambda: scores.append(client.evaluate(records, checklist=QUESTIONS).mean_score))
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert scores == [pytest.approx(2 / 3)] * 3

        async def inside_a_loop() -> int:
            run = client.run(checklist_eval(records, checklist_given=QUESTIONS))
            assert [e.kind for e in run][-1] == "completed"
            return client.get_run(run.run_id).state

        assert asyncio.run(inside_a_loop()) == pb.gateway.RUN_STATE_SUCCEEDED
    with pytest.raises(ValueError, match="closed"):
        client.list_runs()
    client.close()  # closing twice is harmless


def test_a_records_generator_calling_its_own_client_is_refused(client: Assay) -> None:
    """A records generator is read on the client's own thread: calling the same client from it
    is refused (it would wait for itself), and the error is raised as the generator raised it."""

    def asking() -> Iterator[dict]:
        yield {"id": "a", "target": "leaves"}
        client.list_runs(limit=1)
        yield {"id": "b", "target": "stones"}

    run = client.run(checklist_eval([], checklist_given=QUESTIONS), open=True)
    with pytest.raises(RuntimeError, match="its own event loop"):
        client.append_records(run, asking(), seal=True)
    assert client.append_records(run, [], seal=True).sealed, "the client still works"
    assert run.wait() is not None and run.state_name == "succeeded"
