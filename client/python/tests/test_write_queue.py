"""ferry.WriteQueue (the shared-memory ring) against live ferryd processes."""
import array
import os
import random
import threading
import time

import pytest

import ferry
from ferry.write_queue import BatchParts


def reap_all(q, n, timeout=30.0):
    """Completions of the next ``n`` writes, or fails after ``timeout`` seconds."""
    done, deadline = [], time.monotonic() + timeout
    while len(done) < n and time.monotonic() < deadline:
        done += q.reap(max_count=64, timeout=1.0)
    assert len(done) == n, f"{len(done)} of {n} completions in {timeout} s"
    return done


def test_queued_writes_land_complete_and_notify(agent):
    with ferry.Client(agent.socket) as writer, ferry.Client(agent.socket) as reader:
        src = writer.register_host(1 << 20)
        dst = reader.register_host(1 << 20)
        payload = os.urandom(1 << 20)
        src.buffer[:] = payload
        got = []
        watcher = threading.Thread(target=lambda: got.extend(reader.notifications(timeout=5)))
        watcher.start()
        with writer.create_queue([dst.descriptor()], entries=64) as q:
            # 200 writes of 4 KiB through a 64-entry ring: block i of src to block 255 - i.
            posted, done, deadline = 0, [], time.monotonic() + 60
            while (posted < 200 or q.inflight) and time.monotonic() < deadline:
                while posted < 200 and q.inflight < 64:
                    q.post(src, 4096, src_offset=posted * 4096, dst_offset=(255 - posted) * 4096, user_data=posted,
                           notify=posted == 7, tag=99)
                    posted += 1
                done += q.reap(timeout=10.0)
        watcher.join()
        assert sorted(c.user_data for c in done) == list(range(200))
        assert all(c.error is None and c.bytes == 4096 and c.path == "local" and c.transfer_id for c in done)
        for i in range(200):
            assert bytes(dst.buffer[(255 - i) * 4096:(256 - i) * 4096]) == payload[i * 4096:(i + 1) * 4096]
        assert bytes(dst.buffer[:56 * 4096]) == bytes(56 * 4096)  # blocks 0..55 untouched
        assert [(n.tag, n.bytes) for n in got] == [(99, 4096)]


def test_refused_entries_come_back_as_errors_and_move_nothing(agent):
    with ferry.Client(agent.socket) as a, ferry.Client(agent.socket) as b:
        src = a.register_host(8192)
        theirs = b.register_host(8192)  # another session's region
        dst = b.register_host(8192)
        src.buffer[:] = b"\x5a" * 8192
        with a.create_queue([dst.descriptor()], entries=8) as q:
            q.post(src, 4096, dst_offset=6144, user_data=1)  # past the destination's end
            q.post(src, 4096, dst_index=3, user_data=2)  # no such destination
            q.post(theirs, 4096, user_data=3)  # not this session's region
            q.post(src, 0, user_data=4)  # empty
            q.post(src, 16, src_offset=8190, user_data=5)  # past the source's end
            q.post(src, 4096, user_data=6)  # fine
            done = {c.user_data: c for c in reap_all(q, 6)}
        assert isinstance(done[1].error, ferry.OutOfRange)
        assert isinstance(done[2].error, ferry.InvalidArgument) and "destination" in done[2].error.message
        assert isinstance(done[3].error, (ferry.NotFound, ferry.PermissionDenied))
        assert isinstance(done[4].error, ferry.InvalidArgument)
        assert isinstance(done[5].error, ferry.OutOfRange)
        assert all(done[k].transfer_id == 0 for k in range(1, 6))
        assert done[6].error is None and done[6].bytes == 4096
        assert bytes(dst.buffer[:4096]) == b"\x5a" * 4096
        assert bytes(dst.buffer[4096:]) == bytes(4096)  # the refused writes moved nothing


