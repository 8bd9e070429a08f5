"""What the write queue and the inbox share: a memfd this process and the agent both map,
its doorbells, and the doorbell protocol (announce a wait, look again, sleep).

Doorbells the agent rings (completions, notifications) are unix stream socketpairs: we
keep one end and hand the agent the other, which it rings with a non-blocking send
whatever that shared file's flags say (an eventfd's write could be made to block the
agent). Doorbells we ring (a queue's submissions) are eventfds the agent only waits on."""
from __future__ import annotations

import mmap
import os
import platform
import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Callable, List, TypeVar

from . import errors

if TYPE_CHECKING:
    from ._session import Session

_R = TypeVar("_R", bound="SharedRing")

_FENCE = threading.Lock()


def store_load_fence() -> None:
    """Orders our last cursor store before our next load. Each doorbell check is one side
    of a pair (we store a "waiting" word then load the agent's cursor; the agent stores
    its cursor then loads our word): x86 lets a load pass an earlier store, and then both
    sides could miss each other and sleep. A lock round trip is a locked instruction,
    which x86 does not let loads pass."""
    _FENCE.acquire()
    _FENCE.release()


class SharedRing:
    """A sealed-ready memfd of ``size`` bytes mapped here (``_map``, ``_words`` as uint32),
    ``eventfds`` non-blocking eventfds we ring, and ``doorbells`` socketpairs the agent
    rings (``_doorbells``: our ends; ``_send_doorbell`` hands over the other); closed by
    close() or the context manager. After close() (``closed``), the mapping is gone:
    callers check ``closed`` before touching it."""

    _map: mmap.mmap
    _words: memoryview

    def __init__(self, what: str, name: str, size: int, eventfds: int, doorbells: int):
        if platform.machine() not in ("x86_64", "AMD64"):
            raise errors.FailedPrecondition(f"{what} needs x86-64 (this is {platform.machine()})")
        if not hasattr(os, "eventfd"):
            raise errors.FailedPrecondition(f"{what} needs Python 3.10 or later (os.eventfd)")
        self._fds: List[int] = []
        self.closed = True  # until mapped
        try:
            # MFD_ALLOW_SEALING: the agent seals what it maps against shrinking.
            self._ring_fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            self._fds.append(self._ring_fd)
            self._eventfds = [os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK) for _ in range(eventfds)]
            self._fds += self._eventfds
            self._doorbells: List[int] = []
            self._agents_ends: List[int] = []
            for _ in range(doorbells):
                ours, agents = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                ours.setblocking(False)
                self._doorbells.append(ours.detach())
                self._agents_ends.append(agents.detach())
                self._fds += [self._doorbells[-1], self._agents_ends[-1]]
            os.ftruncate(self._ring_fd, size)
            self._map = mmap.mmap(self._ring_fd, size)
            self._words = memoryview(self._map).cast("I")  # 4-byte aligned stores and loads
            self.closed = False
        except BaseException:
            self.close()
            raise

    def _send_doorbell(self, session: Session, i: int) -> int:
        """Hands the agent its end of doorbell ``i`` on the session socket (and closes
        ours of that end); returns the fd handle."""
        fd = self._agents_ends[i]
        try:
            return session.send_fd(fd)
        finally:
            self._fds.remove(fd)
            os.close(fd)

    def _sleep_on(self, doorbell: int, waiting_at: int, want: int, ready: Callable[[], int], deadline: float) -> None:
        """One wait for ``want`` things ready: announce it at byte ``waiting_at`` (the agent
        rings ``doorbell`` only then), look again (what came before the announcement
        rang nothing), then sleep until the doorbell or ``deadline``."""
        self._words[waiting_at // 4] = want
        store_load_fence()
        if ready() < want:
            # poll, not select: a serving process often has more than FD_SETSIZE (1024) fds,
            # and select() refuses a doorbell numbered past it.
            poller = select.poll()
            poller.register(doorbell, select.POLLIN)
            poller.poll(max(0.0, min(deadline - time.monotonic(), 1.0)) * 1000)
            try:
                os.read(doorbell, 256)  # each ring is a byte
            except BlockingIOError:
                pass
        self._words[waiting_at // 4] = 0

    def close(self) -> None:
        """Unmaps the ring and closes its fds."""
        self.closed = True
        words, ring = self.__dict__.pop("_words", None), self.__dict__.pop("_map", None)
        if words is not None:
            words.release()
        if ring is not None:
            ring.close()
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
