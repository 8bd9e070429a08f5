"""The KV handoff's messages (ferry.kv_handoff): every one encoded and decoded here, so
that the consumer that writes a message and the producer that reads it share one
definition of its bytes.

A consumer's message to a producer's mailbox is a ferry message (at most MAX_PAYLOAD
bytes): MAGIC, a kind byte, then the body. Strings are a <H length and UTF-8; block ids
a <I count and as many <I; a secret a <B length and its bytes. Bodies, in order:

  HELLO   consumer, <QQI num_blocks block_bytes halves, <III first total count, `count`
          layer descriptors (<H length and bytes), <I features (none from consumers
          before features: 0)
  PULL    consumer, request (the producer's id), <III skip total first, ids, reply (the
          consumer's id for the request), secret (none from consumers before secrets)
  CANCEL  consumer, request, reply, secret
  PING    empty: the consumer only needs to know the mailbox still takes messages

A producer answers with messages tagged DONE (no write was needed), REFUSED (payload:
the reply id, a newline, why) or DROPPED (after a CANCEL), and a write's notification
tagged DONE names the requests it carried (names_payload).

    body = Pull("decode-0.ab12", "req-1", 0, 2, 0, ids, "req-1", secret).encode()
    kind, body = parse(payload)        # ValueError: not a handoff message
    pull = Pull.decode(body)           # struct.error, UnicodeDecodeError: malformed
"""
from __future__ import annotations

import array
import dataclasses
import struct
from typing import List, Optional, Tuple

MAGIC = b"FYKV"
HELLO, PULL, CANCEL, PING = 1, 2, 3, 4
DONE, REFUSED, DROPPED = 1, 2, 3  # tags of a producer's answers
MAX_PAYLOAD = 4096  # a ferry message's payload
WINDOW_BYTES = 24  # a write window in a PULL: its id (8 bytes, little-endian) and token (16)
# What a consumer can take, in its HELLO's features word. SHARED_WRITES: it reads a
# write's notification naming several requests (names_payload).
SHARED_WRITES = 1
FEATURES = SHARED_WRITES
_HEADER = len(MAGIC) + 1


def frame(kind: int, body: bytes) -> bytes:
    msg = MAGIC + bytes([kind]) + body
    if len(msg) > MAX_PAYLOAD:
        raise ValueError(f"a handoff message of {len(msg)} bytes exceeds {MAX_PAYLOAD}")
    return msg


def parse(payload: bytes) -> Tuple[int, bytes]:
    """A message's kind and body; ValueError for a payload that is not a handoff message."""
    if payload[:len(MAGIC)] != MAGIC or len(payload) < _HEADER:
        raise ValueError("not a ferry KV handoff message")
    return payload[len(MAGIC)], payload[_HEADER:]


def requested(payload: bytes) -> Optional[str]:
    """The producer's request id a PULL or CANCEL names; None for any other message.
    Raises as decode does for a malformed one."""
    kind, body = parse(payload)
    if kind not in (PULL, CANCEL):
        return None
    _, at = _unpack_str(body, 0)  # the consumer
    return _unpack_str(body, at)[0]


@dataclasses.dataclass
class Hello:
    """A consumer's layout and a run of its layer descriptors (several HELLOs when they do
    not fit in one message: `first` of `total`)."""
    consumer: str
    num_blocks: int
    block_bytes: int
    halves: int
    first: int
    total: int
    descriptors: List[bytes]
    features: int = FEATURES

    def encode(self) -> bytes:
        return (_pack_str(self.consumer) + struct.pack("<QQI", self.num_blocks, self.block_bytes, self.halves) +
                struct.pack("<III", self.first, self.total, len(self.descriptors)) +
                b"".join(struct.pack("<H", len(d)) + d for d in self.descriptors) + struct.pack("<I", self.features))

    @classmethod
    def decode(cls, body: bytes) -> "Hello":
        consumer, at = _unpack_str(body, 0)
        num_blocks, block_bytes, halves = struct.unpack_from("<QQI", body, at)
        first, total, count = struct.unpack_from("<III", body, at + 20)
        at += 32
        descriptors = []
        for _ in range(count):
            (n,) = struct.unpack_from("<H", body, at)
            if at + 2 + n > len(body):
                raise struct.error(f"a {n}-byte descriptor does not fit in a {len(body)}-byte HELLO")
            descriptors.append(body[at + 2:at + 2 + n])
            at += 2 + n
        (features,) = struct.unpack_from("<I", body, at) if at + 4 <= len(body) else (0,)
        return cls(consumer, num_blocks, block_bytes, halves, first, total, descriptors, features)

    @classmethod
    def split(cls, consumer: str, num_blocks: int, block_bytes: int, halves: int, descriptors: List[bytes],
              features: int = FEATURES) -> List["Hello"]:
        """The HELLOs that carry every descriptor, as many per message as fit."""
        out: List[Hello] = []
        fixed = _HEADER + len(cls(consumer, num_blocks, block_bytes, halves, 0, 0, [], features).encode())
        first = 0
        while first < len(descriptors):
            count, size = 0, fixed
            while first + count < len(descriptors) and size + 2 + len(descriptors[first + count]) <= MAX_PAYLOAD:
                size += 2 + len(descriptors[first + count])
                count += 1
            if count == 0:
                raise ValueError(f"a {len(descriptors[first])}-byte descriptor does not fit in a HELLO")
            out.append(cls(consumer, num_blocks, block_bytes, halves, first, len(descriptors),
                           descriptors[first:first + count], features))
            first += count
        return out


