"""The Python client against live ferryd processes: host memory (CPU CI)."""
import os
import random
import subprocess
import sys
import threading
import time

import pytest

import ferry
from ferry._proto import ferry_pb2


def test_write_between_two_clients_lands_and_notifies(agent):
    with ferry.Client(agent.socket) as writer, ferry.Client(agent.socket) as reader:
        src = writer.register_host(1 << 20)
        dst = reader.register_host(1 << 20)
        payload = os.urandom(1 << 20)
        src.buffer[:] = payload
        desc = ferry.RegionDescriptor.from_bytes(dst.descriptor())  # as another pod would
        assert desc.size == 1 << 20 and not desc.is_gpu

        got = []
        watcher = threading.Thread(target=lambda: got.extend(reader.notifications(timeout=5)))
        watcher.start()
        result = writer.write(src, desc, chunks=[(0, 4096, 8192), (100, 0, 10)], tag=42, notify=True).result(10)
        assert result.bytes == 8202 and result.path == "local"
        assert bytes(dst.buffer[4096:4096 + 8192]) == payload[:8192]
        assert bytes(dst.buffer[:10]) == payload[100:110]
        assert bytes(dst.buffer[10:4096]) == bytes(4086)  # untouched
        watcher.join()
        assert [(n.tag, n.bytes, n.region_id) for n in got] == [(42, 8202, dst.id)]


def test_write_blocks_moves_10000_scattered_blocks(agent):
    with ferry.Client(agent.socket) as c:
        block = 256
        src = c.register_host(10000 * block)
        dst = c.register_host(10000 * block)
        src.buffer[:] = os.urandom(10000 * block)
        s_ids = list(range(10000))
        d_ids = list(range(10000))
        random.Random(1).shuffle(s_ids)
        random.Random(2).shuffle(d_ids)
        c.write_blocks(src, dst.descriptor(), block, s_ids, d_ids).result(30)
        for s, d in zip(s_ids[:500], d_ids[:500], strict=False):
            assert dst.buffer[d * block:(d + 1) * block] == src.buffer[s * block:(s + 1) * block]


def test_block_ids_travel_packed_when_they_fit_32_bits_and_as_varints_when_not():
    from ferry.client import _set_block_ids
    p = ferry_pb2.PagedChunks()
    _set_block_ids(p, (i for i in [5, 2**32 - 1]), [0, 70000])  # a generator is read once
    assert p.src_blocks_le32 == (5).to_bytes(4, "little") + (2**32 - 1).to_bytes(4, "little")
    assert p.dst_blocks_le32 == (0).to_bytes(4, "little") + (70000).to_bytes(4, "little")
    assert not p.src_blocks and not p.dst_blocks
    p = ferry_pb2.PagedChunks()
    _set_block_ids(p, [2**32, 1], [3, 4])  # each side on its own
    assert list(p.src_blocks) == [2**32, 1] and not p.src_blocks_le32
    assert p.dst_blocks_le32 and not p.dst_blocks
    with pytest.raises(TypeError):
        _set_block_ids(ferry_pb2.PagedChunks(), [1.5], [0])  # never rounded into another block


def test_block_ids_of_either_form_land_in_the_same_blocks(agent):
    with ferry.Client(agent.socket) as c:
        block = 64
        src = c.register_host(64 * block)
        dst = c.register_host(64 * block)
        src.buffer[:] = os.urandom(64 * block)
        packed = c.write_blocks(src, dst.descriptor(), block, [3, 9], [0, 1])  # packed ids
        req = ferry_pb2.WriteRequest(src_region_id=src.id, dst=ferry.RegionDescriptor.from_bytes(dst.descriptor())._proto)
        req.paged.block_size = block
        req.paged.src_blocks.extend([4, 8])  # varints, as an older client sends them
        req.paged.dst_blocks_le32 = (2).to_bytes(4, "little") + (3).to_bytes(4, "little")
        varint = ferry.client.TransferFuture(c, c._call("Write", req))
        packed.result(10)
        varint.result(10)
        for s, d in ((3, 0), (9, 1), (4, 2), (8, 3)):
            assert dst.buffer[d * block:(d + 1) * block] == src.buffer[s * block:(s + 1) * block]
        req.paged.src_blocks_le32 = b"\x01\x00\x00\x00"  # both forms on one side
        with pytest.raises(ferry.errors.InvalidArgument, match="set src_blocks or src_blocks_le32, not both"):
            c._call("Write", req)
        req.paged.ClearField("src_blocks")
        req.paged.src_blocks_le32 = b"\x01\x02\x03"  # not whole ids
        with pytest.raises(ferry.errors.InvalidArgument, match="src_blocks_le32 holds 3 bytes"):
            c._call("Write", req)


