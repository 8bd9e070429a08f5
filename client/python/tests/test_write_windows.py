"""Write windows, enforced by the receiving agent (real agents; no mocks): a region in
window mode takes writes only through an open window of it, inside its ranges, from its
writer; a late write (after the owner closed the window and reused the bytes) is refused
and the new owner's bytes stay intact, on one agent and across two (fabric and staged
paths); malformed windows are refused naming the field; the owner hears of refusals."""
import array
import time

import pytest

import ferry

BLOCK = 4096
FABRIC = ("--fabric_provider=tcp;ofi_rxm",)


def _agents(agent_factory, *flags):
    return tuple(agent_factory(f"--peer_address={ip}:0", f"--fabric_iface={ip}", *FABRIC, *flags)
                 for ip in ("127.0.0.1", "127.0.0.2"))


def _fill(region, start: int, end: int, value: int) -> None:
    region.buffer[start:end] = bytes([value]) * (end - start)


def _all(region, start: int, end: int, value: int) -> bool:
    return bytes(region.buffer[start:end]) == bytes([value]) * (end - start)


def _refusals(client, want: int, seconds: float = 5.0):
    """The window refusals the owner's stream yields within `seconds` (at most `want`)."""
    out = []
    deadline = time.monotonic() + seconds
    stream = client.notification_stream(timeout=seconds)
    try:
        for n in stream:
            if n.kind == "window_refused":
                out.append(n)
            if len(out) >= want or time.monotonic() > deadline:
                break
    except ferry.DeadlineExceeded:
        pass
    finally:
        stream.cancel()
    return out


def _late_write_is_refused(owner, writer, *, staged_or_fabric: str):
    """The vLLM case: the consumer (owner) opens a window over blocks 2..3 for a request,
    times it out and closes the window, reuses the blocks for another request; the
    producer's write for the first request comes late and must not land."""
    kv = owner.register_host(8 * BLOCK, write_windows=True)
    src = writer.register_host(8 * BLOCK)
    _fill(src, 0, src.size, 0xAB)
    writer_id = writer.register_host(BLOCK)  # names the writer to the owner's agent
    window = owner.open_write_window([kv], [(2 * BLOCK, 2 * BLOCK)], writer=writer_id.descriptor(), timeout=30)
    (dst,) = window.descriptors
    assert dst.window_id == window.id

    # Inside the window: lands.
    writer.write(src, dst, [(0, 2 * BLOCK, BLOCK)]).result(30)
    assert _all(kv, 2 * BLOCK, 3 * BLOCK, 0xAB), staged_or_fabric

    # Outside it (block 4, and block 1): refused before a byte moves.
    with pytest.raises(ferry.OutOfRange, match="outside write window"):
        writer.write(src, dst, [(0, 4 * BLOCK, BLOCK)]).result(30)
    with pytest.raises(ferry.OutOfRange, match="outside write window"):
        writer.write(src, dst, [(0, 3 * BLOCK, 2 * BLOCK)]).result(30)  # straddles its end
    assert _all(kv, 4 * BLOCK, kv.size, 0) and _all(kv, 0, 2 * BLOCK, 0)

    # With the region's own descriptor: refused, the region is in window mode.
    with pytest.raises(ferry.FailedPrecondition, match="only through write windows"):
        writer.write(src, kv.descriptor(), [(0, 2 * BLOCK, BLOCK)]).result(30)

    # The owner times the request out: closes the window, reuses the blocks.
    window.close()
    _fill(kv, 2 * BLOCK, 4 * BLOCK, 0x11)
    with pytest.raises(ferry.FailedPrecondition, match=f"write window {window.id} was"):
        writer.write(src, dst, [(0, 2 * BLOCK, BLOCK)]).result(30)
    with pytest.raises(ferry.FailedPrecondition, match=f"write window {window.id} was"):
        writer.write(src, dst, [(0, 3 * BLOCK, BLOCK)]).result(30)
    time.sleep(0.2)  # nothing lands late either
    assert _all(kv, 2 * BLOCK, 4 * BLOCK, 0x11), "a late write landed in reused blocks"
    return kv


def test_a_late_write_is_refused_on_one_agent(agent):
    with ferry.Client(agent.socket) as owner, ferry.Client(agent.socket) as writer:
        kv = _late_write_is_refused(owner, writer, staged_or_fabric="local")
        refused = _refusals(owner, want=5)
        assert len(refused) >= 5, refused  # 2 outside, 1 own descriptor, 2 after close
        assert all(n.region_id == kv.id and n.code != 0 and n.message for n in refused), refused


