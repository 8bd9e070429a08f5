"""The kv_transfer_params a FerryConnector producer hands out (through the proxy) and a
consumer checks, before anything is asked of a producer. No vLLM import.

A producer's ``request_finished`` returns::

    {"do_remote_prefill": True, "do_remote_decode": False,
     "remote_engine_id": "prefill-0", "remote_request_id": "cmpl-1",
     "remote_block_ids": [...], "remote_num_tokens": 40,
     "tp_size": 1, "ferry_mailboxes": ["<hex descriptor>", ...],   # one per producer TP rank
     "ferry_layout": "bfloat16 L4 H2x64 B16 LBNHC", "ferry_request_secret": "<32 hex digits>"}

The mailboxes are small regions the producer's workers registered: holding one's
descriptor lets the consumer send messages to that worker, nothing more. The consumer
never writes; it tells the producer which of its own blocks to fill, and its pull (or
cancel) carries the request's secret: a pod that holds the mailbox but not the params
of this request cannot take or drop it (SECURITY.md, "KV handoff").
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional

from .._types import RegionDescriptor
from ..errors import FerryError


class BadParams(ValueError):
    """kv_transfer_params this consumer cannot take; the message says why."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """What both sides' KV caches must share for blocks to be copied as bytes."""
    dtype: str
    num_layers: int
    num_kv_heads: int  # per TP rank
    head_size: int
    block_size: int  # tokens per block
    # The order of a block's bytes in memory, as vLLM names it (e.g. LBNHC), where the
    # release says: two sides whose blocks are the same size but ordered differently
    # would swap heads and tokens.
    memory: str = ""

    def __str__(self) -> str:
        s = f"{self.dtype} L{self.num_layers} H{self.num_kv_heads}x{self.head_size} B{self.block_size}"
        return f"{s} {self.memory}" if self.memory else s


@dataclasses.dataclass(frozen=True)
class RemotePrefill:
    """A producer's kv_transfer_params, checked."""
    engine_id: str
    request_id: str
    block_ids: List[int]
    mailboxes: List[bytes]
    secret: bytes


def producer_params(engine_id: str, request_id: str, block_ids: List[int], num_tokens: int, tp_size: int,
                    mailboxes: List[bytes], layout: Layout, secret: bytes) -> Dict[str, Any]:
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_block_ids": list(block_ids),
        "remote_num_tokens": num_tokens,
        "tp_size": tp_size,
        "ferry_mailboxes": [m.hex() for m in mailboxes],
        "ferry_layout": str(layout),
        "ferry_request_secret": secret.hex(),
    }


def _field(params: Mapping[str, Any], name: str, kind: type) -> Any:
    if name not in params:
        raise BadParams(f"kv_transfer_params lack {name!r}: are they from a FerryConnector producer?")
    value = params[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BadParams(f"kv_transfer_params[{name!r}] is {type(value).__name__}, not {kind.__name__}")
    return value


def parse(params: Optional[Mapping[str, Any]], layout: Layout, tp_size: int, num_prompt_tokens: int) -> RemotePrefill:
    """Checks a producer's params against this consumer; raises BadParams saying what differs."""
    if not isinstance(params, Mapping):
        raise BadParams(f"kv_transfer_params must be a JSON object, got {type(params).__name__}")
    theirs = _field(params, "ferry_layout", str)
    if theirs != str(layout):
        raise BadParams(f"the producer's KV cache layout is '{theirs}', this consumer's is '{layout}' "
                        "(dtype, layers, KV heads per rank x head size, block size and memory layout must match)")
    their_tp = _field(params, "tp_size", int)
    if their_tp != tp_size:
        raise BadParams(f"the producer runs tensor-parallel size {their_tp}, this consumer {tp_size}: "
                        "FerryConnector needs the same size on both sides")
    mailboxes = _field(params, "ferry_mailboxes", list)
    if len(mailboxes) != tp_size:
        raise BadParams(f"kv_transfer_params name {len(mailboxes)} producer mailboxes for tensor-parallel size "
                        f"{tp_size}")
    decoded = []
    for i, m in enumerate(mailboxes):
        try:
            raw = bytes.fromhex(m)
            RegionDescriptor.from_bytes(raw)
        except (TypeError, ValueError, FerryError) as e:
            raise BadParams(f"ferry_mailboxes[{i}] is not a ferry region descriptor: {e}") from None
        decoded.append(raw)
    block_ids = _field(params, "remote_block_ids", list)
    expected = -(-num_prompt_tokens // layout.block_size)
    if len(block_ids) != expected:
        raise BadParams(f"the producer holds {len(block_ids)} blocks; a {num_prompt_tokens}-token prompt fills "
                        f"{expected} blocks of {layout.block_size} tokens")
    if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in block_ids):
        raise BadParams("remote_block_ids must be non-negative integers")
    secret_hex = _field(params, "ferry_request_secret", str)  # its absence named, not its form
    try:
        secret = bytes.fromhex(secret_hex)
    except ValueError:
        secret = b""
    if not 16 <= len(secret) <= 64:
        raise BadParams("kv_transfer_params['ferry_request_secret'] must be 32..128 hex digits")
    return RemotePrefill(engine_id=_field(params, "remote_engine_id", str),
                         request_id=_field(params, "remote_request_id", str), block_ids=list(block_ids),
                         mailboxes=decoded, secret=secret)
