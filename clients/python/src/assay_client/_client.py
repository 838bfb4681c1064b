"""The synchronous client: the asyncio client (``_aio.py``) run on an event loop of its own, on a
thread of its own. Each method submits its coroutine to that loop and waits for it here.

The caller waits on a :class:`threading.Event`, never inside grpc: a Ctrl-C (KeyboardInterrupt)
lands in that wait, cancels the coroutine (which cancels its call, so the gateway drops the work)
and is raised once the coroutine has wound down. Since the loop is the client's own, the client
works the same from a thread without an event loop and from code that runs one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import weakref
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

from . import _common, _compat
from ._aio import AsyncAssay, AsyncRun, RunRecord
from ._proto.assay.gateway.v1 import gateway_pb2
from ._types import Event

if TYPE_CHECKING:
    from typing_extensions import Concatenate, ParamSpec

    P = ParamSpec("P")

T = TypeVar("T")

__all__ = ["Assay", "Run", "RunRecord"]


def _settle(done: threading.Event) -> None:
    """Wait for ``done``, waking every 0.1 s: a signal may be handled by another thread, and the
    main thread only raises its KeyboardInterrupt when it runs Python code."""
    while not done.wait(0.1):
        pass


async def _now(make: Callable[[], T]) -> T:
    """``make()``, on the loop: grpc.aio's calls and channels are made on the loop they run on."""
    return make()


