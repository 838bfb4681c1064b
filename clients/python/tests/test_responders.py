"""Models under test through the client against a real mesh: ``evaluate(records, respond=[...])``
asks each responder every record's input, scores its answers against the input's checklist (one
per input, shared), and returns each responder's aggregate and the paired comparison."""

from __future__ import annotations

from typing import Any, Dict, Iterator

import pytest

from assay_client import Assay, AsyncAssay
from conftest import TOKEN, Mesh, ScriptedLlm

INPUTS = 6


def answer(request: Dict[str, Any], prompt: str) -> str:
    """A responder: model-a mentions leaves every time, model-b on even inputs only."""
    model = request.get("model", "")
    n = int(prompt.rstrip("?").split()[-1])
    leaves = model == "model-a" or n % 2 == 0
    return f"{'Falling leaves' if leaves else 'Grey stones'} for topic {n}, by {model}."


def checklist(request: Dict[str, Any], prompt: str) -> Any:
    """A generated checklist: one question about leaves, one general."""
    return {"items": [{"question": "Does it mention leaves?"}, {"question": "Is it an answer?"}]}


@pytest.fixture()
def client(mesh: Mesh, llm: ScriptedLlm) -> Iterator[Assay]:
    saved = dict(llm.handlers)
    llm.handlers.update(text=answer, checklist=checklist)
    with Assay(mesh.address, token=TOKEN, timeout=60) as c:
        yield c
    llm.handlers.clear()
    llm.handlers.update(saved)


def records() -> Any:
    return [{"id": f"q{i}", "input": f"Write about topic {i}?"} for i in range(INPUTS)]


def test_two_responders_are_scored_and_compared(client: Assay, llm: ScriptedLlm) -> None:
    llm.reset()
    e = client.evaluate(records(), preset="tick", respond=["openai:model-a", {"model": "openai:model-b", "name": "b"}])
    assert [r.name for r in e.responders] == ["model-a", "b"]
    assert llm.requests.count("checklist") == INPUTS, "one checklist per input, shared"
    assert llm.requests.count("text") == 2 * INPUTS
    rows = e.to_records()
    assert len(rows) == 2 * INPUTS
    assert [r["responder"] for r in rows[:2]] == ["model-a", "b"]
    assert rows[0]["response"] == "Falling leaves for topic 0, by model-a."
    means = {r.name: r.aggregate.mean_primary_score for r in e.responders}
    assert means["model-a"] > means["b"], means
    assert [list(r.missing) for r in e.responders] == [[], []], "every record scored for both"
    assert len(e.comparisons) == 1
    c = e.comparisons[0]
    assert (c.baseline_run_id, c.candidate_run_id, c.n_pairs) == ("model-a", "b", INPUTS)
    assert c.diff < 0


@pytest.mark.asyncio
async def test_the_async_client_takes_responders(mesh: Mesh, llm: ScriptedLlm) -> None:
    saved = dict(llm.handlers)
    llm.handlers.update(text=answer, checklist=checklist)
    try:
        async with AsyncAssay(mesh.address, token=TOKEN, timeout=60) as c:
            e = await c.evaluate(records(), preset="tick", respond=["model-a@openai", "model-b@openai"])
        assert [r.name for r in e.responders] == ["model-a", "model-b"]
        assert len(e.results) == 2 * INPUTS
    finally:
        llm.handlers.clear()
        llm.handlers.update(saved)


def test_a_streamed_evaluation_takes_responders(client: Assay, llm: ScriptedLlm) -> None:
    """``evaluate_stream(..., respond=[...])``: an open run, its records appended in batches, one
    result per (record, responder) read back in pages, the responders and their comparison."""
    e = client.evaluate_stream(
        iter(records()), preset="tick", respond=["openai:model-a", "openai:model-b"], batch_size=4, page_size=5
    )
    assert [r.name for r in e.responders] == ["model-a", "model-b"]
    rows = e.to_records()
    assert len(rows) == 2 * INPUTS
    assert [(r["record_id"], r["responder"]) for r in rows[:4]] == [
        ("q0", "model-a"),
        ("q0", "model-b"),
        ("q1", "model-a"),
        ("q1", "model-b"),
    ]
    assert rows[0]["response"] == "Falling leaves for topic 0, by model-a."
    assert [list(r.missing) for r in e.responders] == [[], []]
    c = e.comparisons[0]
    assert (c.baseline_run_id, c.candidate_run_id, c.n_pairs) == ("model-a", "model-b", INPUTS)
    assert c.diff < 0


def test_a_decided_comparison_stops_asking(client: Assay, llm: ScriptedLlm) -> None:
    """``stop_when_decided``: model-b loses half its records, so the sequence decides "worse" and
    the run stops asking long before the last of 200 records."""
    from assay_client import pb

    llm.reset()
    many = [{"id": f"q{i}", "input": f"Write about topic {1000 + i}?"} for i in range(200)]
    e = client.evaluate(many, preset="tick", respond=["openai:model-a", "openai:model-b"], stop_when_decided={"seed": 5})
    s = e.sequential
    assert s is not None and s.stopped_early, s
    assert s.seed == 5
    (c,) = s.comparisons
    assert (c.baseline, c.candidate) == ("model-a", "model-b")
    assert c.decision == pb.gateway.SEQUENTIAL_DECISION_WORSE and c.high < 0, c
    asked = 200 - len(s.records_not_asked)
    assert llm.requests.count("text") == 2 * asked < 200, "each record asked has two answers"
    assert [list(r.missing) for r in e.responders] == [[], []], "records not asked are not missing"
    with pytest.raises(ValueError, match="unknown field"):
        client.evaluate(many[:40], preset="tick", respond=["openai:model-a", "openai:model-b"], stop_when_decided={"sed": 1})
