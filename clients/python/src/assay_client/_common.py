"""What the clients are made of besides their I/O: channel settings, method paths, request builders
and the bookkeeping of a run's events."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type, Union

import grpc
from google.protobuf.message import Message

from . import _convert
from ._errors import AssayError
from ._proto.assay.common.v1 import common_pb2
from ._proto.assay.gateway.v1 import gateway_pb2
from ._types import Evaluation, Event, cost_usd, result_usage

SERVICE = "assay.gateway.v1.GatewayService"
#: Status codes after which a broken event stream is reattached from its last sequence.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
Metadata = Tuple[Tuple[str, str], ...]


@dataclass(frozen=True)
class TLS:
    """TLS settings: PEM file paths or bytes.

    ``ca`` verifies the server (default: the system roots); ``cert`` and ``key`` are the client's
    certificate for mutual TLS; ``server_name`` overrides the name checked against the server's
    certificate (when the target is an IP address, say).
    """

    ca: Union[str, bytes, None] = None
    cert: Union[str, bytes, None] = None
    key: Union[str, bytes, None] = None
    server_name: Optional[str] = None


def _pem(value: Union[str, bytes, None]) -> Optional[bytes]:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


def channel_settings(
    tls: Union[TLS, bool, None], options: Sequence[Tuple[str, Any]] = ()
) -> Tuple[Optional[grpc.ChannelCredentials], List[Tuple[str, Any]]]:
    """(credentials or None for plaintext, channel options) for ``tls``."""
    opts = list(options)
    if tls is None or tls is False:
        return None, opts
    if tls is True:
        return grpc.ssl_channel_credentials(), opts
    if (tls.cert is None) != (tls.key is None):
        raise ValueError("tls: set both cert and key (mutual TLS) or neither")
    creds = grpc.ssl_channel_credentials(
        root_certificates=_pem(tls.ca), private_key=_pem(tls.key), certificate_chain=_pem(tls.cert)
    )
    if tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return creds, opts


def metadata(token: Optional[str]) -> Metadata:
    """Call metadata: the bearer token when one is set."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def method(name: str) -> str:
    """The full path of a gateway method."""
    return f"/{SERVICE}/{name}"


#: (method, request class, response class) of every gateway RPC.
UNARY: Dict[str, Tuple[Type[Message], Type[Message]]] = {
    "Evaluate": (gateway_pb2.EvaluateRequest, gateway_pb2.EvaluateResponse),
    "GetRun": (gateway_pb2.GetRunRequest, gateway_pb2.GetRunResponse),
    "ListRuns": (gateway_pb2.ListRunsRequest, gateway_pb2.ListRunsResponse),
    "ControlRun": (gateway_pb2.ControlRunRequest, gateway_pb2.ControlRunResponse),
    "CompareRuns": (gateway_pb2.CompareRunsRequest, gateway_pb2.CompareRunsResponse),
    "DeleteRun": (gateway_pb2.DeleteRunRequest, gateway_pb2.DeleteRunResponse),
    "ListRunResults": (gateway_pb2.ListRunResultsRequest, gateway_pb2.ListRunResultsResponse),
}
STREAMS: Dict[str, Tuple[Type[Message], Type[Message]]] = {
    "RunPipeline": (gateway_pb2.RunPipelineRequest, gateway_pb2.RunPipelineResponse),
    "WatchRun": (gateway_pb2.WatchRunRequest, gateway_pb2.WatchRunResponse),
}
#: Client-streaming RPCs (a stream of requests, one response).
CLIENT_STREAMS: Dict[str, Tuple[Type[Message], Type[Message]]] = {
    "AppendRecords": (gateway_pb2.AppendRecordsRequest, gateway_pb2.AppendRecordsResponse),
}
#: States a run ends in.
FINISHED = frozenset(
    {
        gateway_pb2.RUN_STATE_SUCCEEDED,
        gateway_pb2.RUN_STATE_PARTIAL,
        gateway_pb2.RUN_STATE_FAILED,
        gateway_pb2.RUN_STATE_CANCELLED,
    }
)