def test_a_late_write_is_refused_across_agents_on_the_fabric(agent_factory):
    a, b = _agents(agent_factory)
    with ferry.Client(a.socket) as writer, ferry.Client(b.socket) as owner:
        kv = _late_write_is_refused(owner, writer, staged_or_fabric="fabric")
        # 2 outside the window (told by the writer's agent), 2 after close; a write with the
        # region's own descriptor is refused its keys, which is not told.
        refused = _refusals(owner, want=4)
        assert len(refused) >= 4, refused
        assert all(n.region_id == kv.id for n in refused), refused


def test_a_late_write_is_refused_across_agents_on_the_staged_path(agent_factory):
    a, b = _agents(agent_factory, "--stage_host_regions")
    with ferry.Client(a.socket) as writer, ferry.Client(b.socket) as owner:
        _late_write_is_refused(owner, writer, staged_or_fabric="staged")


def test_only_the_named_writer_passes(agent_factory):
    a, b = _agents(agent_factory)
    with ferry.Client(a.socket) as writer, ferry.Client(a.socket) as other, ferry.Client(b.socket) as owner:
        kv = owner.register_host(4 * BLOCK, write_windows=True)
        named = writer.register_host(BLOCK)
        window = owner.open_write_window([kv], [(0, BLOCK)], writer=named.descriptor(), timeout=30)
        src = other.register_host(BLOCK)
        _fill(src, 0, BLOCK, 7)
        with pytest.raises(ferry.PermissionDenied, match="this session is not it"):
            other.write(src, window.descriptors[0], [(0, 0, BLOCK)]).result(30)
        local = owner.register_host(BLOCK)  # on the owner's own agent: another agent entirely
        with pytest.raises(ferry.PermissionDenied, match="is not it"):
            owner.write(local, window.descriptors[0], [(0, 0, BLOCK)]).result(30)
        writer.write(named, window.descriptors[0], [(0, 0, BLOCK)]).result(30)
        assert _all(kv, BLOCK, kv.size, 0)
        window.close()


def test_a_window_past_its_time_takes_no_write(agent_factory):
    a, b = _agents(agent_factory)
    with ferry.Client(a.socket) as writer, ferry.Client(b.socket) as owner:
        kv = owner.register_host(4 * BLOCK, write_windows=True)
        src = writer.register_host(BLOCK)
        window = owner.open_write_window([kv], [(0, BLOCK)], timeout=2.0)  # room for a sanitized agent
        writer.write(src, window.descriptors[0], [(0, 0, BLOCK)]).result(30)  # opens it, keys cached
        time.sleep(2.5)
        _fill(kv, 0, BLOCK, 0x22)
        _fill(src, 0, BLOCK, 0x33)
        with pytest.raises(ferry.FailedPrecondition, match="expired"):
            writer.write(src, window.descriptors[0], [(0, 0, BLOCK)]).result(30)
        assert _all(kv, 0, BLOCK, 0x22)


def test_malformed_windows_are_refused_precisely(agent):
    with ferry.Client(agent.socket) as owner, ferry.Client(agent.socket) as stranger:
        kv = owner.register_host(8 * BLOCK, write_windows=True)
        plain = owner.register_host(BLOCK)
        theirs = stranger.register_host(BLOCK, write_windows=True)
        with pytest.raises(ferry.InvalidArgument, match="overlaps"):
            owner.open_write_window([kv], [(0, 2 * BLOCK), (BLOCK, BLOCK)])
        with pytest.raises(ferry.OutOfRange, match="past region"):
            owner.open_write_window([kv], [(7 * BLOCK, 2 * BLOCK)])
        with pytest.raises(ferry.NotFound, match=r"region_ids\[0\]"):
            owner.open_write_window([theirs], [(0, BLOCK)])  # another session's region
        with pytest.raises(ferry.FailedPrecondition, match="not registered with write_windows"):
            owner.open_write_window([plain], [(0, BLOCK)])
        with pytest.raises(ferry.InvalidArgument, match="length must be >= 1"):
            owner.open_write_window([kv], [(0, 0)])
        with pytest.raises(ferry.InvalidArgument, match="region_ids"):
            owner.open_write_window([], [(0, BLOCK)])
        with pytest.raises(ferry.InvalidArgument, match="timeout_ms"):
            owner.open_write_window([kv], [(0, BLOCK)], timeout=1e6)
        with pytest.raises(ferry.InvalidArgument, match="twice"):
            owner.open_write_window([kv, kv], [(0, BLOCK)])
        first = owner.open_write_window([kv], [(0, 2 * BLOCK)])
        with pytest.raises(ferry.FailedPrecondition, match=f"in open write window {first.id}"):
            owner.open_write_window([kv], [(BLOCK, BLOCK)])
        second = owner.open_write_window([kv], [(2 * BLOCK, BLOCK), (3 * BLOCK, BLOCK)])  # adjacent: one range
        with pytest.raises(ferry.NotFound, match="not a write window of this session"):
            stranger._call("CloseWriteWindow", ferry._proto.ferry_pb2.CloseWriteWindowRequest(window_id=first.id))
        first.close()
        second.close()
        first.close()  # closing again is harmless
        # A descriptor with a window id its token does not open.
        forged = ferry.RegionDescriptor.from_bytes(kv.descriptor())
        forged._proto.window_id = second.id
        src = stranger.register_host(BLOCK)
        with pytest.raises(ferry.NotFound, match="not an open write window"):
            stranger.write(src, forged, [(0, 0, BLOCK)]).result(30)
        # Messages still reach a region in window mode with its own descriptor.
        stranger.send_message(kv.descriptor(), b"hello")


