"""CPU tests of the PyTorch comparison's pure helpers; torch is never imported here (it breaks under pytest on the
device machine), so ``TorchDecoder`` itself runs only in ``benchmarks/compare_torch.py``."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from rawgraphs.compare import bf16_bits, key_mask, match_length, rope_tables
from rawgraphs.model import ModelConfig
from rawgraphs.model.reference import rope


def test_module_imports_without_torch():
    code = ("import sys; import rawgraphs.compare, rawgraphs.compare.torch_model; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bf16_bits_are_the_bf16_bit_patterns(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)  # never exactly zero
    b = x.astype(ml_dtypes.bfloat16)
    bits = bf16_bits(b)
    assert bits.dtype == np.int16 and bits.shape == (3, 5) and bits.flags.c_contiguous
    # bf16 is the top half of fp32: shifting the bits back up rebuilds the (rounded) value exactly
    rebuilt = (bits.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(rebuilt, b.astype(np.float32))
    np.testing.assert_allclose(rebuilt, x, rtol=1e-2)


def test_bf16_bits_of_a_strided_view_and_wrong_dtype(rng):
    b = rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16)
    view = b[:, ::2]  # [4, 3] non-contiguous
    bits = bf16_bits(view)
    assert bits.flags.c_contiguous
    np.testing.assert_array_equal(bits.view(ml_dtypes.bfloat16), view)
    with pytest.raises(TypeError, match="bfloat16"):
        bf16_bits(np.ones(3, np.float32))


def test_key_mask_lets_each_row_see_slots_up_to_its_position():
    positions = np.array([0, 3, 7])
    mask = key_mask(positions, np.arange(8))  # [3, 8]
    assert mask.dtype == bool and mask.shape == (3, 8)
    np.testing.assert_array_equal(mask.sum(axis=1), positions + 1)
    np.testing.assert_array_equal(mask[1], [True] * 4 + [False] * 4)


def test_rope_tables_match_the_reference_rotation(rng):
    cfg = ModelConfig.preset("tiny")  # hd = 16
    cos, sin = rope_tables(cfg, 64)
    assert cos.shape == sin.shape == (64, cfg.head_dim // 2) and cos.dtype == np.float32
    positions = np.array([0, 5, 63])
    x = rng.standard_normal((3, cfg.n_heads, cfg.head_dim))  # [B, H, hd]
    half = cfg.head_dim // 2
    c, s = cos[positions][:, None, :].astype(np.float64), sin[positions][:, None, :].astype(np.float64)
    x1, x2 = x[..., :half], x[..., half:]
    ours = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    np.testing.assert_allclose(ours, rope(x, positions, cfg.rope_theta), rtol=1e-6, atol=1e-6)  # fp32 tables


def test_match_length_is_the_shortest_common_prefix_over_rows():
    a = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert match_length(a, [r[:] for r in a]) == 4
    assert match_length(a, [[1, 2, 3, 4], [5, 6, 0, 8]]) == 2
    assert match_length(a, [[9, 2, 3, 4], [5, 6, 7, 8]]) == 0
    assert match_length([[1, 2, 3]], [[1, 2]]) == 2
    with pytest.raises(ValueError, match="rows"):
        match_length(a, a[:1])