def stubs(channel: Any) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
    """(unary, server-streaming, client-streaming) callables of every gateway RPC on ``channel``
    (a grpc or grpc.aio channel: both make them the same way)."""
    unary = {
        name: channel.unary_unary(
            method(name), request_serializer=req.SerializeToString, response_deserializer=resp.FromString
        )
        for name, (req, resp) in UNARY.items()
    }
    streams = {
        name: channel.unary_stream(
            method(name), request_serializer=req.SerializeToString, response_deserializer=resp.FromString
        )
        for name, (req, resp) in STREAMS.items()
    }
    client_streams = {
        name: channel.stream_unary(
            method(name), request_serializer=req.SerializeToString, response_deserializer=resp.FromString
        )
        for name, (req, resp) in CLIENT_STREAMS.items()
    }
    return unary, streams, client_streams


class RunView:
    """The accessors of a run's result, all read from :attr:`completed`: what the sync and
    asyncio runs share."""

    @property
    def completed(self) -> Optional[gateway_pb2.RunCompleted]:
        """The run's ``completed`` event (None until it arrived)."""
        raise NotImplementedError

    @property
    def state(self) -> int:
        """The final ``RunState`` number (RUN_STATE_UNSPECIFIED until the run completed)."""
        return self.completed.state if self.completed is not None else gateway_pb2.RUN_STATE_UNSPECIFIED

    @property
    def state_name(self) -> str:
        """The final state's short name (``succeeded``, ``partial``, ``cancelled``, ...;
        ``unspecified`` until the run completed)."""
        return gateway_pb2.RunState.Name(self.state)[len("RUN_STATE_") :].lower()

    @property
    def result(self) -> Optional[gateway_pb2.RunResult]:
        """The run's result once completed."""
        return self.completed.result if self.completed is not None else None

    @property
    def evaluation(self) -> Optional[Evaluation]:
        """The result of a checklist_eval run, once completed."""
        result = self.result
        if result is None or result.WhichOneof("result") != "checklist_eval":
            return None
        return Evaluation(result.checklist_eval)

    @property
    def usage(self) -> Optional[common_pb2.Usage]:
        """Model calls, tokens and cost of the completed run, as its result reports them (a
        debate's: its debates and baselines summed); None before the end or for a generated
        checklist."""
        return result_usage(self.result)

    @property
    def cost_usd(self) -> Optional[float]:
        """Cost in US dollars of the completed run; None before the end or when unknown (a call's
        model has no price: see :attr:`unpriced_calls`), never 0 for unknown."""
        usage = self.usage
        return cost_usd(usage) if usage is not None else None

    @property
    def unpriced_calls(self) -> int:
        """Model calls of the completed run whose model has no price."""
        usage = self.usage
        return usage.unpriced_calls if usage is not None else 0


class RunEvents(RunView):
    """A run's events seen so far: the stream's reader (:class:`assay_client.AsyncRun`) passes
    each to :meth:`_accept`, which keeps the bookkeeping."""

    def __init__(self, run_id: str, after: int, reconnect: int) -> None:
        self.run_id = run_id
        self.last_sequence = after
        self._reconnect = reconnect
        self._attempts = 0
        self._done = False
        self._completed: Optional[gateway_pb2.RunCompleted] = None
        #: How many times the stream was reattached.
        self.reattached = 0
        # Events read ahead to learn the run's id (``started()``), yielded before any other.
        self._early: Deque[Event] = deque()

    @property
    def completed(self) -> Optional[gateway_pb2.RunCompleted]:
        """The run's ``completed`` event (None until it arrived)."""
        return self._completed

    def _accept(self, event: gateway_pb2.RunEvent) -> Optional[Event]:
        """The Event of ``event``, or None when it was already yielded (replayed after a
        reattach)."""
        if event.sequence <= self.last_sequence:
            return None
        self.last_sequence = event.sequence
        self.run_id = event.run_id or self.run_id
        self._attempts = 0
        if event.WhichOneof("event") == "completed":
            self._completed = event.completed
            self._done = True
        return Event.from_proto(event)

    def _may_reattach(self) -> bool:
        return bool(self.run_id) and self.completed is None and self._attempts < self._reconnect

    def _reattach_delay(self) -> float:
        """Count a reattach and return how long to wait before it (seconds)."""
        self._attempts += 1
        self.reattached += 1
        return min(0.1 * 2.0**self._attempts, 2.0)


