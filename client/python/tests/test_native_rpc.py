"""The Python client's unary calls through libferry_rpc (client/native) against live
ferryd processes. tools/pytest.sh builds the library and names it in FERRY_TEST_RPC_LIB;
it also runs test_client.py a second time with every client on it (FERRY_RPC_LIB)."""
import ctypes
import os
import signal
import threading
import time

import pytest

import ferry
from ferry import _native_rpc
from ferry._proto import ferry_pb2


@pytest.fixture(scope="module")
def rpc_lib():
    path = os.environ.get("FERRY_TEST_RPC_LIB", "")
    assert path and os.path.exists(path), (
        "FERRY_TEST_RPC_LIB must name libferry_rpc.so: run through tools/pytest.sh, or `bazel build -c opt "
        "//client/native:libferry_rpc.so` and set it")
    return path


def _clients(socket, rpc_lib):
    """The same agent through grpcio and through the library."""
    return ferry.Client(socket, rpc_lib=""), ferry.Client(socket, rpc_lib=rpc_lib)


def test_calls_answer_as_through_grpcio(agent, rpc_lib):
    plain, native = _clients(agent.socket, rpc_lib)
    with plain, native:
        assert plain._native is None and native._native is not None
        src = native.register_host(1 << 16)
        dst = plain.register_host(1 << 16)
        src.buffer[:] = os.urandom(1 << 16)
        r = native.write(src, dst.descriptor(), [(0, 4096, 8192)], tag=9).result(10)
        assert (r.bytes, r.path, r.tag) == (8192, "local", 9)
        assert dst.buffer[4096:4096 + 8192] == src.buffer[:8192]
        native.write_blocks(src, dst.descriptor(), 1024, [1, 2, 3], [7, 6, 5]).result(10)
        assert dst.buffer[7 * 1024:8 * 1024] == src.buffer[1024:2048]
        native.send_message(dst.descriptor(), b"hello", tag=3)
        got = next(iter(plain.notifications(timeout=5)))
        assert (got.tag, got.payload) == (3, b"hello")
        assert native.status().regions == plain.status().regions == 2


def test_errors_carry_the_same_kind_and_message_as_through_grpcio(agent, rpc_lib):
    plain, native = _clients(agent.socket, rpc_lib)
    with plain, native, ferry.Client(agent.socket) as third:
        for c in (plain, native):
            c.src = c.register_host(4096)
        foreign = third.register_host(4096)
        forged = ferry.RegionDescriptor.from_bytes(plain.src.descriptor())
        forged._proto.token = b"x" * 16
        bad_calls = {
            "out of range": lambda c: c.write(c.src, plain.src.descriptor(), [(0, 4000, 200)]),
            "forged token": lambda c: c.write(c.src, forged, [(0, 0, 1)]),
            "not this session's region": lambda c: c.write(foreign, c.src.descriptor(), [(0, 0, 1)]),
            "empty region": lambda c: c.register_host(0),
            "unknown transfer": lambda c: c._call("Wait", ferry_pb2.WaitRequest(transfer_id=12345)),
            "unknown region": lambda c: c._call("DeregisterMemory", ferry_pb2.DeregisterMemoryRequest(region_id=999)),
        }

        for name, call in bad_calls.items():
            seen = []
            for c in (plain, native):
                with pytest.raises(ferry.FerryError) as e:
                    call(c)
                seen.append((type(e.value), e.value.code, e.value.message))
            assert seen[0] == seen[1], name
            assert seen[0][0] is not ferry.FerryError, (name, seen[0])  # a precise kind


def test_a_library_that_does_not_load_is_refused_naming_it(agent, tmp_path):
    not_a_library = tmp_path / "libferry_rpc.so"
    not_a_library.write_bytes(b"not an ELF file")
    for path in ("/nonexistent/libferry_rpc.so", str(not_a_library)):
        with pytest.raises(ferry.FailedPrecondition) as e:
            ferry.Client(agent.socket, rpc_lib=path)
        assert path in e.value.message and "bazel build" in e.value.message


