"""The pipeline helpers (self_refine, debate) against the mesh, with scripted model replies."""

from __future__ import annotations

import re
from typing import Any, Dict, Iterator

import pytest

from assay_client import Assay, AsyncAssay, pb
from conftest import TOKEN, Mesh, ScriptedLlm


@pytest.fixture()
def client(mesh: Mesh) -> Iterator[Assay]:
    with Assay(mesh.address, token=TOKEN, timeout=60) as c:
        yield c


def critique(request: Dict[str, Any], prompt: str) -> str:
    """Self-refine: one critique and the draft with a sentence added."""
    draft = re.search(r"<draft>\s*(.*?)\s*</draft>", prompt, re.S)
    text = draft.group(1) if draft else prompt[-400:]
    return f"<critique>\n- No example.\n</critique>\n<revised>\n{text} For example, maple leaves turn red.\n</revised>"


def test_self_refine_streams_its_pass_and_returns_the_revision(client: Assay, llm: ScriptedLlm) -> None:
    llm.handlers["text"] = critique
    draft = "Autumn is the season when the leaves change colour and fall from the trees."
    run = client.self_refine(draft, "Explain autumn to a child.", min_bytes=0, max_passes=1)
    kinds = [e.kind for e in run]
    assert kinds[0] == "started" and kinds[-1] == "completed"
    assert "self_refine_pass" in kinds
    assert run.state_name == "succeeded"
    result = run.result
    assert result is not None and result.WhichOneof("result") == "self_refine"
    assert len(result.self_refine.passes) == 1
    assert list(result.self_refine.passes[0].critique) == ["No example."]


def debate_handlers(llm: ScriptedLlm) -> None:
    def solution(request: Dict[str, Any], prompt: str) -> Any:
        return {"approach": "add", "reasoning_steps": ["2 + 2 = 4"], "final_answer": "4", "confidence": 0.9}

    def review(request: Dict[str, Any], prompt: str) -> Any:
        return {"strengths": ["correct"], "weaknesses": [], "errors": [], "suggested_changes": []}

    def refinement(request: Dict[str, Any], prompt: str) -> Any:
        return {
            "critiques_accepted": [], "critiques_rejected": [], "refinement_reasoning": "no change needed",
            "reasoning_steps": ["2 + 2 = 4"], "final_answer": "4", "confidence": 0.9,
            "changed_from_original": False, "improvement_explanation": "none",
        }

    def judgment(request: Dict[str, Any], prompt: str) -> Any:
        ids = request["response_format"]["json_schema"]["schema"]["properties"]["winner"]["enum"]
        return {"reasoning": "all agree", "winner": ids[0], "confidence": 0.9}

    llm.handlers.update(
        debate_solution=solution, debate_review=review, debate_refinement=refinement, debate_judgment=judgment
    )


def test_debate_with_baselines_grades_the_answers(client: Assay, llm: ScriptedLlm) -> None:
    debate_handlers(llm)
    run = client.debate([{"id": "sum", "problem": "What is 2 + 2?", "reference": "4"}, "What is 3 + 1?"], baselines=True)
    done = [e.payload for e in run if e.kind == "debate_problem_done"]
    assert sorted((p.id, p.final_answer, p.error) for p in done) == [("p2", "4", ""), ("sum", "4", "")]
    assert [p.correct for p in done if p.id == "sum"] == [True]
    assert run.state_name == "succeeded"
    result = run.result
    assert result is not None
    debate = result.debate
    assert debate.problems_total == 2 and debate.graded == 1 and debate.correct == 1
    assert debate.accuracy == 1.0 and debate.single_model_accuracy == 1.0
    stored = client.get_run(run.run_id)
    assert stored.kind == pb.gateway.PIPELINE_KIND_DEBATE


async def test_asyncio_self_refine(mesh: Mesh, llm: ScriptedLlm) -> None:
    llm.handlers["text"] = critique
    async with AsyncAssay(mesh.address, token=TOKEN) as client:
        run = client.self_refine("Leaves fall in autumn because the days get shorter.", min_bytes=0)
        result = await run.wait()
        assert result.self_refine.passes[0].critique[0] == "No example."