def test_paged_entries_apply_one_block_table_to_each_layer(agent):
    block, per_layer, moved = 4096, 64, 24
    with ferry.Client(agent.socket) as writer, ferry.Client(agent.socket) as reader:
        layers = [writer.register_host(block * per_layer) for _ in range(3)]
        targets = [reader.register_host(block * per_layer) for _ in range(3)]
        payloads = [os.urandom(block * per_layer) for _ in layers]
        for r, p in zip(layers, payloads, strict=False):
            r.buffer[:] = p
        rng = random.Random(5)
        src_ids, dst_ids = rng.sample(range(per_layer), moved), rng.sample(range(per_layer), moved)
        with writer.create_queue([t.descriptor() for t in targets], entries=8, table_ids=256) as q:
            assert len(q.table) == 256
            q.table[10:10 + moved] = array.array("I", src_ids)
            q.table[10 + moved:10 + 2 * moved] = array.array("I", dst_ids)
            for i, r in enumerate(layers):
                q.post_paged(r, block, moved, table_index=10, dst_index=i, user_data=i)
            done = reap_all(q, 3)
        assert sorted(c.user_data for c in done) == [0, 1, 2]
        assert all(c.error is None and c.bytes == moved * block for c in done), [c.error for c in done]
        for t, p in zip(targets, payloads, strict=False):
            expected = bytearray(block * per_layer)
            for s, d in zip(src_ids, dst_ids, strict=False):
                expected[d * block:(d + 1) * block] = p[s * block:(s + 1) * block]
            assert bytes(t.buffer) == bytes(expected)


def test_bad_paged_entries_are_refused_and_move_nothing(agent):
    with ferry.Client(agent.socket) as c:
        src = c.register_host(8 * 4096)
        dst = c.register_host(8 * 4096)
        src.buffer[:] = b"\x5a" * (8 * 4096)
        with pytest.raises(ferry.InvalidArgument, match="table_ids"):
            c.create_queue([dst.descriptor()], table_ids=-1)
        with c.create_queue([dst.descriptor()], entries=8, table_ids=16) as q:
            q.table[0:7] = array.array("I", [0, 1, 2, 3, 3, 5, 9])  # 0,1,2 -> 3,3,5
            q.post_paged(src, 4096, 3, user_data=1)  # block 3 twice
            q.post_paged(src, 4096, 1, table_index=2, user_data=2)  # 2 -> 3: fine, but...
            q.post_paged(src, 4096, 9, table_index=0, user_data=3)  # ...these ids leave the table
            q.post_paged(src, 4096, 1, table_index=5, user_data=4)  # 5 -> 9: past the destination
            q.post_paged(src, 0, 1, user_data=5)  # no block size
            done = {x.user_data: x for x in reap_all(q, 5)}
            with pytest.raises(ferry.InvalidArgument, match="blocks"):
                q.post_paged(src, 4096, 1 << 32)
        assert isinstance(done[1].error, ferry.InvalidArgument) and "appears twice" in done[1].error.message
        assert done[2].error is None
        assert isinstance(done[3].error, ferry.OutOfRange) and "block table of 16 ids" in done[3].error.message
        assert isinstance(done[4].error, ferry.OutOfRange)
        assert isinstance(done[5].error, ferry.InvalidArgument) and "block_size" in done[5].error.message
        assert bytes(dst.buffer[3 * 4096:4 * 4096]) == b"\x5a" * 4096  # the one good entry
        assert bytes(dst.buffer[:3 * 4096]) == bytes(3 * 4096) and bytes(dst.buffer[4 * 4096:]) == bytes(4 * 4096)
        with c.create_queue([dst.descriptor()], entries=8) as plain:  # no table: no paged entry
            plain.post_paged(src, 4096, 1, user_data=6)
            (x,) = reap_all(plain, 1)
            assert isinstance(x.error, ferry.OutOfRange) and "block table of 0 ids" in x.error.message