def _queue_entry(q, post, timeout: float = 10.0):
    """Posts one entry with ``post(user_data)`` and returns its completion."""
    post(77)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in q.reap(timeout=0.5):
            assert c.user_data == 77
            return c
    raise AssertionError("no completion")


def _through(kv, window_id: int, token: bytes) -> ferry.RegionDescriptor:
    d = ferry.RegionDescriptor.from_bytes(kv.descriptor())
    d._proto.window_id, d._proto.token = window_id, token
    return d


@pytest.mark.parametrize("path", ["local", "fabric"])
def test_a_window_opened_and_closed_through_a_write_queue(agent, agent_factory, path):
    """The same window as open_write_window's, opened and closed by entries of the owner's
    write queue to its writer (no RPC): the completion names the window (id and token),
    the named writer's write lands inside it, a write outside or from another session is
    refused, and after the close entry's completion a late write is refused and the
    owner's reused bytes stay."""
    a, b = (agent, agent) if path == "local" else _agents(agent_factory)
    with ferry.Client(a.socket) as writer, ferry.Client(a.socket) as other, ferry.Client(b.socket) as owner:
        kv = owner.register_host(8 * BLOCK, write_windows=True)
        mailbox = writer.register_host(BLOCK)  # names the writer, as a producer's mailbox does
        src = writer.register_host(8 * BLOCK)
        _fill(src, 0, src.size, 0xAB)
        q = owner.create_queue([mailbox.descriptor()], entries=8, table_ids=64)
        opened = _queue_entry(q, lambda ud: q.post_open_window([kv.id], [(2 * BLOCK, 2 * BLOCK)], timeout=30,
                                                               user_data=ud))
        assert opened.error is None and opened.transfer_id > 0 and len(opened.token) == 16, opened
        dst = _through(kv, opened.transfer_id, opened.token)
        writer.write(src, dst, [(0, 2 * BLOCK, 2 * BLOCK)]).result(30)
        assert _all(kv, 2 * BLOCK, 4 * BLOCK, 0xAB) and _all(kv, 4 * BLOCK, kv.size, 0)
        with pytest.raises(ferry.OutOfRange, match="outside write window"):
            writer.write(src, dst, [(0, 4 * BLOCK, BLOCK)]).result(30)
        stranger_src = other.register_host(BLOCK)
        with pytest.raises(ferry.PermissionDenied, match="is not it"):
            other.write(stranger_src, dst, [(0, 2 * BLOCK, BLOCK)]).result(30)
        closed = _queue_entry(q, lambda ud: q.post_close_window(opened.transfer_id, wait=1.0, user_data=ud))
        assert closed.error is None, closed
        _fill(kv, 2 * BLOCK, 4 * BLOCK, 0x11)  # reused
        with pytest.raises(ferry.FailedPrecondition, match=f"write window {opened.transfer_id} was"):
            writer.write(src, dst, [(0, 2 * BLOCK, BLOCK)]).result(30)
        assert _all(kv, 2 * BLOCK, 4 * BLOCK, 0x11)
        again = _queue_entry(q, lambda ud: q.post_close_window(opened.transfer_id, user_data=ud))
        assert again.error is None, again  # closing again is harmless


