"""Paged KV-cache helper: block ids in, chunk lists out.

The common layout (vLLM, SGLang): per layer, K and V tensors of shape
``[num_blocks, block_size, num_heads, head_dim]``. With the tensors registered as one
region, back to back (layer 0 K, layer 0 V, layer 1 K, ...; or any fixed stride), moving
blocks between two pods is one write:

    layout = ferry.KVLayout(num_layers=32, num_blocks=4096, block_size=16, num_heads=8,
                            head_dim=128, element_size=2)
    chunks = layout.chunks(src_block_ids, dst_block_ids)
    client.write(region, peer_descriptor, chunks).result()

Runs of consecutive ids on both sides become one chunk.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

Chunk = Tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_blocks: int
    block_size: int  # tokens per block
    num_heads: int
    head_dim: int
    element_size: int  # bytes per element (2 for fp16/bf16)
    kv: int = 2  # tensors per layer (K and V; 1 for MLA-style caches)
    tensor_stride: Optional[int] = None  # bytes between tensors; default: packed

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.num_heads * self.head_dim * self.element_size

    @property
    def tensor_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def stride(self) -> int:
        return self.tensor_stride if self.tensor_stride is not None else self.tensor_bytes

    @property
    def region_bytes(self) -> int:
        """Size of the region holding every tensor."""
        return (self.num_layers * self.kv - 1) * self.stride + self.tensor_bytes

    def chunks(self, src_ids: Sequence[int], dst_ids: Sequence[int], dst: Optional["KVLayout"] = None,
               layers: Optional[Sequence[int]] = None) -> List[Chunk]:
        """Chunks moving block src_ids[i] to dst_ids[i] in every K and V tensor of
        ``layers`` (default all). ``dst`` is the destination's layout (default the same);
        both must have the same block shape."""
        dst = dst or self
        if dst.block_bytes != self.block_bytes:
            raise ValueError(f"block sizes differ: {self.block_bytes} vs {dst.block_bytes} bytes")
        if len(src_ids) != len(dst_ids):
            raise ValueError(f"{len(src_ids)} source ids but {len(dst_ids)} destination ids")
        for ids, layout, side in ((src_ids, self, "source"), (dst_ids, dst, "destination")):
            bad = [i for i in ids if not 0 <= i < layout.num_blocks]
            if bad:
                raise ValueError(f"{side} block id {bad[0]} is outside 0..{layout.num_blocks - 1}")
        runs = _runs(src_ids, dst_ids)
        bb = self.block_bytes
        out: List[Chunk] = []
        for layer in (range(self.num_layers) if layers is None else layers):
            for k in range(self.kv):
                t = layer * self.kv + k
                for s, d, n in runs:
                    out.append((t * self.stride + s * bb, t * dst.stride + d * bb, n * bb))
        return out


def _runs(src_ids: Sequence[int], dst_ids: Sequence[int]) -> List[Tuple[int, int, int]]:
    """(src_start, dst_start, count) for maximal runs consecutive on both sides."""
    runs: List[Tuple[int, int, int]] = []
    for s, d in zip(src_ids, dst_ids, strict=False):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs
