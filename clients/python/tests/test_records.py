"""Evaluation records from plain Python values, without a mesh: dicts, dataclasses, messages and
bare strings (each a record's target). `evaluate(["hello"])` with the default preset reached the
server as a record without an input and came back "input must not be empty"; it is now refused
before any call, saying what a bare string is and what to pass instead."""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator, Dict, Iterator, List

import pytest

from assay_client import Assay, AsyncAssay, checklist_eval
from assay_client import _common, _convert
from assay_client.pb import gateway as gateway_pb2


@dataclasses.dataclass
class Row:
    id: str
    input: str
    target: str


def test_dicts_dataclasses_and_messages_become_records() -> None:
    pipeline = checklist_eval(
        [
            {"id": "a", "input": "Describe autumn.", "target": "Red leaves."},
            Row("b", "Describe autumn.", "Grey stones."),
            gateway_pb2.EvalRecord(id="c", input="Describe autumn.", target="Wind."),
        ]
    )
    got = [(r.id, r.input, r.target) for r in pipeline.records]
    assert got == [
        ("a", "Describe autumn.", "Red leaves."),
        ("b", "Describe autumn.", "Grey stones."),
        ("c", "Describe autumn.", "Wind."),
    ]
    assert pipeline.source.WhichOneof("source") == "preset"


def test_bare_strings_are_targets_scored_against_a_given_checklist() -> None:
    pipeline = checklist_eval(["Red leaves.", "Grey stones."], checklist_given=["Mentions leaves?"])
    assert [(r.input, r.target) for r in pipeline.records] == [("", "Red leaves."), ("", "Grey stones.")]
    request = _common.evaluate_request(
        ["hello"], "tick", ["Is it a greeting?"], None, 0, None, None, {}, None, None
    )
    assert [r.target for r in request.pipeline.records] == ["hello"]
    assert request.pipeline.source.checklist.items[0].question == "Is it a greeting?"


@pytest.mark.parametrize("preset", ["tick", "rocketeval", 1])
def test_bare_strings_with_a_preset_are_refused_naming_the_record(preset: Any) -> None:
    with pytest.raises(TypeError) as refused:
        checklist_eval([{"input": "Describe autumn.", "target": "Red leaves."}, "hello"], preset=preset)
    message = str(refused.value)
    assert message.startswith("records[1]: a bare string is a record's target"), message
    assert "{'input': <prompt>, 'target': <response>}" in message and "checklist=" in message, message


@pytest.mark.parametrize("records", ["hello", b"hello", {"input": "x", "target": "y"}, 42])
def test_records_that_are_not_a_list_are_refused(records: Any) -> None:
    with pytest.raises(TypeError, match=r"^records: expected a list of records"):
        checklist_eval(records, checklist_given=["Q?"])


class Unreachable(Exception):
    """Raised instead of any RPC: the call must be refused before one."""


def test_evaluate_refuses_before_any_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: List[str] = []

    def no_call(*args: Any, **kwargs: Any) -> Any:
        calls.append("rpc")
        raise Unreachable()

    with Assay("127.0.0.1:1", check_server=False) as assay:
        monkeypatch.setattr(assay._aio, "_call", no_call)  # the calls of its asyncio client
        with pytest.raises(TypeError, match=r"^records\[0\]: a bare string"):
            assay.evaluate(["hello"])
        # With a checklist the same string is a target, and the call goes out.
        with pytest.raises(Unreachable):
            assay.evaluate(["hello"], checklist=["Is it a greeting?"])
    assert calls == ["rpc"]


async def test_async_evaluate_refuses_before_any_call() -> None:
    async with AsyncAssay("127.0.0.1:1", check_server=False) as assay:
        with pytest.raises(TypeError, match=r"^records\[0\]: a bare string"):
            await assay.evaluate(["hello"])


# Open runs: the AppendRecords messages are built from any iterable as they are sent.


