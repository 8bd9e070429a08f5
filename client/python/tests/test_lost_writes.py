"""Terminal means terminal: once the receiver's agent tells a receiver that a notified
write will not complete (its writer's agent stopped answering), no further operation of
that write lands, whether it goes through a write window or not (real agents, the
writer's agent stopped with SIGSTOP and resumed)."""
import signal
import time

import pytest

import ferry

FABRIC = ("--fabric_provider=tcp;ofi_rxm",)


@pytest.mark.parametrize("through", ["window", "region"])
def test_a_write_its_receiver_was_told_will_not_complete_lands_no_more(agent_factory, through):
    """A notified 512 MiB write a→b, agent a stopped mid-write. b's agent pings it, gets no
    answer, fences the writer (through a window: closes the window; else: closes a's own
    keys of the region and refuses it new ones until the write's deadline) and only then
    tells the receiver the write will not complete. Once a runs again, the writer gets a
    failure and at most the one operation (--fabric_max_op_bytes, 1 MiB) the receiving NIC
    had begun still lands: tcp's provider checks a key when an operation starts, and the
    rest of that operation's bytes come when the stopped writer resumes (without the fence,
    the whole rest of the write landed: 836 MB of 1 GiB)."""
    a, b = (agent_factory(f"--peer_address={ip}:0", f"--fabric_iface={ip}", *FABRIC)
            for ip in ("127.0.0.1", "127.0.0.2"))
    size = 512 << 20
    with ferry.Client(a.socket) as writer, ferry.Client(b.socket) as owner:
        dst = owner.register_host(size, write_windows=through == "window")
        src = writer.register_host(size)
        src.buffer[:] = b"\x77" * size
        if through == "window":
            target = owner.open_write_window([dst], [(0, size)], timeout=60).descriptors[0]
        else:
            target = dst.descriptor()
        stream = owner.notification_stream(timeout=20)
        future = writer.write(src, target, [(0, 0, size)], notify=True, timeout=60)
        deadline = time.monotonic() + 10
        while dst.buffer[0] != 0x77 and time.monotonic() < deadline:  # under way: announced, first bytes in
            pass
        a.proc.send_signal(signal.SIGSTOP)
        try:
            told = next(n for n in stream if n.kind == "write")
            assert told.code != 0, "the write ended before its writer's agent was stopped: nothing to test"
            assert "no further operation of it is accepted" in told.message, told
            landed = bytes(dst.buffer).count(b"\x77")
        finally:
            a.proc.send_signal(signal.SIGCONT)
            stream.cancel()
        with pytest.raises(ferry.FerryError):
            future.result(30)
        time.sleep(0.3)
        later = bytes(dst.buffer).count(b"\x77") - landed
        assert later <= 1 << 20, f"{later} bytes landed after the receiver was told"
        if through == "region":
            # Until the lost write's deadline, its agent writes nothing more into the region.
            with pytest.raises(ferry.FailedPrecondition, match="was declared lost"):
                writer.write(src, target, [(0, 0, 4096)]).result(30)
