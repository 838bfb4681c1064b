"""The asyncio client (grpc.aio)."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterable, List, Optional, Sequence, Tuple, Union

import grpc
import grpc.aio

from . import _common, _compat, _convert
from ._errors import AssayError, from_rpc_error
from ._proto.assay.gateway.v1 import gateway_pb2
from ._types import Evaluation, Event

RunRecord = gateway_pb2.Run


class AsyncRun(_common.RunEvents):
    """The asyncio form of :class:`assay_client.Run`: ``async for event in run``.

    Cancelling the task that iterates drops the stream only; the run goes on in the gateway
    unless :meth:`cancel` is awaited.
    """

    def __init__(self, client: "AsyncAssay", call: Any, *, run_id: str = "", after: int = 0, reconnect: int = 5) -> None:
        super().__init__(run_id, after, reconnect)
        self._client = client
        self._call = call
        self._iter: AsyncIterator[Any] = call.__aiter__()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        await self._client._check.ensure_async(self._client._channel, self._client._metadata)
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
            except BaseException:
                self._call.cancel()
                self._done = True
                raise
            event = self._accept(message.event)
            if event is not None:
                return event
        raise StopAsyncIteration

    async def _reattach(self) -> None:
        await asyncio.sleep(self._reattach_delay())
        self._call = self._client._watch_call(self.run_id, self.last_sequence)
        self._iter = self._call.__aiter__()

    def close(self) -> None:
        """Drop the stream (the run goes on in the gateway)."""
        self._call.cancel()
        self._done = True

    async def cancel(self, reason: str = "", actor: str = "") -> RunRecord:
        """Cancel the run in the gateway."""
        while not self.run_id:
            await self.__anext__()
        return await self._client.cancel(self.run_id, reason=reason, actor=actor)

    async def record(self, *, timeout: Optional[float] = None) -> RunRecord:
        """See :meth:`assay_client.Run.record`."""
        while not self.run_id:
            await self.__anext__()
        return await self._client.get_run(self.run_id, timeout=timeout)

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
        self._unary, self._streams = _common.stubs(self._channel)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncAssay":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, name: str, request: Any, timeout: Optional[float]) -> Any:
        await self._check.ensure_async(self._channel, self._metadata)
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
        """See :meth:`assay_client.Assay.check_server`."""
        try:
            found = await _compat.reflect_async(self._channel, self._metadata, timeout)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        self._check.skip()
        _compat.report(found)
        return found

    async def evaluate(
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
        **scorer_options: Any,
    ) -> Evaluation:
        """See :meth:`assay_client.Assay.evaluate`; cancelling the task cancels the call."""
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
        )
        return Evaluation(await self._call("Evaluate", request, timeout))

    def run(
        self,
        pipeline: Any,
        *,
        label: str = "",
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        timeout: Optional[float] = None,
        reconnect: int = 5,
    ) -> AsyncRun:
        """See :meth:`assay_client.Assay.run`."""
        request = _convert.pipeline_request(pipeline, label, _convert.budget(max_tokens, max_cost_usd))
        call = self._streams["RunPipeline"](request, metadata=self._metadata, timeout=timeout)
        return AsyncRun(self, call, reconnect=reconnect)

    def watch(self, run_id: str, after: int = 0, *, reconnect: int = 5) -> AsyncRun:
        """See :meth:`assay_client.Assay.watch`."""
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
        """See :meth:`assay_client.Assay.list_runs`."""
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
        """See :meth:`assay_client.Assay.delete_run`."""
        request = gateway_pb2.DeleteRunRequest(run_id=_common.run_id_of(run_id))
        run: RunRecord = (await self._call("DeleteRun", request, timeout)).run
        return run

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
        document: Union[str, Sequence[_convert.SectionLike]],
        mode: Union[str, int] = "full_auto",
        *,
        label: str = "",
        max_tokens: Optional[int] = None,
        max_cost_usd: Optional[float] = None,
        **options: Any,
    ) -> AsyncRun:
        """See :meth:`assay_client.Assay.refine`."""
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
    ) -> AsyncRun:
        """See :meth:`assay_client.Assay.debate`."""
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
    ) -> AsyncRun:
        """See :meth:`assay_client.Assay.self_refine`."""
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
        """See :meth:`assay_client.Assay.compare`."""
        request = _common.compare_request(baseline, candidate, metric, alpha, min_effect, bootstrap_seed)
        response: gateway_pb2.CompareRunsResponse = await self._call("CompareRuns", request, timeout)
        return response
