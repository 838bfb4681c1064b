"""The synchronous client."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from . import _common, _compat, _convert
from ._errors import AssayError, from_rpc_error
from ._proto.assay.gateway.v1 import gateway_pb2
from ._types import Evaluation, Event

#: A stored run as GetRun, ListRuns and ControlRun return it (``assay.gateway.v1.Run``).
RunRecord = gateway_pb2.Run

_END = object()


def _pump(call: Any, out: "queue.SimpleQueue[Any]") -> None:
    """Move a stream's messages (then its end or error) to ``out``, on a thread of its own.

    The caller waits on ``out`` rather than inside grpc: a KeyboardInterrupt then lands in the
    queue's wait and cannot leave one of the channel's locks held (which wedges every later call).
    """
    try:
        for message in call:
            out.put(message)
        out.put(_END)
    except BaseException as e:  # grpc.RpcError, or anything else the stream raised
        out.put(e)


def _take(out: "queue.SimpleQueue[Any]") -> Any:
    """The next item of ``out``, waking every 0.1 s: a signal may be handled by another thread,
    and the main thread only raises its KeyboardInterrupt when it runs Python code."""
    while True:
        try:
            return out.get(timeout=0.1)
        except queue.Empty:
            continue


def _stream(call: Any) -> "queue.SimpleQueue[Any]":
    out: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
    threading.Thread(target=_pump, args=(call, out), daemon=True, name="assay-client-stream").start()
    return out


class _Guarded:
    """A request iterator that keeps the error it raised: grpc only reports "Exception iterating
    requests" (UNKNOWN) and logs it, and the caller should see the error itself."""

    def __init__(self, requests: Iterator[Any]) -> None:
        self._requests = requests
        self.error: Optional[BaseException] = None

    def __iter__(self) -> "_Guarded":
        return self

    def __next__(self) -> Any:
        try:
            return next(self._requests)
        except StopIteration:
            raise
        except BaseException as e:
            self.error = e
            raise


class Run(_common.RunEvents):
    """A pipeline run's event stream (from RunPipeline or WatchRun).

    Iterate it for :class:`Event` values as they arrive; after the ``completed`` event,
    ``result`` holds the ``assay.gateway.v1.RunResult``, ``state`` the final state and
    ``usage`` / ``cost_usd`` what the run spent; :meth:`record` fetches the stored run (its
    ``budget_exhausted`` says why a run with a budget stopped). When the stream breaks
    (UNAVAILABLE, a reset connection) the run is reattached with WatchRun from the last sequence
    seen, up to ``reconnect`` times without progress; no event is yielded twice. Leaving the loop
    early (or Ctrl-C) drops the stream only: the run goes on in the gateway unless ``cancel()``
    is called (or the Run was made with ``cancel_on_interrupt=True``).
    """

    def __init__(
        self,
        client: "Assay",
        call: Any,
        *,
        run_id: str = "",
        after: int = 0,
        reconnect: int = 5,
        cancel_on_interrupt: bool = False,
    ) -> None:
        super().__init__(run_id, after, reconnect)
        self._client = client
        self._call = call
        self._messages = _stream(call)
        self._cancel_on_interrupt = cancel_on_interrupt

    def __iter__(self) -> Iterator[Event]:
        return self

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __next__(self) -> Event:
        if self._early:
            return self._early.popleft()
        return self._read()

    def _read(self) -> Event:
        while not self._done:
            try:
                message = _take(self._messages)
            except BaseException:
                self._interrupted()
                raise
            if message is _END:
                if self._may_reattach():
                    self._reattach()
                    continue
                self._done = True
                break
            if isinstance(message, grpc.RpcError):
                if message.code() in _common.RETRYABLE and self._may_reattach():
                    self._reattach()
                    continue
                self._done = True
                raise from_rpc_error(message) from None
            if isinstance(message, BaseException):
                self._done = True
                raise message
            event = self._accept(message.event)
            if event is not None:
                return event
        raise StopIteration

    def _reattach(self) -> None:
        time.sleep(self._reattach_delay())
        self._call = self._client._watch_call(self.run_id, self.last_sequence)
        self._messages = _stream(self._call)

    def _interrupted(self) -> None:
        self._call.cancel()
        self._done = True
        if self._cancel_on_interrupt and self.run_id:
            self._client.cancel(self.run_id, reason="client interrupted")

    def close(self) -> None:
        """Drop the stream (the run goes on in the gateway)."""
        self._call.cancel()
        self._done = True

    def cancel(self, reason: str = "", actor: str = "") -> RunRecord:
        """Cancel the run in the gateway (it ends CANCELLED); the stream then delivers the end."""
        if not self.run_id:
            self._first_event()
        return self._client.cancel(self.run_id, reason=reason, actor=actor)

    def record(self, *, timeout: Optional[float] = None) -> RunRecord:
        """The stored run as it stands (one GetRun call): state, progress, usage with its cost,
        the budget and ``budget_exhausted``, the reason a run with a budget stopped (empty while
        it has not)."""
        if not self.run_id:
            self._first_event()
        return self._client.get_run(self.run_id, timeout=timeout)

    def _first_event(self) -> None:
        """Read events ahead (kept for iteration) until the run's id is known."""
        while not self.run_id and not self._done:
            try:
                self._early.append(self._read())
            except StopIteration:
                return

    def started(self) -> str:
        """The run's id: when it is not known yet, the stream is read up to the run's first event,
        which iterating the run still yields. Raises :class:`AssayError` when the gateway refused
        the run."""
        self._first_event()
        if not self.run_id:
            raise AssayError(grpc.StatusCode.UNAVAILABLE, "the event stream ended before the run started")
        return self.run_id

    def wait(self) -> gateway_pb2.RunResult:
        """Consume the remaining events and return the run's result."""
        for _ in self:
            pass
        if self.completed is None:
            raise AssayError(grpc.StatusCode.UNAVAILABLE, f"the event stream of run {self.run_id!r} ended early")
        return self.completed.result


class Assay:
    """A client of the Assay gateway.

    ``target`` is ``host:port``; ``token`` the bearer token (``auth_token`` of the server's
    configuration); ``tls`` None for plaintext, True for TLS with the system roots, or a
    :class:`TLS`. ``timeout`` is the default deadline in seconds of the unary calls (None: none).
    Before its first RPC the client compares the server's protos with its own by reflection
    (once, within a few seconds): a newer server warns :class:`ServerNewerWarning`, and a server
    without reflection or a failed check never fails the call (``check_server=False``: no check).
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        target: str = "localhost:50051",
        token: Optional[str] = None,
        tls: Union[_common.TLS, bool, None] = None,
        *,
        timeout: Optional[float] = None,
        options: Sequence[Tuple[str, Any]] = (),
        check_server: bool = True,
    ) -> None:
        creds, opts = _common.channel_settings(tls, options)
        self._check = _compat.AutoCheck(check_server)
        if creds is None:
            self._channel = grpc.insecure_channel(target, options=opts)
        else:
            self._channel = grpc.secure_channel(target, creds, options=opts)
        self._metadata = _common.metadata(token)
        self.timeout = timeout
        self._unary, self._streams, self._client_streams = _common.stubs(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> "Assay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, name: str, request: Any, timeout: Optional[float]) -> Any:
        self._check.ensure(self._channel, self._metadata)
        future = self._unary[name].future(
            request, metadata=self._metadata, timeout=timeout if timeout is not None else self.timeout
        )
        done: "queue.SimpleQueue[None]" = queue.SimpleQueue()
        future.add_done_callback(lambda _: done.put(None))
        try:
            _take(done)  # Ctrl-C lands here, outside grpc's locks (see _pump)
            return future.result()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except BaseException:
            future.cancel()  # Ctrl-C: the gateway sees the call cancelled and stops its work
            raise

    def _watch_call(self, run_id: str, after: int) -> Any:
        request = gateway_pb2.WatchRunRequest(run_id=run_id, after_sequence=after)
        return self._streams["WatchRun"](request, metadata=self._metadata, wait_for_ready=True)

    def check_server(self, timeout: float = 10.0) -> List[str]:
        """Compare the server's protos (by reflection) with the client's: the messages, fields,
        enum values and methods the server has and this client lacks (empty: compatible). A
        non-empty answer also warns :class:`ServerNewerWarning`: v1 only grows, so the client
        still works, without the new parts. (The client also checks once on its own before its
        first RPC; this call makes that unnecessary.)"""
        try:
            found = _compat.reflect(self._channel, self._metadata, timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        self._check.skip()
        _compat.report(found)
        return found

    def evaluate(
        self,
        records: Iterable[_convert.RecordLike],
        preset: Union[str, int] = "tick",
        *,
        checklist: Any = None,
        max_items: Optional[int] = None,
        record_concurrency: int = 0,
        generator_model: Optional[_convert.ModelLike] = None,
        scorer_model: Optional[_convert.ModelLike] = None,
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        timeout: Optional[float] = None,
        respond: Optional[Sequence[Any]] = None,
        **scorer_options: Any,
    ) -> Evaluation:
        """Evaluate ``records`` (dicts or dataclasses with ``input``, ``target``, ...) and wait.

        The checklist is ``checklist`` (a list of questions, item dicts or a Checklist) for every
        record, else one generated per input with ``preset`` (``tick``, ``rocketeval``, ...). A
        bare string is a record's target (the response scored) and needs ``checklist``: with a
        preset it raises TypeError (the preset needs each record's ``input``).
        ``scorer_options`` are ScorerConfig fields (``mode="item"``, ``samples=3``, ...).
        ``max_tokens`` / ``max_cost_usd`` are the run's budget (prompt + completion tokens over
        every model call; US dollars from the backends' price tables): once it is spent no new
        model call starts, the records scored so far are kept and every other one's error says
        ``not run: budget exhausted: ...``.

        ``respond`` names models under test (``"openai:MODEL"``, ``"MODEL@BACKEND"``, or dicts of
        Responder fields: ``name``, ``model``, ``system_prompt``, ``template``, ``samples``): each
        answers every record's ``input`` and its answers are scored against the input's checklist
        (one per input, shared). :attr:`Evaluation.responders` has each one's aggregate and cost,
        :attr:`Evaluation.comparisons` each one against the first, as ``compare_runs`` computes it.
        """
        request = _common.evaluate_request(
            records,
            preset,
            checklist,
            max_items,
            record_concurrency,
            generator_model,
            scorer_model,
            scorer_options,
            max_tokens,
            max_cost_usd,
            respond,
        )
        return Evaluation(self._call("Evaluate", request, timeout))

    def evaluate_stream(
        self,
        records: Iterable[_convert.RecordLike],
        preset: Union[str, int] = "tick",
        *,
        checklist: Any = None,
        max_items: Optional[int] = None,
        record_concurrency: int = 0,
        generator_model: Optional[_convert.ModelLike] = None,
        scorer_model: Optional[_convert.ModelLike] = None,
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        label: str = "",
        batch_size: int = _convert.MAX_APPEND_BATCH,
        page_size: int = 1000,
        timeout: Optional[float] = None,
        respond: Optional[Sequence[Any]] = None,
        **scorer_options: Any,
    ) -> Evaluation:
        """:meth:`evaluate` for any number of records, over an open run: the run is started open,
        ``records`` (any iterable, a generator included, read as it is sent) appended in
        messages of ``batch_size`` and sealed, the run waited for, and its results read with
        :meth:`list_run_results` (``page_size`` a page) into the returned :class:`Evaluation`
        (``raw.results_paged`` is set; ``checklists`` is empty, each result names its checklist).
        The arguments are :meth:`evaluate`'s; ``timeout`` is the deadline of each call made
        (waiting for the run has none). The results are held in memory: for runs too large for
        that, use ``run(..., open=True)``, :meth:`append_records` and :meth:`list_run_results`.
        ``respond`` as in :meth:`evaluate`: each record's result is one per (record, responder,
        sample), and the evaluation has the responders and their comparisons, so a model x
        prompt matrix past the 10,000 results of one request goes this way.
        A failure (a refused record, Ctrl-C) cancels the run; :class:`AssayError` CANCELLED when
        the run was cancelled, ABORTED when it failed."""
        _convert.check_records(records)
        size = _convert.batch_size(batch_size)
        preset_checked = preset if checklist is None else None
        records = _convert.first_checked(records, preset_checked)
        request = _common.open_evaluation_request(
            preset,
            checklist,
            max_items,
            record_concurrency,
            generator_model,
            scorer_model,
            scorer_options,
            max_tokens,
            max_cost_usd,
            label,
            respond,
        )
        run = self.run(request, timeout=timeout)
        run_id = run.started()
        run.close()  # the run goes on; its end is watched once every record is in
        try:
            appends = _convert.append_requests(run_id, records, True, size, preset_checked)
            self._append(_Guarded(appends), timeout)
            state, result = self._finish(run_id, timeout)
        except BaseException:
            self._cancel_quietly(run_id)
            raise
        response = _common.finished_evaluation(run_id, state, result)
        if response.results_paged:
            del response.results[:]
            response.results.extend(self.list_run_results(run_id, page_size, timeout=timeout))
        return Evaluation(response)

    def _finish(self, run_id: str, timeout: Optional[float]) -> Tuple[int, gateway_pb2.RunResult]:
        """Wait for a run to end: (its state, its result)."""
        stored = self.get_run(run_id, timeout=timeout)
        if stored.state in _common.FINISHED:
            return stored.state, stored.result
        watch = self.watch(run_id, after=stored.last_sequence)
        result = watch.wait()
        return watch.state, result

    def _cancel_quietly(self, run_id: str) -> None:
        try:
            self.cancel(run_id, reason="the client's evaluate_stream failed")
        except Exception:  # the run may have ended, or the gateway be gone: the first error matters
            pass

    def run(
        self,
        pipeline: Any,
        *,
        label: str = "",
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        timeout: Optional[float] = None,
        reconnect: int = 5,
        cancel_on_interrupt: bool = False,
        open: bool = False,
    ) -> Run:
        """Start a pipeline (a RunPipelineRequest, a pipeline message, or its dict form such as
        ``{"checklist_eval": {...}}``) and return its event stream.

        ``max_tokens`` / ``max_cost_usd`` set the run's budget (replacing a request's own): once
        it is spent no new model call starts and the run ends PARTIAL with what it has (see
        :meth:`evaluate`; :meth:`Run.record` says why it stopped).

        ``open=True`` (checklist_eval only) creates the run open: its records (the pipeline's,
        possibly none, then :meth:`append_records`) are kept in the run store and scored as they
        arrive; it finishes once sealed, and its results are read with :meth:`list_run_results`
        (its ``evaluation`` has ``results_paged`` set and no results). ``run.started()`` gives
        its id for the appends."""
        request = _convert.pipeline_request(
            pipeline, label, _convert.budget(max_tokens, max_cost_usd), open_run=open
        )
        self._check.ensure(self._channel, self._metadata)
        call = self._streams["RunPipeline"](request, metadata=self._metadata, timeout=timeout)
        return Run(self, call, reconnect=reconnect, cancel_on_interrupt=cancel_on_interrupt)

    def watch(self, run_id: str, after: int = 0, *, reconnect: int = 5) -> Run:
        """Follow a run's events with sequence > ``after`` (replayed, then live)."""
        self._check.ensure(self._channel, self._metadata)
        return Run(self, self._watch_call(run_id, after), run_id=run_id, after=after, reconnect=reconnect)

    def get_run(self, run_id: str, *, timeout: Optional[float] = None) -> RunRecord:
        """A run's state, progress and result."""
        response = self._call("GetRun", gateway_pb2.GetRunRequest(run_id=_common.run_id_of(run_id)), timeout)
        run: RunRecord = response.run
        return run

    def list_runs(
        self,
        kind: Union[str, int, None] = None,
        state: Union[str, int, None] = None,
        *,
        limit: Optional[int] = None,
        page_size: int = 0,
        timeout: Optional[float] = None,
    ) -> List[RunRecord]:
        """Runs, newest first, following pages up to ``limit`` runs (kind and state by short
        name, e.g. ``"checklist_eval"``, ``"succeeded"``)."""
        runs: List[RunRecord] = []
        token = ""
        while True:
            request = _common.list_request(kind, state, page_size, token)
            response = self._call("ListRuns", request, timeout)
            runs.extend(response.runs)
            token = response.next_page_token
            if not token or (limit is not None and len(runs) >= limit):
                return runs[:limit] if limit is not None else runs

    def _control(self, run_id: Any, action: str, actor: str, reason: str, **fields: Any) -> RunRecord:
        request = _common.control(_common.run_id_of(run_id), action, actor, reason, **fields)
        run: RunRecord = self._call("ControlRun", request, None).run
        return run

    def pause(self, run_id: Any, *, reason: str = "", actor: str = "") -> RunRecord:
        """Pause a run after its current task."""
        return self._control(run_id, "pause", actor, reason)

    def resume(self, run_id: Any, *, reason: str = "", actor: str = "") -> RunRecord:
        """Resume a paused or interrupted run."""
        return self._control(run_id, "resume", actor, reason)

    def cancel(self, run_id: Any, *, reason: str = "", actor: str = "") -> RunRecord:
        """Cancel a run."""
        return self._control(run_id, "cancel", actor, reason)

    def delete_run(self, run_id: Any, *, timeout: Optional[float] = None) -> RunRecord:
        """Delete a finished run with its events and audit entries; returns the run as it was
        (without its result). :class:`AssayError` FAILED_PRECONDITION while it has not finished
        (cancel it first), NOT_FOUND when there is no such run."""
        request = gateway_pb2.DeleteRunRequest(run_id=_common.run_id_of(run_id))
        run: RunRecord = self._call("DeleteRun", request, timeout).run
        return run

    def append_records(
        self,
        run_id: Any,
        records: Iterable[_convert.RecordLike],
        seal: bool = False,
        batch_size: int = _convert.MAX_APPEND_BATCH,
        *,
        timeout: Optional[float] = None,
    ) -> gateway_pb2.AppendRecordsResponse:
        """Add ``records`` (as :meth:`evaluate` takes them: dicts, dataclasses, EvalRecord
        messages, bare targets) to an open run (``run(..., open=True)``; ``run_id`` may be that
        :class:`Run`), over one AppendRecords call in messages of ``batch_size`` records (at most
        10,000). ``records`` is read as the messages are sent, never held whole: a generator of
        any length works. ``seal=True`` ends the run's records (the last message carries it; with
        no records, one empty message seals): the run finishes once they are scored.

        Returns the AppendRecordsResponse (``appended`` by this call, ``records_total``,
        ``sealed``). :class:`AssayError` FAILED_PRECONDITION for a sealed run or one not created
        open, NOT_FOUND for no such run, INVALID_ARGUMENT for a refused record; an error raised
        while reading ``records`` cancels the call and is raised as it was (messages sent before
        it may have been added). ``timeout``: the call's deadline (none by default: the client's
        ``timeout`` is for unary calls)."""
        _convert.check_records(records)
        size = _convert.batch_size(batch_size)
        requests = _Guarded(_convert.append_requests(self._run_id(run_id), records, seal, size))
        return self._append(requests, timeout)

    def _append(self, requests: "_Guarded", timeout: Optional[float]) -> gateway_pb2.AppendRecordsResponse:
        self._check.ensure(self._channel, self._metadata)
        future = self._client_streams["AppendRecords"].future(requests, metadata=self._metadata, timeout=timeout)
        done: "queue.SimpleQueue[None]" = queue.SimpleQueue()
        future.add_done_callback(lambda _: done.put(None))
        try:
            _take(done)  # Ctrl-C lands here, outside grpc's locks (see _pump)
            response: gateway_pb2.AppendRecordsResponse = future.result()
            return response
        except grpc.RpcError as e:
            if requests.error is not None:
                raise requests.error from None
            raise from_rpc_error(e) from None
        except BaseException:
            future.cancel()
            raise

    def list_run_results(
        self, run_id: Any, page_size: int = 1000, *, timeout: Optional[float] = None
    ) -> Iterator[gateway_pb2.RecordResult]:
        """A checklist_eval run's record results (``RecordResult``), in record order, read a
        page of ``page_size`` (at most 10,000) at a time with ListRunResults as the iteration
        goes: any run, small or open. While the run executes it ends with the results stored so
        far. A generator: :class:`AssayError` (NOT_FOUND for no such run) is raised by the
        iteration. ``timeout``: each page's deadline (default: the client's)."""
        rid = self._run_id(run_id)
        token = ""
        while True:
            response = self._call("ListRunResults", _common.results_request(rid, page_size, token), timeout)
            yield from response.results
            token = response.next_page_token
            if not token:
                return

    def _run_id(self, value: Any) -> str:
        """A run id; a :class:`Run` whose id is not known yet is read up to its first event."""
        if isinstance(value, Run) and not value.run_id:
            return value.started()
        return _common.run_id_of(value)

    def accept(self, run_id: Any, *, reason: str = "", actor: str = "") -> RunRecord:
        """Accept a targeted refinement's current content as final."""
        return self._control(run_id, "accept", actor, reason)

    def review(self, run_id: Any, *, reason: str = "", actor: str = "") -> RunRecord:
        """Mark an escalated refinement as reviewed."""
        return self._control(run_id, "review", actor, reason)

    def edit_section(
        self, run_id: Any, section_id: str, content: str, *, reason: str = "", actor: str = ""
    ) -> RunRecord:
        """Replace a section of a paused (or escalated) targeted refinement."""
        return self._control(run_id, "edit_section", actor, reason, section_id=section_id, content=content)

    def refine(
        self,
        document: Union[str, Sequence[_convert.SectionLike]],
        mode: Union[str, int] = "full_auto",
        *,
        label: str = "",
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        **options: Any,
    ) -> Run:
        """Start a targeted refinement of ``document`` (section dicts, or text) in ``mode``
        (``full_auto`` or ``semi_auto``); options are TargetedRefinementPipeline fields. A
        ``max_tokens`` smaller than the pipeline's ``token_budget`` becomes the refinement's own
        budget (it ends by its own rules, every verified fix kept)."""
        return self.run(
            _common.refine_pipeline(document, mode, options),
            label=label,
            max_tokens=max_tokens,
            max_cost_usd=max_cost_usd,
        )

    def debate(
        self,
        problems: Iterable[Any],
        baselines: bool = True,
        *,
        label: str = "",
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        **options: Any,
    ) -> Run:
        """Start a debate over ``problems`` (text, or dicts with ``problem`` and ``reference``);
        at the budget's end finished problems are kept and the others say ``not run: budget
        exhausted``."""
        return self.run(
            _common.debate_pipeline(problems, baselines, options),
            label=label,
            max_tokens=max_tokens,
            max_cost_usd=max_cost_usd,
        )

    def self_refine(
        self,
        text: str,
        instruction: str = "",
        *,
        label: str = "",
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        **options: Any,
    ) -> Run:
        """Start a self-refine run of ``text``; options are SelfRefineRequest fields."""
        return self.run(
            _common.self_refine_pipeline(text, instruction, options),
            label=label,
            max_tokens=max_tokens,
            max_cost_usd=max_cost_usd,
        )

    def compare(
        self,
        baseline: Any,
        candidate: Any,
        *,
        metric: Union[str, int, None] = None,
        alpha: float = 0.0,
        min_effect: Optional[float] = None,
        bootstrap_seed: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> gateway_pb2.CompareRunsResponse:
        """Compare two checklist_eval runs (ids, Runs or Evaluations): candidate minus baseline."""
        request = _common.compare_request(baseline, candidate, metric, alpha, min_effect, bootstrap_seed)
        response: gateway_pb2.CompareRunsResponse = self._call("CompareRuns", request, timeout)
        return response
