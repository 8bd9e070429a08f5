"""ferry.WriteQueue: many small writes to fixed destinations without an RPC each.

    q = client.create_queue([receiver_descriptor], entries=256)
    q.post(region, 65536, dst_offset=0, user_data=1)       # no RPC: an entry in shared memory
    for c in q.reap(timeout=1.0):                           # completions, in any order
        if c.error is not None:
            raise c.error

Paged writes (KV-cache blocks) take their block ids from the queue's block table, shared
memory the agent reads when it takes the entry, so one mapping serves every layer:

    q = client.create_queue([consumer_kv], entries=64, table_ids=2 * n)
    q.table[:n] = array.array("I", src_block_ids)           # or numpy.frombuffer(q.table,
    q.table[n:2 * n] = array.array("I", dst_block_ids)      #    dtype=numpy.uint32)
    for layer in range(num_layers):                         # one entry per layer
        q.post_paged(kv[layer], block_size, n, table_index=0, user_data=layer)

or every layer as one transfer, one completion and one notification (a ``write_batch``
with no RPC): ``q.post_batch([(kv[l], l, 0, 0) for l in layers], block_size, src_ids,
dst_ids, notify=True, tag=7)``. And messages to a destination's owner, with no bytes
written (``Client.send_message`` with no RPC): ``q.post_message(b"pull 12", tag=3)``. And
write windows over this client's own regions for a destination's owner
(``Client.open_write_window`` and ``WriteWindow.close`` with no RPC):
``q.post_open_window([kv.id for kv in layers], ranges, timeout=30)``, whose completion
carries the window's id (``transfer_id``) and ``token``, then ``q.post_close_window(id)``.

The Python face of the agent's shared-memory ring (proto/ferry/wire/ring_layout.h; the C++
client is client/cpp/write_queue.h): a memfd both sides map, a submission ring the
agent's NIC worker polls, a completion ring it fills, and two doorbells (an eventfd we
ring, a socketpair the agent rings) rung only when the other side sleeps. Each entry is checked by the agent
exactly like a ``Client.write``; a refused one comes back as a completion with ``error`` set.

Not thread-safe: one thread posts and reaps. At most ``entries`` writes are in flight;
``post`` raises ResourceExhausted until ``reap`` frees room. Writes in flight together
are not ordered against each other (on a GPU several may be one kernel launch): reap a
write before posting another to the same destination bytes. The queue lives as long as
the client's session: after ``Client.reconnect()`` create a new one. x86-64 and Python
3.10+ only: the ring relies on x86's store order, which Python code cannot request.
"""
from __future__ import annotations

import array
import builtins
import dataclasses
import operator
import os
import struct
import time
from typing import Any, Dict, Iterable, List, Optional, Protocol, Sequence, Set, Tuple, Union

from . import errors
from ._proto import ferry_pb2
from ._shared_ring import SharedRing, store_load_fence
from ._types import ClientCalls, Region, RegionDescriptor


class _Source(Protocol):
    """What an entry names as its source: a Region of the client, or none (_NO_REGION)."""
    @property
    def id(self) -> int: ...


# post_batch's part: (source region, destination index, source base, destination base).
BatchPart = Tuple[Region, int, int, int]

# proto/ferry/wire/ring_layout.h (checked by test_write_queue.py against the agent).
_MAGIC = 0x31515246  # "FRQ1"
_MIN_ENTRIES, _MAX_ENTRIES = 8, 4096
_MAX_TABLE_IDS = 4 << 20
_SQ_TAIL, _SQ_HEAD, _CQ_TAIL, _CQ_HEAD, _AGENT_SLEEPING, _CLIENT_WAITING = 64, 128, 192, 256, 320, 384
_SUBMIT_OFFSET = 448
# user_data src_region src_offset dst_offset length tag dst_index flags table_index blocks
_SUBMIT = struct.Struct("<QQQQQQIIII")
_COMPLETION = struct.Struct("<QQQQiI216s")  # user_data transfer_id bytes duration_ns code path message
_COMPLETION_HEAD = struct.Struct("<QQQQiI")  # all but the message, which only a failure needs
_MESSAGE = struct.Struct("216s")
_FLAG_NOTIFY, _FLAG_PAGED, _FLAG_BATCH, _FLAG_MESSAGE, _FLAG_WINDOW = 1, 2, 4, 8, 16
_FLAG_OPEN_WINDOW, _FLAG_CLOSE_WINDOW, _FLAG_WINDOW_SPANS = 32, 64, 128
_WINDOW_OPEN = struct.Struct("<QII")  # a WindowOpen in the table: timeout_ms regions ranges
_MAX_WINDOW_REGIONS, _MAX_WINDOW_RANGES = 256, 1 << 16
_WINDOW_IDS = 6  # a WindowRef: the window's id (8 bytes) and token (16)
# Window spans: a head (their count, a reserved 0), then per span a WindowRef, its block count and a reserved 0.
_WINDOW_SPANS_IDS, _WINDOW_SPAN_IDS = 2, 8
MAX_WINDOW_SPANS, MAX_WINDOW_SPAN_PARTS = 256, 16384  # post_batch's windows
_MAX_PAYLOAD = 4096  # a notification's or message's payload
_PART = struct.Struct("<QQQII")  # a batch part in the table: src_region src_base dst_base dst_index reserved
_PART_IDS, _MAX_BATCH_PARTS = _PART.size // 4, 1024
PATH_NAMES = {ferry_pb2.TRANSFER_PATH_LOCAL: "local", ferry_pb2.TRANSFER_PATH_FABRIC: "fabric",
              ferry_pb2.TRANSFER_PATH_STAGED: "staged"}


