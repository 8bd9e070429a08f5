"""ferry: move memory between pods and nodes through the node's ferry agent.

    import ferry
    client = ferry.Client("/run/ferry/ferry.sock")
    region = client.register_host(1 << 20)
    ...

See ferry.client for the full example.
"""
from . import cuda  # noqa: F401  (ferry.cuda.empty, DeviceBuffer)
from ._types import Region, RegionDescriptor
from .client import (
    Client,
    HostRegion,
    TransferFuture,
    TransferResult,
    WriteWindow,
)
from .errors import (
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    FerryError,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from .inbox import Inbox
from .kv import KVLayout
from .notification import Notification
from .status import AgentStatus
from .write_queue import WriteQueue

__all__ = [
    "Client", "HostRegion", "Notification", "Region", "RegionDescriptor", "TransferFuture", "TransferResult",
    "WriteWindow",
    "AgentStatus", "KVLayout", "WriteQueue", "Inbox", "FerryError", "AlreadyExists", "Cancelled", "DeadlineExceeded",
    "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutOfRange", "PermissionDenied",
    "ResourceExhausted", "Unauthenticated", "Unavailable",
]
