"""The local API's unary calls through libferry_rpc (client/native): the C++ gRPC
library under the Python client, loaded with ctypes.

grpcio's unary call costs 1.5-3.5x the C++ library's over the same unix socket
(tools/bench/RESULTS.md, "control path"); through this library a call from Python costs
about the C++ call (ctypes itself ~2.5 us, and it releases the GIL for the call). Only unary
calls go this way; streams stay on grpcio. Messages travel serialized, so the library
knows no message types.

    lib = load("/path/to/libferry_rpc.so")   # or load(None): $FERRY_RPC_LIB, else None
    channel = NativeChannel(lib, "/run/ferry/ferry.sock", (("ferry-session", token_hex),))
    answer = channel.call("GetStatus", ferry_pb2.GetStatusRequest(), timeout=30.0)
    channel.close()
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Optional, Tuple

from google.protobuf import message_factory
from google.protobuf.message import Message

from . import errors
from ._proto import ferry_pb2

ENV = "FERRY_RPC_LIB"

_SERVICE = ferry_pb2.DESCRIPTOR.services_by_name["Agent"]
_METHODS = {m.name: (f"/{_SERVICE.full_name}/{m.name}".encode(), message_factory.GetMessageClass(m.output_type))
            for m in _SERVICE.methods if not m.client_streaming and not m.server_streaming}

_loaded = {}
_load_lock = threading.Lock()


def load(path: Optional[str]) -> Optional[ctypes.CDLL]:
    """The library at ``path`` (None: at $FERRY_RPC_LIB; unset or empty: returns None).
    Raises FailedPrecondition naming the path if it cannot be loaded."""
    path = os.environ.get(ENV) if path is None else path
    if not path:
        return None
    with _load_lock:
        if path not in _loaded:
            try:
                lib = ctypes.CDLL(path)
                lib.ferry_rpc_open.restype = ctypes.c_void_p
                lib.ferry_rpc_open.argtypes = [ctypes.c_char_p]
                for name in ("ferry_rpc_shutdown", "ferry_rpc_free"):
                    getattr(lib, name).restype = None
                    getattr(lib, name).argtypes = [ctypes.c_void_p]
                lib.ferry_rpc_call.restype = ctypes.c_int
                lib.ferry_rpc_call.argtypes = [
                    ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                    ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p),
                    ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_char_p)]
            except (OSError, AttributeError) as e:
                raise errors.FailedPrecondition(
                    f"cannot load the native RPC library {path!r} ({e}): build it with `bazel build -c opt "
                    f"//client/native:libferry_rpc.so`, or unset {ENV} / pass rpc_lib="" to use grpcio") from None
            _loaded[path] = lib
        return _loaded[path]


class NativeChannel:
    """A channel to the agent's socket through libferry_rpc; thread-safe."""

    def __init__(self, lib: ctypes.CDLL, socket: str, metadata: Tuple[Tuple[str, str], ...] = ()):
        """``metadata``: sent with every call, at most one (key, value) pair (the session's
        token)."""
        if len(metadata) > 1:
            raise ValueError("native RPC: at most one metadata pair")
        self._lib = lib
        self._key: Optional[bytes] = metadata[0][0].encode() if metadata else None
        self._value: Optional[bytes] = metadata[0][1].encode() if metadata else None
        self._channel = lib.ferry_rpc_open(f"unix:{socket}".encode())
        if not self._channel:
            raise errors.InvalidArgument(f"native RPC: cannot open a channel to {socket!r}")
        self._local = threading.local()  # each thread's out-parameters, made once

    def call(self, method: str, request: Message, timeout: float) -> Message:
        """The answer of ``method``, or raises the FerryError of its status."""
        path, answer_type = _METHODS[method]
        out = getattr(self._local, "out", None)
        if out is None:
            out = self._local.out = (ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_char_p())
        data = request.SerializeToString()
        code = self._lib.ferry_rpc_call(self._channel, path, data, len(data), self._key, self._value,
                                        int(timeout * 1e6), ctypes.byref(out[0]), ctypes.byref(out[1]),
                                        ctypes.byref(out[2]))
        if code != 0:
            raise errors.from_code(code, (out[2].value or b"").decode("utf-8", "replace"))
        return answer_type.FromString(ctypes.string_at(out[0].value or 0, out[1].value) if out[1].value else b"")

    def close(self) -> None:
        """Cancels calls in flight (they raise Cancelled) and fails later ones (Unavailable).
        The memory goes when the last reference does: a thread inside call() holds one."""
        self._lib.ferry_rpc_shutdown(self._channel)

    def __del__(self) -> None:
        if getattr(self, "_channel", None):
            self._lib.ferry_rpc_free(self._channel)
