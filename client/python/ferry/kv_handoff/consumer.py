"""The decode side of the KV handoff (ferry.kv_handoff): KVConsumer asks producers for
requests' blocks through their mailboxes and learns when they landed."""
from __future__ import annotations

import array
import dataclasses
import secrets
import struct
import time
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from .. import errors
from .._types import Region
from ..client import Client, WriteWindow
from ..write_queue import Completion
from . import wire
from ._common import KVCacheSpec, Progress, _block_ids, _Inbox

# A consumer waiting this long on a producer sends its mailbox an empty PING, once per
# such interval: a mailbox that is gone (its pod ended, its agent restarted) refuses it,
# and the consumer fails that producer's requests at once, not at its timeout.
_PROBE_S = 1.0
# A request's write window outlives the consumer's own timeout by this much (the consumer
# closes it when it gives up; this bounds a window whose consumer never does), and a close
# waits this long for the agent's copies into it to end.
_WINDOW_SLACK_S = 5.0
_WINDOW_CLOSE_S = 2.0
# poll() waits at most this long for the closes it posted (one round trip to the agent,
# ~0.1-0.2 ms); a request whose close takes longer (the agent busy, a copy through the
# window still ending) is reported by a later poll(), so the engine's step does not wait.
_CLOSE_IN_POLL_S = 0.002
# KVConsumer.poll()'s reason for a request given up with cancel(): its blocks may be reused.
CANCELLED = "cancelled"
# What this consumer's HELLO says it can take (wire.FEATURES; a test may say less).
_FEATURES = wire.FEATURES


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


# (kind, request id or None, the error) of a message its agent refused or could not deliver.
RefusedMessage = Tuple[int, Optional[str], errors.FerryError]


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
        self._sent: Dict[int, Tuple[Optional[int], int, Optional[str]]] = {}  # user_data -> (slot, kind, request id)
        self._user_data = 0
        self.failed: List[RefusedMessage] = []  # messages the agent refused
        self._windows_done: Dict[int, Completion] = {}  # user_data -> a window entry's completion
        self._abandoned: Set[int] = set()  # window entries whose caller stopped waiting
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

    def _post_window_entry(self, post: Callable[[int], None], slot: Optional[int] = None) -> int:
        if len(self._sent) >= self.ENTRIES:
            self._reap(self.WAIT)
        self._user_data += 1
        ud = self._user_data
        post(ud)
        self._sent[ud] = (slot, self._WINDOW, None)
        return ud

    def window_entry(self, ud: int) -> Optional[Completion]:
        """The completion of window entry ``ud`` if it has come (None if not yet), without
        waiting."""
        if ud not in self._windows_done:
            self._reap(0)
        return self._windows_done.pop(ud, None)

    def abandon_window_entry(self, ud: int) -> None:
        """Stops waiting for window entry ``ud``: its completion is dropped when it comes."""
        if self._windows_done.pop(ud, None) is None and ud in self._sent:
            self._abandoned.add(ud)

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
            assert slot is not None  # a message entry always has its table slot
            self._free.append(slot)
            if c.error is not None:
                self.failed.append((kind, rid, c.error))

    def take_failed(self) -> List[RefusedMessage]:
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


@dataclasses.dataclass(frozen=True)
class PullRequest:
    """What KVConsumer.pull() takes, for pull_many()."""
    request_id: str
    producer_mailbox: bytes
    dst_block_ids: Sequence[int]
    skip: int = 0
    producer_request_id: Optional[str] = None
    secret: bytes = b""