def test_a_batch_entry_is_one_transfer_with_one_notification(agent):
    block, per_layer, moved = 4096, 32, 12
    with ferry.Client(agent.socket) as writer, ferry.Client(agent.socket) as reader:
        layers = [writer.register_host(block * per_layer) for _ in range(4)]
        target = reader.register_host(4 * block * per_layer)  # the 4 layers side by side
        for r in layers:
            r.buffer[:] = os.urandom(block * per_layer)
        rng = random.Random(8)
        src_ids, dst_ids = rng.sample(range(per_layer), moved), rng.sample(range(per_layer), moved)
        got = []
        watcher = threading.Thread(target=lambda: got.extend(reader.notifications(timeout=5)))
        watcher.start()
        parts = [(r, 0, 0, i * block * per_layer) for i, r in enumerate(layers)]

        def landed():
            for i, r in enumerate(layers):
                base = i * block * per_layer
                for s, d in zip(src_ids, dst_ids, strict=False):
                    assert bytes(target.buffer[base + d * block:base + (d + 1) * block]) == \
                        bytes(r.buffer[s * block:(s + 1) * block])
        with writer.create_queue([target.descriptor()], entries=8, table_ids=128) as q:
            q.post_batch(parts, block, src_ids, dst_ids, table_index=3, notify=True, tag=55, user_data=9,
                         payload=b"request-7")
            (done,) = reap_all(q, 1)
            assert done.error is None and done.user_data == 9 and done.bytes == 4 * moved * block
            landed()
            # The same parts packed once, and ids as 32-bit arrays (what a KV producer posts).
            target.buffer[:] = bytes(target.size)
            packed = q.pack_parts(parts)
            q.post_batch(packed, block, array.array("I", src_ids), array.array("I", dst_ids), user_data=11)
            (again,) = reap_all(q, 1)
            assert again.error is None and again.bytes == 4 * moved * block
            with pytest.raises(ferry.InvalidArgument, match=r"1\.\.1024 parts"):
                q.pack_parts([])
            with pytest.raises(ferry.InvalidArgument, match=r"parts\[1\]"):
                q.pack_parts([parts[0], (layers[1], -1, 0, 0)])
            with pytest.raises(ferry.InvalidArgument, match="table ids"):
                q.post_batch(parts, block, src_ids, dst_ids, table_index=100)  # 4 * 8 + 24 ids do not fit
            with pytest.raises(ferry.InvalidArgument, match="pair up"):
                q.post_batch(parts, block, src_ids, dst_ids[:-1])
            with pytest.raises(ferry.InvalidArgument, match=r"parts\[0\]"):
                q.post_batch([("not a region", 0, 0, 0)], block, src_ids, dst_ids)
            q.post_batch([(layers[0], 5, 0, 0)], block, src_ids, dst_ids, user_data=10)  # no destination 5
            (bad,) = reap_all(q, 1)
            assert isinstance(bad.error, ferry.InvalidArgument) and "parts[0]: dst_index 5" in bad.error.message
            # A part's reserved word set (a later ABI's field): refused, not ignored.
            fields = bytearray(q.pack_parts(parts[:1]).packed)
            fields[28:32] = (1).to_bytes(4, "little")
            q.post_batch(BatchParts(bytes(fields)), block, src_ids, dst_ids, user_data=12)
            (reserved,) = reap_all(q, 1)
            assert isinstance(reserved.error, ferry.InvalidArgument) and "parts[0]: reserved is 1" in reserved.error.message
            # Two parts writing the same bytes of the target would land in either order.
            q.post_batch([parts[0], (layers[1], 0, 0, 0)], block, src_ids, dst_ids, user_data=13)
            (overlap,) = reap_all(q, 1)
            assert isinstance(overlap.error, ferry.InvalidArgument), overlap.error
            assert f"parts: two parts write region {target.id}: destination ranges overlap" in overlap.error.message
        watcher.join()
        assert [(n.tag, n.bytes, n.payload) for n in got] == [(55, 4 * moved * block, b"request-7")]  # one
        landed()


def _messages_arrive_in_order(sender, reader, target, expect_path=""):
    got = []
    watcher = threading.Thread(target=lambda: got.extend(reader.notifications(timeout=5)))
    watcher.start()
    payloads = [b"hello", b"", os.urandom(4096), b"pull 12"]
    with sender.create_queue([target.descriptor()], entries=8, table_ids=4 * 1024) as q:
        for i, p in enumerate(payloads):
            q.post_message(p, tag=20 + i, table_index=i * 1024, user_data=i)
        done = reap_all(q, len(payloads))
    watcher.join()
    assert all(c.error is None and c.bytes == 0 for c in done), [c.error for c in done]
    assert [(n.kind, n.tag, n.payload, n.region_id) for n in got] == \
        [("message", 20 + i, p, target.id) for i, p in enumerate(payloads)]