class _Loop:
    """An event loop running on a daemon thread of its own."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="assay-client")
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def wait(self, step: Awaitable[T]) -> T:
        """Run ``step`` on the loop and wait here for its result. Anything raised here before the
        result (Ctrl-C) cancels it and is raised once it has wound down."""
        if threading.current_thread() is self._thread:
            _close(step)
            raise RuntimeError("the sync client was called from its own event loop (by a records generator?)")
        if self.closed:
            _close(step)
            raise ValueError("the client is closed")
        done = threading.Event()
        task: List["asyncio.Future[T]"] = []

        def start() -> None:
            task.append(asyncio.ensure_future(step))
            task[0].add_done_callback(lambda _: done.set())

        def cancel() -> None:  # runs after start when start was scheduled: callbacks run in order
            if task:
                task[0].cancel()
            else:
                _close(step)
                done.set()

        try:
            self._loop.call_soon_threadsafe(start)
            _settle(done)
        except BaseException:
            self._loop.call_soon_threadsafe(cancel)
            _settle(done)
            raise
        return task[0].result()

    @property
    def closed(self) -> bool:
        return self._loop.is_closed() or not self._thread.is_alive()

    def stop(self) -> None:
        """Stop the loop (its tasks cancelled) and wait for its thread to end."""
        with contextlib.suppress(RuntimeError):  # closed already
            self._loop.call_soon_threadsafe(self._loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join()


def _close(step: Awaitable[Any]) -> None:
    """Close a coroutine that will not run (no "never awaited" warning)."""
    if asyncio.iscoroutine(step):
        step.close()


def _unwrapped(value: Any) -> Any:
    """The asyncio run of a :class:`Run` (what the asyncio client takes), else ``value``."""
    return value._run if isinstance(value, Run) else value


def _blocking(method: "Callable[Concatenate[Any, P], Awaitable[T]]") -> "Callable[Concatenate[Any, P], T]":
    """The sync form of a coroutine method of an asyncio object: called on the sync object's
    ``_target`` (that asyncio object) and waited for with its ``_wait``."""

    @functools.wraps(method)
    def blocking(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        call: Callable[..., Awaitable[T]] = method
        unwrapped = {key: _unwrapped(value) for key, value in kwargs.items()}
        result: T = self._wait(call(self._target, *map(_unwrapped, args), **unwrapped))
        return result

    return blocking


def _running(method: "Callable[Concatenate[AsyncAssay, P], AsyncRun]") -> "Callable[Concatenate[Assay, P], Run]":
    """The sync form of a method of :class:`AsyncAssay` that starts a stream: the same stream,
    made on the loop, as a :class:`Run`."""

    @functools.wraps(method)
    def running(self: Assay, /, *args: P.args, **kwargs: P.kwargs) -> Run:
        return Run(self, self._wait(_now(lambda: method(self._aio, *args, **kwargs))))

    return running


def _iterating(
    method: "Callable[Concatenate[AsyncAssay, P], AsyncIterator[T]]",
) -> "Callable[Concatenate[Assay, P], Iterator[T]]":
    """The sync form of an async generator method of :class:`AsyncAssay`: a generator pulling
    each item from it (nothing runs before the iteration, as with the async generator)."""

    @functools.wraps(method)
    def iterating(self: Assay, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        call: Callable[..., AsyncIterator[T]] = method
        unwrapped = {key: _unwrapped(value) for key, value in kwargs.items()}
        items = call(self._aio, *map(_unwrapped, args), **unwrapped)
        try:
            while True:
                try:
                    item = self._wait(items.__anext__())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            closing = getattr(items, "aclose", None)
            if closing is not None:
                with contextlib.suppress(Exception):  # the client may be closed by now
                    self._wait(closing())

    return iterating


class Run(_common.RunView):
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

    def __init__(self, client: "Assay", run: AsyncRun) -> None:
        self._client = client
        self._run = self._target = run

    def _wait(self, step: Awaitable[T]) -> T:
        try:
            return self._client._wait(step)
        except BaseException as e:
            if not isinstance(e, Exception):
                # Ctrl-C: the reader saw it as its task's cancellation, unless it came before the
                # task ran. Either way the stream is dropped (and the run cancelled, if it was
                # made so) once; the second time does nothing.
                self._client._wait(self._run._interrupted())
            raise

    @property
    def run_id(self) -> str:
        """The run's id ("" until the stream's first event told it)."""
        return self._run.run_id

    @property
    def last_sequence(self) -> int:
        """The sequence of the last event seen."""
        return self._run.last_sequence

    @property
    def reattached(self) -> int:
        """How many times the stream was reattached."""
        return self._run.reattached

    @property
    def completed(self) -> Optional[gateway_pb2.RunCompleted]:
        """The run's ``completed`` event (None until it arrived)."""
        return self._run.completed

    def __iter__(self) -> Iterator[Event]:
        return self

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __next__(self) -> Event:
        try:
            return self._wait(self._run.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        """Drop the stream (the run goes on in the gateway)."""
        self._wait(_now(self._run.close))

    cancel = _blocking(AsyncRun.cancel)
    record = _blocking(AsyncRun.record)
    started = _blocking(AsyncRun.started)
    wait = _blocking(AsyncRun.wait)


class Assay:
    """A client of the Assay gateway.

    ``target`` is ``host:port``; ``token`` the bearer token (``auth_token`` of the server's
    configuration); ``tls`` None for plaintext, True for TLS with the system roots, or a
    :class:`TLS`. ``timeout`` is the default deadline in seconds of the unary calls (None: none).
    Before its first RPC the client compares the server's protos with its own by reflection
    (once, within a few seconds): a newer server warns :class:`ServerNewerWarning`, and a server
    without reflection or a failed check never fails the call (``check_server=False``: no check).
    Use as a context manager, or call :meth:`close`.

    The methods are :class:`AsyncAssay`'s, waited for: the client runs one on an event loop and
    a thread of its own. A records generator (``append_records``, ``evaluate_stream``) is read
    on that thread.
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
        self._loop = _Loop()
        weakref.finalize(self, self._loop.stop)  # a client never closed does not keep its thread
        # Differences the server check found: warned in the caller's thread, at the caller's line.
        self._found: List[List[str]] = []

        def make() -> AsyncAssay:
            return AsyncAssay(target, token, tls, timeout=timeout, options=options, check_server=check_server)

        try:
            self._aio = self._target = self._loop.wait(_now(make))
        except BaseException:
            self._loop.stop()
            raise
        self._aio._check.report = self._found.append

    @property
    def timeout(self) -> Optional[float]:
        """The default deadline in seconds of the unary calls (None: none)."""
        return self._aio.timeout

    @timeout.setter
    def timeout(self, value: Optional[float]) -> None:
        self._aio.timeout = value

    def close(self) -> None:
        """Close the channel."""
        if self._loop.closed:
            return
        try:
            self._wait(self._aio.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> "Assay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait(self, step: Awaitable[T]) -> T:
        try:
            return self._loop.wait(step)
        finally:
            while self._found:
                _compat.report(self._found.pop(0))

    check_server = _blocking(AsyncAssay.check_server)
    evaluate = _blocking(AsyncAssay.evaluate)
    evaluate_stream = _blocking(AsyncAssay.evaluate_stream)
    run = _running(AsyncAssay.run)
    watch = _running(AsyncAssay.watch)
    get_run = _blocking(AsyncAssay.get_run)
    list_runs = _blocking(AsyncAssay.list_runs)
    pause = _blocking(AsyncAssay.pause)
    resume = _blocking(AsyncAssay.resume)
    cancel = _blocking(AsyncAssay.cancel)
    delete_run = _blocking(AsyncAssay.delete_run)
    append_records = _blocking(AsyncAssay.append_records)
    list_run_results = _iterating(AsyncAssay.list_run_results)
    accept = _blocking(AsyncAssay.accept)
    review = _blocking(AsyncAssay.review)
    edit_section = _blocking(AsyncAssay.edit_section)
    refine = _running(AsyncAssay.refine)
    debate = _running(AsyncAssay.debate)
    self_refine = _running(AsyncAssay.self_refine)
    compare = _blocking(AsyncAssay.compare)
