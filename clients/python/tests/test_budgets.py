"""Cost and budgets through the client, against the mesh with a price table: the scripted backend
reports 100 prompt and 10 completion tokens a call, priced at $2 / $8 per million tokens."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Iterator, List

import grpc
import pytest

from assay_client import Assay, AssayError, AsyncAssay, checklist_eval, cost_usd
from conftest import TOKEN, Mesh, ScriptedLlm, serving_mesh

PROMPT, COMPLETION = 100, 10
PER_CALL = PROMPT + COMPLETION
INPUT_USD, OUTPUT_USD = 2.0, 8.0
COST_PER_CALL = (PROMPT * INPUT_USD + COMPLETION * OUTPUT_USD) / 1e6
QUESTIONS = ["Mentions leaves?", "Is it short?"]
#: Records scored at once (the budget's reservations decide how many calls are in flight).
IN_FLIGHT = 4


def records(n: int) -> List[Dict[str, Any]]:
    return [{"id": f"r{i}", "input": "Describe autumn.", "target": f"Red leaves fall ({i})."} for i in range(n)]


@pytest.fixture(scope="module")
def priced_llm() -> Iterator[ScriptedLlm]:
    server = ScriptedLlm(usage={"prompt_tokens": PROMPT, "completion_tokens": COMPLETION})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def priced_mesh(priced_llm: ScriptedLlm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    config: Path = tmp_path_factory.mktemp("prices") / "assay.toml"
    config.write_text(f'[backends.openai.prices."*"]\ninput = {INPUT_USD}\noutput = {OUTPUT_USD}\n')
    yield from serving_mesh(priced_llm, {"ASSAY_CONFIG": str(config)})


@pytest.fixture()
def priced(priced_mesh: Mesh, priced_llm: ScriptedLlm) -> Iterator[Assay]:
    priced_llm.reset()
    with Assay(priced_mesh.address, token=TOKEN, timeout=60) as c:
        yield c


def tokens(usage: Any) -> int:
    return int(usage.prompt_tokens + usage.completion_tokens)


def test_an_unbudgeted_run_costs_its_calls_at_the_price_table(priced: Assay, priced_llm: ScriptedLlm) -> None:
    ev = priced.evaluate(records(12), checklist=QUESTIONS)
    calls = priced_llm.calls("checklist_answers")
    assert calls == 12, "one judging call per record"
    assert ev.usage.calls == calls and tokens(ev.usage) == calls * PER_CALL
    assert ev.cost_usd is not None and math.isclose(ev.cost_usd, calls * COST_PER_CALL, rel_tol=1e-9)
    assert ev.unpriced_calls == 0

    priced_llm.reset()
    run = priced.run(checklist_eval(records(8), checklist_given=QUESTIONS))
    run.wait()
    calls = priced_llm.calls("checklist_answers")
    assert run.state_name == "succeeded" and calls == 8
    assert run.cost_usd is not None and math.isclose(run.cost_usd, calls * COST_PER_CALL, rel_tol=1e-9)
    stored = run.record()
    assert cost_usd(stored) == run.cost_usd, "the result's cost is the stored run's"
    assert stored.budget_exhausted == "" and not stored.HasField("budget")


def test_a_tenth_of_the_tokens_ends_partial_keeping_what_was_scored(priced: Assay, priced_llm: ScriptedLlm) -> None:
    n = 100
    limit = n * PER_CALL // 10
    pipeline = checklist_eval(records(n), checklist_given=QUESTIONS, record_concurrency=IN_FLIGHT)
    run = priced.run(pipeline, label="budget", max_tokens=limit)
    run.wait()
    assert run.state_name == "partial"
    stored = run.record()
    assert stored.budget.max_tokens == limit and not stored.budget.HasField("max_cost_usd")
    assert stored.budget_exhausted.startswith("budget exhausted"), stored.budget_exhausted
    ev = run.evaluation
    assert ev is not None and len(ev) == n, "every record is accounted for"
    scored = [r for r in ev.results if r.HasField("score")]
    calls = priced_llm.calls("checklist_answers")
    assert 0 < len(scored) < n
    assert calls == len(scored), "every call made scored a record; none was started for nothing"
    used = tokens(ev.usage)
    assert used == calls * PER_CALL, "every call made is charged"
    # Every call reserved its worst case before it was sent: the limit is never passed.
    assert 0 < used <= limit, f"{used} tokens for a limit of {limit}"
    for r in ev.results:
        if not r.HasField("score"):
            assert r.error.startswith("not run: budget exhausted"), r.error
    assert ev.cost_usd is not None and math.isclose(ev.cost_usd, calls * COST_PER_CALL, rel_tol=1e-9)


async def test_asyncio_evaluate_stops_at_half_the_cost(priced_mesh: Mesh, priced_llm: ScriptedLlm) -> None:
    # Half the run's cost: enough for several calls' worst case (the prompt estimated and the
    # scorer's completion limit, reserved before each call is sent), not for every record.
    n = 100
    limit = n * COST_PER_CALL / 2
    priced_llm.reset()
    async with AsyncAssay(priced_mesh.address, token=TOKEN, timeout=60) as client:
        ev = await client.evaluate(records(n), checklist=QUESTIONS, record_concurrency=IN_FLIGHT, max_cost_usd=limit)
    scored = [r for r in ev.results if r.HasField("score")]
    calls = priced_llm.calls("checklist_answers")
    assert len(ev) == n and 0 < len(scored) < n
    assert calls == len(scored)
    assert ev.cost_usd is not None and math.isclose(ev.cost_usd, calls * COST_PER_CALL, rel_tol=1e-9)
    assert 0 < ev.cost_usd <= limit + 1e-12
    assert all(r.error.startswith("not run: budget exhausted") for r in ev.results if not r.HasField("score"))
    assert ev.budget_exhausted.startswith("budget exhausted"), ev.budget_exhausted


def test_a_budget_the_gateway_refuses_comes_back_naming_its_field(priced: Assay, priced_llm: ScriptedLlm) -> None:
    with pytest.raises(AssayError) as refused:
        priced.evaluate(records(2), checklist=QUESTIONS, max_tokens=0)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "budget.max_tokens" in refused.value.fields, refused.value.fields

    run = priced.run(checklist_eval(records(2), checklist_given=QUESTIONS), max_cost_usd=-1.0)
    with pytest.raises(AssayError) as refused:
        run.wait()
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "budget.max_cost_usd" in refused.value.fields, refused.value.fields

    # What the wire cannot carry is refused before any call.
    with pytest.raises(ValueError, match="budget.max_tokens"):
        priced.evaluate(records(2), checklist=QUESTIONS, max_tokens=-1)
    with pytest.raises(TypeError, match="budget.max_cost_usd"):
        priced.evaluate(records(2), checklist=QUESTIONS, max_cost_usd="5")  # type: ignore[arg-type]
    assert priced_llm.calls("checklist_answers") == 0


def test_a_debate_costs_what_its_stored_run_says(priced: Assay, priced_llm: ScriptedLlm) -> None:
    from test_pipelines import debate_handlers

    debate_handlers(priced_llm)
    run = priced.debate(["What is 2 + 2?", "What is 3 + 1?"], baselines=True)
    run.wait()
    assert run.state_name == "succeeded"
    calls = len(priced_llm.requests)
    assert calls > 0 and run.usage is not None and run.usage.calls == calls
    assert run.cost_usd is not None and math.isclose(run.cost_usd, calls * COST_PER_CALL, rel_tol=1e-9)
    stored = cost_usd(run.record())
    assert stored is not None and math.isclose(stored, run.cost_usd, rel_tol=1e-9)


def test_a_model_without_a_price_costs_unknown_never_zero(mesh: Mesh, llm: ScriptedLlm) -> None:
    with Assay(mesh.address, token=TOKEN, timeout=60) as client:
        ev = client.evaluate(records(3), checklist=QUESTIONS)
        assert ev.usage.calls == 3
        assert ev.cost_usd is None and cost_usd(ev) is None
        assert ev.unpriced_calls == 3
        run = client.run(checklist_eval(records(2), checklist_given=QUESTIONS))
        run.wait()
        assert run.cost_usd is None and run.unpriced_calls == 2
