"""Build request messages from plain Python values (dicts, dataclasses, strings)."""

from __future__ import annotations

import dataclasses
import itertools
import numbers
from typing import Any, AsyncIterable, AsyncIterator, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from google.protobuf import json_format
from google.protobuf.descriptor import EnumDescriptor
from google.protobuf.message import Message

from ._proto.assay.common.v1 import common_pb2
from ._proto.assay.gateway.v1 import gateway_pb2
from ._proto.assay.generator.v1 import generator_pb2
from ._proto.assay.refiners.v1 import refiners_pb2

#: A record to evaluate: a dict or a dataclass with the fields of ``assay.gateway.v1.EvalRecord``
#: (``id``, ``input``, ``target``, ``reference``, ``history``, ``candidates``), the message, or
#: bare text: the target (the response scored), with a given checklist only (a preset generates
#: each record's checklist from its ``input``).
RecordLike = Union[Mapping[str, Any], gateway_pb2.EvalRecord, str, Any]
#: One document section: a dict (``id``, ``title``, ``content``), the message, or bare text.
SectionLike = Union[Mapping[str, Any], common_pb2.Section, str]
#: A model spec: a dict of ``assay.common.v1.ModelSpec`` fields, the message, or a model name.
ModelLike = Union[Mapping[str, Any], common_pb2.ModelSpec, str]


def enum_value(descriptor: EnumDescriptor, value: Union[int, str], field: str) -> Any:
    """An enum number from an int, a full name (``PRESET_TICK``) or its short form (``tick``).

    Typed Any: the generated stubs type each enum field with its own enum class."""
    if isinstance(value, int):
        return value
    prefix = descriptor.values[0].name[: -len("UNSPECIFIED")]
    for name in (value, prefix + value.upper()):
        if name in descriptor.values_by_name:
            return int(descriptor.values_by_name[name].number)
    names = ", ".join(v.name[len(prefix) :].lower() for v in descriptor.values[1:])
    raise ValueError(f"{field}: unknown value {value!r} (one of: {names})")


def _plain(value: Any) -> Any:
    """A dataclass as a dict; anything else unchanged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def to_message(value: Any, cls: Any, field: str) -> Any:
    """``value`` (a message of ``cls``, a dict or a dataclass) as a message of ``cls``."""
    if isinstance(value, cls):
        return value
    value = _plain(value)
    if not isinstance(value, Mapping):
        raise TypeError(f"{field}: expected a dict, a dataclass or {cls.__name__}, got {type(value).__name__}")
    try:
        return json_format.ParseDict(dict(value), cls())
    except json_format.ParseError as e:
        raise ValueError(f"{field}: {e}") from e


def record(value: RecordLike, index: int) -> gateway_pb2.EvalRecord:
    """One evaluation record (bare text is its target)."""
    if isinstance(value, str):
        return gateway_pb2.EvalRecord(target=value)
    message: gateway_pb2.EvalRecord = to_message(value, gateway_pb2.EvalRecord, f"records[{index}]")
    return message


def check_records(values: Any, iterable: Any = Iterable) -> None:
    """Refuse ``values`` unless it is a collection of records (``iterable``: the abstract class it
    must be an instance of): a string or a single record dict is a common slip."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, iterable):
        raise TypeError(
            f"records: expected a list of records (dicts, dataclasses, EvalRecord messages or strings), "
            f"got {type(values).__name__}"
        )


def checked_record(value: RecordLike, index: int, preset: Optional[Union[str, int]]) -> gateway_pb2.EvalRecord:
    """:func:`record`, refusing bare text up front when ``preset`` generates each record's
    checklist from its input: the server would refuse every such record with "input must not be
    empty"."""
    if isinstance(value, str) and preset is not None:
        raise TypeError(
            f"records[{index}]: a bare string is a record's target (the response scored), but preset "
            f"{preset!r} generates each record's checklist from its input: pass "
            f"{{'input': <prompt>, 'target': <response>}} records, or a checklist=[...] to score "
            f"bare targets against"
        )
    return record(value, index)


def _records(values: Iterable[RecordLike], preset: Optional[Union[str, int]]) -> List[gateway_pb2.EvalRecord]:
    """The records of an evaluation (see :func:`checked_record`)."""
    check_records(values)
    return [checked_record(value, i, preset) for i, value in enumerate(values)]


def first_checked(values: Iterable[RecordLike], preset: Optional[Union[str, int]]) -> Iterable[RecordLike]:
    """``values`` with its first record converted up front (:func:`checked_record`), so that the
    common slip (bare text with a preset, a non-record) is refused before a run starts; the
    rest is still read lazily."""
    it = iter(values)
    for first in it:
        checked_record(first, 0, preset)
        return itertools.chain([first], it)
    return []


