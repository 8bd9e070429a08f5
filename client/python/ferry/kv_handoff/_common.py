"""What both sides of the KV handoff share: the cache's shape, what poll() reports,
block ids as a message's words, and a session's inbox split between its producer and
consumer."""
from __future__ import annotations

import array
import dataclasses
import logging
import secrets
import threading
import weakref
from typing import Dict, List, Sequence, Set

from .._session import Session
from .._types import Region
from ..client import Client
from ..notification import Notification
from ..write_queue import _words

logger = logging.getLogger("ferry.kv_handoff")


@dataclasses.dataclass(frozen=True)
class KVCacheSpec:
    """The shape both sides must share: blocks per layer region, bytes per block per
    half, and halves per layer (2: K and V; 1: MLA)."""
    num_blocks: int
    block_bytes: int
    halves: int = 2

    @property
    def region_bytes(self) -> int:
        return self.halves * self.num_blocks * self.block_bytes


@dataclasses.dataclass
class Progress:
    """What poll() found: requests now done, and requests that failed (id -> why)."""
    done: Set[str] = dataclasses.field(default_factory=set)
    failed: Dict[str, str] = dataclasses.field(default_factory=dict)


def _block_ids(ids: Sequence[int], num_blocks: int) -> array.array[int]:
    """``ids`` as 32-bit words (what messages and a write queue's table hold: copied in
    one piece, checked at C speed), each in 0..num_blocks - 1, else ValueError naming one."""
    try:
        words = _words(ids)
        if not words or max(words) < num_blocks:
            return words
    except (OverflowError, TypeError):
        pass
    bad = next(i for i in ids if not (isinstance(i, int) and 0 <= i < num_blocks))
    raise ValueError(f"block id {bad} is outside 0..{num_blocks - 1}")


def new_request_secret() -> bytes:
    """A request's secret (KVProducer.hold): 16 random bytes."""
    return secrets.token_bytes(16)


class _SessionInbox:
    """A session's notifications, read from its inbox (shared memory, ferry.inbox) when
    polled: no thread, no RPC. A session has one inbox, so a client's producer and
    consumer share it: each reads the notifications of its own regions (an _Inbox), and
    those of regions neither has are dropped."""
    _by_session: weakref.WeakKeyDictionary[Session, _SessionInbox] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, client: Client) -> "_SessionInbox":
        shared = cls._by_session.get(client._session)
        if shared is None:
            shared = cls._by_session[client._session] = cls(client)
        return shared

    def __init__(self, client: Client):
        self._inbox = client.open_inbox(slots=256)
        self.readers: List[Set[int]] = []  # each reader's region ids
        self._kept: List[Notification] = []  # notifications another reader has not taken yet
        self._lock = threading.Lock()  # a producer's responder thread takes too

    def take(self, mine: Set[int]) -> List[Notification]:
        with self._lock:
            pending = self._kept + self._inbox.poll(max_count=1 << 20)
            others = set().union(*(r for r in self.readers if r is not mine))
            self._kept = [n for n in pending if n.region_id in others and n.region_id not in mine]
            return [n for n in pending if n.region_id in mine]

    def wait(self, timeout: float) -> None:
        """Returns once the ring holds something (for any reader) or after ``timeout``;
        takes nothing. Only the producer's responder waits; the others only poll."""
        self._inbox.poll(max_count=0, timeout=timeout)

    def leave(self, mine: Set[int]) -> None:
        with self._lock:
            self.readers = [r for r in self.readers if r is not mine]
            if not self.readers:
                self._inbox.close()


class _Inbox:
    """The notifications of ``regions`` (a producer's mailbox, a consumer's layers)."""

    def __init__(self, client: Client, regions: Sequence[Region]):
        self._shared = _SessionInbox.of(client)
        self._mine = {r.id for r in regions}
        self._shared.readers.append(self._mine)

    def drain(self) -> List[Notification]:
        """What arrived for these regions since the last call, in order."""
        return self._shared.take(self._mine)

    def wait(self, timeout: float) -> None:
        self._shared.wait(timeout)

    def close(self) -> None:
        self._shared.leave(self._mine)
