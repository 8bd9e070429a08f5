"""ferry.status: GetStatus as plain, typed, frozen values (no protobuf in the client's API),
and Client.status() against a live agent."""
import dataclasses
import os

import pytest

import ferry
from ferry._proto import ferry_pb2
from ferry.status import AgentStatus


def test_every_field_comes_over_typed_with_classes_by_name():
    m = ferry_pb2.GetStatusResponse(version="v1", incarnation=7, regions=3, qos=True, notifications_lost=2)
    m.nics.add(name="eth0", tx_bytes=10, cpus=[2, 3], numa_node=-1)
    m.peers.add(address="10.0.0.2:7700", incarnation=9, state="connected", open_regions=1)
    m.tenants.add(session_id=5, pid=42, uid=1000, rule="uid=1000", ceiling=ferry_pb2.TRAFFIC_CLASS_BULK,
                  default_class=ferry_pb2.TRAFFIC_CLASS_UNSPECIFIED, weight=4, fabric_bytes=[1, 2, 3])
    s = AgentStatus.from_proto(m)
    assert (s.version, s.incarnation, s.regions, s.qos, s.notifications_lost) == ("v1", 7, 3, True, 2)
    assert s.nics[0].name == "eth0" and s.nics[0].cpus == (2, 3) and s.nics[0].numa_node == -1
    assert s.peers == (ferry.status.PeerStatus("10.0.0.2:7700", 9, "connected", 1),)
    t = s.tenants[0]
    assert (t.ceiling, t.default_class, t.fabric_bytes) == ("bulk", "", (1, 2, 3))
    # Every field of the message is a field here: a field added to the proto must be added too.
    assert {f.name for f in dataclasses.fields(AgentStatus)} == {f.name for f in m.DESCRIPTOR.fields}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.regions = 4  # type: ignore[misc]


def test_a_live_agent_reports_this_client(agent):
    with ferry.Client(agent.socket) as c:
        c.register_host(1 << 16)
        s = c.status()
        assert isinstance(s, AgentStatus)
        assert s.regions == 1 and s.sessions >= 1 and s.registered_bytes >= 1 << 16
        assert any(t.pid == os.getpid() for t in s.tenants)