async def first_checked_async(
    values: Union[Iterable[RecordLike], AsyncIterable[RecordLike]], preset: Optional[Union[str, int]]
) -> Union[Iterable[RecordLike], AsyncIterable[RecordLike]]:
    """:func:`first_checked` for an iterable or an async iterable."""
    if not isinstance(values, AsyncIterable):
        return first_checked(values, preset)
    it = values.__aiter__()
    try:
        first = await it.__anext__()
    except StopAsyncIteration:
        return []
    checked_record(first, 0, preset)

    async def chained() -> AsyncIterator[RecordLike]:
        yield first
        async for value in it:
            yield value

    return chained()


#: Records one AppendRecords message carries at most (as ``pipeline.records``).
MAX_APPEND_BATCH = 10_000
# Bytes of records per AppendRecords message at most (the gateway takes messages of up to 64 MiB):
# a batch goes out early when its records reach this, however few they are.
MAX_APPEND_BYTES = 16 * 1024 * 1024


def batch_size(value: int) -> int:
    """``value`` as the records per AppendRecords message: 1 to :data:`MAX_APPEND_BATCH`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"batch_size: expected an int, got {type(value).__name__}")
    if not 1 <= int(value) <= MAX_APPEND_BATCH:
        raise ValueError(f"batch_size: must be between 1 and {MAX_APPEND_BATCH}, got {value}")
    return int(value)


def append_requests(
    run_id: str,
    values: Iterable[RecordLike],
    seal: bool,
    size: int,
    preset: Optional[Union[str, int]] = None,
) -> Iterator[gateway_pb2.AppendRecordsRequest]:
    """The AppendRecords messages of ``values``, ``size`` records each, built as they are read
    (one message in memory at a time). A full message is sent only once the next record exists,
    so the last one holds the last records and carries ``seal``; no records at all make one
    empty message (sealing the run when ``seal``)."""
    batch: List[gateway_pb2.EvalRecord] = []
    nbytes = 0
    for i, value in enumerate(values):
        record = checked_record(value, i, preset)
        if batch and (len(batch) == size or nbytes + record.ByteSize() > MAX_APPEND_BYTES):
            yield gateway_pb2.AppendRecordsRequest(run_id=run_id, records=batch)
            batch, nbytes = [], 0
        batch.append(record)
        nbytes += record.ByteSize()
    yield gateway_pb2.AppendRecordsRequest(run_id=run_id, records=batch, seal=seal)


async def append_requests_async(
    run_id: str,
    values: Union[Iterable[RecordLike], AsyncIterable[RecordLike]],
    seal: bool,
    size: int,
    preset: Optional[Union[str, int]] = None,
) -> AsyncIterator[gateway_pb2.AppendRecordsRequest]:
    """:func:`append_requests` over an iterable or an async iterable."""
    if not isinstance(values, AsyncIterable):
        for request in append_requests(run_id, values, seal, size, preset):
            yield request
        return
    batch: List[gateway_pb2.EvalRecord] = []
    nbytes = 0
    i = 0
    async for value in values:
        record = checked_record(value, i, preset)
        if batch and (len(batch) == size or nbytes + record.ByteSize() > MAX_APPEND_BYTES):
            yield gateway_pb2.AppendRecordsRequest(run_id=run_id, records=batch)
            batch, nbytes = [], 0
        batch.append(record)
        nbytes += record.ByteSize()
        i += 1
    yield gateway_pb2.AppendRecordsRequest(run_id=run_id, records=batch, seal=seal)


def model(value: Optional[ModelLike], field: str) -> Optional[common_pb2.ModelSpec]:
    """A model spec, or None when unset."""
    if value is None:
        return None
    if isinstance(value, str):
        return common_pb2.ModelSpec(model=value)
    spec: common_pb2.ModelSpec = to_message(value, common_pb2.ModelSpec, field)
    return spec


def checklist(value: Any) -> common_pb2.Checklist:
    """A checklist from a list of questions (strings or item dicts), a dict or the message."""
    if isinstance(value, common_pb2.Checklist):
        return value
    if isinstance(value, Mapping):
        result: common_pb2.Checklist = to_message(value, common_pb2.Checklist, "checklist")
        return result
    items: List[common_pb2.ChecklistItem] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            items.append(common_pb2.ChecklistItem(id=f"q{i + 1}", question=item))
        else:
            items.append(to_message(item, common_pb2.ChecklistItem, f"checklist[{i}]"))
    return common_pb2.Checklist(items=items)


_SCORER_ENUMS = {
    "mode": common_pb2.ScoringMode.DESCRIPTOR,
    "primary_metric": common_pb2.PrimaryMetric.DESCRIPTOR,
    "prompt": common_pb2.ScoringPrompt.DESCRIPTOR,
}


def scorer_config(options: Mapping[str, Any]) -> Optional[common_pb2.ScorerConfig]:
    """A ScorerConfig from keyword options named like its fields (enums by short name)."""
    if not options:
        return None
    known = set(common_pb2.ScorerConfig.DESCRIPTOR.fields_by_name)
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown scorer option(s) {unknown}; known: {sorted(known)}")
    config = common_pb2.ScorerConfig()
    for key, value in options.items():
        if key in _SCORER_ENUMS:
            setattr(config, key, enum_value(_SCORER_ENUMS[key], value, f"scorer.{key}"))
        elif key == "sample_models":
            config.sample_models.extend(value)
        else:
            setattr(config, key, value)
    return config


def checklist_eval(
    records: Iterable[RecordLike],
    *,
    preset: Union[str, int] = "tick",
    checklist_given: Any = None,
    max_items: Optional[int] = None,
    record_concurrency: int = 0,
    generator_model: Optional[ModelLike] = None,
    scorer_model: Optional[ModelLike] = None,
    scorer_options: Optional[Mapping[str, Any]] = None,
    responders: Optional[Sequence["ResponderLike"]] = None,
    stop_when_decided: Union[bool, Mapping[str, Any]] = False,
) -> gateway_pb2.ChecklistEvalPipeline:
    """The checklist_eval pipeline: a given checklist, or one generated per input by ``preset``;
    with ``responders`` (models under test, the first the baseline) each answers every record's
    input and its answers are what is scored."""
    pipeline = gateway_pb2.ChecklistEvalPipeline(
        records=_records(records, preset if checklist_given is None else None), concurrency=record_concurrency
    )
    if checklist_given is not None:
        pipeline.source.checklist.CopyFrom(checklist(checklist_given))
    else:
        pipeline.source.preset = enum_value(generator_pb2.Preset.DESCRIPTOR, preset, "preset")
    if max_items is not None:
        pipeline.max_items = max_items
    for name, spec in (("generator_model", generator_model), ("scorer_model", scorer_model)):
        message = model(spec, name)
        if message is not None:
            getattr(pipeline, name).CopyFrom(message)
    config = scorer_config(scorer_options or {})
    if config is not None:
        pipeline.scorer.CopyFrom(config)
    for i, value in enumerate(responders or []):
        pipeline.responders.append(responder(value, f"responders[{i}]"))
    if stop_when_decided is True:
        pipeline.stop_when_decided.SetInParent()
    elif isinstance(stop_when_decided, Mapping):
        unknown = set(stop_when_decided) - {"alpha", "margin", "min_records", "seed"}
        if unknown:
            raise ValueError(
                f"stop_when_decided: unknown field(s) {sorted(unknown)}; use alpha, margin, min_records, seed"
            )
        pipeline.stop_when_decided.CopyFrom(gateway_pb2.StopWhenDecided(**stop_when_decided))
    elif stop_when_decided is not False:
        raise TypeError("stop_when_decided: give True, or a dict of alpha, margin, min_records, seed")
    return pipeline


#: A model under test: ``"openai:MODEL"`` / ``"local:"`` / ``"MODEL@BACKEND"`` / ``"MODEL"``, a dict
#: of Responder fields (``model`` may be such a string), or the message.
ResponderLike = Union[str, Mapping[str, Any], "gateway_pb2.Responder"]


def responder_model(value: str) -> common_pb2.ModelSpec:
    """A responder's model from ``BACKEND:MODEL`` (built-in backends), ``MODEL@BACKEND`` or ``MODEL``."""
    if "@" not in value and ":" in value:
        backend, name = value.split(":", 1)
        if backend in ("openai", "local"):
            return common_pb2.ModelSpec(backend=backend, model=name.strip())
    name, _, backend = value.rpartition("@") if "@" in value else (value, "", "")
    return common_pb2.ModelSpec(backend=backend.strip(), model=name.strip())


