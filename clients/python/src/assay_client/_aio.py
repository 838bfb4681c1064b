"""The client, on asyncio (grpc.aio): its one implementation. The sync client (``_client.py``)
runs this one on an event loop of its own, so every docstring here speaks for both."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterable, AsyncIterator, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
import grpc.aio

from . import _common, _compat, _convert
from ._errors import AssayError, from_rpc_error
from ._proto.assay.gateway.v1 import gateway_pb2
from ._types import Evaluation, Event

#: A stored run as GetRun, ListRuns and ControlRun return it (``assay.gateway.v1.Run``).
RunRecord = gateway_pb2.Run


class AsyncRun(_common.RunEvents):
    """The asyncio form of :class:`assay_client.Run`: ``async for event in run``.

    Cancelling the task that iterates drops the stream only; the run goes on in the gateway
    unless :meth:`cancel` is awaited (or the run was made with ``cancel_on_interrupt=True``).
    """

    def __init__(
        self,
        client: "AsyncAssay",
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
        self._iter: AsyncIterator[Any] = call.__aiter__()
        self._cancel_on_interrupt = cancel_on_interrupt
        self._cancel_sent = False

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        if self._early:
            return self._early.popleft()
        return await self._read()

    async def _read(self) -> Event:
        try:
            await self._client._check.ensure(self._client._channel, self._client._metadata)
            while not self._done:
                try:
                    message = await self._iter.__anext__()
                except StopAsyncIteration:
                    if self._may_reattach():
                        await self._reattach()
                        continue
                    self._done = True
                    break
                except grpc.RpcError as e:
                    if isinstance(e, grpc.aio.AioRpcError) and e.code() in _common.RETRYABLE and self._may_reattach():
                        await self._reattach()
                        continue
                    self._done = True
                    raise from_rpc_error(e) from None
                event = self._accept(message.event)
                if event is not None:
                    return event
        except asyncio.CancelledError:
            await self._interrupted()
            raise
        except BaseException:
            self.close()  # an error ends the stream
            raise
        raise StopAsyncIteration

    async def _interrupted(self) -> None:
        """The reader was interrupted (Ctrl-C, its task cancelled): drop the stream, and with
        ``cancel_on_interrupt`` cancel the run (once)."""
        self.close()
        if self._cancel_on_interrupt and self.run_id and not self._cancel_sent:
            self._cancel_sent = True
            await asyncio.shield(self._client._cancel_quietly(self.run_id, "client interrupted"))

    async def _reattach(self) -> None:
        await asyncio.sleep(self._reattach_delay())
        self._call = self._client._watch_call(self.run_id, self.last_sequence)
        self._iter = self._call.__aiter__()

    def close(self) -> None:
        """Drop the stream (the run goes on in the gateway)."""
        self._call.cancel()
        self._done = True

    async def cancel(self, reason: str = "", actor: str = "") -> RunRecord:
        """Cancel the run in the gateway (it ends CANCELLED); the stream then delivers the end."""
        return await self._client.cancel(await self.started(), reason=reason, actor=actor)

    async def record(self, *, timeout: Optional[float] = None) -> RunRecord:
        """The stored run as it stands (one GetRun call): state, progress, usage with its cost,
        the budget and ``budget_exhausted``, the reason a run with a budget stopped (empty while
        it has not)."""
        return await self._client.get_run(await self.started(), timeout=timeout)

    async def started(self) -> str:
        """The run's id: when it is not known yet, the stream is read up to the run's first event,
        which iterating the run still yields. Raises :class:`AssayError` when the gateway refused
        the run."""
        while not self.run_id and not self._done:
            try:
                self._early.append(await self._read())
            except StopAsyncIteration:
                break
        if not self.run_id:
            raise AssayError(grpc.StatusCode.UNAVAILABLE, "the event stream ended before the run started")
        return self.run_id

    async def wait(self) -> gateway_pb2.RunResult:
        """Consume the remaining events and return the run's result."""
        async for _ in self:
            pass
        if self.completed is None:
            raise AssayError(grpc.StatusCode.UNAVAILABLE, f"the event stream of run {self.run_id!r} ended early")
        return self.completed.result


