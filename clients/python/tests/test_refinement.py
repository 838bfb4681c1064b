"""A streamed targeted refinement with a human edit: semi-auto escalates to a human, who edits a
section and accepts the document."""

from __future__ import annotations

from typing import Any, Dict, Iterator

import pytest

from assay_client import Assay, pb
from conftest import TOKEN, Mesh, ScriptedLlm

DOCUMENT = [
    {"id": "intro", "title": "Introduction", "content": "Autumn is a season."},
    {"id": "why", "title": "Why leaves fall", "content": "Trees drop leaves to save water in winter."},
]


def mediocre_verdict(request: Dict[str, Any], prompt: str) -> Any:
    """Every criterion at 0.5, no issue: below every threshold with nothing to fix."""
    names = request["response_format"]["json_schema"]["schema"]["properties"]["criterion_scores"]["required"]
    return {"criterion_scores": {n: 0.5 for n in names}, "issues": [], "section_scores": []}


@pytest.fixture()
def client(mesh: Mesh) -> Iterator[Assay]:
    with Assay(mesh.address, token=TOKEN, timeout=60) as c:
        yield c


def test_semi_auto_refinement_with_a_human_edit_and_accept(client: Assay, llm: ScriptedLlm) -> None:
    llm.handlers["section_verdict"] = mediocre_verdict
    run = client.refine(DOCUMENT, mode="semi_auto", brief={"audience": "children"}, label="human edit")
    edited = "Autumn is the season between summer and winter, when leaves turn red and fall."
    kinds = []
    for event in run:
        kinds.append(event.kind)
        if event.kind == "state_changed" and event.payload.state == pb.gateway.RUN_STATE_AWAITING_HUMAN:
            stored = client.edit_section(run.run_id, "intro", edited, actor="editor", reason="clearer")
            assert stored.run_id == run.run_id
            client.accept(run.run_id, actor="editor", reason="good enough")
    assert "refinement" in kinds and kinds[-1] == "completed"
    assert run.state_name == "succeeded"
    result = run.result
    assert result is not None and result.WhichOneof("result") == "targeted_refinement"
    refined = result.targeted_refinement
    assert refined.outcome == pb.gateway.REFINEMENT_OUTCOME_ACCEPTED_MANUAL
    assert [(s.id, s.content) for s in refined.sections] == [("intro", edited), ("why", DOCUMENT[1]["content"])]
    assert {(a.actor, a.action) for a in refined.audit_log} >= {("editor", "accept")}
    assert "intro" in refined.changed_section_ids