def responder(value: ResponderLike, field: str) -> gateway_pb2.Responder:
    """A Responder from a model string, a dict or the message."""
    if isinstance(value, gateway_pb2.Responder):
        return value
    if isinstance(value, str):
        return gateway_pb2.Responder(model=responder_model(value))
    fields = dict(value)
    model_value = fields.pop("model", None)
    message: gateway_pb2.Responder = to_message(fields, gateway_pb2.Responder, field)
    if isinstance(model_value, str):
        message.model.CopyFrom(responder_model(model_value))
    elif model_value is not None:
        message.model.CopyFrom(to_message(model_value, common_pb2.ModelSpec, f"{field}.model"))
    return message


def sections(document: Union[str, Sequence[SectionLike]]) -> List[common_pb2.Section]:
    """Document sections; bare text is one section per string (ids ``s1``, ``s2``, ...)."""
    parts: Sequence[SectionLike] = [document] if isinstance(document, str) else document
    result: List[common_pb2.Section] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            result.append(common_pb2.Section(id=f"s{i + 1}", index=i, content=part))
        else:
            section: common_pb2.Section = to_message(part, common_pb2.Section, f"sections[{i}]")
            result.append(section)
    return result


def debate_problem(value: Any, index: int) -> gateway_pb2.DebateProblem:
    """A debate problem from text, a dict or the message."""
    if isinstance(value, str):
        return gateway_pb2.DebateProblem(problem=value)
    problem: gateway_pb2.DebateProblem = to_message(value, gateway_pb2.DebateProblem, f"problems[{index}]")
    return problem


