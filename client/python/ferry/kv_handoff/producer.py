"""The prefill side of the KV handoff (ferry.kv_handoff): KVProducer holds requests'
blocks until their consumer pulls them, and answers each pull with one batch write."""
from __future__ import annotations

import array
import dataclasses
import hmac
import queue
import struct
import threading
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .. import errors
from .._types import Region, RegionDescriptor
from ..client import Client, TransferFuture
from ..write_queue import MAX_WINDOW_SPAN_PARTS, MAX_WINDOW_SPANS
from . import wire
from ._common import KVCacheSpec, Progress, _block_ids, _Inbox, logger, new_request_secret

# Where a refusal of a pulled request goes: the consumer's first layer descriptor, and its
# id for the request.
AnswerTo = Tuple[RegionDescriptor, str]


def _complete(slots: Optional[List[Optional[RegionDescriptor]]]) -> Optional[List[RegionDescriptor]]:
    """A consumer's layer descriptors once its HELLOs brought every one, else None."""
    if slots is None or any(d is None for d in slots):
        return None
    return [d for d in slots if d is not None]


def _secret_matches(held: "_Held", secret: bytes) -> bool:
    return hmac.compare_digest(held.secret, secret)


@dataclasses.dataclass
class _Held:
    src_ids: array.array[int]
    expires: float
    secret: bytes  # what a PULL or CANCEL of this request must carry (hold's return value)
    future: Optional[object] = None  # the write in flight: a TransferFuture, or _QUEUED
    dst_ids: Optional[array.array[int]] = None  # a long pull's ids, as its messages arrive
    dst_pieces: Optional[Dict[int, int]] = None  # which of them arrived: first id -> count
    answer_to: Optional[AnswerTo] = None  # (consumer's first descriptor, its id for the request), once pulled


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
    src_ids: array.array[int]
    dst_ids: array.array[int]
    reply: bytes  # the consumer's id for the request
    window: bytes = b""  # the consumer's write window for it (wire.WINDOW_BYTES), if any


def _through_window(descriptor: RegionDescriptor, window: bytes) -> RegionDescriptor:
    """A consumer's layer descriptor, writing through its write window (a PULL's)."""
    d = RegionDescriptor.from_bytes(descriptor.to_bytes())
    d._proto.window_id = struct.unpack_from("<Q", window)[0]
    d._proto.token = window[8:]
    return d


