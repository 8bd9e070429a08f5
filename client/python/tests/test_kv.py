"""KVLayout: block ids to chunk lists (pure logic)."""
import pytest

import ferry


def test_chunks_cover_every_tensor_and_coalesce_runs():
    layout = ferry.KVLayout(num_layers=2, num_blocks=8, block_size=16, num_heads=2, head_dim=4, element_size=2)
    bb = 16 * 2 * 4 * 2
    assert layout.block_bytes == bb and layout.region_bytes == 4 * 8 * bb
    chunks = layout.chunks([0, 1, 2, 7], [4, 5, 6, 0])
    # Per tensor: ids 0..2 -> 4..6 is one run, 7 -> 0 another; four tensors (2 layers x K, V).
    assert len(chunks) == 8
    assert chunks[0] == (0, 4 * bb, 3 * bb)
    assert chunks[1] == (7 * bb, 0, bb)
    assert chunks[7] == (3 * 8 * bb + 7 * bb, 3 * 8 * bb, bb)


def test_strides_layers_and_bad_ids():
    src = ferry.KVLayout(1, 4, 1, 1, 8, 1, tensor_stride=100)
    dst = ferry.KVLayout(1, 6, 1, 1, 8, 1)
    assert src.chunks([3], [5], dst=dst) == [(24, 40, 8), (124, 48 + 40, 8)]
    assert ferry.KVLayout(3, 4, 1, 1, 8, 1).chunks([0], [1], layers=[2]) == [(4 * 32 + 0, 4 * 32 + 8, 8),
                                                                            (5 * 32, 5 * 32 + 8, 8)]
    with pytest.raises(ValueError):
        src.chunks([4], [0])
    with pytest.raises(ValueError):
        src.chunks([0, 1], [0])
