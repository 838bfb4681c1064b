"""Results of the client's calls: typed events and the evaluation table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional

from google.protobuf.message import Message

from ._proto.assay.common.v1 import common_pb2
from ._proto.assay.gateway.v1 import gateway_pb2

if TYPE_CHECKING:
    import pandas


@dataclass(frozen=True)
class Event:
    """One run event.

    ``kind`` names the event (``started``, ``progress``, ``checklist_ready``, ``record_scored``,
    ``aggregate``, ``refinement``, ``self_refine_pass``, ``debate_stage``, ``state_changed``,
    ``completed``, ``debate_problem_done``, ``self_refined``, ``records_claimed``); ``payload`` is
    its message and ``raw`` the whole ``assay.gateway.v1.RunEvent``.
    """

    run_id: str
    sequence: int
    kind: str
    payload: Optional[Message]
    raw: gateway_pb2.RunEvent

    @classmethod
    def from_proto(cls, event: gateway_pb2.RunEvent) -> "Event":
        """Wrap a RunEvent."""
        kind = event.WhichOneof("event") or ""
        payload: Optional[Message] = getattr(event, kind) if kind else None
        return cls(run_id=event.run_id, sequence=event.sequence, kind=kind, payload=payload, raw=event)

    @property
    def completed(self) -> Optional[gateway_pb2.RunCompleted]:
        """The RunCompleted payload when this is the last event of the run."""
        return self.raw.completed if self.kind == "completed" else None


def cost_usd(value: Any) -> Optional[float]:
    """The cost in US dollars of a ``Usage``, or of anything carrying one in ``usage`` (a stored
    run, an evaluation, a refinement result); None when it is unknown (a call's model has no
    price, or the server does not price calls), never 0 for unknown."""
    usage = value if isinstance(value, common_pb2.Usage) else getattr(value, "usage", None)
    if not isinstance(usage, common_pb2.Usage):
        raise TypeError(f"cost_usd: no usage in {type(value).__name__}")
    return usage.cost_usd if usage.HasField("cost_usd") else None


def sum_usage(usages: Iterable[common_pb2.Usage]) -> common_pb2.Usage:
    """The sum of ``usages``, as the mesh sums them: counts added, the cost set only when every
    part's cost is known."""
    total = common_pb2.Usage()
    known = True
    cost = 0.0
    for usage in usages:
        for field in _COUNTS:
            setattr(total, field, getattr(total, field) + getattr(usage, field))
        total.cost_estimate_usd += usage.cost_estimate_usd
        if usage.HasField("cost_usd"):
            cost += usage.cost_usd
        else:
            known = False
    if known:
        total.cost_usd = cost
    return total


_COUNTS = (
    "calls",
    "prompt_tokens",
    "completion_tokens",
    "cache_hits",
    "retries",
    "schema_fallbacks",
    "cached_prompt_tokens",
    "unpriced_calls",
)


def result_usage(result: Optional[gateway_pb2.RunResult]) -> Optional[common_pb2.Usage]:
    """The usage a run's result reports (a debate's: its debates and baselines summed); None
    without a result or for a result that carries none (a generated checklist)."""
    if result is None:
        return None
    kind = result.WhichOneof("result")
    if kind == "checklist_eval":
        return result.checklist_eval.usage
    if kind == "self_refine":
        return result.self_refine.usage
    if kind == "targeted_refinement":
        return result.targeted_refinement.usage
    if kind == "debate":
        return sum_usage([result.debate.debate_usage, result.debate.baseline_usage])
    return None


_ANSWERS = {common_pb2.ANSWER_YES: "YES", common_pb2.ANSWER_NO: "NO"}


class Evaluation:
    """A checklist evaluation: per-record scores, the aggregate, checklists and usage.

    The message is ``raw`` (``assay.gateway.v1.EvaluateResponse``); ``to_records()`` flattens it
    into one dict per record and ``to_dataframe()`` into a pandas DataFrame.
    """

    def __init__(self, response: gateway_pb2.EvaluateResponse) -> None:
        self.raw = response

    @property
    def run_id(self) -> str:
        """The run that produced the evaluation."""
        return self.raw.run_id

    @property
    def results(self) -> List[gateway_pb2.RecordResult]:
        """Per-record results, in record order."""
        return list(self.raw.results)

    @property
    def responders(self) -> List[gateway_pb2.ResponderResult]:
        """With responders: each one's aggregate, answering cost and ``missing`` (the record ids it
        has no scored response for, e.g. after a budget stopped the run), in the request's order."""
        return list(self.raw.responders)

    @property
    def comparisons(self) -> List[gateway_pb2.CompareRunsResponse]:
        """With responders: each one after the first against the first (``baseline_run_id`` /
        ``candidate_run_id`` hold their names)."""
        return list(self.raw.comparisons)

    @property
    def sequential(self) -> Optional[gateway_pb2.SequentialResult]:
        """With ``stop_when_decided``: each responder's confidence sequence against the first, its
        decision, the records used and those not asked, and the calls stopping saved."""
        return self.raw.sequential if self.raw.HasField("sequential") else None

    @property
    def aggregate(self) -> common_pb2.AggregateScores:
        """Aggregates over the scored records."""
        return self.raw.aggregate

    @property
    def checklists(self) -> List[common_pb2.Checklist]:
        """The checklists used."""
        return list(self.raw.checklists)

    @property
    def usage(self) -> common_pb2.Usage:
        """Model calls and tokens."""
        return self.raw.usage

    @property
    def cost_usd(self) -> Optional[float]:
        """Cost in US dollars from the backends' price tables; None when unknown (a call's model
        has no price: see :attr:`unpriced_calls`), never 0 for unknown."""
        return cost_usd(self.raw.usage)

    @property
    def unpriced_calls(self) -> int:
        """Model calls whose model has no price (their cost is unknown)."""
        return self.raw.usage.unpriced_calls

    @property
    def budget_exhausted(self) -> str:
        """Why the evaluation stopped starting records before the end (``"budget exhausted:
        ..."``); empty when its budget, if any, held."""
        return self.raw.budget_exhausted

    @property
    def results_paged(self) -> bool:
        """The run was open: the gateway's response held no results (nor checklists; each result
        names its checklist), which are read with ``list_run_results``. ``evaluate_stream`` has
        read them into :attr:`results` already."""
        return self.raw.results_paged

    @property
    def mean_score(self) -> float:
        """Mean primary score over the scored records."""
        return self.raw.aggregate.mean_primary_score

    def __len__(self) -> int:
        return len(self.raw.results)

    def __repr__(self) -> str:
        return f"Evaluation(run_id={self.run_id!r}, records={len(self)}, mean_score={self.mean_score:.3f})"

    def to_records(self) -> List[Dict[str, Any]]:
        """One flat dict per record: ids, every aggregate of its score, its error, and one
        ``item:<item id>`` column per checklist item ("YES", "NO" or None when unanswered); with
        responders one per (record, responder, sample), with ``responder``, ``sample`` and
        ``response`` columns."""
        rows: List[Dict[str, Any]] = []
        for result in self.raw.results:
            row: Dict[str, Any] = {
                "index": result.index,
                "record_id": result.record_id,
                "checklist_id": result.checklist_id,
                "error": result.error or None,
            }
            if result.responder:
                row.update(responder=result.responder, sample=result.sample, response=result.response)
            if result.HasField("score"):
                score = result.score
                row.update(
                    primary_score=score.primary_score,
                    pass_rate=score.pass_rate,
                    weighted_score=score.weighted_score,
                    normalized_score=score.normalized_score,
                    answered=score.answered_count,
                    unanswered=score.unanswered_count,
                )
                for item in score.item_scores:
                    row[f"item:{item.item_id}"] = _ANSWERS.get(item.answer)
            else:
                row.update(
                    primary_score=None,
                    pass_rate=None,
                    weighted_score=None,
                    normalized_score=None,
                    answered=0,
                    unanswered=0,
                )
            rows.append(row)
        return rows

    def to_dataframe(self) -> "pandas.DataFrame":
        """:meth:`to_records` as a DataFrame (needs the ``pandas`` extra)."""
        try:
            import pandas
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("to_dataframe needs pandas: pip install 'assay-client[pandas]'") from e
        return pandas.DataFrame(self.to_records())
