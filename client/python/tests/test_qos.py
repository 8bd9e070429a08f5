"""Traffic classes with real agents: the operator's rules (--qos_*) decide which classes a
pod may use; a bad rule keeps the agent from starting; a class above the ceiling is
refused by every call that takes one; bytes are counted per class in the metrics and in
each pod's status. (The order in which a NIC worker posts is unit-tested in
tests/engine/op_scheduler_test.cc; `tools/bench.sh qos` measures it.)"""
import os
import urllib.request

import pytest
from conftest import Agent

import ferry

FABRIC = ("--fabric_provider=tcp;ofi_rxm",)


def _metric(agent, series: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{agent.ready()['metrics_port']}/metrics", timeout=5).read()
    for line in text.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.split()[1])
    raise AssertionError(f"{series} is not in the metrics")


@pytest.mark.parametrize("flag,says", [
    ("--qos_tenants=uid=1000,class=urgent", "--qos_tenants: rule 1: unknown class 'urgent'"),
    ("--qos_tenants=gid=5,weight=0", "weight must be 1..1000, not '0'"),
    ("--qos_tenants=uid=1000,inflight=64KiB", "inflight=64KiB is smaller than one op (--fabric_max_op_bytes="),
    ("--qos_tenants=uid=1000,ceiling=bulk,class=latency", "class=latency is above ceiling=bulk"),
    ("--qos_default_tenant=ceiling=bulk,rate=fast", "--qos_default_tenant: the default rule: rate must be"),
    ("--qos_class_weights=bulk=0", "--qos_class_weights: bulk must be 1..1000"),
    ("--qos_latency_window_bytes=0", "--qos_latency_window_bytes must be 1..--qos_window_bytes"),
])
def test_a_bad_qos_rule_keeps_the_agent_from_starting(tmp_path, flag, says):
    with pytest.raises(RuntimeError) as e:
        Agent(flag)
    assert says in str(e.value)


def test_a_class_above_the_pods_ceiling_is_refused_by_every_call(agent_factory):
    a = agent_factory("--peer_address=127.0.0.1:0", "--fabric_iface=127.0.0.1", *FABRIC,
                      "--qos_default_tenant=ceiling=bulk")
    b = agent_factory("--peer_address=127.0.0.2:0", "--fabric_iface=127.0.0.2", *FABRIC)
    with pytest.raises(ferry.PermissionDenied, match="latency is above this pod's ceiling bulk"):
        ferry.Client(a.socket, traffic_class="latency")  # refused as the session opens
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb, \
            ferry.Client(a.socket, traffic_class="background") as patient:
        src, dst = ca.register_host(1 << 16), cb.register_host(1 << 16)
        d = dst.descriptor()
        refusals = [
            lambda: ca.write(src, d, [(0, 0, 4096)], traffic_class="latency"),
            lambda: ca.write_blocks(src, d, 4096, [0], [1], traffic_class="latency"),
            lambda: ca.write_batch([(src, d, 0, 0)], 4096, [0], [1], traffic_class="latency"),
            lambda: ca.create_queue([d], traffic_class="latency"),
        ]
        for call in refusals:
            with pytest.raises(ferry.PermissionDenied) as e:
                call()
            assert "latency is above this pod's ceiling bulk" in str(e.value)
            assert "rule default" in str(e.value)
        # At or below the ceiling: the bytes move.
        src.buffer[:] = os.urandom(1 << 16)
        ca.write(src, d, [(0, 0, 1 << 15)], traffic_class="background").result(30)
        ca.write(src, d, [(1 << 15, 1 << 15, 1 << 15)]).result(30)  # the rule's default, bulk
        assert dst.buffer == src.buffer
        patient.write(patient.register_host(4096), d, [(0, 0, 4096)]).result(30)  # the session's class
    with pytest.raises(ValueError, match="traffic_class must be one of"):
        ferry.Client(a.socket, traffic_class="fast")


def test_bytes_are_counted_per_class_in_the_metrics_and_each_pods_status(agent_factory):
    a = agent_factory("--peer_address=127.0.0.1:0", "--fabric_iface=127.0.0.1", *FABRIC,
                      f"--qos_tenants=gid={os.getgid()},ceiling=latency,class=latency,weight=5")
    b = agent_factory("--peer_address=127.0.0.2:0", "--fabric_iface=127.0.0.2", *FABRIC)
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        src, dst = ca.register_host(1 << 20), cb.register_host(1 << 20)
        ca.write(src, dst.descriptor(), [(0, 0, 1 << 20)]).result(30)  # latency: this gid's default
        ca.write(src, dst.descriptor(), [(0, 0, 1 << 19)], traffic_class="bulk").result(30)
        q = ca.create_queue([dst.descriptor()], traffic_class="background")
        q.post(src, 4096, user_data=1)
        assert [c.error for c in q.reap(timeout=30)] == [None]
        q.close()
        for cls, n in (("latency", 1 << 20), ("bulk", 1 << 19), ("background", 4096)):
            assert _metric(a, f'ferry_qos_bytes_total{{class="{cls}",nic="nic0"}}') == n
        mine = [t for t in ca.status().tenants if t.pid == os.getpid()]
        assert len(mine) == 1
        t = mine[0]
        assert (t.rule, t.weight, list(t.fabric_bytes)) == (f"gid={os.getgid()}", 5, [1 << 20, 1 << 19, 4096])
        assert t.ceiling == "latency"
        assert ca.status().qos
