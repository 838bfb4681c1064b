"""Large runs through the client against a real mesh: an open checklist_eval run fed with
AppendRecords (one client stream, messages of a batch each, the last one sealing) and its results
read back a page at a time with ListRunResults."""

from __future__ import annotations

import time
from typing import Any, AsyncIterator, Dict, Iterator, List

import grpc
import pytest

from assay_client import Assay, AssayError, AsyncAssay, checklist_eval, pb
from conftest import TOKEN, Mesh

QUESTIONS = ["Mentions leaves?", "Is it short?"]
#: A run id of the gateway's form that no run has.
UNKNOWN_RUN = "00000000-0000-7000-8000-000000000000"


def rows(start: int, stop: int, prefix: str = "o") -> Iterator[Dict[str, str]]:
    """Records start..stop-1, made as they are read; every third mentions leaves (pass rate 1.0,
    else 0.5)."""
    for i in range(start, stop):
        yield {"id": f"{prefix}{i}", "input": "Describe autumn.", "target": f"leaves {i}" if i % 3 == 0 else f"stones {i}"}


def expected_pass_rate(index: int) -> float:
    return 1.0 if index % 3 == 0 else 0.5


@pytest.fixture()
def client(mesh: Mesh) -> Iterator[Assay]:
    with Assay(mesh.address, token=TOKEN, timeout=60) as c:
        yield c


