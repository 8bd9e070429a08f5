"""ferry.Inbox: this session's notifications through shared memory, read by polling.

    inbox = client.open_inbox(slots=64)
    for n in inbox.poll():            # what arrived; never blocks, no RPC, no thread
        ...                           # ferry.Notification, as notifications() yields
    inbox.poll(timeout=0.005)         # or waits up to 5 ms for the first

The Python face of proto/ferry/wire/inbox_layout.h (the C++ client is client/cpp/
inbox.h): a memfd ring the agent fills with the session's notifications, in order, and
a doorbell (socketpair) it rings only while we wait. For a serving engine's step loop, which polls
anyway: a notification costs a memory read and a protobuf parse instead of a gRPC read
on a thread of its own. One inbox per session, for the session's life; the agent
refuses it while a notifications() stream is open, and a stream once there is one.
Unread notifications beyond ``slots`` wait in the agent. Not thread-safe: one thread
polls. x86-64 and Python 3.10+ only, as the write queue.
"""
from __future__ import annotations

import os
import struct
import time
from typing import List

from . import errors
from ._proto import ferry_pb2
from ._shared_ring import SharedRing, store_load_fence
from ._types import ClientCalls
from .notification import Notification, _notification

# proto/ferry/wire/inbox_layout.h (checked by test_inbox.py against the agent).
_MAGIC = 0x31494246  # "FBI1"
_MIN_SLOTS, _MAX_SLOTS = 8, 4096
_SLOT_BYTES, _SLOTS_OFFSET = 8192, 256
_AGENT_WAITING, _TAIL, _HEAD, _CLIENT_WAITING = 8, 64, 128, 192
_LENGTH = struct.Struct("<I")


class Inbox(SharedRing):
    """See the module docstring. Made by ``Client.open_inbox``. close() unmaps the ring;
    the agent keeps the inbox (and the session's notifications) until the session ends."""

    def __init__(self, client: ClientCalls, slots: int = 64):
        if not (isinstance(slots, int) and _MIN_SLOTS <= slots <= _MAX_SLOTS and slots & (slots - 1) == 0):
            raise errors.InvalidArgument(f"slots must be a power of two in [{_MIN_SLOTS}, {_MAX_SLOTS}], got {slots!r}")
        self._slots, self._head = slots, 0
        super().__init__("ferry.Inbox", "ferry-inbox", _SLOTS_OFFSET + slots * _SLOT_BYTES, eventfds=0, doorbells=1)
        (self._doorbell,) = self._doorbells
        try:
            struct.pack_into("<II", self._map, 0, _MAGIC, slots)
            client._call("OpenInbox", ferry_pb2.OpenInboxRequest(
                ring_fd=client._session.send_fd(self._ring_fd), doorbell_fd=self._send_doorbell(client._session, 0),
                slots=slots))
        except BaseException:
            self.close()
            raise

    def poll(self, max_count: int = 64, timeout: float = 0.0) -> List[Notification]:
        """Up to ``max_count`` notifications, in the order the agent delivered them;
        waits up to ``timeout`` seconds for the first when there is none."""
        if self.closed:
            raise errors.FailedPrecondition("this inbox is closed")
        deadline = time.monotonic() + timeout
        while self._ready() == 0 and time.monotonic() < deadline:
            self._sleep_on(self._doorbell, _CLIENT_WAITING, 1, self._ready, deadline)
        out: List[Notification] = []
        for _ in range(min(self._ready(), max_count)):
            at = _SLOTS_OFFSET + (self._head & (self._slots - 1)) * _SLOT_BYTES
            (size,) = _LENGTH.unpack_from(self._map, at)
            if size > _SLOT_BYTES - _LENGTH.size:
                raise errors.Internal(f"inbox slot {self._head} holds no notification")
            out.append(_notification(ferry_pb2.Notification.FromString(self._map[at + 4:at + 4 + size])))
            self._head += 1
        if out:
            self._words[_HEAD // 4] = self._head & 0xFFFFFFFF  # those slots are free again
            store_load_fence()
            if self._words[_AGENT_WAITING // 4]:  # notifications wait for them: say so now
                try:
                    os.write(self._doorbell, b"\1")
                except BlockingIOError:
                    pass  # rung already, and not yet read
        return out

    def _ready(self) -> int:
        return (self._words[_TAIL // 4] - self._head) & 0xFFFFFFFF