@pytest.mark.parametrize("path", ["local", "fabric"])
def test_requests_in_their_own_windows_share_one_write(agent, agent_factory, path):
    """A producer's write of several requests' blocks, each request through the window its
    consumer opened for it (post_batch's windows, in spans): the blocks land in every
    part's region; a span outside its own window, or through a window closed since, fails
    the whole entry and nothing lands in that span's blocks. On one agent nothing of the
    entry moves; on the fabric a window's close can reach the writer's agent only as its
    revoked keys, and the other spans' bytes may land, inside their own open windows."""
    a, b = (agent, agent) if path == "local" else _agents(agent_factory)
    with ferry.Client(a.socket) as writer, ferry.Client(b.socket) as owner:
        layers = [owner.register_host(8 * BLOCK, write_windows=True) for _ in range(2)]
        src = writer.register_host(8 * BLOCK)
        for i in range(8):
            _fill(src, i * BLOCK, (i + 1) * BLOCK, 0xA0 + i)
        name = writer.register_host(BLOCK).descriptor()  # names the writer
        first = owner.open_write_window(layers, [(BLOCK, 2 * BLOCK)], writer=name, timeout=30)  # blocks 1-2
        second = owner.open_write_window(layers, [(5 * BLOCK, BLOCK)], writer=name, timeout=30)  # block 5
        q = writer.create_queue([kv.descriptor() for kv in layers], entries=8, table_ids=256)
        parts = [(src, 0, 0, 0), (src, 1, 0, 0)]

        def write(windows):
            return _queue_entry(q, lambda ud: q.post_batch(parts, BLOCK, [0, 1, 2], [1, 2, 5], user_data=ud,
                                                           windows=windows))

        def blocks(kv):
            return [bytes(kv.buffer[i * BLOCK:(i + 1) * BLOCK]) for i in range(8)]

        c = write([(first.descriptors[0], 2), (second.descriptors[0], 1)])
        assert c.error is None and c.bytes == 2 * 3 * BLOCK, c
        for kv in layers:
            got = blocks(kv)
            assert [got[1][0], got[2][0], got[5][0]] == [0xA0, 0xA1, 0xA2], path
            assert all(got[i] == bytes(BLOCK) for i in (0, 3, 4, 6, 7)), path

        for kv in layers:
            _fill(kv, 0, kv.size, 0x11)  # the blocks reused
        c = write([(first.descriptors[0], 1), (second.descriptors[0], 2)])  # block 2 through the second
        assert isinstance(c.error, ferry.OutOfRange), c
        assert "window spans[1]: parts[0]" in str(c.error) and "outside write window" in str(c.error), c
        second.close()
        c = write([(first.descriptors[0], 2), (second.descriptors[0], 1)])
        assert isinstance(c.error, ferry.FailedPrecondition) and f"write window {second.id} was" in str(c.error), c
        time.sleep(0.2)
        for kv in layers:  # nothing in the closed window's block, nor outside the windows
            assert _all(kv, 5 * BLOCK, kv.size, 0x11) and _all(kv, 0, BLOCK, 0x11) and _all(kv, 3 * BLOCK, 5 * BLOCK, 0x11)
            if path == "local":  # refused before any byte moved; on the fabric, the open window's span may land
                assert _all(kv, BLOCK, 3 * BLOCK, 0x11), "a refused entry wrote some of its spans"

        with pytest.raises(ferry.InvalidArgument, match="windows cover 2 blocks; the ids are 3"):
            q.post_batch(parts, BLOCK, [0, 1, 2], [1, 2, 5], windows=[(first.descriptors[0], 2)])
        with pytest.raises(ferry.InvalidArgument, match="window or windows, not both"):
            q.post_batch(parts, BLOCK, [0], [1], window=first.descriptors[0], windows=[(first.descriptors[0], 1)])
        with pytest.raises(ferry.InvalidArgument, match=r"windows\[0\] must be a write window"):
            q.post_batch(parts, BLOCK, [0], [1], windows=[(layers[0].descriptor(), 1)])
        # What a client that skipped those checks would post: each refused by the agent.
        q.table[0:2] = array.array("I", [0, 0])
        c = _queue_entry(q, lambda ud: q._post(ferry.write_queue._NO_REGION, 0, 0, BLOCK, 0, 2, 4 | 128, 0, 1, ud,
                                               {}))
        assert isinstance(c.error, ferry.InvalidArgument) and "spans must be 1..256" in str(c.error), c
        c = _queue_entry(q, lambda ud: q._post(ferry.write_queue._NO_REGION, 0, 0, BLOCK, 0, 2, 4 | 16 | 128, 0, 1,
                                               ud, {}))
        assert isinstance(c.error, ferry.InvalidArgument) and "exclude each other" in str(c.error), c
        first.close()