def evaluate_request(
    records: Iterable[_convert.RecordLike],
    preset: Union[str, int],
    checklist: Any,
    max_items: Optional[int],
    record_concurrency: int,
    generator_model: Optional[_convert.ModelLike],
    scorer_model: Optional[_convert.ModelLike],
    scorer_options: Mapping[str, Any],
    max_tokens: Optional[int],
    max_cost_usd: Optional[float],
    respond: Optional[Sequence[Any]] = None,
    stop_when_decided: Union[bool, Mapping[str, Any]] = False,
) -> gateway_pb2.EvaluateRequest:
    """An EvaluateRequest: the checklist_eval pipeline of ``records`` (answered by the
    ``respond`` models when given) and its budget."""
    pipeline = _convert.checklist_eval(
        records,
        preset=preset,
        checklist_given=checklist,
        max_items=max_items,
        record_concurrency=record_concurrency,
        generator_model=generator_model,
        scorer_model=scorer_model,
        scorer_options=scorer_options,
        responders=respond,
        stop_when_decided=stop_when_decided,
    )
    request = gateway_pb2.EvaluateRequest(pipeline=pipeline)
    run_budget = _convert.budget(max_tokens, max_cost_usd)
    if run_budget is not None:
        request.budget.CopyFrom(run_budget)
    return request


def open_evaluation_request(
    preset: Union[str, int],
    checklist: Any,
    max_items: Optional[int],
    record_concurrency: int,
    generator_model: Optional[_convert.ModelLike],
    scorer_model: Optional[_convert.ModelLike],
    scorer_options: Mapping[str, Any],
    max_tokens: Optional[int],
    max_cost_usd: Optional[float],
    label: str,
    respond: Optional[Sequence[Any]] = None,
) -> gateway_pb2.RunPipelineRequest:
    """The RunPipelineRequest of an open checklist_eval run without records (they follow with
    AppendRecords), answered by the ``respond`` models when given."""
    pipeline = _convert.checklist_eval(
        [],
        preset=preset,
        checklist_given=checklist,
        max_items=max_items,
        record_concurrency=record_concurrency,
        generator_model=generator_model,
        scorer_model=scorer_model,
        scorer_options=scorer_options,
        responders=respond,
    )
    return _convert.pipeline_request(pipeline, label, _convert.budget(max_tokens, max_cost_usd), open_run=True)


def results_request(run_id: str, page_size: int, page_token: str) -> gateway_pb2.ListRunResultsRequest:
    """A ListRunResultsRequest (``page_size`` 0: the gateway's default, 1000)."""
    return gateway_pb2.ListRunResultsRequest(run_id=run_id, page_size=page_size, page_token=page_token)


def finished_evaluation(run_id: str, state: int, result: gateway_pb2.RunResult) -> gateway_pb2.EvaluateResponse:
    """The EvaluateResponse of a finished checklist_eval run (a copy, for the caller to fill with
    its paged results); :class:`AssayError` when the run was cancelled (CANCELLED) or ended
    without an evaluation (ABORTED, with the run's error)."""
    name = gateway_pb2.RunState.Name(state)[len("RUN_STATE_") :].lower()
    if state == gateway_pb2.RUN_STATE_CANCELLED:
        raise AssayError(grpc.StatusCode.CANCELLED, f"run {run_id} was cancelled")
    if result.error or result.WhichOneof("result") != "checklist_eval":
        reason = result.error or "without an evaluation"
        raise AssayError(grpc.StatusCode.ABORTED, f"run {run_id} ended {name}: {reason}")
    response = gateway_pb2.EvaluateResponse()
    response.CopyFrom(result.checklist_eval)
    response.run_id = response.run_id or run_id
    return response


