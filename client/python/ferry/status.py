"""What ``Client.status()`` returns: the agent's state as plain, typed, frozen values
(no protobuf). Field names and meanings are GetStatusResponse's in ferry.proto; traffic
classes are the names the client takes ("latency", "bulk", "background"; "" when
unspecified).

    s = client.status()
    s.regions, s.registered_bytes, s.notifications_lost
    [(n.name, n.tx_bytes) for n in s.nics]
    mine = [t for t in s.tenants if t.pid == os.getpid()]
"""
from __future__ import annotations

import dataclasses
from typing import Any, Tuple, Type, TypeVar

from ._proto import ferry_pb2

_T = TypeVar("_T")


def class_name(value: int) -> str:
    """A ferry.v1.TrafficClass as the client names it; "" for TRAFFIC_CLASS_UNSPECIFIED."""
    if value == ferry_pb2.TRAFFIC_CLASS_UNSPECIFIED:
        return ""
    name: str = ferry_pb2.TrafficClass.Name(value)
    return name.removeprefix("TRAFFIC_CLASS_").lower()


def _from(cls: Type[_T], message: Any, **converted: Any) -> _T:
    """``cls`` with each field read from ``message``'s field of that name (repeated
    scalars as tuples), except those given in ``converted``."""
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in converted:
            values[f.name] = converted[f.name]
        else:
            v = getattr(message, f.name)
            values[f.name] = v if isinstance(v, (int, str, bool, float)) else tuple(v)
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class NicStatus:
    name: str
    provider: str
    address: str
    tx_bytes: int
    rx_bytes: int
    ops_inflight: int
    cpus: Tuple[int, ...]  # the CPUs its worker thread is pinned to; () if not pinned
    numa_node: int  # -1: unknown
    device: str  # the RDMA device or netdev in sysfs; "" if none


@dataclasses.dataclass(frozen=True)
class PeerStatus:
    address: str
    incarnation: int
    state: str  # "connected" or "suspect"
    open_regions: int


@dataclasses.dataclass(frozen=True)
class TenantStatus:
    """A session (a pod's client), as the agent's traffic classes see it."""
    session_id: int
    pid: int  # 0 when the client is in a PID namespace the agent cannot see
    uid: int
    gid: int
    rule: str  # the --qos_tenants rule that matched, or "default"
    ceiling: str  # the highest class it may use
    default_class: str  # its writes' class when they name none
    weight: int
    fabric_bytes: Tuple[int, ...]  # its finished transfers' bytes over the fabric: latency, bulk, background


@dataclasses.dataclass(frozen=True)
class AgentStatus:
    version: str
    incarnation: int
    socket: str
    peer_address: str
    metrics_address: str
    uptime_seconds: int
    sessions: int
    regions: int
    registered_bytes: int
    transfers_inflight: int
    transfers_completed: int
    transfers_failed: int
    fabric_provider: str
    nics: Tuple[NicStatus, ...]
    peers: Tuple[PeerStatus, ...]
    cuda: str  # "driver 12090, 2 devices", or why GPU memory cannot be registered here
    cuda_imports: int  # CUDA allocations imported
    staging_buffers: int  # held for peers writing into this agent's staged regions
    qos: bool  # traffic classes on (--qos)
    tenants: Tuple[TenantStatus, ...]
    notifications_lost: int  # dropped since the agent started: their receiver's queue was full

    @classmethod
    def from_proto(cls, m: ferry_pb2.GetStatusResponse) -> "AgentStatus":
        return _from(
            cls, m,
            nics=tuple(_from(NicStatus, n) for n in m.nics),
            peers=tuple(_from(PeerStatus, p) for p in m.peers),
            tenants=tuple(_from(TenantStatus, t, ceiling=class_name(t.ceiling),
                                default_class=class_name(t.default_class)) for t in m.tenants))