def test_malformed_window_entries_are_refused_precisely(agent):
    with ferry.Client(agent.socket) as owner, ferry.Client(agent.socket) as stranger:
        kv = owner.register_host(8 * BLOCK, write_windows=True)
        plain = owner.register_host(BLOCK)
        theirs = stranger.register_host(BLOCK, write_windows=True)
        q = owner.create_queue([stranger.register_host(BLOCK).descriptor()], entries=8, table_ids=16)

        def refused(post) -> ferry.FerryError:
            c = _queue_entry(q, post)
            assert c.error is not None and c.transfer_id == 0 and c.token == b"", c
            return c.error

        e = refused(lambda ud: q.post_open_window([kv.id], [(0, 2 * BLOCK), (BLOCK, BLOCK)], timeout=5, user_data=ud))
        assert isinstance(e, ferry.InvalidArgument) and "overlaps" in str(e), e
        e = refused(lambda ud: q.post_open_window([theirs.id], [(0, BLOCK)], timeout=5, user_data=ud))
        assert isinstance(e, ferry.NotFound) and "region_ids[0]" in str(e), e
        e = refused(lambda ud: q.post_open_window([plain.id], [(0, BLOCK)], timeout=5, user_data=ud))
        assert isinstance(e, ferry.FailedPrecondition) and "not registered with write_windows" in str(e), e
        e = refused(lambda ud: q.post_open_window([kv.id], [(0, BLOCK)], timeout=1e6, user_data=ud))
        assert isinstance(e, ferry.InvalidArgument) and "timeout_ms" in str(e), e
        e = refused(lambda ud: q.post_open_window([kv.id], [(0, BLOCK)], timeout=5, dst_index=3, user_data=ud))
        assert isinstance(e, ferry.InvalidArgument) and "dst_index 3" in str(e), e
        e = refused(lambda ud: q._post(ferry.write_queue._NO_REGION, 0, 0, 0, 0, 0, 32, 14, 0, ud, {}))
        assert isinstance(e, ferry.OutOfRange) and "outside the queue's block table of 16 ids" in str(e), e
        with pytest.raises(ferry.InvalidArgument, match="table ids from table_index 8"):
            q.post_open_window([kv.id], [(0, BLOCK)] * 3, timeout=5, table_index=8)  # 18 ids past 16
        e = refused(lambda ud: q.post_close_window(12345, user_data=ud))
        assert isinstance(e, ferry.NotFound) and "not a write window of this session" in str(e), e
        e = refused(lambda ud: q._post(ferry.write_queue._NO_REGION, 1, 0, 0, 0, 0, 32 | 64, 0, 0, ud, {}))
        assert isinstance(e, ferry.InvalidArgument) and "takes no other flag" in str(e), e
        with pytest.raises(ferry.InvalidArgument, match="1..256 regions"):
            q.post_open_window([], [(0, BLOCK)], timeout=5)
        # A window another session opened is not this one's to close.
        window = owner.open_write_window([kv], [(0, BLOCK)], timeout=5)
        theirs_q = stranger.create_queue([kv.descriptor()], entries=8)
        c = _queue_entry(theirs_q, lambda ud: theirs_q.post_close_window(window.id, user_data=ud))
        assert isinstance(c.error, ferry.NotFound), c
        window.close()


def test_closing_a_closed_window_again_waits_again(agent):
    """A close that times out while a write through the window still copies says so, and
    the window is closed all the same; closing it again waits again for that copy (it
    used to answer OK at once, while the copy still wrote into the owner's bytes)."""
    size = 1 << 30
    with ferry.Client(agent.socket) as owner, ferry.Client(agent.socket) as writer:
        kv = owner.register_host(size, write_windows=True)
        src = writer.register_host(size)
        window = owner.open_write_window([kv], [(0, size)], timeout=60)
        future = writer.write(src, window.descriptors[0], [(0, 0, size)], timeout=60)
        # The Write call returned with the copy admitted; 1 GiB of memcpy outlasts a call.
        with pytest.raises(ferry.DeadlineExceeded, match="still copying"):
            window.close(wait=0)
        with pytest.raises(ferry.DeadlineExceeded, match="still copying"):
            window.close(wait=0)  # still copying: not over yet
        window.close(wait=30)  # waits for the copy
        assert future.done()
        future.result(0)  # admitted before the close, so it completes