def run_id_of(value: Any) -> str:
    """A run id from a string or anything with a ``run_id`` (Run, Evaluation, messages)."""
    if isinstance(value, str):
        return value
    run_id = getattr(value, "run_id", None)
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"no run id in {type(value).__name__}")
    return run_id


def control(run_id: str, action: str, actor: str, reason: str, **fields: Any) -> gateway_pb2.ControlRunRequest:
    """A ControlRunRequest taking ``action`` (pause, resume, cancel, accept, review, edit_section)."""
    request = gateway_pb2.ControlRunRequest(run_id=run_id, actor=actor, reason=reason)
    getattr(request, action).SetInParent()
    for key, value in fields.items():
        setattr(getattr(request, action), key, value)
    return request


def list_request(
    kind: Union[str, int, None], state: Union[str, int, None], page_size: int, page_token: str
) -> gateway_pb2.ListRunsRequest:
    """A ListRunsRequest (kind and state by short name, e.g. ``checklist_eval``, ``running``)."""
    request = gateway_pb2.ListRunsRequest(page_size=page_size, page_token=page_token)
    if kind is not None:
        request.kind = _convert.enum_value(gateway_pb2.PipelineKind.DESCRIPTOR, kind, "kind")
    if state is not None:
        request.state = _convert.enum_value(gateway_pb2.RunState.DESCRIPTOR, state, "state")
    return request


def refine_pipeline(
    document: Union[str, Sequence[_convert.SectionLike]], mode: Union[str, int], options: Mapping[str, Any]
) -> gateway_pb2.TargetedRefinementPipeline:
    """A targeted refinement of ``document``; options named like the pipeline's fields."""
    pipeline = gateway_pb2.TargetedRefinementPipeline(
        sections=_convert.sections(document),
        mode=_convert.enum_value(gateway_pb2.RefinementMode.DESCRIPTOR, mode, "mode"),
    )
    rest = dict(options)
    if "brief" in rest:
        pipeline.brief.CopyFrom(_convert.to_message(rest.pop("brief"), type(pipeline.brief), "brief"))
    if rest:
        extra = _convert.to_message(rest, gateway_pb2.TargetedRefinementPipeline, "refine options")
        pipeline.MergeFrom(extra)
    return pipeline


def debate_pipeline(problems: Iterable[Any], baselines: bool, options: Mapping[str, Any]) -> gateway_pb2.DebatePipeline:
    """A debate over ``problems`` (strings or dicts with ``problem`` and ``reference``)."""
    pipeline = gateway_pb2.DebatePipeline(
        problems=[_convert.debate_problem(p, i) for i, p in enumerate(problems)], baselines=baselines
    )
    if options:
        pipeline.MergeFrom(_convert.to_message(dict(options), gateway_pb2.DebatePipeline, "debate options"))
    return pipeline


def self_refine_pipeline(text: str, instruction: str, options: Mapping[str, Any]) -> gateway_pb2.SelfRefinePipeline:
    """A self-refine run of ``text``; options named like SelfRefineRequest's fields."""
    return gateway_pb2.SelfRefinePipeline(request=_convert.self_refine_request(text, instruction, **options))


def compare_request(
    baseline: Any,
    candidate: Any,
    metric: Union[str, int, None],
    alpha: float,
    min_effect: Optional[float],
    bootstrap_seed: Optional[int],
) -> gateway_pb2.CompareRunsRequest:
    """A CompareRunsRequest (candidate minus baseline)."""
    request = gateway_pb2.CompareRunsRequest(
        baseline_run_id=run_id_of(baseline), candidate_run_id=run_id_of(candidate), alpha=alpha
    )
    if metric is not None:
        request.metric = _convert.enum_value(gateway_pb2.CompareMetric.DESCRIPTOR, metric, "metric")
    if min_effect is not None:
        request.min_effect = min_effect
    if bootstrap_seed is not None:
        request.bootstrap_seed = bootstrap_seed
    return request