@dataclasses.dataclass
class Completion:
    user_data: int
    transfer_id: int  # 0 when the agent refused the entry before starting it
    bytes: int
    error: Optional[errors.FerryError]  # None when the write succeeded
    path: str = ""  # local, fabric or staged
    seconds: float = 0.0  # post -> completion, as the agent measured it
    token: builtins.bytes = b""  # an opened window's token (post_open_window), its id in transfer_id


def _window_ref(window: RegionDescriptor, what: str) -> bytes:
    """A write window's id and token, as the table holds them (a WindowRef)."""
    proto = getattr(window, "_proto", None)
    if proto is None or not proto.window_id or len(proto.token) != 16:
        raise errors.InvalidArgument(f"{what} must be a write window's RegionDescriptor (its window_id set)")
    return bytes(struct.pack("<Q", proto.window_id) + proto.token)


def _refuse(src: object, **values: Any) -> None:
    """Raises what is wrong with a post that struct could not pack."""
    if not isinstance(getattr(src, "id", None), int):
        raise TypeError("src must be a Region of this client")
    for name, v in values.items():
        try:
            v = operator.index(v)  # ints, and integer types that say so (numpy's)
        except TypeError:
            raise errors.InvalidArgument(f"{name} must be an integer, got {v!r}") from None
        if not 0 <= v < (1 << (32 if name in ("dst_index", "table_index", "blocks") else 64)):
            raise errors.InvalidArgument(f"{name} out of range: {v}")


@dataclasses.dataclass(frozen=True)
class BatchParts:
    """A batch entry's parts as the block table holds them (``WriteQueue.pack_parts``)."""
    packed: bytes

    @property
    def count(self) -> int:
        return len(self.packed) // _PART.size


def _words(ids: Iterable[int]) -> array.array[int]:
    """Block ids as the table's 32-bit words: an ``array.array("I")`` as it is (x86-64:
    native order is the table's little-endian), anything else converted."""
    return ids if isinstance(ids, array.array) and ids.typecode == "I" else array.array("I", ids)


class _NoRegion:
    """What a batch or message entry names as its source: none of its own."""
    id = 0


_NO_REGION = _NoRegion()


