"""Wire compatibility: compare the server's protos (by reflection) with the ones the client was
generated from. v1 only grows, so a difference means a newer server; it is reported, not fatal."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Sequence

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor

from . import _common

REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


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
