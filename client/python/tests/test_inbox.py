"""ferry.Inbox (notifications through shared memory) against live ferryd processes."""
import os
import threading
import time
import urllib.request

import pytest

import ferry


def poll_all(inbox, n, timeout=30.0):
    got, deadline = [], time.monotonic() + timeout  # by time: a sanitized agent may deliver a few at a time
    while len(got) < n and time.monotonic() < deadline:
        got += inbox.poll(max_count=n - len(got), timeout=0.2)
    assert len(got) == n, f"{len(got)} of {n} notifications"
    return got


def test_writes_and_messages_arrive_in_order_and_a_full_ring_loses_nothing(agent):
    with ferry.Client(agent.socket) as writer, ferry.Client(agent.socket) as reader:
        src, dst = writer.register_host(4096), reader.register_host(4096)
        src.buffer[:] = os.urandom(4096)
        with reader.open_inbox(slots=8) as inbox:
            assert inbox.poll() == []
            assert inbox.poll(timeout=0.05) == []  # waits, then nothing
            writer.write(src, dst.descriptor(), [(0, 0, 4096)], notify=True, tag=7, notify_payload=b"req-1").result()
            writer.send_message(dst.descriptor(), os.urandom(4096), tag=8)
            # Two ways in (the write's notification by the fabric, the message by an RPC
            # between the agents): no order between them.
            (w, m) = sorted(poll_all(inbox, 2), key=lambda n: n.kind != "write")
            assert (w.kind, w.tag, w.bytes, w.payload, w.region_id, w.ok) == ("write", 7, 4096, b"req-1", dst.id, True)
            assert (m.kind, m.tag, len(m.payload)) == ("message", 8, 4096)
            assert dst.buffer == src.buffer
            for i in range(50):  # eight slots: the rest wait in the agent
                writer.send_message(dst.descriptor(), b"%d" % i, tag=100 + i)
            assert [n.tag for n in poll_all(inbox, 50)] == list(range(100, 150))
            # A waiting poll() wakes on the doorbell (often before the sender's RPC returns).
            sender = threading.Timer(0.1, lambda: writer.send_message(dst.descriptor(), b"late", tag=9))
            sender.start()
            (late,) = inbox.poll(timeout=10)
            sender.join()
            assert late.payload == b"late"


def test_one_reader_per_session_and_bad_arguments(agent):
    with ferry.Client(agent.socket) as a, ferry.Client(agent.socket) as b:
        with pytest.raises(ferry.InvalidArgument, match="power of two"):
            a.open_inbox(slots=12)
        with a.open_inbox(slots=8):
            with pytest.raises(ferry.AlreadyExists, match="one per session"):
                a.open_inbox()
            with pytest.raises(ferry.FailedPrecondition, match="through its inbox"):
                next(iter(a.notifications(timeout=2)))
        stream = b.notification_stream(timeout=5)
        got = []
        reader = threading.Thread(target=lambda: got.extend(stream))
        reader.start()
        try:
            for _ in range(100):  # the stream may not be open at the agent yet
                try:
                    b.open_inbox(slots=8).close()
                except ferry.FailedPrecondition as e:
                    assert "close it before opening an inbox" in e.message
                    break
            else:
                pytest.fail("an inbox opened while a stream was open")
        finally:
            stream.cancel()
            reader.join()


def test_notifications_from_another_agent(fabric_agents):
    a, b = fabric_agents
    with ferry.Client(a.socket) as writer, ferry.Client(b.socket) as reader:
        src, dst = writer.register_host(1 << 16), reader.register_host(1 << 16)
        src.buffer[:] = os.urandom(1 << 16)
        with reader.open_inbox(slots=16) as inbox:
            writer.write(src, dst.descriptor(), [(0, 0, 1 << 16)], notify=True, tag=3).result()
            writer.send_message(dst.descriptor(), b"hello from a", tag=4)
            # The write's notification comes by a fabric message, read by agent b's NIC
            # worker; the message by an RPC between the agents: no order between them.
            (w, m) = sorted(poll_all(inbox, 2), key=lambda n: n.kind != "write")
            assert (w.kind, w.tag, w.bytes, m.kind, m.payload) == ("write", 3, 1 << 16, "message", b"hello from a")
            assert dst.buffer == src.buffer


