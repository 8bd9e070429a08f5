"""KV-cache handoff between a producer (prefill) and a consumer (decode), push model,
with no side channel: the core a serving engine's KV connector drives (no engine import).

Each side holds one region per layer, in the FlashAttention layout
``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (K half, then V half; one half
for MLA caches). The producer publishes a small mailbox region's descriptor (in vLLM, in
the request's kv_transfer_params); the consumer sends it, through the agents (message
entries of a write queue to that mailbox: no RPC, in order): once per producer its
layout and layer descriptors (HELLO), then per request the blocks it wants filled
(PULL). The producer answers a PULL with one batch write — the request's blocks in every
layer, K and V, as one transfer — whose notification names the request; the consumer
counts it as received. The PULLs of one consumer that the producer reads together (a
decode step's, while it answered earlier ones) share one such write, whose notification
names them all. Both sides read their notifications from their session's inbox (shared
memory, no stream): the consumer when polled, the producer as they arrive, on a
responder thread that sleeps on the inbox's doorbell. The write goes
as a batch entry of a write queue to that consumer (no RPC: the parts and block ids go
through shared memory), or as one ``write_batch`` RPC where a queue cannot take it (more
than 64 layers, a full queue or block table).

    spec = KVCacheSpec(num_blocks=4096, block_bytes=32768, halves=2)
    producer = KVProducer(client, spec, layer_regions, engine_id="prefill-0")
    producer.hold("req-1", src_block_ids, lease=30.0)      # after prefill
    params = {"mailbox": producer.mailbox.hex(), ...}       # to the consumer
    consumer = KVConsumer(client, spec, layer_regions, engine_id="decode-0")
    consumer.pull("req-1", bytes.fromhex(params["mailbox"]), dst_block_ids, skip=0)
    # or a decode step's at once: consumer.pull_many([PullRequest("req-1", mailbox, ids), ...])
    ... producer.poll() -> Progress(done={"req-1"}, failed={})   # blocks may be freed
    ... consumer.poll() -> Progress(done={"req-1"}, failed={})   # blocks may be used

A consumer that gives a request up (an abort) sends CANCEL: a producer that has not
started the write drops the request and says so; one that has, lets the write answer.
A long request's block ids span several PULL messages (4 KiB each).

A consumer whose layer regions are in window mode (registered with write_windows) opens
a write window over each pulled request's blocks for that producer alone, as an entry of
its queue to the producer (a step's opens together, in pull_many), the PULL carrying it;
the window is closed before poll() reports the request, so nothing lands in its blocks
afterwards, however late the producer's write comes.

Failures are reported, never waited on forever: a PULL that does not match what the
producer holds (unknown request, block counts, layouts) fails that request on the
producer and, through a notification with an error code, on the consumer; a consumer
that never pulls lets the lease expire (the producer frees the blocks); a consumer that
hears nothing before its timeout reports the request failed; a consumer whose producer's
mailbox is gone (PING refused) reports its requests failed within about a second.

The messages' bytes are defined once, in ferry/_kv_wire.py.
"""
from __future__ import annotations

import array
import dataclasses
import hmac
import logging
import queue
import secrets
import struct
import threading
import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple, Union

from . import _kv_wire as wire
from . import errors
from .client import Client, Region, RegionDescriptor, TransferFuture, WriteWindow
from .write_queue import Completion, _words

logger = logging.getLogger("ferry.kv_handoff")
# A consumer waiting this long on a producer sends its mailbox an empty PING, once per
# such interval: a mailbox that is gone (its pod ended, its agent restarted) refuses it,
# and the consumer fails that producer's requests at once, not at its timeout.
_PROBE_S = 1.0
# A request's write window outlives the consumer's own timeout by this much (the consumer
# closes it when it gives up; this bounds a window whose consumer never does), and a close
# waits this long for the agent's copies into it to end.
_WINDOW_SLACK_S = 5.0
_WINDOW_CLOSE_S = 2.0
# KVConsumer.poll()'s reason for a request given up with cancel(): its blocks may be reused.
CANCELLED = "cancelled"
# What this consumer's HELLO says it can take (wire.FEATURES; a test may say less).
_FEATURES = wire.FEATURES


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
    done: set = dataclasses.field(default_factory=set)
    failed: Dict[str, str] = dataclasses.field(default_factory=dict)


def _block_ids(ids: Sequence[int], num_blocks: int) -> array.array:
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


def _secret_matches(held: "_Held", secret: bytes) -> bool:
    return hmac.compare_digest(held.secret, secret)


class _SessionInbox:
    """A session's notifications, read from its inbox (shared memory, ferry.inbox) when
    polled: no thread, no RPC. A session has one inbox, so a client's producer and
    consumer share it: each reads the notifications of its own regions (an _Inbox), and
    those of regions neither has are dropped."""
    _by_session: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, client: Client) -> "_SessionInbox":
        shared = cls._by_session.get(client._session)
        if shared is None:
            shared = cls._by_session[client._session] = cls(client)
        return shared

    def __init__(self, client: Client):
        self._inbox = client.open_inbox(slots=256)
        self.readers: List[set] = []  # each reader's region ids
        self._kept: list = []  # notifications another reader has not taken yet
        self._lock = threading.Lock()  # a producer's responder thread takes too

    def take(self, mine: set) -> list:
        with self._lock:
            pending = self._kept + self._inbox.poll(max_count=1 << 20)
            others = set().union(*(r for r in self.readers if r is not mine))
            self._kept = [n for n in pending if n.region_id in others and n.region_id not in mine]
            return [n for n in pending if n.region_id in mine]

    def wait(self, timeout: float) -> None:
        """Returns once the ring holds something (for any reader) or after ``timeout``;
        takes nothing. Only the producer's responder waits; the others only poll."""
        self._inbox.poll(max_count=0, timeout=timeout)

    def leave(self, mine: set) -> None:
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

    def drain(self) -> list:
        """What arrived for these regions since the last call, in order."""
        return self._shared.take(self._mine)

    def wait(self, timeout: float) -> None:
        self._shared.wait(timeout)

    def close(self) -> None:
        self._shared.leave(self._mine)