class WriteQueue(SharedRing):
    """See the module docstring. Made by ``Client.create_queue``."""

    def __init__(self, client: ClientCalls, destinations: Sequence[Union[RegionDescriptor, bytes]], entries: int = 256,
                 timeout: Optional[float] = None,
                 traffic_class: Optional[str] = None, table_ids: int = 0):
        if not (_MIN_ENTRIES <= entries <= _MAX_ENTRIES and entries & (entries - 1) == 0):
            raise errors.InvalidArgument(
                f"entries must be a power of two in [{_MIN_ENTRIES}, {_MAX_ENTRIES}], got {entries}")
        if not (isinstance(table_ids, int) and 0 <= table_ids <= _MAX_TABLE_IDS):
            raise errors.InvalidArgument(f"table_ids must be an integer in [0, {_MAX_TABLE_IDS}], got {table_ids!r}")
        self._entries = entries
        self._posted = 0
        self._reaped = 0
        self._opening: Set[int] = set()  # user_data of window opens not reaped yet: their completions carry a token
        self._cq_offset = _SUBMIT_OFFSET + entries * _SUBMIT.size
        table_offset = self._cq_offset + entries * _COMPLETION.size
        #: The block table: ``table_ids`` uint32 ids shared with the agent (see post_paged).
        self.table = memoryview(b"")
        super().__init__("ferry.WriteQueue", "ferry-write-queue", table_offset + 4 * table_ids, eventfds=1,
                         doorbells=1)
        (self._submit_fd,), (self._complete_fd,) = self._eventfds, self._doorbells
        try:
            self.table = self._words[table_offset // 4:]
            self._table_offset = table_offset
            struct.pack_into("<II", self._map, 0, _MAGIC, entries)
            req = ferry_pb2.CreateQueueRequest(
                ring_fd=client._session.send_fd(self._ring_fd),
                submit_doorbell_fd=client._session.send_fd(self._submit_fd),
                complete_doorbell_fd=self._send_doorbell(client._session, 0), entries=entries,
                timeout_ms=0 if timeout is None else max(1, int(timeout * 1000)),
                traffic_class=client._traffic_class(traffic_class), table_ids=table_ids)
            for d in destinations:
                req.destinations.append(client._descriptor(d)._proto)
            self.id = client._call("CreateQueue", req).queue_id
        except BaseException:
            self.close()
            raise

    @property
    def inflight(self) -> int:
        return self._posted - self._reaped

    def post(self, src: _Source, length: int, *, dst_index: int = 0, src_offset: int = 0, dst_offset: int = 0,
             user_data: int = 0, notify: bool = False, tag: int = 0) -> None:
        """Queues one write of ``length`` bytes: [src_offset, +length) of region ``src``
        to [dst_offset, +length) of destination ``dst_index``. Bounds, ownership and
        tokens are the agent's to check; its verdict arrives through ``reap``."""
        self._post(src, src_offset, dst_offset, length, tag, dst_index, _FLAG_NOTIFY if notify else 0, 0, 0, user_data,
                   dict(length=length, src_offset=src_offset, dst_offset=dst_offset))

    def post_paged(self, src: _Source, block_size: int, blocks: int, *, table_index: int = 0, dst_index: int = 0,
                   src_base: int = 0, dst_base: int = 0, user_data: int = 0, notify: bool = False,
                   tag: int = 0) -> None:
        """Queues one paged write of ``blocks`` blocks of ``block_size`` bytes: block i
        copies from src_base + table[table_index + i] * block_size of region ``src`` to
        dst_base + table[table_index + blocks + i] * block_size of destination
        ``dst_index`` (the source ids, then the destination ids, in ``self.table``). The
        ids those entries name must stay as they are until the entries are reaped. The
        agent checks them as a ``Client.write`` of PagedChunks."""
        self._post(src, src_base, dst_base, block_size, tag, dst_index, _FLAG_PAGED | (_FLAG_NOTIFY if notify else 0),
                   table_index, blocks, user_data,
                   dict(block_size=block_size, src_base=src_base, dst_base=dst_base, table_index=table_index,
                        blocks=blocks))

    @staticmethod
    def batch_table_ids(parts: int, blocks: int, payload_bytes: int = 0, window: bool = False, windows: int = 0) -> int:
        """How many ids of the block table a ``post_batch`` of ``parts`` parts, ``blocks``
        block pairs and a ``payload_bytes`` payload (through a window, through ``windows``
        windows in spans, or neither) takes from its ``table_index``."""
        head = _WINDOW_IDS if window else (_WINDOW_SPANS_IDS + windows * _WINDOW_SPAN_IDS if windows else 0)
        return head + parts * _PART_IDS + 2 * blocks + (payload_bytes + 3) // 4

    def pack_parts(self, parts: Sequence[BatchPart]) -> BatchParts:
        """``post_batch``'s ``parts``, checked and packed once: a caller that posts the
        same parts for many requests (a KV producer: every layer, for each request) passes
        the result to ``post_batch`` instead of the list."""
        if not 1 <= len(parts) <= _MAX_BATCH_PARTS:
            raise errors.InvalidArgument(f"parts must hold 1..{_MAX_BATCH_PARTS} parts, got {len(parts)}")
        packed = bytearray(len(parts) * _PART.size)
        for i, part in enumerate(parts):
            try:
                src, dst_index, src_base, dst_base = part
                _PART.pack_into(packed, i * _PART.size, src.id, src_base, dst_base, dst_index, 0)
            except (TypeError, ValueError, AttributeError, struct.error) as e:
                raise errors.InvalidArgument(
                    f"parts[{i}] must be (Region, dst_index, src_base, dst_base) of unsigned integers: {e}") from None
        return BatchParts(bytes(packed))

    def post_batch(self, parts: Union[BatchParts, Sequence[BatchPart]], block_size: int, src_ids: Sequence[int],
                   dst_ids: Sequence[int], *, table_index: int = 0, user_data: int = 0, notify: bool = False,
                   tag: int = 0, payload: bytes = b"", window: Optional[RegionDescriptor] = None,
                   windows: Optional[Sequence[Tuple[RegionDescriptor, int]]] = None) -> None:
        """Queues one block mapping over several regions as one transfer (the queue's form
        of ``Client.write_batch``): ``parts`` are ``(src Region, dst_index, src_base,
        dst_base)``; part p's block i copies ``block_size`` bytes from src_base +
        src_ids[i] * block_size to dst_base + dst_ids[i] * block_size of destination
        dst_index (or ``parts`` from ``pack_parts``; ids as ``array.array("I")`` are
        copied as they are). Writes the parts and ids into ``self.table`` at ``table_index`` (they
        must stay as they are until the entry is reaped), then posts one entry: one
        completion, and with ``notify`` one notification (``tag``, ``payload`` of at most
        4 KiB) to the owner of part 0's destination once every part has landed. With
        ``window`` (a RegionDescriptor of a write window, from its owner: only its id and
        token are used), every part writes through that window of its destination's owner
        instead of with the destination's own token. With ``windows``, runs of the blocks
        go through different windows: ``(window descriptor, count)`` each, the next
        ``count`` blocks of the ids through that window (counts of at least 1 adding up to
        the ids'; at most 256 windows, and parts times windows at most 16,384): several
        requests' blocks in one write, each request through its own window. The agent
        refuses the whole entry if any window refuses its blocks."""
        if self.closed:
            raise errors.FailedPrecondition("this queue is closed")
        n = len(src_ids)
        if len(dst_ids) != n:
            raise errors.InvalidArgument(f"{n} source ids but {len(dst_ids)} destination ids; they must pair up")
        if not isinstance(parts, BatchParts):
            parts = self.pack_parts(parts)
        payload = bytes(payload)
        ref = b""
        if window is not None and windows is not None:
            raise errors.InvalidArgument("give window or windows, not both")
        if window is not None:
            ref = _window_ref(window, "window")
        elif windows is not None:
            ref = self._pack_spans(windows, n, parts.count)
        words = self.batch_table_ids(parts.count, n, len(payload)) + len(ref) // 4
        self._check_table_room("batch", table_index, words)
        at = self._table_offset + 4 * table_index
        self._map[at:at + len(ref)] = ref
        at += len(ref)
        self._map[at:at + len(parts.packed)] = parts.packed
        first = table_index + len(ref) // 4 + parts.count * _PART_IDS
        try:
            self.table[first:first + n] = _words(src_ids)
            self.table[first + n:first + 2 * n] = _words(dst_ids)
        except (TypeError, OverflowError) as e:
            raise errors.InvalidArgument(f"block ids must be integers in [0, 2**32): {e}") from None
        end = self._table_offset + 4 * (first + 2 * n)
        self._map[end:end + len(payload)] = payload
        flags = _FLAG_BATCH | (_FLAG_NOTIFY if notify else 0) | \
            (0 if not ref else _FLAG_WINDOW if window is not None else _FLAG_WINDOW_SPANS)
        self._post(_NO_REGION, len(payload), 0, block_size, tag, parts.count, flags, table_index, n, user_data,
                   dict(block_size=block_size))

    @staticmethod
    def _pack_spans(windows: Sequence[Tuple[RegionDescriptor, int]], blocks: int, parts: int) -> bytes:
        """post_batch's ``windows`` as the table holds them (a WindowSpans head, then a
        WindowSpan each), checked."""
        if not 1 <= len(windows) <= MAX_WINDOW_SPANS:
            raise errors.InvalidArgument(f"windows must hold 1..{MAX_WINDOW_SPANS} (window, count) pairs, "
                                         f"got {len(windows)}")
        if parts * len(windows) > MAX_WINDOW_SPAN_PARTS:
            raise errors.InvalidArgument(f"parts times windows are at most {MAX_WINDOW_SPAN_PARTS}, "
                                         f"got {parts} x {len(windows)}")
        out = bytearray(struct.pack("<II", len(windows), 0))
        total = 0
        for i, span in enumerate(windows):
            try:
                descriptor, count = span
            except (TypeError, ValueError):
                raise errors.InvalidArgument(f"windows[{i}] must be (window descriptor, block count)") from None
            if not isinstance(count, int) or count < 1:
                raise errors.InvalidArgument(f"windows[{i}]: the block count must be an integer >= 1, got {count!r}")
            out += _window_ref(descriptor, f"windows[{i}]") + struct.pack("<II", count, 0)
            total += count
        if total != blocks:
            raise errors.InvalidArgument(f"windows cover {total} blocks; the ids are {blocks} (they must add up)")
        return bytes(out)

    def post_message(self, payload: bytes, *, dst_index: int = 0, tag: int = 0, table_index: int = 0,
                     user_data: int = 0) -> None:
        """Queues a message (``Client.send_message`` without the RPC): the owner of
        destination ``dst_index`` gets a notification of kind "message" with ``tag`` and
        ``payload`` (at most 4 KiB). The payload goes into ``self.table`` at
        ``table_index``, where it must stay until the entry is reaped; the completion
        comes once the message was queued for its owner. Messages to one destination
        arrive in the order they were posted."""
        payload = bytes(payload)
        if len(payload) > _MAX_PAYLOAD:
            raise errors.InvalidArgument(f"the payload is {len(payload)} bytes; at most {_MAX_PAYLOAD}")
        words = (len(payload) + 3) // 4
        self._check_table_room("message", table_index, words)
        at = self._table_offset + 4 * table_index
        self._map[at:at + len(payload)] = payload
        self._post(_NO_REGION, len(payload), 0, 0, tag, dst_index, _FLAG_MESSAGE, table_index, 0, user_data, {})

    def post_open_window(self, region_ids: Sequence[int], ranges: Sequence[Tuple[int, int]], *, timeout: float,
                         dst_index: int = 0, table_index: int = 0, user_data: int = 0) -> None:
        """Queues ``Client.open_write_window`` without the RPC: a window over ``ranges``
        ((offset, length) byte ranges) of each of this client's regions ``region_ids``
        (registered with write_windows), for the owner of destination ``dst_index`` alone,
        closing by itself after ``timeout`` seconds. Its completion carries the window's
        id in ``transfer_id`` and its ``token``: what the writer's descriptors need. The
        window goes into ``self.table`` at ``table_index`` (4 + 2 per region + 4 per range
        ids), where it must stay until the entry is reaped. Entries are taken in order, so
        a message posted after the completion reaches the writer after the window opened."""
        if not (1 <= len(region_ids) <= _MAX_WINDOW_REGIONS and 1 <= len(ranges) <= _MAX_WINDOW_RANGES):
            raise errors.InvalidArgument(f"a window has 1..{_MAX_WINDOW_REGIONS} regions and 1..{_MAX_WINDOW_RANGES} "
                                         f"ranges, got {len(region_ids)} and {len(ranges)}")
        timeout_ms = int(timeout * 1000)
        if timeout_ms < 1:
            raise errors.InvalidArgument(f"timeout must be at least 1 ms, got {timeout!r} s")
        try:
            packed = (_WINDOW_OPEN.pack(timeout_ms, len(region_ids), len(ranges)) +
                      struct.pack(f"<{len(region_ids)}Q", *region_ids) +
                      struct.pack(f"<{2 * len(ranges)}Q", *(v for r in ranges for v in r)))
        except (struct.error, TypeError) as e:
            raise errors.InvalidArgument(f"region ids and ranges must be unsigned 64-bit integers: {e}") from None
        self._check_table_room("window", table_index, len(packed) // 4)
        at = self._table_offset + 4 * table_index
        self._map[at:at + len(packed)] = packed
        self._post(_NO_REGION, 0, 0, 0, 0, dst_index, _FLAG_OPEN_WINDOW, table_index, 0, user_data, {})
        self._opening.add(user_data)

    def post_close_window(self, window_id: int, *, wait: float = 1.0, user_data: int = 0) -> None:
        """Queues ``WriteWindow.close`` without the RPC: the window closes, and its completion
        comes once no byte of any write through it can land any more, or after ``wait``
        seconds with DeadlineExceeded (the window is closed all the same; close again to
        wait again)."""
        self._post(_NO_REGION, window_id, 0, max(0, int(wait * 1000)), 0, 0, _FLAG_CLOSE_WINDOW, 0, 0, user_data,
                   {"window_id": window_id})

    def _check_table_room(self, what: str, table_index: int, words: int) -> None:
        """That ``words`` table ids from ``table_index`` fit, and that a slot is free
        (checked before the table is written: entries in flight may still use it)."""
        if self.closed:
            raise errors.FailedPrecondition("this queue is closed")
        if not (isinstance(table_index, int) and 0 <= table_index and table_index + words <= len(self.table)):
            raise errors.InvalidArgument(f"the {what} needs {words} table ids from table_index {table_index!r}; "
                                         f"the queue's table has {len(self.table)} (create_queue's table_ids)")
        if self._posted - self._reaped >= self._entries:
            raise errors.ResourceExhausted(
                f"the queue already has {self._entries} writes in flight; reap completions first")

    def _post(self, src: _Source, src_offset: int, dst_offset: int, length: int, tag: int, dst_index: int,
              flags: int, table_index: int, blocks: int, user_data: int, named: Dict[str, object]) -> None:
        if self.closed:
            raise errors.FailedPrecondition("this queue is closed")
        if self._posted - self._reaped >= self._entries:
            _refuse(src, user_data=user_data, tag=tag, dst_index=dst_index, **named)  # a bad argument says so
            raise errors.ResourceExhausted(
                f"the queue already has {self._entries} writes in flight; reap completions first")
        # The slot's last entry was reaped, so the agent is done with it; struct checks
        # every value's type and range (a refused entry is never published).
        slot = _SUBMIT_OFFSET + (self._posted & (self._entries - 1)) * _SUBMIT.size
        try:
            _SUBMIT.pack_into(self._map, slot, user_data, src.id, src_offset, dst_offset, length, tag, dst_index, flags,
                              table_index, blocks)
        except (AttributeError, struct.error):
            _refuse(src, user_data=user_data, tag=tag, dst_index=dst_index, **named)
            raise
        self._posted += 1
        self._words[_SQ_TAIL // 4] = self._posted & 0xFFFFFFFF  # after the entry: x86 keeps store order
        store_load_fence()
        if self._words[_AGENT_SLEEPING // 4]:
            os.eventfd_write(self._submit_fd, 1)

    def reap(self, max_count: int = 64, timeout: float = 1.0, min_count: int = 1,
             spin: float = 0.0) -> List[Completion]:
        """Returns up to ``max_count`` completions, waiting up to ``timeout`` seconds
        until at least ``min_count`` are ready (never for more than are in flight), then
        whatever there is. ``spin``: seconds to poll the ring before sleeping on the
        doorbell (for a thread with a core of its own)."""
        if self.closed:
            raise errors.FailedPrecondition("this queue is closed")
        want = max(1, min(min_count, max_count, self.inflight))
        now = time.monotonic()
        deadline, spin_until = now + timeout, now + min(spin, timeout)
        while self._ready() < want:
            now = time.monotonic()
            if now < spin_until:
                continue
            if now >= deadline:
                break
            self._sleep_on(self._complete_fd, _CLIENT_WAITING, want, self._ready, deadline)
        return self._take(max_count)

    def close(self) -> None:
        """Unmaps the ring and closes its fds. Writes still in flight complete in the
        agent; their completions are not read. The agent drops the queue with the session."""
        table = getattr(self, "table", None)
        if table is not None:
            table.release()
        super().close()

    # ------------------------------------------------------------------ plumbing

    def _ready(self) -> int:
        return (self._words[_CQ_TAIL // 4] - self._reaped) & 0xFFFFFFFF

    def _take(self, max_count: int) -> List[Completion]:
        out: List[Completion] = []
        n = min(self._ready(), max_count)
        ring, unpack, mask, size = self._map, _COMPLETION_HEAD.unpack_from, self._entries - 1, _COMPLETION.size
        for r in range(self._reaped, self._reaped + n):
            slot = self._cq_offset + (r & mask) * size
            user_data, transfer_id, nbytes, duration_ns, code, path = unpack(ring, slot)
            error = None
            if code != 0:
                message = _MESSAGE.unpack_from(ring, slot + _COMPLETION_HEAD.size)[0]
                error = errors.from_code(code, message.split(b"\0", 1)[0].decode("utf-8", "replace"))
            token = b""
            if user_data in self._opening:
                self._opening.discard(user_data)
                if error is None:
                    token = _MESSAGE.unpack_from(ring, slot + _COMPLETION_HEAD.size)[0][:16]
            out.append(Completion(user_data, transfer_id, nbytes, error, PATH_NAMES.get(path, ""), duration_ns / 1e9,
                                  token))
        if n:
            self._reaped += n
            self._words[_CQ_HEAD // 4] = self._reaped & 0xFFFFFFFF
        return out

