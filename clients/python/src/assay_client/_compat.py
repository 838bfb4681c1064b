"""Wire compatibility: compare the server's protos (by reflection) with the ones the client was
generated from. v1 only grows, so a difference means a newer server; it is reported, not fatal.

Both clients check once on their own, before their first RPC (:class:`AutoCheck`), unless made
with ``check_server=False``; ``check_server()`` checks on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor

from . import _common

REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
#: Deadline in seconds of the automatic check (the explicit ``check_server`` takes its own).
AUTO_CHECK_TIMEOUT = 3.0
#: Automatic checks that found the server unreachable before the client stops trying.
AUTO_CHECK_ATTEMPTS = 3

log = logging.getLogger("assay_client")


class ServerNewerWarning(UserWarning):
    """The server's protos have messages, fields, enum values or methods this client lacks."""


def _messages(prefix: str, messages: Iterable[descriptor_pb2.DescriptorProto]) -> Iterable[Any]:
    for message in messages:
        name = f"{prefix}.{message.name}"
        yield name, message
        yield from _messages(name, message.nested_type)


def differences(files: Sequence[descriptor_pb2.FileDescriptorProto]) -> List[str]:
    """What the server's ``files`` (assay ones only) have that this client's protos lack."""
    pool = descriptor_pool.Default()
    out: List[str] = []
    for file in files:
        if not file.package.startswith("assay."):
            continue
        for name, message in _messages(file.package, file.message_type):
            try:
                local: Descriptor = pool.FindMessageTypeByName(name)
            except KeyError:
                out.append(f"message {name}")
                continue
            for field in message.field:
                if field.number not in local.fields_by_number:
                    out.append(f"field {name}.{field.name} = {field.number}")
            for enum in message.enum_type:
                out.extend(_enum_differences(pool, f"{name}.{enum.name}", enum))
        for enum in file.enum_type:
            out.extend(_enum_differences(pool, f"{file.package}.{enum.name}", enum))
        for service in file.service:
            full = f"{file.package}.{service.name}"
            try:
                known = pool.FindServiceByName(full).methods_by_name
            except KeyError:
                out.append(f"service {full}")
                continue
            out.extend(f"method {full}.{m.name}" for m in service.method if m.name not in known)
    return out


def _enum_differences(pool: Any, name: str, enum: descriptor_pb2.EnumDescriptorProto) -> List[str]:
    try:
        local = pool.FindEnumTypeByName(name)
    except KeyError:
        return [f"enum {name}"]
    return [f"enum value {name}.{v.name} = {v.number}" for v in enum.value if v.number not in local.values_by_number]


def _reflection_messages() -> Any:
    from grpc_reflection.v1alpha import reflection_pb2

    return reflection_pb2


def request_bytes() -> bytes:
    """A reflection request for the file defining the gateway service (and its dependencies)."""
    r = _reflection_messages()
    data: bytes = r.ServerReflectionRequest(file_containing_symbol=_common.SERVICE).SerializeToString()
    return data


def files_of(responses: Iterable[bytes]) -> List[descriptor_pb2.FileDescriptorProto]:
    """The file descriptors of reflection responses."""
    r = _reflection_messages()
    files: Dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for raw in responses:
        response = r.ServerReflectionResponse.FromString(raw)
        for blob in response.file_descriptor_response.file_descriptor_proto:
            proto = descriptor_pb2.FileDescriptorProto.FromString(blob)
            files[proto.name] = proto
    return list(files.values())


async def reflect(channel: Any, metadata: Sequence[Tuple[str, str]], timeout: float) -> List[str]:
    """What the server behind ``channel`` (a ``grpc.aio`` channel) has and this client lacks
    (raises grpc.RpcError)."""
    call = channel.stream_stream(REFLECTION)(metadata=tuple(metadata), timeout=timeout)
    # The request goes out once the server has answered the call's start: a server without the
    # service ends the call there, and a write racing that end would turn its UNIMPLEMENTED into
    # an INTERNAL of grpc.aio's own.
    await call.initial_metadata()
    with contextlib.suppress(asyncio.InvalidStateError):  # the call ended: its status is read below
        await call.write(request_bytes())
        await call.done_writing()
    return differences(files_of([r async for r in call]))


async def _quietly(channel: Any, metadata: Sequence[Tuple[str, str]]) -> Tuple[Optional[List[str]], Optional[BaseException]]:
    try:
        return await reflect(channel, metadata, AUTO_CHECK_TIMEOUT), None
    except Exception as e:  # the automatic check never fails a call
        return None, e


def report(found: List[str]) -> None:
    """Warn :class:`ServerNewerWarning` about ``found`` (nothing when empty), attributed to the
    first caller outside this package."""
    if not found:
        return
    warnings.warn(
        f"the server's protos are newer than this client's: {', '.join(found[:10])}"
        + (f" and {len(found) - 10} more" if len(found) > 10 else ""),
        ServerNewerWarning,
        stacklevel=_outside_frames(),
    )


def _outside_frames() -> int:
    """The ``stacklevel`` of the nearest frame outside ``assay_client``."""
    level = 1
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(__package__ or "assay_client"):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


class AutoCheck:
    """The once-per-client automatic check of the server's protos.

    ``due()`` says whether the next RPC should check first; ``done(found, error)`` records the
    outcome: differences warn once; an error (no reflection service, auth, a timeout) is only
    logged at debug level and never fails the call. An unreachable server (UNAVAILABLE) is tried
    again on the next RPC, up to :data:`AUTO_CHECK_ATTEMPTS` times.
    """

    def __init__(self, enabled: bool) -> None:
        self._pending = enabled
        self._attempts = 0
        self._task: Optional["asyncio.Future[Tuple[Optional[List[str]], Optional[BaseException]]]"] = None
        #: What warns about differences found (:func:`report`); the sync client defers the warning
        #: to the caller's thread, so that it points at the caller's line.
        self.report: Callable[[List[str]], None] = report

    async def ensure(self, channel: Any, metadata: Sequence[Tuple[str, str]]) -> None:
        """Check ``channel``'s server unless done already (concurrent first calls share one check;
        a cancelled caller leaves it running for the next)."""
        if not self._pending:
            return
        if self._task is None:
            self._task = asyncio.ensure_future(_quietly(channel, metadata))
        task = self._task
        found, error = await asyncio.shield(task)
        if self._task is task:
            self._task = None
            self.done(found, error)

    def due(self) -> bool:
        """Whether the server still has to be checked."""
        return self._pending

    def skip(self) -> None:
        """No automatic check any more (an explicit one was made)."""
        self._pending = False

    def done(self, found: Optional[List[str]], error: Optional[BaseException] = None) -> None:
        """Record a check's differences (``found``) or its ``error``."""
        if not self._pending:
            return
        self._attempts += 1
        if error is not None:
            code = getattr(error, "code", None)
            code = code() if callable(code) else code
            log.debug("assay_client: server check failed (%s); calls go on", error)
            if code == grpc.StatusCode.UNAVAILABLE and self._attempts < AUTO_CHECK_ATTEMPTS:
                return
            self._pending = False
            return
        self._pending = False
        if found:
            self.report(found)
        else:
            log.debug("assay_client: the server's protos match this client's")