@dataclasses.dataclass
class _Held:
    src_ids: array.array
    expires: float
    secret: bytes  # what a PULL or CANCEL of this request must carry (hold's return value)
    future: Optional[object] = None  # the write in flight: a TransferFuture, or _QUEUED
    dst_ids: Optional[array.array] = None  # a long pull's ids, as its messages arrive
    dst_pieces: Optional[Dict[int, int]] = None  # which of them arrived: first id -> count
    answer_to: Optional[tuple] = None  # (consumer's first descriptor, its id for the request), once pulled


_ACCEPTED = object()  # _Held.future of a valid pull not written yet (KVProducer._write)
_QUEUED = object()  # _Held.future of a write posted to a _ConsumerQueue
# At most this many blocks in one write of several requests' pulls (4k tokens of 16-token
# blocks; 512 MiB of a Llama-3-8B-shaped cache): past that a write's bytes outweigh its
# fixed cost, and a shared write starts later than its first pull's own would have
# (4 requests of 4k tokens sharing writes with no cap: 3-14 % slower, one H100). A
# request this long or longer is written alone.
_MERGED_BLOCKS = 256


@dataclasses.dataclass
class _Pull:
    """A valid pull, to be written with the others of its consumer read in one pass."""
    consumer: str
    rid: str
    held: _Held
    src_ids: array.array
    dst_ids: array.array
    reply: bytes  # the consumer's id for the request
    window: bytes = b""  # the consumer's write window for it (wire.WINDOW_BYTES), if any


def _through_window(descriptor: RegionDescriptor, window: bytes) -> RegionDescriptor:
    """A consumer's layer descriptor, writing through its write window (a PULL's)."""
    d = RegionDescriptor.from_bytes(descriptor.to_bytes())
    d._proto.window_id = struct.unpack_from("<Q", window)[0]
    d._proto.token = window[8:]
    return d


def _block_ranges(ids: Sequence[int], spec: "KVCacheSpec") -> List[Tuple[int, int]]:
    """The byte ranges (offset, length) of blocks `ids` in each half of a layer's region:
    runs of consecutive ids as one range."""
    runs: List[Tuple[int, int]] = []
    for i in sorted(ids):
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    half = spec.num_blocks * spec.block_bytes
    return [(h * half + first * spec.block_bytes, count * spec.block_bytes)
            for h in range(spec.halves) for first, count in runs]


class _ConsumerQueue:
    """A write queue to one consumer's layers, whose block table is handed out in ranges:
    a request's range stays its own until its completion is reaped."""
    ENTRIES, TABLE_IDS = 64, 1 << 20  # 4 MiB of ids: a 64-part request of 16,384 blocks 30 times over

    def __init__(self, client: Client, descriptors: list, parts: list):
        self.queue = client.create_queue(descriptors, entries=self.ENTRIES, table_ids=self.TABLE_IDS)
        self._parts = self.queue.pack_parts(parts)  # every request writes the same layer halves
        self._next = 0
        self._ranges: Dict[int, tuple] = {}  # user_data -> (request ids, first id, end)
        self._user_data = 0

    def post(self, rids: List[str], block_bytes: int, src_ids, dst_ids, payload: bytes, window=None) -> bool:
        """Posts the requests' batch entry (through the consumer's write ``window``, if
        any); False when the queue or its table is full (or refused the entry)."""
        words = self.queue.batch_table_ids(self._parts.count, len(src_ids), len(payload), window=window is not None)
        if self.queue.inflight >= self.ENTRIES or words > self.TABLE_IDS:
            return False
        for start in (self._next, 0):  # after the last request's range, else from the start
            end = start + words
            if end <= self.TABLE_IDS and all(end <= a or start >= b for _, a, b in self._ranges.values()):
                break
        else:
            return False
        self._user_data += 1
        try:
            self.queue.post_batch(self._parts, block_bytes, src_ids, dst_ids, table_index=start,
                                  user_data=self._user_data, notify=True, tag=wire.DONE, payload=payload, window=window)
        except errors.FerryError:
            return False  # the caller's write_batch says what is wrong, if anything
        self._ranges[self._user_data] = (rids, start, end)
        self._next = end
        return True

    def busy(self) -> bool:
        return bool(self._ranges)

    def reap(self) -> List[Tuple[str, Optional[str]]]:
        """(request id, None or the error) of each request whose write completed since the
        last call."""
        out: List[Tuple[str, Optional[str]]] = []
        for c in self.queue.reap(max_count=self.ENTRIES, timeout=0):
            rids, _, _ = self._ranges.pop(c.user_data)
            out.extend((rid, None if c.error is None else f"writing the blocks failed: {c.error}") for rid in rids)
        return out