_UINT64_MAX = 2**64 - 1


def budget(max_tokens: Optional[int] = None, max_cost_usd: Optional[float] = None) -> Optional[gateway_pb2.RunBudget]:
    """A run's spending limit, or None when neither limit is set.

    Only what the wire cannot carry is refused here (a non-number, a negative or too large token
    count); the gateway judges the values (at least 1 token, a finite cost above 0) and refuses
    the run with INVALID_ARGUMENT naming ``budget.max_tokens`` / ``budget.max_cost_usd``."""
    if max_tokens is None and max_cost_usd is None:
        return None
    result = gateway_pb2.RunBudget()
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral):
            raise TypeError(f"budget.max_tokens: expected an int, got {type(max_tokens).__name__}")
        tokens = int(max_tokens)
        if tokens < 0:
            raise ValueError(f"budget.max_tokens: must be at least 1 (leave it unset for no token limit), got {tokens}")
        if tokens > _UINT64_MAX:
            raise ValueError(f"budget.max_tokens: {tokens} is above the largest the wire carries ({_UINT64_MAX})")
        result.max_tokens = tokens
    if max_cost_usd is not None:
        if isinstance(max_cost_usd, bool) or not isinstance(max_cost_usd, numbers.Real):
            raise TypeError(f"budget.max_cost_usd: expected a number (US dollars), got {type(max_cost_usd).__name__}")
        result.max_cost_usd = float(max_cost_usd)
    return result


def pipeline_request(
    pipeline: Any, label: str = "", run_budget: Optional[gateway_pb2.RunBudget] = None, open_run: bool = False
) -> gateway_pb2.RunPipelineRequest:
    """A RunPipelineRequest from a request, one of the pipeline messages, or a dict such as
    ``{"checklist_eval": {...}}`` (the request's JSON form). ``run_budget``, when set, replaces
    the request's own budget, and ``open_run`` sets ``open`` (on a copy: the caller's request is
    left as it was)."""
    if (run_budget is not None or open_run) and isinstance(pipeline, gateway_pb2.RunPipelineRequest):
        copy = gateway_pb2.RunPipelineRequest()
        copy.CopyFrom(pipeline)
        pipeline = copy
    request = _pipeline_request(pipeline, label)
    if run_budget is not None:
        request.budget.CopyFrom(run_budget)
    if open_run:
        request.open = True
    return request


def _pipeline_request(pipeline: Any, label: str) -> gateway_pb2.RunPipelineRequest:
    if isinstance(pipeline, gateway_pb2.RunPipelineRequest):
        if label and not pipeline.label:
            pipeline.label = label
        return pipeline
    request = gateway_pb2.RunPipelineRequest(label=label)
    fields: Dict[type, str] = {
        gateway_pb2.ChecklistEvalPipeline: "checklist_eval",
        gateway_pb2.GenerateChecklistPipeline: "generate_checklist",
        gateway_pb2.TargetedRefinementPipeline: "targeted_refinement",
        gateway_pb2.SelfRefinePipeline: "self_refine",
        gateway_pb2.DebatePipeline: "debate",
    }
    if isinstance(pipeline, Message):
        name = fields.get(type(pipeline))
        if name is None:
            raise TypeError(f"pipeline: {type(pipeline).__name__} is not a pipeline message")
        getattr(request, name).CopyFrom(pipeline)
        return request
    parsed: gateway_pb2.RunPipelineRequest = to_message(pipeline, gateway_pb2.RunPipelineRequest, "pipeline")
    if label and not parsed.label:
        parsed.label = label
    return parsed


def self_refine_request(text: str, instruction: str = "", **options: Any) -> refiners_pb2.SelfRefineRequest:
    """A SelfRefineRequest for ``text``; options named like its fields."""
    request = refiners_pb2.SelfRefineRequest(draft=text, instruction=instruction)
    for key, value in options.items():
        if key == "convergence_mode":
            value = enum_value(refiners_pb2.ConvergenceMode.DESCRIPTOR, value, key)
        if key in ("model", "embedding_model"):
            getattr(request, key).CopyFrom(model(value, key))
            continue
        if key not in refiners_pb2.SelfRefineRequest.DESCRIPTOR.fields_by_name:
            raise TypeError(f"unknown self-refine option {key!r}")
        setattr(request, key, value)
    return request
