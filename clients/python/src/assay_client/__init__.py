"""Python client of the Assay mesh.

>>> from assay_client import Assay
>>> with Assay("localhost:50051") as assay:
...     ev = assay.evaluate([{"input": "Write a haiku.", "target": "red leaves fall"}],
...                         checklist=["Is it three lines?"])

The generated messages are in ``assay_client.pb`` (``pb.gateway``, ``pb.common``, ...).
"""

from . import pb
from ._aio import AsyncAssay, AsyncRun
from ._client import Assay, Run, RunRecord
from ._common import TLS
from ._compat import ServerNewerWarning
from ._convert import checklist_eval
from ._errors import AssayError
from ._types import Evaluation, Event, cost_usd

#: The proto package version the client was generated from.
PROTO_VERSION = "v1"

__all__ = [
    "PROTO_VERSION",
    "TLS",
    "Assay",
    "AssayError",
    "AsyncAssay",
    "AsyncRun",
    "Evaluation",
    "Event",
    "Run",
    "RunRecord",
    "ServerNewerWarning",
    "checklist_eval",
    "cost_usd",
    "pb",
]