class _Mailbox:
    """A write queue to one producer's mailbox, for the consumer's messages to it (HELLO,
    PULL, CANCEL) as message entries: no RPC, delivered in order. Each message in flight
    has its own 4 KiB of the block table. 64 in flight: a decode step that schedules many
    requests from one producer sends their pulls at once (with 16, the 17th waited for the
    first's delivery: 64 pulls took 4-6 ms to send on the 2-CPU VM).

    The same queue opens and closes the consumer's write windows for that producer (window
    entries: no RPC, where the two RPCs of a request cost ~0.5 ms each through grpcio).
    Entries posted together run together; an open's completion (the window's id and token)
    is awaited before the PULL that carries it is sent. An open takes a message's table
    slot when it fits (up to ~220 ranges over 64 layers), else the table's last WINDOW_IDS
    ids, one such open at a time (up to MAX_WINDOW_RANGES ranges over 256 layers)."""
    ENTRIES, SLOT_IDS = 64, wire.MAX_PAYLOAD // 4
    MAX_WINDOW_RANGES = 4096
    WINDOW_IDS = 4 + 2 * 256 + 4 * MAX_WINDOW_RANGES
    WAIT = 1.0  # seconds send() waits for a free entry before it gives up
    _WINDOW = -1  # the "kind" of a window entry in _sent

    def __init__(self, client: Client, mailbox: bytes):
        self.queue = client.create_queue([mailbox], entries=self.ENTRIES,
                                         table_ids=self.ENTRIES * self.SLOT_IDS + self.WINDOW_IDS)
        self._free = list(range(self.ENTRIES))  # table slots
        self._sent: Dict[int, tuple] = {}  # user_data -> (slot, kind, request id)
        self._user_data = 0
        self.failed: List[tuple] = []  # (kind, request id, error) of messages the agent refused
        self._windows_done: Dict[int, Completion] = {}  # user_data -> a window entry's completion
        self._abandoned: set = set()  # window entries whose caller stopped waiting
        self._area_user = 0  # the window open entry in the table's window area, if any

    def send(self, kind: int, body: bytes, rid: Optional[str] = None) -> None:
        if not self._free:
            self._reap(self.WAIT)
        if not self._free:
            raise errors.ResourceExhausted(f"{self.ENTRIES} messages to this producer are still being delivered")
        slot = self._free.pop()
        self._user_data += 1
        self.queue.post_message(wire.frame(kind, body), table_index=slot * self.SLOT_IDS, user_data=self._user_data)
        self._sent[self._user_data] = (slot, kind, rid)

    def post_open_window(self, region_ids: Sequence[int], ranges: Sequence[Tuple[int, int]], timeout: float) -> int:
        """Starts opening a write window for the producer (the queue's destination);
        window_ref(the returned id) waits for it. Opens posted together run together: each
        in a message's table slot when it fits, else in the table's window area, one at a
        time."""
        slot: Optional[int] = None
        if 4 + 2 * len(region_ids) + 4 * len(ranges) <= self.SLOT_IDS:
            if not self._free:
                self._reap(self.WAIT)
            if not self._free:
                raise errors.ResourceExhausted(f"{self.ENTRIES} entries to this producer are still in flight")
            free = self._free.pop()
            slot, table_index = free, free * self.SLOT_IDS
        else:
            deadline = time.monotonic() + self.WAIT
            while self._area_user in self._sent and time.monotonic() < deadline:
                self._reap(deadline - time.monotonic())
            if self._area_user in self._sent:
                raise errors.DeadlineExceeded(f"the agent did not take a write window's entry in {self.WAIT} s")
            table_index = self.ENTRIES * self.SLOT_IDS
        try:
            ud = self._post_window_entry(lambda ud: self.queue.post_open_window(
                region_ids, ranges, timeout=timeout, table_index=table_index, user_data=ud), slot)
        except BaseException:
            if slot is not None:
                self._free.append(slot)
            raise
        if slot is None:
            self._area_user = ud
        return ud

    def window_ref(self, ud: int) -> bytes:
        """The window open entry ``ud`` opened, as a PULL carries it (wire.WINDOW_BYTES).
        Raises the agent's refusal."""
        c = self.await_window_entry(ud, self.WAIT)
        return struct.pack("<Q", c.transfer_id) + c.token

    def post_close_window(self, window_id: int, wait: float) -> int:
        """Starts closing window ``window_id``; await_window_entry(the returned id) returns
        once nothing can land through it any more, or raises DeadlineExceeded when writes
        through it still moved after ``wait``. Closes posted together run together."""
        return self._post_window_entry(lambda ud: self.queue.post_close_window(window_id, wait=wait, user_data=ud))

    def _post_window_entry(self, post, slot: Optional[int] = None) -> int:
        if len(self._sent) >= self.ENTRIES:
            self._reap(self.WAIT)
        self._user_data += 1
        ud = self._user_data
        post(ud)
        self._sent[ud] = (slot, self._WINDOW, None)
        return ud

    def await_window_entry(self, ud: int, wait: float) -> Completion:
        """The completion of window entry ``ud``, waiting up to ``wait`` seconds; raises
        its error, or DeadlineExceeded."""
        deadline = time.monotonic() + wait
        while ud not in self._windows_done and time.monotonic() < deadline:
            self._reap(deadline - time.monotonic())
        c = self._windows_done.pop(ud, None)
        if c is None:  # the agent did not answer in time: the entry is still the queue's
            self._abandoned.add(ud)
            raise errors.DeadlineExceeded(f"the agent did not answer a write window's entry in {wait} s")
        if c.error is not None:
            raise c.error
        return c

    def _reap(self, timeout: float) -> None:
        for c in self.queue.reap(max_count=self.ENTRIES, timeout=timeout):
            slot, kind, rid = self._sent.pop(c.user_data)
            if kind == self._WINDOW:
                if slot is not None:
                    self._free.append(slot)
                if c.user_data in self._abandoned:
                    self._abandoned.discard(c.user_data)
                else:
                    self._windows_done[c.user_data] = c
                continue
            self._free.append(slot)
            if c.error is not None:
                self.failed.append((kind, rid, c.error))

    def take_failed(self) -> List[tuple]:
        """The messages refused or undeliverable since the last call."""
        if self._sent:
            self._reap(0)
        out, self.failed = self.failed, []
        return out

    def close(self) -> None:
        self.queue.close()


class _QueueWindow:
    """A write window the consumer opened through a producer's mailbox queue."""

    def __init__(self, mailbox: _Mailbox, window_id: int):
        self.mailbox, self.id = mailbox, window_id

    def close(self, wait: float) -> None:
        self.mailbox.await_window_entry(self.mailbox.post_close_window(self.id, wait), wait + _Mailbox.WAIT)