def test_errors_are_exceptions_with_the_agents_message(agent):
    with ferry.Client(agent.socket) as a, ferry.Client(agent.socket) as b:
        src = a.register_host(4096)
        dst = b.register_host(4096)
        with pytest.raises(ferry.OutOfRange) as e:
            a.write(src, dst.descriptor(), [(0, 4000, 200)])
        assert "outside" in e.value.message
        forged = ferry.RegionDescriptor.from_bytes(dst.descriptor())
        forged._proto.token = b"x" * 16
        with pytest.raises(ferry.PermissionDenied):
            a.write(src, forged, [(0, 0, 1)])
        with pytest.raises(ferry.PermissionDenied) as e:  # b's region is not a's to write from
            a.write(dst, src.descriptor(), [(0, 0, 1)])
        assert "another session" in e.value.message
        with pytest.raises(ferry.InvalidArgument):
            ferry.RegionDescriptor.from_bytes(b"\x01\x02garbage")
        with pytest.raises(ferry.InvalidArgument):
            a.register_host(0)
        assert isinstance(ferry.OutOfRange("x"), IndexError)  # usable as the builtin kind too


def test_context_managers_deregister_and_closing_ends_the_session(agent):
    c = ferry.Client(agent.socket)
    with c.register_host(4096):
        assert c.status().regions == 1
    assert c.status().regions == 0
    r = c.register_host(4096)
    other = ferry.Client(agent.socket)
    c.close()  # the agent reclaims r
    for _ in range(100):
        if other.status().regions == 0:
            break
        threading.Event().wait(0.02)
    assert other.status().regions == 0
    with pytest.raises(ferry.Unavailable):
        c.register_host(4096)
    other.close()


def test_a_killed_client_process_is_cleaned_up(agent):
    code = ("import ferry, os, sys; c = ferry.Client(sys.argv[1]); c.register_host(1 << 20); "
            "print('ready', flush=True); os.kill(os.getpid(), 9)")
    subprocess.run([sys.executable, "-c", code, agent.socket], check=False, timeout=30)
    with ferry.Client(agent.socket) as c:
        for _ in range(100):
            if c.status().regions == 0:
                break
            threading.Event().wait(0.02)
        assert c.status().regions == 0


def test_result_timeout_and_done(agent):
    with ferry.Client(agent.socket) as c:
        src = c.register_host(1 << 20)
        dst = c.register_host(1 << 20)
        f = c.write(src, dst.descriptor(), [(0, 0, 1 << 20)])
        r = f.result(timeout=10)
        assert f.done() and r.transfer_id == f.transfer_id


def test_an_agent_that_is_not_there_is_unavailable(tmp_path):
    with pytest.raises(ferry.Unavailable) as e:
        ferry.Client(str(tmp_path / "nothing.sock"))
    assert "is ferryd running" in e.value.message


def test_cross_agent_write_through_the_fabric(fabric_agents):
    a, b = fabric_agents
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        src = ca.register_host(1 << 20)
        dst = cb.register_host(1 << 20)
        src.buffer[:] = os.urandom(1 << 20)
        r = ca.write(src, dst.descriptor(), [(0, 0, 1 << 20)], notify=True, tag=3).result(30)
        assert r.path == "fabric"
        assert dst.buffer == src.buffer
        assert [n.tag for n in cb.notifications(timeout=2)] == [3]


