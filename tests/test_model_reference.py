"""Properties of the float64 NumPy reference ops and of ``ReferenceModel`` (CPU only)."""

import ml_dtypes
import numpy as np
import pytest

from rawgraphs.model import BlockAllocator, ModelConfig, ReferenceModel, Weights, make_block_tables
from rawgraphs.model import reference as ref

THETA = 10000.0


def test_rope_is_a_rotation_and_identity_at_zero(rng):
    x = rng.standard_normal((5, 3, 32))  # [B, nh, hd]
    positions = np.array([0, 1, 7, 100, 4095])
    out = ref.rope(x, positions, THETA)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)
    np.testing.assert_array_equal(out[0], x[0])
    assert not np.allclose(out[1:], x[1:])


def test_rope_matches_rotate_half_formula(rng):
    hd = 16
    x = rng.standard_normal((1, 1, hd))
    pos = 9
    i = np.arange(hd // 2)
    angle = pos * THETA ** (-2.0 * i / hd)
    x1, x2 = x[0, 0, :hd // 2], x[0, 0, hd // 2:]
    want = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)])
    np.testing.assert_allclose(ref.rope(x, np.array([pos]), THETA)[0, 0], want, rtol=1e-12)


def test_rope_dot_product_depends_only_on_relative_position(rng):
    q, k = rng.standard_normal((1, 1, 64)), rng.standard_normal((1, 1, 64))

    def score(m, n):
        return float(np.sum(ref.rope(q, np.array([m]), THETA) * ref.rope(k, np.array([n]), THETA)))

    assert score(10, 3) == pytest.approx(score(107, 100), rel=1e-9)
    assert score(0, 0) == pytest.approx(score(55, 55), rel=1e-9)
    assert score(10, 3) != pytest.approx(score(10, 4), rel=1e-3)


def test_rmsnorm_and_silu_mul_match_direct_formulas(rng):
    x = rng.standard_normal((4, 48)) * 3.0
    w = 1.0 + 0.1 * rng.standard_normal(48)
    eps = 1e-5
    want = np.stack([row / np.sqrt(np.sum(row ** 2) / row.size + eps) * w for row in x])
    np.testing.assert_allclose(ref.rmsnorm(x, w, eps), want, rtol=1e-12)
    # scale invariance (up to eps) and unit RMS with unit weight
    np.testing.assert_allclose(ref.rmsnorm(7.0 * x, w, 0.0), ref.rmsnorm(x, w, 0.0), rtol=1e-12)
    unit = ref.rmsnorm(x, np.ones(48), 0.0)
    np.testing.assert_allclose(np.sqrt(np.mean(unit ** 2, axis=-1)), 1.0, rtol=1e-12)

    gu = rng.standard_normal((3, 2 * 20))  # [B, 2F]
    gate, up = gu[:, :20], gu[:, 20:]
    np.testing.assert_allclose(ref.silu_mul(gu), gate * (1 / (1 + np.exp(-gate))) * up, rtol=1e-12)


def test_ops_accept_bf16_and_upcast(rng):
    x = rng.standard_normal((2, 8)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((5, 8)).astype(ml_dtypes.bfloat16)
    y = ref.linear(x, w)
    assert y.dtype == np.float64 and y.shape == (2, 5)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-12)
    table = rng.standard_normal((10, 8)).astype(ml_dtypes.bfloat16)
    rows = ref.embedding(np.array([3, 3, 9]), table)
    np.testing.assert_array_equal(rows, table[[3, 3, 9]].astype(np.float64))
    assert ref.to_bf16(np.array([1.0 + 2 ** -9]))[0] == 1.0  # ties round to even


def _paged_copy(k, v, rng, num_blocks=40):
    """Scatter contiguous ``k, v [B, T, KVH, hd]`` into a paged cache with shuffled blocks."""
    n, t, kvh, hd = k.shape
    k_cache = rng.standard_normal((num_blocks, kvh, 16, hd))  # garbage where nothing was written
    v_cache = rng.standard_normal((num_blocks, kvh, 16, hd))
    alloc = BlockAllocator(num_blocks, seed=7)
    rows = [alloc.grow([], t) for _ in range(n)]
    tables = make_block_tables(rows, max_blocks=8)
    for pos in range(t):
        ref.append_kv(k_cache, v_cache, k[:, pos], v[:, pos], tables, np.full(n, pos))
    return k_cache, v_cache, tables