class _ConsumerQueue:
    """A write queue to one consumer's layers, whose block table is handed out in ranges:
    a request's range stays its own until its completion is reaped."""
    ENTRIES, TABLE_IDS = 64, 1 << 20  # 4 MiB of ids: a 64-part request of 16,384 blocks 30 times over

    def __init__(self, client: Client, descriptors: List[RegionDescriptor], parts: List[Tuple[Region, int, int, int]]):
        self.queue = client.create_queue(descriptors, entries=self.ENTRIES, table_ids=self.TABLE_IDS)
        self._parts = self.queue.pack_parts(parts)  # every request writes the same layer halves
        self._next = 0
        self._ranges: Dict[int, Tuple[List[str], int, int]] = {}  # user_data -> (request ids, first id, end)
        self._user_data = 0

    def post(self, rids: List[str], block_bytes: int, src_ids: Sequence[int], dst_ids: Sequence[int], payload: bytes,
             windows: Optional[List[Tuple[RegionDescriptor, int]]] = None) -> bool:
        """Posts the requests' batch entry (each request's blocks through the consumer's
        write window for it, if any: ``windows``, in the ids' order); False when the queue
        or its table is full (or refused the entry)."""
        words = self.queue.batch_table_ids(self._parts.count, len(src_ids), len(payload), windows=len(windows or ()))
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
                                  user_data=self._user_data, notify=True, tag=wire.DONE, payload=payload,
                                  windows=windows)
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
        # consumer id -> its layer descriptors, each None until a HELLO brought it
        self._consumers: Dict[str, List[Optional[RegionDescriptor]]] = {}
        self._consumer_specs: Dict[str, KVCacheSpec] = {}
        self._consumer_features: Dict[str, int] = {}  # consumer id -> its HELLO's _FEATURES
        self._queues: Dict[str, Optional[_ConsumerQueue]] = {}  # consumer id -> its queue (None: write_batch)
        self._retired: List[_ConsumerQueue] = []  # replaced queues with writes still in flight
        self._held: Dict[str, _Held] = {}
        self._written: queue.Queue[Tuple[str, Optional[str]]] = queue.Queue()  # (request id, None or why it failed)
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

    def _refuse_unattributed(self, consumer: str, answer_to: AnswerTo, why: str) -> None:
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
        descriptors = _complete(self._consumers.get(consumer))
        if held is not None and not _secret_matches(held, secret):
            # Not the request's consumer (or one from before secrets): the request stays
            # held for the one that has it.
            progress.failed.setdefault("", f"a pull of request {rid} by consumer {consumer} without the "
                                           "request's secret was refused")
            if descriptors is not None:
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
        elif descriptors is None:
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
            if descriptors is not None:
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
        per pull. Pulls each in their consumer's write window for it share a write as well,
        each request's blocks through its own window (the queue's window spans), as many
        as a write takes."""
        # (consumer, through windows?) -> the pulls of its next write, their block count,
        # their destination blocks (while another pull may join), and their names' bytes
        runs: Dict[Tuple[str, bool], Tuple[List[_Pull], int, Set[int], int]] = {}
        max_windows = max(1, min(MAX_WINDOW_SPANS, MAX_WINDOW_SPAN_PARTS // (len(self._layers) * self._spec.halves)))
        for pull in accepted:
            if self._held.get(pull.rid) is not pull.held:  # cancelled after its PULL, in the same pass
                continue
            if not self._consumer_features.get(pull.consumer, 0) & wire.SHARED_WRITES:
                self._write_run(pull.consumer, [pull], progress)
                continue
            key = (pull.consumer, bool(pull.window))
            run, count, blocks, names = runs.get(key, ([], 0, set(), 1))
            if run and (count + len(pull.dst_ids) > _MERGED_BLOCKS or names + 2 + len(pull.reply) > wire.MAX_PAYLOAD or
                        not blocks.isdisjoint(pull.dst_ids) or (pull.window and len(run) >= max_windows)):
                self._write_run(pull.consumer, run, progress)
                run, count, blocks, names = [], 0, set(), 1
            run.append(pull)
            if count + len(pull.dst_ids) < _MERGED_BLOCKS:
                blocks.update(pull.dst_ids)
            runs[key] = (run, count + len(pull.dst_ids), blocks, names + 2 + len(pull.reply))
        for (consumer, _), (run, _, _, _) in runs.items():
            self._write_run(consumer, run, progress)

    def _write_run(self, consumer: str, run: List[_Pull], progress: Progress) -> None:
        src_ids, dst_ids = array.array("I"), array.array("I")
        for p in run:
            src_ids.extend(p.src_ids)
            dst_ids.extend(p.dst_ids)
        rids, payload = [p.rid for p in run], wire.names_payload([p.reply for p in run])
        descriptors = _complete(self._consumers[consumer])
        assert descriptors is not None  # only a complete consumer's pulls are accepted
        windows = [(_through_window(descriptors[0], p.window), len(p.dst_ids)) for p in run] if run[0].window else None
        q = self._queue_for(consumer, descriptors)
        if q is not None and q.post(rids, self._spec.block_bytes, src_ids, dst_ids, payload, windows):
            for p in run:
                p.held.future = _QUEUED  # poll() reaps its completion
            return
        if windows is not None and len(run) > 1:  # write_batch goes through one window: a write per request
            for p in run:
                self._write_run(consumer, [p], progress)
            return
        if windows is not None:
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

    def _layer_halves(self, consumer: str) -> List[Tuple[int, int, int]]:
        """(layer, src_base, dst_base) of each layer half (K, V) a write to `consumer` moves."""
        half = self._spec.num_blocks * self._spec.block_bytes
        dst_half = self._consumer_specs[consumer].num_blocks * self._spec.block_bytes
        return [(layer, h * half, h * dst_half) for layer in range(len(self._layers)) for h in range(self._spec.halves)]

    def _queue_for(self, consumer: str, descriptors: List[RegionDescriptor]) -> Optional[_ConsumerQueue]:
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

    def in_flight(self) -> List[AnswerTo]:
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


def refuse(client: Client, answer_to: AnswerTo, why: str) -> None:
    """Tells a consumer (one of KVProducer.in_flight()) that its request will not be written."""
    descriptor, reply = answer_to
    client.send_message(descriptor, wire.refused_payload(reply, why), tag=wire.REFUSED)
