"""Errors raised by the client: the gRPC code plus the field violations of the status details."""

from __future__ import annotations

from typing import Dict, Optional

import grpc


class AssayError(Exception):
    """A call to the mesh failed.

    ``code`` is the gRPC status code, ``message`` the server's message and ``fields`` the field
    violations of a ``google.rpc.BadRequest`` detail (field path -> description), empty when the
    status carries none.
    """

    def __init__(self, code: grpc.StatusCode, message: str, fields: Optional[Dict[str, str]] = None) -> None:
        self.code = code
        self.message = message
        self.fields: Dict[str, str] = dict(fields or {})
        super().__init__(f"{code.name}: {message}")


def _violations(error: grpc.RpcError) -> Dict[str, str]:
    """The BadRequest field violations carried in the status details of ``error``."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    try:
        status = rpc_status.from_call(error)
    except ValueError:  # details inconsistent with the call's code or message
        return {}
    fields: Dict[str, str] = {}
    if status is None:
        return fields
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            for violation in bad.field_violations:
                fields[violation.field] = violation.description
    return fields


def from_rpc_error(error: grpc.RpcError) -> AssayError:
    """Translate a grpc error (sync or aio) into an :class:`AssayError`."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return AssayError(code, details or "", _violations(error))