def test_paged_attention_over_shuffled_blocks_equals_contiguous(rng):
    n, t, h, kvh, hd = 3, 45, 4, 2, 16
    k = rng.standard_normal((n, t, kvh, hd))
    v = rng.standard_normal((n, t, kvh, hd))
    q = rng.standard_normal((n, h, hd))
    k_cache, v_cache, tables = _paged_copy(k, v, rng)
    assert np.any(np.diff(tables[:, :3], axis=1) != 1)  # the blocks really are out of order
    ctx = np.array([45, 17, 1])
    out = ref.paged_attention(q, k_cache, v_cache, tables, ctx)
    for b in range(n):
        np.testing.assert_allclose(out[b], ref.attention(q[b], k[b, :ctx[b]], v[b, :ctx[b]]), rtol=1e-12)
    # one token of context: attention returns that token's v for every head of its group
    np.testing.assert_allclose(out[2], v[2, 0][np.arange(h) // 2], rtol=1e-12)


def test_gqa_equals_repeated_kv_heads(rng):
    h, kvh, t, hd = 8, 2, 11, 8
    q = rng.standard_normal((h, hd))
    k, v = rng.standard_normal((t, kvh, hd)), rng.standard_normal((t, kvh, hd))
    rep = np.repeat(np.arange(kvh), h // kvh)  # query head h reads kv head h // (H // KVH)
    np.testing.assert_allclose(ref.attention(q, k, v), ref.attention(q, k[:, rep], v[:, rep]), rtol=1e-12)
    scores = q[5] @ k[:, 1].T / np.sqrt(hd)
    p = np.exp(scores - scores.max())
    np.testing.assert_allclose(ref.attention(q, k, v)[5], p @ v[:, 1] / p.sum(), rtol=1e-12)


def test_inactive_rows_give_zeros_and_write_nothing(rng):
    q = rng.standard_normal((3, 4, 16)) + 1.0
    k_cache = rng.standard_normal((6, 2, 16, 16))
    v_cache = rng.standard_normal((6, 2, 16, 16))
    tables = np.array([[0, 1], [2, 3], [4, 5]], dtype=np.int32)
    out = ref.paged_attention(q, k_cache, v_cache, tables, np.array([5, 0, -3]))
    assert np.all(out[1:] == 0) and np.all(out[0] != 0)
    assert np.all(ref.rope(q, np.array([3, -1, 2]), THETA)[1] == 0)
    before = k_cache.copy()
    ref.append_kv(k_cache, v_cache, q[:, :2], q[:, :2], tables, np.array([-1, -1, -1]))
    np.testing.assert_array_equal(k_cache, before)


def test_argmax_lowest_index_on_ties():
    logits = np.array([[0.0, 2.0, 2.0, -1.0], [5.0, 5.0, 5.0, 5.0]], dtype=np.float32)
    out = ref.argmax(logits)
    assert out.dtype == np.int32 and out.tolist() == [1, 0]


def test_block_allocator_grows_frees_and_reports_full():
    alloc = BlockAllocator(4, seed=1)
    blocks = alloc.grow([], 17)  # two blocks for 17 tokens
    assert len(blocks) == 2 and alloc.num_free == 2
    assert alloc.grow(blocks, 32) is blocks and len(blocks) == 2
    with pytest.raises(MemoryError):
        alloc.allocate(3)
    alloc.free(blocks)
    assert sorted(alloc.allocate(4)) == [0, 1, 2, 3]


def test_block_tables_pad_rows_and_refuse_rows_past_max_seq_len():
    table = make_block_tables([[3, 1], [2]], 3)
    assert table.dtype == np.int32 and table.tolist() == [[3, 1, 0], [2, 0, 0]]
    with pytest.raises(ValueError, match=r"row 1 holds 4 KV blocks \(64 tokens\).*has 3 \(max_seq_len 48\)"):
        make_block_tables([[0], [1, 2, 3, 4]], 3)  # e.g. a 4096-token context plus the new token at max_seq_len 4096


def _decode(model, cfg, prompts, starts, n_steps, alloc):
    """Feed each row its prompt then greedy tokens; row b is inactive before step starts[b]."""
    rows = [[] for _ in prompts]
    tokens = np.array([p[0] for p in prompts])
    history = []
    for step in range(n_steps):
        positions = np.array([step - s for s in starts])  # [B]; < 0 means not started yet
        for b, pos in enumerate(positions):
            if pos >= 0:
                alloc.grow(rows[b], pos + 1)
                if pos < len(prompts[b]):
                    tokens[b] = prompts[b][pos]
        logits = model.step(tokens, positions, make_block_tables(rows, cfg.max_seq_len // 16))
        history.append((positions, logits))
        tokens = ref.argmax(logits)
    return history


@pytest.mark.parametrize("bf16", [True, False])
def test_reference_model_batch_rows_equal_rows_run_alone(bf16):
    cfg = ModelConfig.preset("tiny")
    weights = Weights.random(cfg, seed=3)
    prompts = [[5, 9, 200, 7, 1], [300, 2], list(range(11, 28))]
    starts = [0, 4, 1]
    n_steps = 24
    batched = _decode(ReferenceModel(cfg, weights, 64, bf16_activations=bf16), cfg, prompts, starts, n_steps,
                      BlockAllocator(64, seed=5))
    for b in range(3):
        single = ReferenceModel(cfg, weights, 8, bf16_activations=bf16)
        alone = _decode(single, cfg, [prompts[b]], [starts[b]], n_steps, BlockAllocator(8))
        for (pos, logits), (_, logits_alone) in zip(batched, alone, strict=True):
            if pos[b] >= 0:
                np.testing.assert_allclose(logits[b], logits_alone[0], rtol=1e-9, atol=1e-9)
    positions, logits = batched[-1]
    assert np.all(positions >= 16) and np.all(np.isfinite(logits))
    assert 0.1 < logits.std() < 100  # activations stay O(1) through the layers
    assert logits.dtype == np.float64 and logits.shape == (3, cfg.vocab)


def test_bf16_activations_stay_close_to_float64():
    cfg = ModelConfig.preset("tiny")
    weights = Weights.random(cfg, seed=4)
    exact = ReferenceModel(cfg, weights, 4, bf16_activations=False)
    rounded = ReferenceModel(cfg, weights, 4, bf16_activations=True)
    assert rounded.k_cache[0].dtype == ml_dtypes.bfloat16 and exact.k_cache[0].dtype == np.float64
    table = np.array([[2, 0, 1]], dtype=np.int32)
    for pos, tok in enumerate([3, 70, 500, 9, 9, 41]):
        a = exact.step(np.array([tok]), np.array([pos]), table)
        b = rounded.step(np.array([tok]), np.array([pos]), table)
    assert not np.array_equal(a, b)
    assert np.max(np.abs(a - b)) < 0.05 * np.max(np.abs(a))


def test_rope_tables_match_the_reference_rotation(rng):
    cfg = ModelConfig.preset("tiny")  # hd = 16
    cos, sin = ref.rope_tables(cfg.head_dim, cfg.rope_theta, 64)
    assert cos.shape == sin.shape == (64, cfg.head_dim // 2) and cos.dtype == np.float32
    positions = np.array([0, 5, 63])
    x = rng.standard_normal((3, cfg.n_heads, cfg.head_dim))  # [B, H, hd]
    half = cfg.head_dim // 2
    c, s = cos[positions][:, None, :].astype(np.float64), sin[positions][:, None, :].astype(np.float64)
    x1, x2 = x[..., :half], x[..., half:]
    ours = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    np.testing.assert_allclose(ours, ref.rope(x, positions, cfg.rope_theta), rtol=1e-6, atol=1e-6)  # fp32 tables
