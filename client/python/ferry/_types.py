"""The types that the client's modules share without importing one another: a region's
descriptor, a region this client registered, and what a region, queue or inbox needs of
the Client that made it (``ClientCalls``; ``ferry.Client`` is the one implementation).
``ferry.client`` re-exports the public ones."""
from __future__ import annotations

from typing import Any, Optional, Protocol, TypeVar

from google.protobuf.message import Message

from . import errors
from ._proto import ferry_pb2
from ._session import Session


class ClientCalls(Protocol):
    """What a Region, WriteQueue or Inbox calls on its Client: the session it passes fds
    through, a unary call, and the conversions every request shares."""

    _session: Session

    def _call(self, method: str, request: Message, timeout: Optional[float] = None) -> Any: ...

    def _traffic_class(self, name: Optional[str]) -> ferry_pb2.TrafficClass: ...

    def _descriptor(self, dst: object) -> RegionDescriptor: ...

    def _deregister(self, region_id: int) -> None: ...


class RegionDescriptor:
    """Names a region anywhere in the cluster, with the capability to write into it."""

    def __init__(self, proto: ferry_pb2.RegionDescriptor):
        self._proto = proto

    @classmethod
    def from_bytes(cls, data: bytes) -> "RegionDescriptor":
        """Parses what Region.descriptor() produced. Raises InvalidArgument on garbage."""
        proto = ferry_pb2.RegionDescriptor()
        try:
            proto.ParseFromString(bytes(data))
        except Exception as e:  # protobuf's DecodeError
            raise errors.InvalidArgument(f"not a ferry RegionDescriptor: {e}") from None
        if proto.version != 1 or proto.region_id == 0 or len(proto.token) != 16:
            raise errors.InvalidArgument("not a ferry RegionDescriptor (version, region id or token missing)")
        return cls(proto)

    def to_bytes(self) -> bytes:
        return bytes(self._proto.SerializeToString())

    @property
    def size(self) -> int:
        return self._proto.size

    @property
    def agent_address(self) -> str:
        return self._proto.agent_address

    @property
    def is_gpu(self) -> bool:
        return self._proto.kind == ferry_pb2.MEMORY_KIND_CUDA

    @property
    def window_id(self) -> int:
        """The write window this descriptor writes through (Client.open_write_window); 0: none."""
        return self._proto.window_id

    def __repr__(self) -> str:
        kind = "cuda" if self.is_gpu else "host"
        return (f"RegionDescriptor(agent={self._proto.agent_address or 'local'}, region={self._proto.region_id}, "
                f"size={self._proto.size}, kind={kind})")


_RegionT = TypeVar("_RegionT", bound="Region")


class Region:
    """A region this client registered. Use as a context manager to deregister on exit."""

    def __init__(self, client: ClientCalls, response: ferry_pb2.RegisterMemoryResponse, write_windows: bool = False):
        self._client = client
        self.id: int = response.region_id
        self._descriptor = response.region
        self._registered = True
        # Registered in window mode: writes land only through windows its client opens.
        self.write_windows = write_windows

    @property
    def size(self) -> int:
        return self._descriptor.size

    def descriptor(self) -> bytes:
        """What another pod needs to write into this region (serialized RegionDescriptor)."""
        return bytes(self._descriptor.SerializeToString())

    def deregister(self) -> None:
        if self._registered:
            self._registered = False
            self._client._deregister(self.id)

    def __enter__(self: _RegionT) -> _RegionT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.deregister()