class PageSpy:
    """Wraps the client's unary calls and records the size of every ListRunResults page."""

    def __init__(self, client: Assay, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pages: List[int] = []
        calls = client._aio  # the sync client's calls are made by its asyncio client
        real = calls._call

        async def spied(name: str, request: Any, timeout: Any) -> Any:
            response = await real(name, request, timeout)
            if name == "ListRunResults":
                self.pages.append(len(response.results))
            return response

        monkeypatch.setattr(calls, "_call", spied)


def test_an_open_run_takes_2500_records_in_batches_and_pages_its_results(
    client: Assay, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = client.run(checklist_eval([], checklist_given=QUESTIONS), open=True, label="open 2500")
    run_id = run.started()
    first = client.append_records(run, rows(0, 2_000), batch_size=1_000)
    assert (first.run_id, first.appended, first.records_total, first.sealed) == (run_id, 2_000, 2_000, False)
    assert client.get_run(run_id).open, "the run takes records until sealed"
    last = client.append_records(run_id, rows(2_000, 2_500), seal=True, batch_size=1_000)
    assert (last.appended, last.records_total, last.sealed) == (500, 2_500, True)

    result = run.wait()
    assert run.state_name == "succeeded", run.state_name
    assert result.WhichOneof("result") == "checklist_eval" and result.checklist_eval.results_paged
    assert len(result.checklist_eval.results) == 0, "an open run's results are read with ListRunResults"
    assert run.evaluation is not None and run.evaluation.results_paged
    stored = client.get_run(run_id)
    assert not stored.open and stored.records_total == 2_500 and stored.records_done == 2_500

    spy = PageSpy(client, monkeypatch)
    results = list(client.list_run_results(run_id, page_size=1_000))
    assert spy.pages == [1_000, 1_000, 500]
    assert len(results) == 2_500
    assert [r.index for r in results] == list(range(2_500))
    assert [r.record_id for r in results] == [f"o{i}" for i in range(2_500)]
    unscored = [r.index for r in results if r.error or not r.HasField("score")]
    assert unscored == [], f"records without a score: {unscored[:10]}"
    assert [r.score.pass_rate for r in results] == [expected_pass_rate(i) for i in range(2_500)]
    assert all(r.checklist_id for r in results), "each result names its checklist"

    with pytest.raises(AssayError) as caught:
        client.append_records(run_id, [{"id": "late", "target": "leaves"}])
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION, caught.value
    with pytest.raises(AssayError) as caught:
        client.append_records(run_id, [], seal=True)
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION, caught.value
    assert client.get_run(run_id).records_total == 2_500


def test_list_run_results_of_an_unknown_run_is_not_found(client: Assay) -> None:
    with pytest.raises(AssayError) as caught:
        list(client.list_run_results(UNKNOWN_RUN))
    assert caught.value.code == grpc.StatusCode.NOT_FOUND, caught.value
    with pytest.raises(AssayError) as caught:
        client.append_records(UNKNOWN_RUN, rows(0, 3), seal=True)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND, caught.value


def test_list_run_results_reads_a_small_run_with_inline_results(client: Assay) -> None:
    run = client.run(checklist_eval(list(rows(0, 7, "s")), checklist_given=QUESTIONS))
    run.wait()
    assert run.evaluation is not None and not run.evaluation.results_paged
    inline = [(r.index, r.record_id, r.score.pass_rate) for r in run.evaluation.results]
    paged = [(r.index, r.record_id, r.score.pass_rate) for r in client.list_run_results(run, page_size=3)]
    assert paged == inline and len(paged) == 7


def test_a_run_not_created_open_takes_no_records(client: Assay) -> None:
    run = client.run(checklist_eval(list(rows(0, 2, "c")), checklist_given=QUESTIONS))
    run.wait()
    with pytest.raises(AssayError) as caught:
        client.append_records(run, rows(2, 3, "c"))
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION, caught.value


def test_records_appended_unsealed_are_scored_and_listed_while_the_run_is_open(client: Assay) -> None:
    run = client.run(checklist_eval(list(rows(0, 3, "p")), checklist_given=QUESTIONS), open=True)
    run_id = run.started()
    client.append_records(run_id, rows(3, 5, "p"))
    scored = 0
    for event in run:
        scored += event.kind == "record_scored"
        if scored == 5:
            break
    assert client.get_run(run_id).open
    deadline = time.monotonic() + 30
    so_far = list(client.list_run_results(run_id))
    while len(so_far) < 5 and time.monotonic() < deadline:  # results are stored as records end
        time.sleep(0.1)
        so_far = list(client.list_run_results(run_id))
    assert [r.record_id for r in so_far] == [f"p{i}" for i in range(5)]
    assert client.append_records(run_id, [], seal=True).records_total == 5
    client.watch(run_id).wait()
    assert client.get_run(run_id).state == pb.gateway.RUN_STATE_SUCCEEDED


def test_evaluate_stream_appends_a_generator_and_returns_every_result(client: Assay) -> None:
    ev = client.evaluate_stream(rows(0, 1_200, "e"), checklist=QUESTIONS, batch_size=500, page_size=400, label="stream")
    assert ev.results_paged and len(ev) == 1_200
    assert [r.record_id for r in ev.results] == [f"e{i}" for i in range(1_200)]
    assert [r.score.pass_rate for r in ev.results] == [expected_pass_rate(i) for i in range(1_200)]
    assert ev.mean_score == pytest.approx((400 * 1.0 + 800 * 0.5) / 1_200)
    assert ev.to_records()[3]["item:q1"] == "YES" and ev.to_records()[4]["item:q1"] == "NO"
    stored = client.get_run(ev.run_id)
    assert stored.state == pb.gateway.RUN_STATE_SUCCEEDED and stored.label == "stream" and not stored.open


def test_evaluate_stream_cancels_its_run_when_a_record_is_refused(client: Assay) -> None:
    def refused() -> Iterator[Dict[str, str]]:
        yield from rows(0, 3, "x")
        yield {"id": "big", "input": "x" * 300_000, "target": "y"}

    with pytest.raises(AssayError) as caught:
        client.evaluate_stream(refused(), checklist=QUESTIONS, batch_size=2, label="stream refused")
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    runs = [r for r in client.list_runs(kind="checklist_eval", limit=50) if r.label == "stream refused"]
    assert len(runs) == 1, runs
    client.watch(runs[0].run_id).wait()
    assert client.get_run(runs[0].run_id).state == pb.gateway.RUN_STATE_CANCELLED


async def test_asyncio_open_run_append_and_pages(mesh: Mesh) -> None:
    async def arows(start: int, stop: int) -> AsyncIterator[Dict[str, str]]:
        for record in rows(start, stop, "a"):
            yield record

    async with AsyncAssay(mesh.address, token=TOKEN, timeout=60) as client:
        run = client.run(checklist_eval([], checklist_given=QUESTIONS), open=True)
        appended = await client.append_records(run, arows(0, 250), seal=True, batch_size=100)
        assert (appended.appended, appended.records_total, appended.sealed) == (250, 250, True)
        events = [e async for e in run]
        assert events[0].kind == "started", "the event read to learn the run's id is still yielded"
        assert run.state_name == "succeeded"
        results = [r async for r in client.list_run_results(run.run_id, page_size=100)]
        assert [r.index for r in results] == list(range(250))
        assert [r.record_id for r in results] == [f"a{i}" for i in range(250)]
        assert all(r.HasField("score") and not r.error for r in results)
        with pytest.raises(AssayError) as caught:
            await client.append_records(run.run_id, arows(250, 251))
        assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(AssayError) as caught:
            [r async for r in client.list_run_results(UNKNOWN_RUN)]
        assert caught.value.code == grpc.StatusCode.NOT_FOUND

        ev = await client.evaluate_stream(arows(0, 40), checklist=QUESTIONS, batch_size=16)
        assert [r.record_id for r in ev.results] == [f"a{i}" for i in range(40)]
        assert ev.mean_score == pytest.approx((14 * 1.0 + 26 * 0.5) / 40)