@dataclasses.dataclass
class Pull:
    """A consumer's ask for a request's blocks after the first `skip`: ids[first:first +
    len(ids)] of `total` destination block ids (a long request takes several PULLs)."""
    consumer: str
    request: str
    skip: int
    total: int
    first: int
    ids: array.array[int]
    reply: str
    secret: bytes = b""
    # The write window the consumer opened over the request's blocks: its id and token
    # (WINDOW_BYTES), the producer writing through it; empty from consumers whose caches
    # take writes with their own descriptors (and from those before windows).
    window: bytes = b""

    def encode(self) -> bytes:
        return (_pack_str(self.consumer) + _pack_str(self.request) +
                struct.pack("<III", self.skip, self.total, self.first) + _pack_ids(self.ids) +
                _pack_str(self.reply) + _pack_secret(self.secret) + _pack_secret(self.window))

    @classmethod
    def decode(cls, body: bytes) -> "Pull":
        consumer, at = _unpack_str(body, 0)
        request, at = _unpack_str(body, at)
        skip, total, first = struct.unpack_from("<III", body, at)
        ids, at = _unpack_ids(body, at + 12)
        reply, at = _unpack_str(body, at)
        secret = _unpack_secret(body, at)
        window = _unpack_secret(body, at + 1 + len(secret)) if at < len(body) else b""
        if window and len(window) != WINDOW_BYTES:
            raise struct.error(f"a PULL's window has {len(window)} bytes, not {WINDOW_BYTES}")
        return cls(consumer, request, skip, total, first, ids, reply, secret, window)

    @classmethod
    def split(cls, consumer: str, request: str, skip: int, ids: array.array[int], reply: str,
              secret: bytes, window: bytes = b"") -> List["Pull"]:
        """The PULLs that carry every id, as many per message as fit (at least one)."""
        fixed = _HEADER + len(cls(consumer, request, skip, len(ids), 0, array.array("I"), reply, secret,
                                  window).encode())
        per_message = (MAX_PAYLOAD - fixed) // 4
        if per_message < 1:
            raise ValueError("the request's names and secret leave no room for block ids in a PULL")
        starts = range(0, len(ids), per_message) if len(ids) else [0]
        return [cls(consumer, request, skip, len(ids), at, ids[at:at + per_message], reply, secret, window)
                for at in starts]


@dataclasses.dataclass
class Cancel:
    consumer: str
    request: str
    reply: str
    secret: bytes = b""

    def encode(self) -> bytes:
        return _pack_str(self.consumer) + _pack_str(self.request) + _pack_str(self.reply) + _pack_secret(self.secret)

    @classmethod
    def decode(cls, body: bytes) -> "Cancel":
        consumer, at = _unpack_str(body, 0)
        request, at = _unpack_str(body, at)
        reply, at = _unpack_str(body, at)
        return cls(consumer, request, reply, _unpack_secret(body, at))


def refused_payload(reply: str, why: str) -> bytes:
    return f"{reply}\n{why}".encode()[:MAX_PAYLOAD]


def names_payload(replies: List[bytes]) -> bytes:
    """A write's notification payload naming ``replies`` (the consumer's ids): one id as
    it is (as producers did before writes were shared), several after a zero byte
    (which starts no id of a serving engine's), each with its length."""
    if len(replies) == 1:
        return replies[0]
    return b"\0" + b"".join(struct.pack("<H", len(r)) + r for r in replies)


def unpack_names(payload: bytes) -> List[str]:
    """The request ids a write's payload names (names_payload); of several, those
    before any malformed tail."""
    if payload[:1] != b"\0":
        return [payload.decode(errors="replace")]
    names, at = [], 1
    try:
        while at + 2 <= len(payload):
            (n,) = struct.unpack_from("<H", payload, at)
            if at + 2 + n > len(payload):
                break
            name, at = _unpack_str(payload, at)
            names.append(name)
    except UnicodeDecodeError:
        pass
    return names


def _pack_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<H", len(b)) + b


def _unpack_str(body: bytes, at: int) -> Tuple[str, int]:
    (n,) = struct.unpack_from("<H", body, at)
    if at + 2 + n > len(body):
        raise struct.error(f"a {n}-byte string does not fit in a {len(body)}-byte message")
    return body[at + 2:at + 2 + n].decode(), at + 2 + n


def _pack_ids(ids: array.array[int]) -> bytes:
    return struct.pack("<I", len(ids)) + ids.tobytes()  # x86-64: native order is little-endian


def _unpack_ids(body: bytes, at: int) -> Tuple[array.array[int], int]:
    (n,) = struct.unpack_from("<I", body, at)
    if at + 4 + 4 * n > len(body):
        raise struct.error(f"{n} block ids do not fit in a {len(body)}-byte message")
    return array.array("I", body[at + 4:at + 4 + 4 * n]), at + 4 + 4 * n


def _pack_secret(secret: bytes) -> bytes:
    return struct.pack("<B", len(secret)) + secret


def _unpack_secret(body: bytes, at: int) -> bytes:
    """Empty from consumers before secrets (nothing after the reply id)."""
    if at >= len(body):
        return b""
    (n,) = struct.unpack_from("<B", body, at)
    return body[at + 1:at + 1 + n]