def counted(n: int, read: List[int]) -> Iterator[Dict[str, str]]:
    """n records, counting in ``read`` how many were taken."""
    for i in range(n):
        read[0] += 1
        yield {"id": f"r{i}", "target": f"t{i}"}


def test_append_requests_batch_lazily_and_seal_the_last_message() -> None:
    read = [0]
    requests = _convert.append_requests("run-1", counted(2_500, read), True, 1_000)
    first = next(requests)
    assert len(first.records) == 1_000 and not first.seal and first.run_id == "run-1"
    assert read[0] == 1_001, "one message is built at a time (the next record tells it is full)"
    rest = list(requests)
    assert [len(r.records) for r in [first, *rest]] == [1_000, 1_000, 500]
    assert [r.seal for r in rest] == [False, True]
    ids = [rec.id for r in [first, *rest] for rec in r.records]
    assert ids == [f"r{i}" for i in range(2_500)]
    # A multiple of the batch size: the last full message carries the seal, no empty one follows.
    exact = list(_convert.append_requests("run-1", counted(2_000, [0]), True, 1_000))
    assert [(len(r.records), r.seal) for r in exact] == [(1_000, False), (1_000, True)]
    unsealed = list(_convert.append_requests("run-1", counted(3, [0]), False, 2))
    assert [(len(r.records), r.seal) for r in unsealed] == [(2, False), (1, False)]
    # No records: one empty message, which seals when asked.
    assert [(len(r.records), r.seal) for r in _convert.append_requests("run-1", [], True, 10)] == [(0, True)]


def test_append_requests_go_out_early_at_the_byte_cap() -> None:
    big = ({"id": f"r{i}", "target": "x" * (5 * 1024 * 1024)} for i in range(7))
    got = list(_convert.append_requests("run-1", big, True, 10_000))
    # Three records of 5 MiB fit under 16 MiB; the fourth opens the next message.
    assert [len(r.records) for r in got] == [3, 3, 1]
    assert all(r.ByteSize() < 64 * 1024 * 1024 for r in got)
    assert [r.seal for r in got] == [False, False, True]


async def test_async_append_requests_take_async_and_plain_iterables() -> None:
    async def agen() -> AsyncIterator[Any]:
        for i in range(5):
            yield {"id": f"a{i}", "target": "t"} if i % 2 else gateway_pb2.EvalRecord(id=f"a{i}", target="t")

    got = [r async for r in _convert.append_requests_async("run-2", agen(), True, 2)]
    assert [([x.id for x in r.records], r.seal) for r in got] == [
        (["a0", "a1"], False),
        (["a2", "a3"], False),
        (["a4"], True),
    ]
    plain = [r async for r in _convert.append_requests_async("run-2", counted(3, [0]), False, 10)]
    assert [(len(r.records), r.seal) for r in plain] == [(3, False)]


def test_append_requests_name_the_bad_record_and_refuse_bare_text_with_a_preset() -> None:
    with pytest.raises(TypeError, match=r"^records\[1\]: a bare string"):
        list(_convert.append_requests("run", [{"input": "i", "target": "t"}, "hello"], True, 10, "tick"))
    assert [r.target for r in next(_convert.append_requests("run", ["hello"], True, 10)).records] == ["hello"]
    with pytest.raises(ValueError, match=r"^records\[2\]: "):
        list(_convert.append_requests("run", [{}, {}, {"no_such_field": 1}], True, 10))


@pytest.mark.parametrize("size", [0, -1, 10_001])
def test_batch_sizes_outside_1_to_10000_are_refused(size: int) -> None:
    with pytest.raises(ValueError, match="batch_size: must be between 1 and 10000"):
        _convert.batch_size(size)