class KVProducer:
    """The prefill side: holds requests' blocks until their consumer pulls them.

    With ``background`` (the default) a thread answers each pull for a held request as it
    arrives, so that the write starts at once rather than at the engine's next poll(): a
    prefill engine polls once per step, and its steps (forward passes of other requests)
    last tens of milliseconds. A pull for a request not held yet (its consumer can be
    faster than this engine's next step, which holds it) waits for poll(), as does
    everything after it. poll() reports what was done and answers what is left; every
    method may be called from the engine's thread while the responder runs."""

    def __init__(self, client: Client, spec: KVCacheSpec, layers: Sequence[Region], engine_id: str,
                 background: bool = True):
        for i, r in enumerate(layers):
            if r.size < spec.region_bytes:
                raise ValueError(f"layer {i}'s region has {r.size} bytes; the spec needs {spec.region_bytes}")
        self._client, self._spec, self._layers, self.engine_id = client, spec, list(layers), engine_id
        self._mailbox_region = client.register_host(4096)  # its descriptor is only a way to reach us
        self.mailbox = self._mailbox_region.descriptor()
        self._consumers: Dict[str, list] = {}  # consumer id -> its layer descriptors
        self._consumer_specs: Dict[str, KVCacheSpec] = {}
        self._consumer_features: Dict[str, int] = {}  # consumer id -> its HELLO's _FEATURES
        self._queues: Dict[str, Optional[_ConsumerQueue]] = {}  # consumer id -> its queue (None: write_batch)
        self._retired: List[_ConsumerQueue] = []  # replaced queues with writes still in flight
        self._held: Dict[str, _Held] = {}
        self._written: "queue.Queue" = queue.Queue()  # (request id, None or why it failed)
        self._inbox = _Inbox(client, [self._mailbox_region])
        # Everything above that changes is the responder's and the engine's: one at a time.
        self._lock = threading.Lock()
        self._answered = Progress()  # what the responder's answers decided, for the next poll()
        self._deferred: List[bytes] = []  # messages the responder left for poll(), in order
        self._refusals: Dict[str, _Bucket] = {}  # consumer id -> its refusals of pulls that end nothing
        self._unsent_refusals = 0  # skipped past a bucket since the last poll()
        self._stopping = threading.Event()
        self._responder = None
        if background:
            self._responder = threading.Thread(target=self._respond, name=f"ferry-kv-{engine_id}", daemon=True)
            self._responder.start()

    def hold(self, request_id: str, src_block_ids: Sequence[int], lease: float = 30.0,
             secret: Optional[bytes] = None) -> bytes:
        """Keeps ``src_block_ids`` (this request's blocks, in token order) for a consumer
        to pull within ``lease`` seconds. Returns the request's secret (``secret``, or a
        new random one): only a PULL or CANCEL that carries it is answered, so whoever else
        holds this producer's mailbox cannot take or drop the request. Hand it to the
        consumer with the request (FerryConnector: kv_transfer_params)."""
        ids = _block_ids(src_block_ids, self._spec.num_blocks)
        if ids is src_block_ids:  # the caller's own array, which it may change: keep a copy
            ids = array.array("I", ids)
        secret = secret if secret is not None else new_request_secret()
        if not 16 <= len(secret) <= 64:
            raise ValueError(f"a request secret has 16..64 bytes, got {len(secret)}")
        with self._lock:
            self._held[request_id] = _Held(ids, time.monotonic() + lease, secret)
        return secret

    def _respond(self) -> None:
        """The responder thread: waits on the inbox's doorbell, answers what arrived. An
        error it did not foresee is reported (under the empty id) and the thread goes on:
        the producer must keep answering its other consumers."""
        while not self._stopping.is_set():
            try:
                self._inbox.wait(0.05)  # bounded: close() stops it within 50 ms
                with self._lock:
                    self._answer(self._answered, early=True)
            except Exception as e:  # noqa: BLE001 - anything a message can provoke
                logger.exception("KVProducer: answering messages failed")
                with self._lock:
                    self._answered.failed.setdefault("", f"answering messages failed: {e!r}")

    def _answer(self, progress: Progress, early: bool = False) -> None:
        """Handles the messages that arrived, in order; ``early`` (the responder) leaves
        those that name a request not held yet for poll(), in their order, and answers the
        rest now: a pull that came before its hold waits for the hold, and a flood of
        pulls for requests that do not exist delays no pull of one that does."""
        pending = self._deferred + [n.payload for n in self._inbox.drain() if n.kind == "message"]
        self._deferred = []
        accepted: List[_Pull] = []
        for payload in pending:
            if early and not self._knows_request(payload):
                self._deferred.append(payload)
                continue
            self._on_message(payload, progress, accepted)
        self._write(accepted, progress)
        if not early and self._unsent_refusals:
            progress.failed.setdefault("", f"{self._unsent_refusals} refusals of pulls that ended no request were not "
                                           f"sent (more than {_Bucket.RATE:.0f} a second to one consumer)")
            self._unsent_refusals = 0

    def _refuse_unattributed(self, consumer: str, answer_to: tuple, why: str) -> None:
        """Tells a consumer its pull ended no request (unknown, or without the request's
        secret), at most _Bucket's rate per consumer: anyone holding the mailbox's
        descriptor can send such pulls, and each answer is a message of ours."""
        bucket = self._refusals.setdefault(consumer, _Bucket())
        if bucket.take():
            refuse(self._client, answer_to, why)
        else:
            self._unsent_refusals += 1

    def _knows_request(self, payload: bytes) -> bool:
        """False for a pull or cancel of a request this producer does not hold (yet)."""
        try:
            rid = wire.requested(payload)
            return rid is None or rid in self._held
        except (ValueError, struct.error, UnicodeDecodeError, IndexError):
            return True  # malformed: _on_message says so

    def poll(self) -> Progress:
        """Answers pulls, and returns the requests whose blocks may now be freed: written
        (done), or failed (bad pull, failed write, lease expired)."""
        with self._lock:
            progress, self._answered = self._answered, Progress()
            self._answer(progress)
            self._reap(progress)
            return progress

    def _reap(self, progress: Progress) -> None:
        live = [q for q in self._queues.values() if q is not None]
        written = [w for q in live + self._retired for w in q.reap()]
        for q in [q for q in self._retired if not q.busy()]:
            self._retired.remove(q)
            q.queue.close()
        while True:
            try:
                written.append(self._written.get_nowait())
            except queue.Empty:
                break
        for rid, why in written:
            held = self._held.pop(rid, None)
            if why is None:
                progress.done.add(rid)
            else:
                progress.failed[rid] = why
                if held is not None:  # the agent tells the consumer of a failed write, not of a refused one
                    self._tell_refused(held, why)
        now = time.monotonic()
        for rid, h in list(self._held.items()):
            if h.future is None and now > h.expires:
                del self._held[rid]
                progress.failed[rid] = "no consumer pulled the blocks before the lease expired"

    def _on_message(self, payload: bytes, progress: Progress, accepted: List[_Pull]) -> None:
        try:
            kind, body = wire.parse(payload)
            if kind == wire.HELLO:
                self._on_hello(wire.Hello.decode(body))
            elif kind == wire.PULL:
                self._on_pull(wire.Pull.decode(body), progress, accepted)
            elif kind == wire.CANCEL:
                self._on_cancel(wire.Cancel.decode(body), progress)
            elif kind == wire.PING:
                pass  # the consumer only needed it delivered
            else:
                raise ValueError(f"unknown message kind {kind}")
        except (ValueError, struct.error, UnicodeDecodeError, IndexError, errors.FerryError) as e:
            # Not attributable to a request: reported under the empty id.
            progress.failed.setdefault("", f"a message was refused: {e}")

    def _on_hello(self, hello: wire.Hello) -> None:
        consumer, first, total, features = hello.consumer, hello.first, hello.total, hello.features
        spec = KVCacheSpec(hello.num_blocks, hello.block_bytes, hello.halves)
        descriptors = [RegionDescriptor.from_bytes(d) for d in hello.descriptors]  # parsed once, not per write
        if spec.block_bytes != self._spec.block_bytes or spec.halves != self._spec.halves:
            raise ValueError(f"consumer {consumer}'s blocks are {spec.block_bytes} bytes x {spec.halves} halves; "
                             f"this producer's are {self._spec.block_bytes} x {self._spec.halves}")
        # The block count sets every write's destination offsets: it must fit the regions
        # the consumer registered (their descriptors carry the agent's sizes).
        if spec.num_blocks <= 0:
            raise ValueError(f"consumer {consumer}'s HELLO claims {spec.num_blocks} blocks")
        for d in descriptors:
            if d.size < spec.region_bytes:
                raise ValueError(f"consumer {consumer}'s HELLO claims {spec.num_blocks} blocks ({spec.region_bytes} "
                                 f"bytes a layer), but its layer region has {d.size} bytes")
        if total != len(self._layers):
            raise ValueError(f"consumer {consumer} has {total} layers; this producer has {len(self._layers)}")
        if first + len(descriptors) > total:
            raise ValueError(f"consumer {consumer}'s HELLO carries layers {first}..{first + len(descriptors) - 1} "
                             f"of {total}")
        slots = self._consumers.setdefault(consumer, [None] * total)
        slots[first:first + len(descriptors)] = descriptors
        self._consumer_specs[consumer] = spec
        self._consumer_features[consumer] = features
        # New descriptors (a consumer that reconnected): a new queue at the next write; the
        # old one's writes in flight are still reaped.
        old = self._queues.pop(consumer, None)
        if old is not None:
            self._retired.append(old)

    def _on_pull(self, pull: wire.Pull, progress: Progress, accepted: List[_Pull]) -> None:
        """Checks a PULL against the held request; a complete, valid one joins
        ``accepted``, written by _write once every message that arrived is read."""
        consumer, rid, reply, secret = pull.consumer, pull.request, pull.reply, pull.secret
        skip, total, first, chunk = pull.skip, pull.total, pull.first, pull.ids
        held = self._held.get(rid)
        descriptors = self._consumers.get(consumer)
        if held is not None and not _secret_matches(held, secret):
            # Not the request's consumer (or one from before secrets): the request stays
            # held for the one that has it.
            progress.failed.setdefault("", f"a pull of request {rid} by consumer {consumer} without the "
                                           "request's secret was refused")
            if descriptors is not None and all(d is not None for d in descriptors):
                self._refuse_unattributed(consumer, (descriptors[0], reply),
                                          f"request {rid}'s pull lacks its secret (kv_transfer_params' "
                                          "ferry_request_secret); a consumer older than this producer's ferry must "
                                          "be upgraded")
            return
        if held is not None and held.future is None and total == len(held.src_ids) - skip and \
                first + len(chunk) <= total:
            # A long request's block ids come in several messages: gather them.
            ids, pieces = held.dst_ids, held.dst_pieces
            if ids is None or pieces is None or len(ids) != total:
                ids, pieces = array.array("I", bytes(4 * total)), {}
                held.dst_ids, held.dst_pieces = ids, pieces
            ids[first:first + len(chunk)] = chunk
            pieces[first] = len(chunk)
            covered = 0
            for at in sorted(pieces):  # complete when the pieces tile 0..total
                if at != covered:
                    break
                covered += pieces[at]
            if covered != total:
                return
            dst_ids = ids
        else:
            dst_ids = chunk
        why = None
        if held is None or held.future is not None:
            why = f"request {rid} is not held here (unknown, already pulled, or its lease expired)"
        elif descriptors is None or any(d is None for d in descriptors):
            why = f"consumer {consumer} has not introduced itself (HELLO) completely"
        elif skip + len(dst_ids) != len(held.src_ids):
            why = (f"the consumer asks for {len(dst_ids)} blocks after skipping {skip}, "
                   f"but request {rid} has {len(held.src_ids)}")
        else:
            limit = self._consumer_specs[consumer].num_blocks
            if dst_ids and max(dst_ids) >= limit:
                why = f"destination block id {max(dst_ids)} is outside the consumer's 0..{limit - 1}"
        if why is not None:
            ends_request = held is not None and held.future is None
            if ends_request:
                del self._held[rid]
                progress.failed[rid] = why
            if descriptors is not None and all(d is not None for d in descriptors):
                if ends_request:
                    refuse(self._client, (descriptors[0], reply), why)
                else:
                    self._refuse_unattributed(consumer, (descriptors[0], reply), why)
            return
        assert held is not None and descriptors is not None  # else `why` was set above
        if not dst_ids:  # the consumer had every block already
            del self._held[rid]
            progress.done.add(rid)
            self._client.send_message(descriptors[0], reply.encode(), tag=wire.DONE)
            return
        held.answer_to = (descriptors[0], reply)
        held.future = _ACCEPTED
        accepted.append(_Pull(consumer, rid, held, held.src_ids[skip:], dst_ids, reply.encode(), pull.window))

    def _write(self, accepted: List[_Pull], progress: Progress) -> None:
        """Writes the pulls read in one pass over the inbox: those of one consumer as one
        batch write — their blocks together, in every layer half — whose notification
        names them all, up to _MERGED_BLOCKS blocks and a payload's 4 KiB of names. Pulls
        that arrive while the producer answers others gather in the inbox, and a write
        each cost the clients and the agent ~50-100 µs beyond its bytes: 64 requests of
        256 tokens took a third less time so (tools/bench/RESULTS.md). A pull that names a
        destination block an earlier one in the write names (a write may fill a block
        once) starts a new write, as it was written before pulls shared writes; only one
        consumer's pulls share a write, so its mistakes fail only its own requests. A
        consumer from before shared writes (no SHARED_WRITES in its HELLO) gets a write
        per pull."""
        # consumer -> the pulls of its next write, their block count, their destination
        # blocks (while another pull may join), and their names' bytes
        runs: Dict[str, tuple] = {}
        for pull in accepted:
            if self._held.get(pull.rid) is not pull.held:  # cancelled after its PULL, in the same pass
                continue
            if pull.window or not self._consumer_features.get(pull.consumer, 0) & wire.SHARED_WRITES:
                # A request in its own window is written alone: a write goes through one window.
                self._write_run(pull.consumer, [pull], progress)
                continue
            run, count, blocks, names = runs.get(pull.consumer, ([], 0, set(), 1))
            if run and (count + len(pull.dst_ids) > _MERGED_BLOCKS or names + 2 + len(pull.reply) > wire.MAX_PAYLOAD or
                        not blocks.isdisjoint(pull.dst_ids)):
                self._write_run(pull.consumer, run, progress)
                run, count, blocks, names = [], 0, set(), 1
            run.append(pull)
            if count + len(pull.dst_ids) < _MERGED_BLOCKS:
                blocks.update(pull.dst_ids)
            runs[pull.consumer] = (run, count + len(pull.dst_ids), blocks, names + 2 + len(pull.reply))
        for consumer, (run, _, _, _) in runs.items():
            self._write_run(consumer, run, progress)

    def _write_run(self, consumer: str, run: List[_Pull], progress: Progress) -> None:
        src_ids, dst_ids = array.array("I"), array.array("I")
        for p in run:
            src_ids.extend(p.src_ids)
            dst_ids.extend(p.dst_ids)
        rids, payload = [p.rid for p in run], wire.names_payload([p.reply for p in run])
        descriptors = self._consumers[consumer]
        window = _through_window(descriptors[0], run[0].window) if run[0].window else None
        q = self._queue_for(consumer, descriptors)
        if q is not None and q.post(rids, self._spec.block_bytes, src_ids, dst_ids, payload, window):
            for p in run:
                p.held.future = _QUEUED  # poll() reaps its completion
            return
        if window is not None:
            descriptors = [_through_window(d, run[0].window) for d in descriptors]
        parts = [(self._layers[layer], descriptors[layer], s, d) for layer, s, d in self._layer_halves(consumer)]
        try:
            future = self._client.write_batch(parts, self._spec.block_bytes, src_ids, dst_ids, notify=True,
                                              tag=wire.DONE, notify_payload=payload)
        except (errors.FerryError, ValueError, OverflowError, struct.error) as e:
            for p in run:
                del self._held[p.rid]
                progress.failed[p.rid] = f"writing the blocks failed: {e}"
                self._tell_refused(p.held, progress.failed[p.rid])
            return
        for p in run:
            p.held.future = future
        # A thread waits on the agent (one blocking Wait RPC at a time) so that poll()
        # never makes an RPC: an engine polls every step, on the agent's cores.
        threading.Thread(target=self._await_write, args=(rids, future), daemon=True).start()

    def _tell_refused(self, held: _Held, why: str) -> None:
        """Tells a pulled request's consumer that its write failed, so that it need not
        wait for its timeout; if that fails too, the timeout it is."""
        if held.answer_to is None:
            return
        try:
            refuse(self._client, held.answer_to, why)
        except errors.FerryError:
            pass

    def _layer_halves(self, consumer: str) -> List[tuple]:
        """(layer, src_base, dst_base) of each layer half (K, V) a write to `consumer` moves."""
        half = self._spec.num_blocks * self._spec.block_bytes
        dst_half = self._consumer_specs[consumer].num_blocks * self._spec.block_bytes
        return [(layer, h * half, h * dst_half) for layer in range(len(self._layers)) for h in range(self._spec.halves)]

    def _queue_for(self, consumer: str, descriptors: list) -> Optional[_ConsumerQueue]:
        """The write queue to `consumer`'s layers, made at its first write (None: it cannot
        have one, and its writes go by write_batch)."""
        if consumer not in self._queues:
            q = None
            if len(descriptors) <= 64:  # a queue's destinations
                try:
                    parts = [(self._layers[layer], layer, s, d) for layer, s, d in self._layer_halves(consumer)]
                    q = _ConsumerQueue(self._client, descriptors, parts)
                except errors.FerryError:
                    q = None
            self._queues[consumer] = q
        return self._queues[consumer]

    def _await_write(self, rids: List[str], future: TransferFuture) -> None:
        try:
            future.result()
            why = None
        except errors.FerryError as e:
            why = f"writing the blocks failed: {e}"
        for rid in rids:
            self._written.put((rid, why))

    def _on_cancel(self, cancel: wire.Cancel, progress: Progress) -> None:
        consumer, rid, reply = cancel.consumer, cancel.request, cancel.reply
        held = self._held.get(rid)
        if held is not None and not _secret_matches(held, cancel.secret):
            progress.failed.setdefault("", f"a cancel of request {rid} by consumer {consumer} without the "
                                           "request's secret was refused")
            return
        if held is not None and held.future is not None and held.future is not _ACCEPTED:
            return  # being written: the write's own notification answers the consumer
        if held is not None:
            del self._held[rid]
            progress.failed[rid] = "the consumer cancelled the request"
        descriptors = self._consumers.get(consumer)
        if descriptors and descriptors[0] is not None:
            self._client.send_message(descriptors[0], reply.encode(), tag=wire.DROPPED)

    def in_flight(self) -> List[tuple]:
        """Whom to tell if the writes in flight are lost (the agent restarted): see refuse()."""
        with self._lock:
            return [h.answer_to for h in self._held.values() if h.answer_to is not None]

    def close(self) -> None:
        self._stopping.set()
        if self._responder is not None:
            self._responder.join()
        self._inbox.close()
        for q in [q for q in self._queues.values() if q is not None] + self._retired:
            q.queue.close()  # writes in flight complete in the agent; nobody reaps them
        self._queues.clear()
        self._retired.clear()