def test_message_entries_reach_the_owner_in_order_and_bad_ones_are_refused(agent):
    with ferry.Client(agent.socket) as sender, ferry.Client(agent.socket) as reader:
        target = reader.register_host(4096)
        _messages_arrive_in_order(sender, reader, target)
        with sender.create_queue([target.descriptor()], entries=8, table_ids=16) as q:
            with pytest.raises(ferry.InvalidArgument, match="at most 4096"):
                q.post_message(bytes(4097))
            with pytest.raises(ferry.InvalidArgument, match="table ids"):
                q.post_message(bytes(64), table_index=8)  # 16 ids from 8 do not fit in 16
            with pytest.raises(ferry.InvalidArgument, match="dst_index"):
                q.post_message(b"x", dst_index=-1)
            q.post_message(b"x", dst_index=3, user_data=4)  # the queue has one destination
            (bad,) = reap_all(q, 1)
            assert isinstance(bad.error, ferry.InvalidArgument) and "dst_index 3" in bad.error.message
            target.deregister()
            q.post_message(b"anyone?", user_data=5)
            (gone,) = reap_all(q, 1)
            assert isinstance(gone.error, ferry.NotFound) and "is not registered" in gone.error.message


class _Index:
    """An integer that is no int, as numpy's are: it only has __index__."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def test_a_full_ring_and_bad_arguments_raise_at_once(agent):
    with ferry.Client(agent.socket) as c:
        src = c.register_host(4096)
        dst = c.register_host(4096)
        with pytest.raises(ferry.InvalidArgument):
            c.create_queue([dst.descriptor()], entries=12)
        with pytest.raises(ferry.InvalidArgument):
            c.create_queue([b"not a descriptor"])
        q = c.create_queue([dst.descriptor()], entries=8)
        for i in range(8):
            q.post(src, 8, user_data=i)
        with pytest.raises(ferry.ResourceExhausted):
            q.post(src, 8)
        with pytest.raises(ferry.ResourceExhausted):  # an integer type that is no int (numpy's) is no bad argument
            q.post(src, _Index(8), user_data=_Index(1))
        with pytest.raises(ferry.InvalidArgument):
            q.post(src, -1)
        assert len(reap_all(q, 8)) == 8
        assert q.reap(timeout=0.05) == []  # nothing in flight: returns at the timeout
        q.post(src, 8, user_data=9)  # room again
        assert [x.user_data for x in reap_all(q, 1)] == [9]
        # Refused before anything is published, with the field named.
        for bad, field in (({"length": 1 << 64}, "length"), ({"user_data": -1}, "user_data"),
                           ({"dst_index": 1 << 32}, "dst_index"), ({"tag": "7"}, "tag"),
                           ({"src_offset": 1.5}, "src_offset")):
            with pytest.raises(ferry.InvalidArgument, match=field):
                q.post(src, **{"length": 8, **bad})
        with pytest.raises(TypeError, match="src must be a Region"):
            q.post("not a region", 8)
        q.post(src, _Index(8), user_data=_Index(10))  # the refusals took no slot
        assert [x.user_data for x in reap_all(q, 1)] == [10]
        q.close()
        with pytest.raises(ferry.FailedPrecondition):
            q.post(src, 8)


def test_queued_writes_cross_agents_through_the_fabric(fabric_agents):
    a, b = fabric_agents
    with ferry.Client(a.socket) as ca, ferry.Client(b.socket) as cb:
        src = ca.register_host(1 << 20)
        dst = cb.register_host(1 << 20)
        src.buffer[:] = os.urandom(1 << 20)
        with ca.create_queue([dst.descriptor()], entries=16) as q:
            for i in range(16):
                q.post(src, 65536, src_offset=i * 65536, dst_offset=i * 65536, user_data=i)
            done = reap_all(q, 16)
        assert all(c.error is None and c.path == "fabric" for c in done), [c.error for c in done]
        assert dst.buffer == src.buffer


def test_message_entries_to_another_agent(fabric_agents):
    a, b = fabric_agents
    with ferry.Client(a.socket) as sender, ferry.Client(b.socket) as reader:
        _messages_arrive_in_order(sender, reader, reader.register_host(4096))


def test_a_pod_that_makes_its_doorbells_blocking_stalls_only_itself(agent, monkeypatch):
    # A doorbell is one open file the pod shares with the agent, so the pod can clear
    # O_NONBLOCK on it and fill or empty it: an empty submit eventfd would then block a
    # read, a full completion or inbox doorbell a write. This pod keeps a copy of the
    # agent's ends of its doorbells (socketpairs) to do that to them. The agent's threads
    # serve every pod; none of them may wait on this one's doorbells.
    from ferry._shared_ring import SharedRing
    from ferry.inbox import _CLIENT_WAITING as INBOX_WAITING
    from ferry.write_queue import _CLIENT_WAITING as QUEUE_WAITING

    kept = []
    hand_over = SharedRing._send_doorbell

    def keep_a_copy(self, session, i):
        kept.append(os.dup(self._agents_ends[i]))
        return hand_over(self, session, i)

    def fill_and_block(fd):
        os.set_blocking(fd, False)
        with pytest.raises(BlockingIOError):
            for _ in range(1 << 20):
                os.write(fd, b"x" * 4096)
        os.set_blocking(fd, True)

    monkeypatch.setattr(SharedRing, "_send_doorbell", keep_a_copy)
    with ferry.Client(agent.socket) as bad, ferry.Client(agent.socket) as good:
        bad_src, bad_dst = bad.register_host(4096), bad.register_host(4096)
        inbox = bad.open_inbox()
        qa = bad.create_queue([bad_dst.descriptor()], entries=8)
        monkeypatch.undo()
        inbox_agents_end, complete_agents_end = kept
        fill_and_block(inbox_agents_end)
        fill_and_block(complete_agents_end)
        os.set_blocking(qa._submit_fd, True)  # empty: the agent's next read of it would block
        inbox._words[INBOX_WAITING // 4] = 1
        qa._words[QUEUE_WAITING // 4] = 1
        src, dst = good.register_host(4096), good.register_host(4096)
        src.buffer[:8] = b"goodgood"
        with good.create_queue([dst.descriptor()], entries=8) as qb:
            def good_write(i):
                qb.post(src, 8, dst_offset=8 * i, user_data=i)
                [c] = reap_all(qb, 1, timeout=5.0)
                assert c.error is None and bytes(dst.buffer[8 * i:8 * i + 8]) == b"goodgood"

            good_write(0)  # wakes the agent, which looks at every queue's doorbell
            # A notified write into the bad pod's own region: a completion for its full
            # completion doorbell and a notification for its full inbox doorbell.
            qa._words[QUEUE_WAITING // 4] = 1
            qa.post(bad_src, 8, notify=True, user_data=9)
            time.sleep(0.2)
            for i in range(1, 4):
                good_write(i)
        qa._words[QUEUE_WAITING // 4] = 0
        assert [c.user_data for c in reap_all(qa, 1, timeout=5.0)] == [9]  # its own write still completed
        qa.close()
        inbox._words[INBOX_WAITING // 4] = 0
        assert [n.kind for n in inbox.poll(timeout=5.0)] == ["write"]
        inbox.close()
        for fd in kept:
            os.close(fd)


def test_a_process_with_more_than_1024_fds_waits_on_its_rings(agent):
    # A serving process often holds more than FD_SETSIZE fds, so its doorbells are numbered
    # past 1024: select() refused them ("filedescriptor out of range").
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with ferry.Client(agent.socket) as c:
            src, dst = c.register_host(1 << 16), c.register_host(1 << 16)
            with c.create_queue([dst.descriptor()], entries=8) as q:
                assert q.reap(timeout=0.05) == []  # sleeps on a doorbell numbered past 1024
                q.post(src, 4096, user_data=1)
                assert [d.user_data for d in reap_all(q, 1)] == [1]
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