def test_notifications_a_full_queue_drops_are_counted_and_announced(agent_factory):
    # Before, a receiver that did not keep up lost its notified writes' notifications
    # without a trace: no marker, no metric, no status field (the writers all got OK, as
    # they still do: their bytes landed). A message finds the full queue at once instead.
    agent = agent_factory("--max_queued_notifications=16")
    with ferry.Client(agent.socket) as reader, ferry.Client(agent.socket) as writer:
        region = reader.register_host(4096)
        src = writer.register_host(4096)
        for i in range(50):
            writer.write(src, region.descriptor(), [(0, 0, 64)], notify=True, tag=i).result(timeout=10)
        with pytest.raises(ferry.errors.ResourceExhausted, match="not reading its notifications"):
            writer.send_message(region.descriptor(), b"refused", tag=1000)
        assert writer.status().notifications_lost == 35  # the refused message too
        with reader.open_inbox(slots=16) as inbox:
            got = poll_all(inbox, 16)
            assert [n.tag for n in got] == list(range(16)) and not any(n.lost_before for n in got)
            writer.write(src, region.descriptor(), [(0, 0, 64)], notify=True, tag=99).result(timeout=10)
            writer.send_message(region.descriptor(), b"next", tag=100)
            assert [(n.tag, n.lost_before) for n in poll_all(inbox, 2)] == [(99, 35), (100, 0)]
        port = agent.ready()["metrics_port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert "\nferry_notifications_dropped_total 35\n" in r.read().decode()


def test_an_inbox_is_freed_when_its_session_ends(agent):
    # Before, a dead session's inbox kept its ring mapping, doorbell and pump thread until
    # another pod opened an inbox (4,031 fds after 2,000 inbox sessions had ended).
    pid = int(agent.ready()["pid"])

    def fds():
        return len(os.listdir(f"/proc/{pid}/fd"))

    def threads():
        return len(os.listdir(f"/proc/{pid}/task"))

    with ferry.Client(agent.socket) as warm:  # the agent's own lazily made fds and threads
        with warm.open_inbox(slots=8):
            pass
    time.sleep(0.5)
    base_fds, base_threads = fds(), threads()
    clients = [ferry.Client(agent.socket) for _ in range(20)]
    for c in clients:
        c.open_inbox(slots=8)
    for c in clients:
        c.close()  # each session ends with its inbox open, and no other inbox opens after
    deadline = time.monotonic() + 5
    while (fds() > base_fds + 2 or threads() > base_threads + 1) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fds() <= base_fds + 2, f"{fds()} fds, {base_fds} before 20 inbox sessions"
    assert threads() <= base_threads + 1, f"{threads()} threads, {base_threads} before"


def test_inboxes_share_one_thread(agent):
    # Before, every inbox had a pump thread of its own: 2,000 inboxes, 2,028 agent threads.
    pid = int(agent.ready()["pid"])
    with ferry.Client(agent.socket) as warm:
        with warm.open_inbox(slots=8):
            pass
    time.sleep(0.5)
    base = len(os.listdir(f"/proc/{pid}/task"))
    clients = [ferry.Client(agent.socket) for _ in range(30)]
    inboxes = [c.open_inbox(slots=8) for c in clients]
    assert len(os.listdir(f"/proc/{pid}/task")) <= base + 1, "a thread per inbox"
    # And each still gets what a full ring held back once its client reads.
    with ferry.Client(agent.socket) as writer:
        region = clients[7].register_host(4096)
        for i in range(20):  # 8 slots: 12 wait in the session's queue
            writer.send_message(region.descriptor(), b"m", tag=i)
        assert [n.tag for n in poll_all(inboxes[7], 20)] == list(range(20))
    for c in clients:
        c.close()


@pytest.mark.parametrize("rings", [True, False])
def test_a_full_ring_refills_as_its_client_frees_slots(agent, monkeypatch, rings):
    # Before, the agent learnt of freed slots only by looking again, every 50 us to 10 ms:
    # a full 8-slot inbox drained at ~100 notifications per slot per second. Now the
    # client rings the doorbell as it frees slots while notifications wait; a client
    # that does not ring (from before) is still served by those looks.
    with ferry.Client(agent.socket) as reader, ferry.Client(agent.socket) as writer:
        region = reader.register_host(4096)
        inbox = reader.open_inbox(slots=8)
        if not rings:
            monkeypatch.setattr(ferry.inbox.os, "write", lambda fd, data: len(data))
        for i in range(400):
            writer.send_message(region.descriptor(), b"m", tag=i)
        time.sleep(0.3)  # the agent has given up looking often: a client that is not reading
        started = time.monotonic()
        got = poll_all(inbox, 400)
        took = time.monotonic() - started
        assert [n.tag for n in got] == list(range(400))
        print(f"400 notifications through 8 slots in {took * 1e3:.0f} ms (client rings: {rings})")
        if rings:
            assert took < 0.25, f"400 notifications through 8 slots took {took:.2f} s"
