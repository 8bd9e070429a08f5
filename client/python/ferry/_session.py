"""The session socket: a SOCK_SEQPACKET unix socket next to the gRPC socket.

Wire format (proto/ferry/wire/session_wire.h): 32-byte little-endian frames
``u32 magic "FRY1", u32 type, u64 a, u64 b, u64 c``. The agent greets with HELLO
(a = session id, b|c = 16-byte token), or REFUSED (a = status code, b = length of the
reason that follows in the same packet) and closes; ADD_FD carries one fd (SCM_RIGHTS) and is
answered by FD_ADDED (a = request id, b = fd handle or 0, c = errno). The session lasts
as long as the connection: closing it (or dying) releases everything registered in it.
"""
from __future__ import annotations

import errno
import select
import socket
import struct
import threading
import time

from . import errors

_MAGIC = 0x31595246
_HELLO, _ADD_FD, _FD_ADDED, _REFUSED = 1, 2, 3, 4
_FRAME = struct.Struct("<IIQQQ")
_MAX_REFUSAL_BYTES = 480


def session_socket_path(grpc_socket: str) -> str:
    """"/run/ferry/ferry.sock" -> "/run/ferry/ferry.session.sock"."""
    base = grpc_socket[:-5] if grpc_socket.endswith(".sock") else grpc_socket
    return base + ".session.sock"


class Session:
    def __init__(self, grpc_socket: str, timeout: float = 10.0):
        path = session_socket_path(grpc_socket)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
            greeting = self._sock.recv(_FRAME.size + _MAX_REFUSAL_BYTES)
            magic, kind, session_id, b, c = _FRAME.unpack(greeting[:_FRAME.size])
        except (OSError, struct.error) as e:
            self._sock.close()
            raise errors.Unavailable(f"cannot open a session with the ferry agent at {path}: {e} "
                                     "(is ferryd running, and may this user use its socket?)") from None
        if magic == _MAGIC and kind == _REFUSED:
            self._sock.close()
            reason = greeting[_FRAME.size:_FRAME.size + b].decode("utf-8", "replace")
            raise errors.from_code(session_id, f"the ferry agent refused a session: {reason}")
        if magic != _MAGIC or kind != _HELLO or len(greeting) != _FRAME.size:
            self._sock.close()
            raise errors.Unavailable("the agent did not greet the session")
        self.id = session_id
        self.token_hex = (b.to_bytes(8, "little") + c.to_bytes(8, "little")).hex()
        self._lock = threading.Lock()
        self._next_request = 1

    def _recv(self) -> bytes:
        data = self._sock.recv(_FRAME.size)
        if len(data) != _FRAME.size:
            raise OSError("the session socket closed")
        return data

    def send_fd(self, fd: int) -> int:
        """Sends (a duplicate of) ``fd`` to the agent; returns its fd handle."""
        with self._lock:
            request = self._next_request
            self._next_request += 1
            try:
                socket.send_fds(self._sock, [_FRAME.pack(_MAGIC, _ADD_FD, request, 0, 0)], [fd])
                magic, kind, a, handle, reason = _FRAME.unpack(self._recv())
            except OSError as e:
                raise errors.Unavailable(f"the session with the agent broke: {e}") from None
        if magic != _MAGIC or kind != _FD_ADDED or a != request:
            raise errors.Unavailable("unexpected answer on the session socket")
        if handle == 0 and reason == errno.ENFILE:
            raise errors.ResourceExhausted("the agent refused the fd: it is out of file descriptors; try again later")
        if handle == 0:
            raise errors.ResourceExhausted("the agent refused the fd: this session holds too many unused fds "
                                           "(the agent's --max_pending_fds)")
        return int(handle)

    def alive(self) -> bool:
        """False once the agent closed the session (it exited or restarted). Never waits.

        The socket has a timeout, and CPython waits for readability up to that timeout
        before any recv, MSG_DONTWAIT or not: so poll first, without waiting, and peek
        only at a socket that is readable (its end or a frame), under the lock that
        send_fd reads with, so that nothing takes the frame between the two."""
        with self._lock:
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)
            try:
                if not poller.poll(0):
                    return True  # nothing to read: the agent has not closed it
                return self._sock.recv(_FRAME.size, socket.MSG_PEEK) != b""
            except OSError:
                return False

    def close(self, wait: float = 2.0) -> None:
        """Ends the session and waits, up to ``wait`` seconds, until the agent has released
        it: the agent closes its end only after releasing everything registered in it, so
        a pod that closes one client and opens another finds its room given back."""
        try:
            self._sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + wait
            while (left := deadline - time.monotonic()) > 0:
                self._sock.settimeout(left)
                if not self._sock.recv(_FRAME.size):
                    break  # the agent's end: released
        except OSError:
            pass  # already gone, or the agent slower than ``wait``: it still releases
        finally:
            self._sock.close()