def test_a_write_with_wait_comes_back_done_in_one_call(fabric_agents):
    a, b = fabric_agents
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        src, dst = ca.register_host(1 << 20), cb.register_host(1 << 20)
        src.buffer[:] = os.urandom(1 << 20)
        calls = []
        real_call = ca._call
        ca._call = lambda method, *args, **kw: calls.append(method) or real_call(method, *args, **kw)
        fut = ca.write(src, dst.descriptor(), [(0, 0, 1 << 20)], wait=30)
        r = fut.result(1)
        assert calls == ["Write"]  # the result came with the answer: no Wait call
        assert (r.bytes, r.path) == (1 << 20, "fabric")
        assert dst.buffer == src.buffer
        fut = ca.write_batch([(src, dst.descriptor(), 0, 0)], 4096, [1, 2], [3, 4], wait=30)
        fut.result(1)
        assert calls == ["Write", "WriteBatch"]
        assert dst.buffer[3 * 4096:5 * 4096] == src.buffer[4096:3 * 4096]
        for bad in (-1, "soon", 1e7):
            with pytest.raises(ferry.InvalidArgument, match="wait must be a number of seconds"):
                ca.write(src, dst.descriptor(), [(0, 0, 8)], wait=bad)


def _counter(agent, series: str) -> float:
    """One series of the agent's /metrics, e.g. 'ferry_peer_notifications_total{via="rpc"}'."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{agent.ready()['metrics_port']}/metrics", timeout=5).read()
    for line in text.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.split()[1])
    raise AssertionError(f"{series} is not in the metrics")


@pytest.mark.parametrize("via", ["fabric_message", "rpc"])
def test_a_notification_comes_by_fabric_message_or_by_rpc_and_says_the_same(agent_factory, via):
    """The writer's agent sends its notifications as fabric messages after the data
    (--fabric_messages, the default) or by the peer Notify RPC: the receiver gets the
    same notifications, in order, payloads up to the 4 KiB limit intact, either way."""
    a = agent_factory("--peer_address=127.0.0.1:0", "--fabric_iface=127.0.0.1", "--fabric_provider=tcp;ofi_rxm",
                      f"--fabric_messages={'true' if via == 'fabric_message' else 'false'}")
    b = agent_factory("--peer_address=127.0.0.2:0", "--fabric_iface=127.0.0.2", "--fabric_provider=tcp;ofi_rxm")
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        src = ca.register_host(1 << 20)
        dst = cb.register_host(1 << 20)
        src.buffer[:] = os.urandom(1 << 20)
        payloads = [b"", b"req-1", os.urandom(4096), b"\0" * 100]
        for i, p in enumerate(payloads):
            ca.write(src, dst.descriptor(), [(i << 12, i << 12, 4096), (1 << 19, 1 << 19, 1 << 19)], notify=True,
                     tag=i, notify_payload=p).result(30)
        got = [(n.tag, n.payload, n.bytes, n.kind) for n in cb.notifications(timeout=2)]
        assert got == [(i, p, 4096 + (1 << 19), "write") for i, p in enumerate(payloads)]
        assert dst.buffer[1 << 19:] == src.buffer[1 << 19:]
        assert _counter(b, f'ferry_peer_notifications_total{{via="{via}"}}') == len(payloads)
        other = "rpc" if via == "fabric_message" else "fabric_message"
        assert _counter(b, f'ferry_peer_notifications_total{{via="{other}"}}') == 0


def test_messages_and_notify_payloads_reach_the_regions_owner(fabric_agents):
    a, b = fabric_agents
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb, ferry.Client(b.socket) as neighbour:
        src = ca.register_host(1 << 16)
        dst = cb.register_host(1 << 16)
        ca.send_message(dst.descriptor(), b"blocks 1,2,3", tag=5)  # across agents
        neighbour.send_message(dst.descriptor(), tag=6)  # on the owner's own agent, empty payload
        ca.write(src, dst.descriptor(), [(0, 0, 4096)], notify=True, tag=7, notify_payload=b"req-9").result(30)
        got = [(n.kind, n.tag, n.payload, n.bytes, n.region_id) for n in cb.notifications(timeout=2)]
        assert got == [("message", 5, b"blocks 1,2,3", 0, dst.id), ("message", 6, b"", 0, dst.id),
                       ("write", 7, b"req-9", 4096, dst.id)]

        with pytest.raises(ferry.InvalidArgument, match="4096"):
            ca.send_message(dst.descriptor(), b"x" * 4097)
        with pytest.raises(ferry.InvalidArgument, match="notify_payload needs notify"):
            ca.write(src, dst.descriptor(), [(0, 0, 8)], notify_payload=b"orphan")
        forged = ferry_pb2.RegionDescriptor.FromString(dst.descriptor())
        forged.token = b"\x01" * 16
        with pytest.raises(ferry.PermissionDenied):
            ca.send_message(forged.SerializeToString(), b"x")
        assert list(cb.notifications(timeout=0.5)) == []


def test_write_batch_moves_one_block_mapping_into_every_layer_with_one_notification(fabric_agents):
    a, b = fabric_agents
    layers, block, blocks = 4, 4096, 32
    half = block * blocks
    with ferry.Client(a.socket) as producer, ferry.Client(b.socket) as consumer:
        src = [producer.register_host(2 * half) for _ in range(layers)]
        dst = [consumer.register_host(2 * half) for _ in range(layers)]
        for r in src:
            r.buffer[:] = os.urandom(2 * half)
        src_ids = list(range(0, blocks, 2))
        dst_ids = random.Random(3).sample(range(blocks), len(src_ids))
        parts = [(src[l], dst[l].descriptor(), base, base) for l in range(layers) for base in (0, half)]
        r = producer.write_batch(parts, block, src_ids, dst_ids, notify=True, tag=11,
                                 notify_payload=b"req-1").result(30)
        assert r.path == "fabric" and r.bytes == layers * 2 * len(src_ids) * block
        for l in range(layers):
            for base in (0, half):
                for s, d in zip(src_ids, dst_ids, strict=False):
                    assert dst[l].buffer[base + d * block:base + (d + 1) * block] == \
                        src[l].buffer[base + s * block:base + (s + 1) * block]
        got = [(n.kind, n.tag, n.payload, n.bytes) for n in consumer.notifications(timeout=2)]
        assert got == [("write", 11, b"req-1", r.bytes)]
        # Told by one fabric message after the last part, not by an RPC.
        assert _counter(b, 'ferry_peer_notifications_total{via="fabric_message"}') == 1
        assert _counter(b, 'ferry_peer_notifications_total{via="rpc"}') == 0
        with pytest.raises(ferry.OutOfRange, match=r"parts\[1\]"):
            producer.write_batch([(src[0], dst[0].descriptor(), 0, 0), (src[0], dst[0].descriptor(), 0, 2 * half)],
                                 block, src_ids, dst_ids)
        # Parts into one region: interleaved blocks are fine, the same bytes twice are not
        # (they would land in either order).
        even = list(range(0, blocks, 2))
        d0 = dst[0].descriptor()
        producer.write_batch([(src[0], d0, 0, 0), (src[1], d0, 0, block)], block, even, even).result(30)
        assert dst[0].buffer[block:2 * block] == src[1].buffer[:block]
        with pytest.raises(ferry.InvalidArgument,
                           match=rf"parts: two parts write region {dst[0].id}: destination ranges overlap"):
            producer.write_batch([(src[0], d0, 0, 0), (src[1], d0, 0, 0)], block, even, even)


def test_a_notified_write_that_fails_still_notifies_its_receiver(agent):
    size = 256 << 20
    with ferry.Client(agent.socket) as writer, ferry.Client(agent.socket) as reader:
        src = writer.register_host(size)
        dst = reader.register_host(size)
        ids = range(size // 4096)
        f = writer.write_blocks(src, dst.descriptor(), 4096, ids, ids, notify=True, tag=4, timeout=0.001)
        with pytest.raises(ferry.DeadlineExceeded):
            f.result(30)
        got = list(reader.notifications(timeout=1))
        assert [(n.kind, n.tag, n.ok, n.code, n.bytes) for n in got] == [("write", 4, False, 4, 0)]
        assert "deadline" in got[0].message


def test_agent_restart_gives_unavailable_and_reconnect_registers_again(agent_factory):
    a = agent_factory()
    c = ferry.Client(a.socket)
    src = c.register_host(1 << 16)
    dst = c.register_host(1 << 16)
    src.buffer[:4] = b"abcd"
    a.kill()
    agent_factory(dir=a.dir)  # the same socket path: a restarted agent
    with pytest.raises(ferry.Unavailable) as e:
        c.write(src, dst.descriptor(), [(0, 0, 4)])
    assert "reconnect" in e.value.message
    c.reconnect(timeout=10)
    assert c.status().regions == 2  # both regions registered again, same memory
    c.write(src, dst.descriptor(), [(0, 0, 4)]).result(10)
    assert bytes(dst.buffer[:4]) == b"abcd"
    c.close()


def test_a_call_racing_the_agents_shutdown_is_unavailable_never_cancelled(agent_factory):
    """The agent's server cancels calls that arrive while it shuts down (a helm upgrade
    rolling it): the client says UNAVAILABLE and what to do, not gRPC's CANCELLED."""
    for _ in range(4):
        a = agent_factory()
        c = ferry.Client(a.socket)
        src = c.register_host(1 << 16)
        dst = c.register_host(1 << 16)
        failures = []
        started = threading.Event()

        def write_until_it_fails():
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    c.write(src, dst.descriptor(), [(0, 0, 1 << 16)]).result(5)
                    started.set()
                except ferry.FerryError as e:
                    failures.append(e)
                    return
        t = threading.Thread(target=write_until_it_fails)
        t.start()
        assert started.wait(10)
        time.sleep(0.05)
        assert a.stop() == 0
        t.join(15)
        assert len(failures) == 1 and isinstance(failures[0], ferry.Unavailable), failures
        c.close()