class _Bucket:
    """A token bucket: RATE takes a second, BURST at once."""
    RATE, BURST = 64.0, 64.0

    def __init__(self) -> None:
        self._tokens, self._at = self.BURST, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.BURST, self._tokens + (now - self._at) * self.RATE)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def refuse(client: Client, answer_to: tuple, why: str) -> None:
    """Tells a consumer (one of KVProducer.in_flight()) that its request will not be written."""
    descriptor, reply = answer_to
    client.send_message(descriptor, wire.refused_payload(reply, why), tag=wire.REFUSED)


@dataclasses.dataclass(frozen=True)
class PullRequest:
    """What KVConsumer.pull() takes, for pull_many()."""
    request_id: str
    producer_mailbox: bytes
    dst_block_ids: Sequence[int]
    skip: int = 0
    producer_request_id: Optional[str] = None
    secret: bytes = b""


class KVConsumer:
    """The decode side: asks producers for requests' blocks and learns when they landed."""

    def __init__(self, client: Client, spec: KVCacheSpec, layers: Sequence[Region], engine_id: str,
                 timeout: float = 30.0):
        for i, r in enumerate(layers):
            if r.size < spec.region_bytes:
                raise ValueError(f"layer {i}'s region has {r.size} bytes; the spec needs {spec.region_bytes}")
        self._client, self._spec, self.engine_id, self._timeout = client, spec, engine_id, timeout
        # Its name in messages: the engine id and a random suffix, so that another pod
        # cannot introduce itself (HELLO) under this consumer's name and have its
        # requests written into that pod's regions.
        self._wire_name = f"{engine_id}#{secrets.token_hex(8)}"
        self._descriptors = [r.descriptor() for r in layers]
        self._mailboxes: Dict[bytes, _Mailbox] = {}  # producer mailbox -> the queue to it
        self._introduced: set = set()
        self._waiting: Dict[str, float] = {}  # request id -> deadline
        self._waiting_on: Dict[str, bytes] = {}  # request id -> its producer's mailbox
        self._next_probe: Dict[bytes, float] = {}  # producer mailbox -> when to PING it next
        self._cancelled: set = set()
        self._inbox = _Inbox(client, layers)
        # Caches registered with write_windows: each pull opens a window over its blocks for
        # its producer alone, closed before the request is reported: no write lands in the
        # blocks after that, however late it comes.
        self._layers = list(layers)
        self._windowed = bool(layers) and all(getattr(r, "write_windows", False) for r in layers)
        self._windows: Dict[str, Union[WriteWindow, _QueueWindow]] = {}  # request id -> its open window

    def _open_window(self, request_id: str, producer_mailbox: bytes, ids: Sequence[int]) -> Union[bytes, int]:
        """Opens the request's window: WINDOW_BYTES for its PULL, b"" without windows, or
        the id of a window entry posted to the producer's queue (_send_pull waits for it;
        by RPC instead when its ranges do not fit there)."""
        if not self._windowed or not len(ids):
            return b""
        ranges = _block_ranges(ids, self._spec)
        if len(ranges) <= _Mailbox.MAX_WINDOW_RANGES and len(self._layers) <= 256:
            return self._mailbox(producer_mailbox).post_open_window([r.id for r in self._layers], ranges,
                                                                    self._timeout + _WINDOW_SLACK_S)
        window = self._client.open_write_window(self._layers, ranges, writer=producer_mailbox,
                                                timeout=self._timeout + _WINDOW_SLACK_S)
        self._windows[request_id] = window
        return struct.pack("<Q", window.id) + window.descriptors[0]._proto.token

    def _close_window(self, request_id: str) -> Optional[str]:
        """Closes the request's window, if it has one: afterwards no write lands in its
        blocks. Why it could not be, if so (the blocks must not be reused then)."""
        window = self._windows.pop(request_id, None)
        if window is None:
            return None
        try:
            window.close(wait=_WINDOW_CLOSE_S)
            return None
        except errors.FerryError as e:
            return f"closing its write window failed ({e}); its blocks may still change"

    def pull(self, request_id: str, producer_mailbox: bytes, dst_block_ids: Sequence[int], skip: int = 0,
             producer_request_id: Optional[str] = None, secret: bytes = b"") -> None:
        """Asks the producer behind ``producer_mailbox`` to write its request's blocks,
        after the first ``skip`` (already cached here), into ``dst_block_ids``. The
        producer knows the request as ``producer_request_id`` (default: the same id) and
        answers only a pull with the request's ``secret`` (its hold's)."""
        self._send_pull(self._start_pull(PullRequest(request_id, producer_mailbox, dst_block_ids, skip,
                                                     producer_request_id, secret)))

    def pull_many(self, requests: Sequence["PullRequest"]) -> Dict[str, Exception]:
        """pull() of each request (a decode step's), their write windows opened together:
        one round trip to the agent for the step, not one per request. Returns why each
        request that could not be asked for failed (what pull() would have raised)."""
        started: List[tuple] = []
        failed: Dict[str, Exception] = {}
        for r in requests:
            try:
                started.append(self._start_pull(r))
            except (errors.FerryError, ValueError) as e:
                failed[r.request_id] = e
        for s in started:
            try:
                self._send_pull(s)
            except (errors.FerryError, ValueError) as e:
                failed[s[0].request_id] = e
        return failed

    def _start_pull(self, r: "PullRequest") -> tuple:
        """A pull's first half: its ids checked, the producer introduced, its window's open
        posted (not awaited)."""
        dst_block_ids = _block_ids(r.dst_block_ids, self._spec.num_blocks)
        mailbox = self._mailbox(r.producer_mailbox)
        self._introduce(r.producer_mailbox, mailbox)
        return r, mailbox, dst_block_ids, self._open_window(r.request_id, r.producer_mailbox, dst_block_ids)

    def _send_pull(self, started: tuple) -> None:
        """A pull's second half: its window awaited, its PULL messages sent."""
        r, mailbox, dst_block_ids, window = started
        request_id, producer_mailbox, skip, producer_request_id, secret = \
            r.request_id, r.producer_mailbox, r.skip, r.producer_request_id, r.secret
        if isinstance(window, int):  # a window entry posted to the producer's queue
            window = mailbox.window_ref(window)
            self._windows[request_id] = _QueueWindow(mailbox, struct.unpack_from("<Q", window)[0])
        try:
            pulls = wire.Pull.split(self._wire_name, producer_request_id or request_id, skip, dst_block_ids,
                                    request_id, secret, window)
        except ValueError:
            self._close_window(request_id)
            raise
        now = time.monotonic()
        self._waiting[request_id] = now + self._timeout
        self._waiting_on[request_id] = producer_mailbox
        self._next_probe.setdefault(producer_mailbox, now + _PROBE_S)
        try:
            for message in pulls:  # as many ids per message as fit; at least one message
                mailbox.send(wire.PULL, message.encode(), request_id)
        except errors.FerryError:
            del self._waiting[request_id]  # the caller hears it now, not from poll()
            self._close_window(request_id)
            raise

    def _mailbox(self, producer_mailbox: bytes) -> _Mailbox:
        if producer_mailbox not in self._mailboxes:
            self._mailboxes[producer_mailbox] = _Mailbox(self._client, producer_mailbox)
        return self._mailboxes[producer_mailbox]

    def _introduce(self, producer_mailbox: bytes, mailbox: _Mailbox) -> None:
        """Sends the producer behind ``producer_mailbox`` this consumer's layout and layer
        descriptors (HELLO), once; as many descriptors per message as fit in a payload."""
        if producer_mailbox in self._introduced:
            return
        spec = self._spec
        for hello in wire.Hello.split(self._wire_name, spec.num_blocks, spec.block_bytes, spec.halves,
                                      self._descriptors, _FEATURES):
            mailbox.send(wire.HELLO, hello.encode())
        self._introduced.add(producer_mailbox)

    def cancel(self, request_id: str, producer_mailbox: bytes, producer_request_id: Optional[str] = None,
               secret: bytes = b"") -> bool:
        """Tells the producer to drop ``request_id``. Returns True when nothing can be
        written into its blocks any more; False when a pull is out: poll() then reports the
        request (done or failed) once the producer's write or its answer arrives, and only
        then may the blocks be reused."""
        mailbox = self._mailbox(producer_mailbox)
        self._introduce(producer_mailbox, mailbox)
        cancel = wire.Cancel(self._wire_name, producer_request_id or request_id, request_id, secret)
        mailbox.send(wire.CANCEL, cancel.encode(), request_id)
        if request_id in self._windows and self._close_window(request_id) is None:
            self._waiting.pop(request_id, None)  # its window is closed: nothing can land any more
        if request_id in self._waiting:
            self._cancelled.add(request_id)
        return request_id not in self._waiting

    def poll(self) -> Progress:
        """Requests whose blocks have all landed (done), or failed (the producer's error,
        a failed write, a cancel, or nothing heard before the timeout)."""
        progress = Progress()
        for producer_mailbox, mailbox in self._mailboxes.items():
            for kind, rid, error in mailbox.take_failed():
                if kind == wire.PING:  # the producer is gone: nothing will come for its requests
                    for r in [r for r, m in self._waiting_on.items() if m == producer_mailbox and r in self._waiting]:
                        del self._waiting[r]
                        progress.failed[r] = CANCELLED if r in self._cancelled else \
                            f"the producer's mailbox is gone (its pod ended or its agent restarted): {error}"
                elif kind == wire.HELLO:  # introduce again at the next pull; this one's PULL fails too
                    self._introduced.discard(producer_mailbox)
                elif rid in self._waiting:  # a PULL or CANCEL that did not reach the producer
                    del self._waiting[rid]
                    progress.failed[rid] = CANCELLED if rid in self._cancelled else \
                        f"asking the producer failed: {error}"
        for n in self._inbox.drain():
            if n.kind == "write":  # the requests it carried, by name
                for rid in wire.unpack_names(n.payload):
                    if self._waiting.pop(rid, None) is None:
                        continue
                    if n.tag == wire.DONE and n.ok:
                        progress.done.add(rid)
                    else:
                        progress.failed[rid] = f"the producer's write failed: {n.message}"
                continue
            rid, _, why = n.payload.decode(errors="replace").partition("\n")
            if rid not in self._waiting or n.kind != "message":
                continue
            del self._waiting[rid]
            if n.tag == wire.DONE:  # nothing to write: every block was cached
                progress.done.add(rid)
            elif n.tag == wire.REFUSED:
                progress.failed[rid] = f"the producer refused: {why}"
            else:
                progress.failed[rid] = CANCELLED
        now = time.monotonic()
        for rid, deadline in list(self._waiting.items()):
            if now > deadline:
                del self._waiting[rid]
                progress.failed[rid] = f"nothing heard from the producer in {self._timeout} s"
        self._probe(now)
        for rid in list(progress.done):
            if rid in self._cancelled:  # landed after all, but nobody wants it
                progress.done.discard(rid)
                progress.failed[rid] = CANCELLED
        self._cancelled -= progress.done | set(progress.failed)
        reported = progress.done | set(progress.failed)  # their blocks are the engine's again
        for rid, why in self._close_windows(reported).items():
            if why is not None:
                progress.done.discard(rid)
                progress.failed[rid] = why
        return progress

    def _close_windows(self, request_ids) -> Dict[str, Optional[str]]:
        """_close_window of each request, the closes through a queue posted together (a
        step's requests settle in one round trip to the agent, not one each)."""
        out: Dict[str, Optional[str]] = {}
        posted = []
        for rid in request_ids:
            window = self._windows.get(rid)
            if isinstance(window, _QueueWindow):
                del self._windows[rid]
                try:
                    posted.append((rid, window.mailbox, window.mailbox.post_close_window(window.id, _WINDOW_CLOSE_S)))
                except errors.FerryError as e:
                    out[rid] = f"closing its write window failed ({e}); its blocks may still change"
            else:
                out[rid] = self._close_window(rid)
        for rid, mailbox, ud in posted:
            try:
                mailbox.await_window_entry(ud, _WINDOW_CLOSE_S + _Mailbox.WAIT)
                out[rid] = None
            except errors.FerryError as e:
                out[rid] = f"closing its write window failed ({e}); its blocks may still change"
        return out

    def _probe(self, now: float) -> None:
        """PINGs each producer it has waited on for _PROBE_S (see poll())."""
        for rid in [r for r in self._waiting_on if r not in self._waiting]:
            del self._waiting_on[rid]
        waited_on = set(self._waiting_on.values())
        for producer_mailbox in list(self._next_probe):
            if producer_mailbox not in waited_on:
                del self._next_probe[producer_mailbox]
            elif now >= self._next_probe[producer_mailbox] and producer_mailbox in self._mailboxes:
                self._next_probe[producer_mailbox] = now + _PROBE_S
                try:
                    self._mailboxes[producer_mailbox].send(wire.PING, b"")
                except errors.FerryError:
                    pass  # a full queue to it: the producer is busy, not gone

    def close(self) -> None:
        for rid in list(self._windows):
            self._close_window(rid)
        self._inbox.close()
        for mailbox in self._mailboxes.values():
            mailbox.close()
        self._mailboxes.clear()