# A pull started (pull_many): the request, its producer's mailbox queue, its destination
# block ids, and its window (WINDOW_BYTES, b"", or the id of an open entry in flight).
_StartedPull = Tuple[PullRequest, _Mailbox, "array.array[int]", Union[bytes, int]]


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
        self._introduced: Set[bytes] = set()
        self._waiting: Dict[str, float] = {}  # request id -> deadline
        self._waiting_on: Dict[str, bytes] = {}  # request id -> its producer's mailbox
        self._next_probe: Dict[bytes, float] = {}  # producer mailbox -> when to PING it next
        self._cancelled: Set[str] = set()
        self._inbox = _Inbox(client, layers)
        # Caches registered with write_windows: each pull opens a window over its blocks for
        # its producer alone, closed before the request is reported: no write lands in the
        # blocks after that, however late it comes.
        self._layers = list(layers)
        self._windowed = bool(layers) and all(getattr(r, "write_windows", False) for r in layers)
        self._windows: Dict[str, Union[WriteWindow, _QueueWindow]] = {}  # request id -> its open window
        # Requests settled whose window's close is still on its way: request id -> its
        # queue, the close entry, when to give up on it, and what poll() reports once it is
        # closed (None: done; else why it failed).
        self._closing: Dict[str, Tuple[_Mailbox, int, float, Optional[str]]] = {}

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
        started: List[_StartedPull] = []
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

    def _start_pull(self, r: PullRequest) -> _StartedPull:
        """A pull's first half: its ids checked, the producer introduced, its window's open
        posted (not awaited)."""
        dst_block_ids = _block_ids(r.dst_block_ids, self._spec.num_blocks)
        mailbox = self._mailbox(r.producer_mailbox)
        self._introduce(r.producer_mailbox, mailbox)
        return r, mailbox, dst_block_ids, self._open_window(r.request_id, r.producer_mailbox, dst_block_ids)

    def _send_pull(self, started: _StartedPull) -> None:
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
        self._close_windows(progress)  # a request is reported once nothing can land in its blocks
        return progress

    def _close_windows(self, progress: Progress) -> None:
        """Closes the windows of the requests ``progress`` reports, and holds each back
        until its window is closed (its blocks are the engine's again only then). The
        closes through a queue are posted together (a step's requests settle in one round
        trip to the agent) and awaited for at most _CLOSE_IN_POLL_S; those still on their
        way, and those from earlier polls, are reported by the poll that sees them closed."""
        now = time.monotonic()
        for rid in progress.done | set(progress.failed):
            window = self._windows.get(rid)
            if window is None:
                continue
            outcome = None if rid in progress.done else progress.failed[rid]
            progress.done.discard(rid)
            progress.failed.pop(rid, None)
            if isinstance(window, _QueueWindow):
                del self._windows[rid]
                try:
                    ud = window.mailbox.post_close_window(window.id, _WINDOW_CLOSE_S)
                    self._closing[rid] = (window.mailbox, ud, now + _WINDOW_CLOSE_S + _Mailbox.WAIT, outcome)
                    continue
                except errors.FerryError as e:
                    why: Optional[str] = f"closing its write window failed ({e}); its blocks may still change"
            else:
                why = self._close_window(rid)
            self._report(progress, rid, why or outcome)
        deadline = now + _CLOSE_IN_POLL_S
        while self._closing:
            for rid, (mailbox, ud, give_up, outcome) in list(self._closing.items()):
                c = mailbox.window_entry(ud)
                if c is None and time.monotonic() < give_up:
                    continue
                del self._closing[rid]
                if c is None:
                    mailbox.abandon_window_entry(ud)
                    why = f"closing its write window failed (the agent did not answer in {_WINDOW_CLOSE_S} s)"
                elif c.error is not None:
                    why = f"closing its write window failed ({c.error})"
                else:
                    why = None
                self._report(progress, rid, outcome if why is None else f"{why}; its blocks may still change")
            left = deadline - time.monotonic()
            if not self._closing or left <= 0:
                break
            next(iter(self._closing.values()))[0]._reap(left)  # until a completion comes to one of them

    @staticmethod
    def _report(progress: Progress, rid: str, failure: Optional[str]) -> None:
        if failure is None:
            progress.done.add(rid)
        else:
            progress.failed[rid] = failure

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