def test_the_environment_names_the_library_and_an_argument_overrides_it(agent, rpc_lib, monkeypatch):
    monkeypatch.setenv(_native_rpc.ENV, rpc_lib)
    with ferry.Client(agent.socket) as c:
        assert c._native is not None
    with ferry.Client(agent.socket, rpc_lib="") as c:
        assert c._native is None


@pytest.mark.parametrize("through", ["grpcio", "native"])
def test_closing_the_client_ends_a_call_in_flight(fabric_agents, rpc_lib, through):
    """A thread blocked in a call (a write's Wait towards a stopped peer) returns when
    another thread closes the client, as a pod's shutdown does."""
    a, b = fabric_agents
    with ferry.Client(b.socket) as cb:
        dst = cb.register_host(4096)
        c = ferry.Client(a.socket, rpc_lib=rpc_lib if through == "native" else "")
        src = c.register_host(4096)
        c.write(src, dst.descriptor(), [(0, 0, 8)]).result(10)  # connected
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:
            future = c.write(src, dst.descriptor(), [(0, 0, 8)])
            outcome = []
            waiter = threading.Thread(target=lambda: outcome.append(_raised(lambda: future.result(20))))
            waiter.start()
            time.sleep(0.3)
            assert waiter.is_alive(), outcome  # blocked in Wait
            start = time.monotonic()
            c.close()
            waiter.join(5)
            assert not waiter.is_alive(), "the call did not end when its client closed"
            assert time.monotonic() - start < 2
            assert outcome[0] in (ferry.Cancelled, ferry.Unavailable), outcome
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)


def _raised(call):
    try:
        call()
    except ferry.FerryError as e:
        return type(e)
    return None


def test_a_killed_agent_gives_unavailable_and_reconnect_works(agent_factory, rpc_lib):
    a = agent_factory()
    c = ferry.Client(a.socket, rpc_lib=rpc_lib)
    src, dst = c.register_host(4096), c.register_host(4096)
    src.buffer[:4] = b"wxyz"
    a.kill()
    with pytest.raises(ferry.Unavailable) as e:
        c.status()
    assert "reconnect" in e.value.message
    agent_factory(dir=a.dir)
    c.reconnect(timeout=10)
    c.write(src, dst.descriptor(), [(0, 0, 4)]).result(10)
    assert bytes(dst.buffer[:4]) == b"wxyz"
    c.close()


def test_the_c_api_refuses_bad_arguments_with_a_status(agent, rpc_lib):
    lib = _native_rpc.load(rpc_lib)
    assert not lib.ferry_rpc_open(b"") and not lib.ferry_rpc_open(None)
    ch = lib.ferry_rpc_open(f"unix:{agent.socket}".encode())
    out = (ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_char_p())

    def call(method, request=b"", key=None, value=None, timeout_us=5_000_000, channel=ch):
        code = lib.ferry_rpc_call(channel, method, request, len(request), key, value, timeout_us,
                                  *(ctypes.byref(o) for o in out))
        return code, (out[2].value or b"").decode()

    status = b"/ferry.v1.Agent/GetStatus"
    assert call(b"GetStatus")[0] == 3  # INVALID_ARGUMENT: not a path
    assert call(status, channel=None)[0] == 3
    assert call(status, key=b"ferry-session")[0] == 3  # a key without a value
    assert call(b"/ferry.v1.Agent/NoSuchMethod")[0] == 12  # UNIMPLEMENTED, from the agent
    assert call(status, request=b"\xff\xff\xff")[0] == 13  # INTERNAL: the agent cannot parse it
    code, message = call(b"/ferry.v1.Agent/Write")  # no session token
    assert code == 16 and "session" in message, message  # UNAUTHENTICATED
    assert call(status) == (0, "")
    lib.ferry_rpc_shutdown(ch)
    lib.ferry_rpc_shutdown(ch)  # idempotent
    assert call(status) == (14, "this client is closed")
    lib.ferry_rpc_free(ch)