def _aimed_at(desc: bytes, address: str) -> "ferry.RegionDescriptor":
    moved = ferry.RegionDescriptor.from_bytes(desc)
    moved._proto.agent_address = address
    return moved


@pytest.mark.parametrize("target", ["refuses connections", "is not a ferry agent"])
def test_a_write_to_an_unreachable_agent_fails_at_once_and_the_session_lives(fabric_agents, target):
    """A descriptor whose agent is gone (a pool scaled down) or that names some other
    service: the agent's own UNAVAILABLE, naming the peer, at once; the session is fine."""
    a, b = fabric_agents
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        src = ca.register_host(1 << 16)
        dst = cb.register_host(1 << 16)
        src.buffer[:8] = b"ferry-ok"
        if target == "refuses connections":
            address = "127.0.0.9:1"
        else:  # b's metrics port: an HTTP server, not ferry's peer service
            address = f"127.0.0.1:{b.ready()['metrics_port']}"
        start = time.monotonic()
        with pytest.raises(ferry.Unavailable) as e:
            ca.write(src, _aimed_at(dst.descriptor(), address), [(0, 0, 8)]).result(30)
        elapsed = time.monotonic() - start
        assert elapsed < 1.0, f"took {elapsed:.2f} s"
        assert address in e.value.message, e.value.message
        assert "reconnect" not in e.value.message
        ca.write(src, dst.descriptor(), [(0, 0, 8)]).result(30)  # the same session still works
        assert bytes(dst.buffer[:8]) == b"ferry-ok"


def test_alive_answers_at_once_whatever_the_sockets_timeout(agent_factory):
    agent = agent_factory()
    with ferry.Client(agent.socket) as c:
        session = c._session
        for timeout in (10.0, None, 0.0):
            session._sock.settimeout(timeout)
            start = time.monotonic()
            assert session.alive()
            assert time.monotonic() - start < 0.5
        agent.kill()
        session._sock.settimeout(10.0)
        start = time.monotonic()
        deadline = start + 5
        while session.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not session.alive()
        assert time.monotonic() - start < 1.0
