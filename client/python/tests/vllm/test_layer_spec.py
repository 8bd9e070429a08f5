"""FerryConnector's reading of KV cache tensors (ferry.vllm.worker.layer_spec) for every
arrangement vLLM's attention backends allocate, and its import on releases that lack
newer connector types."""
import subprocess
import sys

import pytest
import torch

from ferry.vllm.worker import layer_spec, physical_view

NB, H, N, D = 8, 2, 16, 64


def permuted(physical_shape, order):
    """A view in logical order of a contiguous allocation in physical order (what vLLM does
    with a backend's stride order)."""
    raw = torch.empty(physical_shape, dtype=torch.bfloat16)
    return raw.permute(*[order.index(i) for i in range(len(order))])


@pytest.mark.parametrize("tensor, num_blocks, block_elems, halves", [
    # [2, num_blocks, block_size, heads, head_dim] as shaped: K and V halves outermost.
    (torch.empty(2, NB, N, H, D, dtype=torch.bfloat16), NB, N * H * D, 2),
    # The same logical shape allocated blocks first: each block holds its K and V.
    (permuted((NB, 2, N, H, D), (1, 0, 2, 3, 4)), NB, 2 * N * H * D, 1),
    # vLLM 0.26+ FlashAttention, LBNHC: (num_blocks, heads, block_size, 2 * head_dim) over NHC memory.
    (permuted((NB, N, H, 2 * D), (0, 2, 1, 3)), NB, 2 * N * H * D, 1),
    # LBHNC: the same shape, contiguous.
    (torch.empty(NB, H, N, 2 * D, dtype=torch.bfloat16), NB, 2 * N * H * D, 1),
    # MLA: (num_blocks, block_size, latent).
    (torch.empty(NB, N, 576, dtype=torch.bfloat16), NB, N * 576, 1),
])
def test_each_arrangement_gives_its_blocks(tensor, num_blocks, block_elems, halves):
    spec = layer_spec(tensor)
    assert (spec.num_blocks, spec.block_bytes, spec.halves) == (num_blocks, block_elems * 2, halves)
    flat = physical_view(tensor)
    assert flat.is_contiguous() and flat.data_ptr() == tensor.data_ptr() and flat.numel() == tensor.numel()


def test_a_layer_view_with_gaps_is_refused():
    # Block-outermost (BLNHC): a layer's blocks sit a whole block of all layers apart.
    raw = torch.empty(NB, 4, H, N, 2 * D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="VLLM_KV_CACHE_LAYOUT=LBNHC"):
        layer_spec(raw[:, 1])


def test_a_tensor_with_blocks_inside_is_refused():
    with pytest.raises(ValueError, match="blocks .* are outermost"):
        layer_spec(permuted((H, NB, N, 2 * D), (1, 0, 2, 3)))


def test_the_connector_imports_on_releases_without_the_newer_types():
    # vLLM 0.26 has neither KVConnectorTransferResults nor KVConnectorWorkerMetadata; in a
    # process of its own, so that no other test sees a reloaded module.
    code = """
from vllm.distributed.kv_transfer.kv_connector.v1 import base
del base.KVConnectorTransferResults, base.KVConnectorWorkerMetadata
import ferry.vllm.connector as c
r = c.KVConnectorTransferResults(finished_sending={"a"}, finished_recving=set(), failed_recving=set())
assert r.finished_sending == {"a"} and c.FerryWorkerMetadata({0: b"m"}).mailboxes == {0: b"m"}
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