class AsyncAssay:
    """The asyncio client: the methods of :class:`assay_client.Assay`, awaited.

    Create it inside a running event loop; use ``async with`` or await :meth:`close`. The
    server's protos are checked once before the first RPC, as by :class:`assay_client.Assay`
    (``check_server=False``: no check).
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
            self._channel = grpc.aio.insecure_channel(target, options=opts)
        else:
            self._channel = grpc.aio.secure_channel(target, creds, options=opts)
        self._metadata = _common.metadata(token)
        self.timeout = timeout
        self._unary, self._streams, self._client_streams = _common.stubs(self._channel)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncAssay":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, name: str, request: Any, timeout: Optional[float]) -> Any:
        await self._check.ensure(self._channel, self._metadata)
        try:
            return await self._unary[name](
                request, metadata=self._metadata, timeout=timeout if timeout is not None else self.timeout
            )
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None

    def _watch_call(self, run_id: str, after: int) -> Any:
        request = gateway_pb2.WatchRunRequest(run_id=run_id, after_sequence=after)
        return self._streams["WatchRun"](request, metadata=self._metadata, wait_for_ready=True)

    async def check_server(self, timeout: float = 10.0) -> List[str]:
        """Compare the server's protos (by reflection) with the client's: the messages, fields,
        enum values and methods the server has and this client lacks (empty: compatible). A
        non-empty answer also warns :class:`ServerNewerWarning`: v1 only grows, so the client
        still works, without the new parts. (The client also checks once on its own before its
        first RPC; this call makes that unnecessary.)"""
        try:
            found = await _compat.reflect(self._channel, self._metadata, timeout)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        self._check.skip()
        self._check.report(found)
        return found

    async def evaluate(
        self,
        /,
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
        stop_when_decided: Union[bool, Mapping[str, Any]] = False,
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
        ``stop_when_decided`` (``True``, or a dict of ``alpha``, ``margin``, ``min_records``,
        ``seed``), with two or more ``respond`` models: the records are taken in a seeded random
        order and no new one is asked once every comparison with the first is decided by an
        anytime-valid confidence sequence; :attr:`Evaluation.sequential` says where it stopped.
        Interrupting the call (Ctrl-C; cancelling the task) cancels it and its work.
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
            stop_when_decided,
        )
        return Evaluation(await self._call("Evaluate", request, timeout))

    async def evaluate_stream(
        self,
        /,
        records: Union[Iterable[_convert.RecordLike], AsyncIterable[_convert.RecordLike]],
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
        ``records`` (any iterable, a generator included, or an async iterable, read as it is sent)
        appended in messages of ``batch_size`` and sealed, the run waited for, and its results
        read with :meth:`list_run_results` (``page_size`` a page) into the returned
        :class:`Evaluation` (``raw.results_paged`` is set; ``checklists`` is empty, each result
        names its checklist). The arguments are :meth:`evaluate`'s; ``timeout`` is the deadline of
        each call made (waiting for the run has none). The results are held in memory: for runs
        too large for that, use ``run(..., open=True)``, :meth:`append_records` and
        :meth:`list_run_results`.
        ``respond`` as in :meth:`evaluate`: each record's result is one per (record, responder,
        sample), and the evaluation has the responders and their comparisons, so a model x
        prompt matrix past the 10,000 results of one request goes this way.
        A failure (a refused record, Ctrl-C, the task cancelled) cancels the run;
        :class:`AssayError` CANCELLED when the run was cancelled, ABORTED when it failed."""
        _convert.check_records(records, (Iterable, AsyncIterable))
        size = _convert.batch_size(batch_size)
        preset_checked = preset if checklist is None else None
        records = await _convert.first_checked_async(records, preset_checked)
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
        run_id = await run.started()
        run.close()  # the run goes on; its end is watched once every record is in
        try:
            appends = _convert.append_requests_async(run_id, records, True, size, preset_checked)
            await self._append(appends, timeout)
            state, result = await self._finish(run_id, timeout)
        except BaseException:
            await asyncio.shield(self._cancel_quietly(run_id, "the client's evaluate_stream failed"))
            raise
        response = _common.finished_evaluation(run_id, state, result)
        if response.results_paged:
            del response.results[:]
            response.results.extend([r async for r in self.list_run_results(run_id, page_size, timeout=timeout)])
        return Evaluation(response)

    async def _finish(self, run_id: str, timeout: Optional[float]) -> Tuple[int, gateway_pb2.RunResult]:
        """Wait for a run to end: (its state, its result)."""
        stored = await self.get_run(run_id, timeout=timeout)
        if stored.state in _common.FINISHED:
            return stored.state, stored.result
        watch = self.watch(run_id, after=stored.last_sequence)
        result = await watch.wait()
        return watch.state, result

    async def _cancel_quietly(self, run_id: str, reason: str) -> None:
        try:
            await self.cancel(run_id, reason=reason)
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
    ) -> AsyncRun:
        """Start a pipeline (a RunPipelineRequest, a pipeline message, or its dict form such as
        ``{"checklist_eval": {...}}``) and return its event stream.

        ``max_tokens`` / ``max_cost_usd`` set the run's budget (replacing a request's own): once
        it is spent no new model call starts and the run ends PARTIAL with what it has (see
        :meth:`evaluate`; :meth:`AsyncRun.record` says why it stopped).

        ``open=True`` (checklist_eval only) creates the run open: its records (the pipeline's,
        possibly none, then :meth:`append_records`) are kept in the run store and scored as they
        arrive; it finishes once sealed, and its results are read with :meth:`list_run_results`
        (its ``evaluation`` has ``results_paged`` set and no results). ``run.started()`` gives
        its id for the appends.

        Interrupting the run's reader (Ctrl-C; cancelling the task that iterates) drops the
        stream only, unless ``cancel_on_interrupt=True``: then the run is cancelled too."""
        request = _convert.pipeline_request(
            pipeline, label, _convert.budget(max_tokens, max_cost_usd), open_run=open
        )
        call = self._streams["RunPipeline"](request, metadata=self._metadata, timeout=timeout)
        return AsyncRun(self, call, reconnect=reconnect, cancel_on_interrupt=cancel_on_interrupt)

    def watch(self, run_id: str, after: int = 0, *, reconnect: int = 5) -> AsyncRun:
        """Follow a run's events with sequence > ``after`` (replayed, then live)."""
        return AsyncRun(self, self._watch_call(run_id, after), run_id=run_id, after=after, reconnect=reconnect)

    async def get_run(self, run_id: Any, *, timeout: Optional[float] = None) -> RunRecord:
        """A run's state, progress and result."""
        request = gateway_pb2.GetRunRequest(run_id=_common.run_id_of(run_id))
        run: RunRecord = (await self._call("GetRun", request, timeout)).run
        return run

    async def list_runs(
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
            response = await self._call("ListRuns", _common.list_request(kind, state, page_size, token), timeout)
            runs.extend(response.runs)
            token = response.next_page_token
            if not token or (limit is not None and len(runs) >= limit):
                return runs[:limit] if limit is not None else runs

    async def _control(self, run_id: Any, action: str, actor: str, reason: str, **fields: Any) -> RunRecord:
        request = _common.control(_common.run_id_of(run_id), action, actor, reason, **fields)
        run: RunRecord = (await self._call("ControlRun", request, None)).run
        return run

    async def pause(self, run_id: Any, *, reason: str = "", actor: str = "") -> RunRecord:
        """Pause a run after its current task."""
        return await self._control(run_id, "pause", actor, reason)

    async def resume(self, run_id: Any, *, reason: str = "", actor: str = "") -> RunRecord:
        """Resume a paused or interrupted run."""
        return await self._control(run_id, "resume", actor, reason)

    async def cancel(self, run_id: Any, *, reason: str = "", actor: str = "") -> RunRecord:
        """Cancel a run."""
        return await self._control(run_id, "cancel", actor, reason)

    async def delete_run(self, run_id: Any, *, timeout: Optional[float] = None) -> RunRecord:
        """Delete a finished run with its events and audit entries; returns the run as it was
        (without its result). :class:`AssayError` FAILED_PRECONDITION while it has not finished
        (cancel it first), NOT_FOUND when there is no such run."""
        request = gateway_pb2.DeleteRunRequest(run_id=_common.run_id_of(run_id))
        run: RunRecord = (await self._call("DeleteRun", request, timeout)).run
        return run

    async def append_records(
        self,
        run_id: Any,
        records: Union[Iterable[_convert.RecordLike], AsyncIterable[_convert.RecordLike]],
        seal: bool = False,
        batch_size: int = _convert.MAX_APPEND_BATCH,
        *,
        timeout: Optional[float] = None,
    ) -> gateway_pb2.AppendRecordsResponse:
        """Add ``records`` (as :meth:`evaluate` takes them: dicts, dataclasses, EvalRecord
        messages, bare targets; an iterable or an async iterable) to an open run
        (``run(..., open=True)``; ``run_id`` may be that run), over one AppendRecords call in
        messages of ``batch_size`` records (at most 10,000). ``records`` is read as the messages
        are sent, never held whole: a generator of any length works. ``seal=True`` ends the run's
        records (the last message carries it; with no records, one empty message seals): the run
        finishes once they are scored.

        Returns the AppendRecordsResponse (``appended`` by this call, ``records_total``,
        ``sealed``). :class:`AssayError` FAILED_PRECONDITION for a sealed run or one not created
        open, NOT_FOUND for no such run, INVALID_ARGUMENT for a refused record; an error raised
        while reading ``records`` cancels the call and is raised as it was (messages sent before
        it may have been added), and so does interrupting the call (Ctrl-C; cancelling the task).
        ``timeout``: the call's deadline (none by default: the client's ``timeout`` is for unary
        calls)."""
        _convert.check_records(records, (Iterable, AsyncIterable))
        size = _convert.batch_size(batch_size)
        requests = _convert.append_requests_async(await self._run_id(run_id), records, seal, size)
        return await self._append(requests, timeout)

    async def _append(
        self, requests: AsyncIterator[gateway_pb2.AppendRecordsRequest], timeout: Optional[float]
    ) -> gateway_pb2.AppendRecordsResponse:
        await self._check.ensure(self._channel, self._metadata)
        failed: List[BaseException] = []

        async def guarded() -> AsyncIterator[gateway_pb2.AppendRecordsRequest]:
            # grpc.aio cancels the call on an error of the request iterator and only logs it.
            try:
                async for request in requests:
                    yield request
            except BaseException as e:
                failed.append(e)
                raise

        call = self._client_streams["AppendRecords"](guarded(), metadata=self._metadata, timeout=timeout)
        try:
            response: gateway_pb2.AppendRecordsResponse = await call
            return response
        except grpc.aio.AioRpcError as e:
            if failed:
                raise failed[0] from None
            raise from_rpc_error(e) from None
        except asyncio.CancelledError:
            if failed and not isinstance(failed[0], asyncio.CancelledError):
                raise failed[0] from None
            call.cancel()
            raise

    async def list_run_results(
        self, run_id: Any, page_size: int = 1000, *, timeout: Optional[float] = None
    ) -> AsyncIterator[gateway_pb2.RecordResult]:
        """A checklist_eval run's record results (``RecordResult``), in record order, read a
        page of ``page_size`` (at most 10,000) at a time with ListRunResults as the iteration
        goes: any run, small or open. While the run executes it ends with the results stored so
        far. A generator: :class:`AssayError` (NOT_FOUND for no such run) is raised by the
        iteration. ``timeout``: each page's deadline (default: the client's)."""
        rid = await self._run_id(run_id)
        token = ""
        while True:
            response = await self._call("ListRunResults", _common.results_request(rid, page_size, token), timeout)
            for result in response.results:
                yield result
            token = response.next_page_token
            if not token:
                return

    async def _run_id(self, value: Any) -> str:
        """A run id; an :class:`AsyncRun` whose id is not known yet is read up to its first event."""
        if isinstance(value, AsyncRun) and not value.run_id:
            return await value.started()
        return _common.run_id_of(value)

    async def accept(self, run_id: Any, *, reason: str = "", actor: str = "") -> RunRecord:
        """Accept a targeted refinement's current content as final."""
        return await self._control(run_id, "accept", actor, reason)

    async def review(self, run_id: Any, *, reason: str = "", actor: str = "") -> RunRecord:
        """Mark an escalated refinement as reviewed."""
        return await self._control(run_id, "review", actor, reason)

    async def edit_section(
        self, run_id: Any, section_id: str, content: str, *, reason: str = "", actor: str = ""
    ) -> RunRecord:
        """Replace a section of a paused (or escalated) targeted refinement."""
        return await self._control(run_id, "edit_section", actor, reason, section_id=section_id, content=content)

    def refine(
        self,
        /,
        document: Union[str, Sequence[_convert.SectionLike]],
        mode: Union[str, int] = "full_auto",
        *,
        label: str = "",
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        **options: Any,
    ) -> AsyncRun:
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
        /,
        problems: Iterable[Any],
        baselines: bool = True,
        *,
        label: str = "",
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        **options: Any,
    ) -> AsyncRun:
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
        /,
        text: str,
        instruction: str = "",
        *,
        label: str = "",
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        **options: Any,
    ) -> AsyncRun:
        """Start a self-refine run of ``text``; options are SelfRefineRequest fields."""
        return self.run(
            _common.self_refine_pipeline(text, instruction, options),
            label=label,
            max_tokens=max_tokens,
            max_cost_usd=max_cost_usd,
        )

    async def compare(
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
        """Compare two checklist_eval runs (ids, runs or Evaluations): candidate minus baseline."""
        request = _common.compare_request(baseline, candidate, metric, alpha, min_effect, bootstrap_seed)
        response: gateway_pb2.CompareRunsResponse = await self._call("CompareRuns", request, timeout)
        return response