def test_open_sets_the_request_field_on_a_copy() -> None:
    given = gateway_pb2.RunPipelineRequest(label="mine")
    given.checklist_eval.CopyFrom(checklist_eval([], checklist_given=["Q?"]))
    opened = _convert.pipeline_request(given, open_run=True)
    assert opened.open and opened.label == "mine" and not given.open
    assert not _convert.pipeline_request(given).open
    assert _convert.pipeline_request({"checklist_eval": {}, "open": True}).open
    request = _common.open_evaluation_request("tick", ["Q?"], None, 0, None, None, {}, 100, None, "big")
    assert request.open and request.label == "big" and request.budget.max_tokens == 100
    assert len(request.checklist_eval.records) == 0
    assert request.checklist_eval.source.checklist.items[0].question == "Q?"


def test_append_records_refuses_before_any_call() -> None:
    with Assay("127.0.0.1:1", check_server=False) as assay:
        for records in ("hello", {"target": "t"}, 42):
            with pytest.raises(TypeError, match=r"^records: expected a list of records"):
                assay.append_records("run", records)
        with pytest.raises(ValueError, match="batch_size"):
            assay.append_records("run", [], batch_size=20_000)
        with pytest.raises(TypeError, match=r"^records\[0\]: a bare string"):
            assay.evaluate_stream(["hello"])


def appends_handler() -> Any:
    """A stand-in gateway whose AppendRecords reads the whole stream before it answers (so only
    the client can end a call that breaks off)."""
    import grpc

    def append(requests: Iterator[gateway_pb2.AppendRecordsRequest], context: Any) -> Any:
        n = sum(len(r.records) for r in requests)
        return gateway_pb2.AppendRecordsResponse(appended=n, records_total=n)

    return grpc.method_handlers_generic_handler(
        _common.SERVICE,
        {
            "AppendRecords": grpc.stream_unary_rpc_method_handler(
                append,
                request_deserializer=gateway_pb2.AppendRecordsRequest.FromString,
                response_serializer=gateway_pb2.AppendRecordsResponse.SerializeToString,
            )
        },
    )


def test_an_error_of_the_records_iterable_is_raised_as_it_was() -> None:
    """grpc cancels the call and reports UNKNOWN "Exception iterating requests"; the caller gets
    its own error back."""
    import grpc
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[appends_handler()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    def broken() -> Iterator[Dict[str, str]]:
        yield {"id": "a", "target": "t"}
        raise RuntimeError("the source broke")

    try:
        with Assay(f"127.0.0.1:{port}", check_server=False) as assay:
            with pytest.raises(RuntimeError, match="the source broke"):
                assay.append_records("run", broken(), batch_size=1)
            done = assay.append_records("run", counted(25, [0]), seal=True, batch_size=10)
            assert (done.appended, done.records_total) == (25, 25)
    finally:
        server.stop(None)


async def test_async_an_error_of_the_records_iterable_is_raised_as_it_was() -> None:
    import grpc

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((appends_handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    async def broken() -> AsyncIterator[Dict[str, str]]:
        yield {"id": "a", "target": "t"}
        raise RuntimeError("the async source broke")

    try:
        async with AsyncAssay(f"127.0.0.1:{port}", check_server=False) as assay:
            with pytest.raises(RuntimeError, match="the async source broke"):
                await assay.append_records("run", broken(), batch_size=1)
            with pytest.raises(TypeError, match=r"^records: expected a list of records"):
                await assay.append_records("run", "hello")
            done = await assay.append_records("run", counted(25, [0]), seal=True, batch_size=10)
            assert (done.appended, done.records_total) == (25, 25)
    finally:
        await server.stop(None)


async def test_async_evaluate_stream_refuses_bare_text_before_any_call() -> None:
    async def rows() -> AsyncIterator[str]:
        yield "hello"

    async with AsyncAssay("127.0.0.1:1", check_server=False) as assay:
        with pytest.raises(TypeError, match=r"^records\[0\]: a bare string"):
            await assay.evaluate_stream(rows())
        with pytest.raises(TypeError, match=r"^records\[0\]: a bare string"):
            await assay.evaluate_stream(iter(["hello"]))
