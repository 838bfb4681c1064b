"""Evaluation records from plain Python values, without a mesh: dicts, dataclasses, messages and
bare strings (each a record's target). `evaluate(["hello"])` with the default preset reached the
server as a record without an input and came back "input must not be empty"; it is now refused
before any call, saying what a bare string is and what to pass instead."""

from __future__ import annotations

import dataclasses
from typing import Any, List

import pytest

from assay_client import Assay, AsyncAssay, checklist_eval
from assay_client import _common
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
        monkeypatch.setattr(assay, "_call", no_call)
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
