"""CPU tests of the PyTorch comparison: its pure helpers, and ``TorchDecoder`` on the CPU against the reference.

torch is never imported in this process (under pytest it fails on the device machine): the ``TorchDecoder`` test
runs a script in a subprocess, and skips where torch is not installed.
"""

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from rawgraphs.compare import bf16_bits, key_mask, match_length
from rawgraphs.compare.agreement import (
    first_divergence,
    forced_verdict,
    prefix_lengths,
    row_noise,
    run_forced,
    same_input_logit_diff,
)


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


def test_match_length_is_the_shortest_common_prefix_over_rows():
    a = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert match_length(a, [r[:] for r in a]) == 4
    assert match_length(a, [[1, 2, 3, 4], [5, 6, 0, 8]]) == 2
    assert match_length(a, [[9, 2, 3, 4], [5, 6, 7, 8]]) == 0
    assert match_length([[1, 2, 3]], [[1, 2]]) == 2
    with pytest.raises(ValueError, match="rows"):
        match_length(a, a[:1])


_DECODER_SCRIPT = textwrap.dedent("""
    import numpy as np
    from rawgraphs.compare import TorchDecoder, match_length
    from rawgraphs.model import ModelConfig, ReferenceModel, Weights, make_block_tables
    from rawgraphs.model.reference import argmax

    for kv_heads in (2, 1):  # tiny as is (G=2), and G=4
        cfg = ModelConfig.preset("tiny").replace(n_kv_heads=kv_heads)
        w = Weights.random(cfg, 3)
        B, P, N = 3, 5, 12
        prompts = [[(7 * b + 13 * i + 1) % cfg.vocab for i in range(P)] for b in range(B)]
        got = TorchDecoder(cfg, w, max_batch=4, max_len=32, device="cpu").generate(prompts, N, "eager")
        ref = ReferenceModel(cfg, w, num_blocks=2 * B)
        tables = make_block_tables([[2 * b, 2 * b + 1] for b in range(B)], 2)
        want = [[] for _ in range(B)]
        for t in range(P - 1 + N):
            tokens = [p[t] if t < P else o[-1] for p, o in zip(prompts, want)]
            nxt = argmax(ref.step(tokens, [t] * B, tables))
            if t >= P - 1:
                for o, x in zip(want, nxt):
                    o.append(int(x))
        n = match_length(got, want)
        assert n == N, f"KVH={kv_heads}: torch tokens match the reference for {n}/{N} steps: {got} vs {want}"
    print("ok")
""")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed here")
def test_torch_decoder_greedy_tokens_match_the_reference_on_cpu():
    # the bf16-rounding reference and the torch model round at the same points: 12 greedy tokens agree exactly
    run = subprocess.run([sys.executable, "-c", _DECODER_SCRIPT], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


_PLAIN_SCRIPT = textwrap.dedent("""
    import numpy as np
    from rawgraphs.compare import PlainTorchDecoder, TorchDecoder
    from rawgraphs.model import ModelConfig, Weights

    for kv_heads in (2, 1):  # tiny (G=2), and G=4 through SDPA's grouped-query path
        cfg = ModelConfig.preset("tiny").replace(n_kv_heads=kv_heads)
        w = Weights.random(cfg, 3)
        B, P, N = 3, 5, 10
        prompts = [[(7 * b + 13 * i + 1) % cfg.vocab for i in range(P)] for b in range(B)]
        exact, plain = (c(cfg, w, max_batch=4, max_len=32, device="cpu") for c in (TorchDecoder, PlainTorchDecoder))
        want = []
        tokens = exact.generate(prompts, N, "eager", logits=want)
        worst = 0.0
        for t in range(P - 1 + N):  # the plain twin fed the exact twin's inputs at every step
            plain.step_eager([p[t] if t < P else o[t - P] for p, o in zip(prompts, tokens)], [t] * B)
            worst = max(worst, float(np.abs(plain.read_logits(B) - want[t]).max() / np.abs(want[t]).max()))
        assert 0 < worst < 0.05, f"KVH={kv_heads}: plain vs exact twin, worst relative logit difference {worst}"
    print("ok")
""")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed here")
def test_plain_twin_is_the_same_model_rounded_the_pytorch_way():
    # bf16 addmm, SDPA, bf16 SwiGLU and LM head: within bf16 noise of the exact twin, and not identical to it
    run = subprocess.run([sys.executable, "-c", _PLAIN_SCRIPT], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


def _logits(rng, steps, B, V):
    return [rng.standard_normal((B, V)).astype(np.float32) + 0.5 for _ in range(steps)]  # [B, V] per step


def test_prefix_lengths_per_row():
    assert prefix_lengths([[1, 2, 3], [4, 5, 6]], [[1, 2, 0], [4, 5, 6]]) == [2, 3]
    with pytest.raises(ValueError, match="rows"):
        prefix_lengths([[1]], [[1], [2]])


def test_first_divergence_finds_the_earliest_token_and_both_margins(rng):
    P, V = 3, 10
    a = [[1, 2, 3, 4], [5, 6, 7, 8]]
    b = [[1, 2, 9, 4], [5, 0, 7, 8]]  # row 1 differs at new token 1, row 0 at 2
    la, lb = _logits(rng, P - 1 + 4, 2, V), _logits(rng, P - 1 + 4, 2, V)
    d = first_divergence(a, b, la, lb, P)
    step = P - 1 + 1  # new token 1 comes from step P - 1 + 1
    assert (d.step, d.row, d.token_a, d.token_b) == (1, 1, 6, 0)
    assert d.margin_a == pytest.approx(la[step][1, 6] - la[step][1, 0])
    assert d.margin_b == pytest.approx(lb[step][1, 0] - lb[step][1, 6])
    assert first_divergence(a, a, la, la, P) is None


def test_same_input_logit_diff_ignores_steps_after_a_rows_inputs_differ(rng):
    P, V, n = 2, 6, 3
    a, b = [[1, 2, 3], [4, 5, 6]], [[1, 9, 3], [4, 5, 6]]  # row 0: new token 1 differs
    la = _logits(rng, P - 1 + n, 2, V)
    lb = [x.copy() for x in la]
    lb[0][:, 0] += 0.25                        # a prompt step: inputs the same in both rows
    lb[P - 1 + 1][0, 3] += 0.5                 # the step that chose the differing token: same inputs
    lb[P - 1 + 2][0, 3] += 4.0                 # row 0 read the differing token here: not comparable
    lb[P - 1 + 2][1, 3] += 0.75                # row 1 still agrees: comparable
    assert same_input_logit_diff(a, b, la, lb, P) == pytest.approx(0.75)
    assert same_input_logit_diff(a, b, la, lb, P, rows=1) == pytest.approx(0.5)


_OPS_SCRIPT = textwrap.dedent("""
    import ml_dtypes, numpy as np, torch
    from rawgraphs.compare import TorchDecoder, bf16_bits
    from rawgraphs.compare.torch_model import _attention
    from rawgraphs.model import ModelConfig, Weights
    from rawgraphs.model import reference as R

    rng = np.random.default_rng(7)
    bf = ml_dtypes.bfloat16
    t = lambda a: torch.from_numpy(bf16_bits(np.asarray(a).astype(bf))).view(torch.bfloat16)  # noqa: E731
    f64 = lambda x: x.float().numpy().astype(np.float64)  # noqa: E731
    B, H, KVH, T, hd = 3, 8, 2, 20, 64
    q = rng.standard_normal((B, H, hd)).astype(bf)           # [B, H, hd]
    k = rng.standard_normal((B, KVH, T, hd)).astype(bf)      # [B, KVH, T, hd]
    v = rng.standard_normal((B, KVH, T, hd)).astype(bf)
    ctx = np.array([1, 7, 20])
    hidden = torch.arange(T)[None, :] >= torch.from_numpy(ctx)[:, None]  # [B, T]
    mask = torch.zeros((B, 1, 1, T)).masked_fill(hidden[:, None, None, :], float("-inf"))  # [B, 1, 1, T]
    got = f64(_attention(t(q), t(k), t(v), mask, hd ** -0.5))  # [B, H*hd]
    want = np.stack([R.attention(q[b], k[b, :, :n].transpose(1, 0, 2), v[b, :, :n].transpose(1, 0, 2))
                     for b, n in enumerate(ctx)]).reshape(B, -1)
    off = np.mean(got != R.to_bf16(want))
    assert off < 2e-3, f"attention: {off:.2e} of the bf16 outputs differ from the rounded float64 reference"

    cfg = ModelConfig.preset("tiny").replace(dim=256, n_heads=4, ffn_dim=512)
    dec = TorchDecoder(cfg, Weights.random(cfg, 1), max_batch=4, max_len=16, device="cpu")
    x = (2.5 * rng.standard_normal((4, 256))).astype(bf)      # [B, N] residual
    a = rng.standard_normal((4, 512)).astype(bf)              # [B, K]
    w = (rng.standard_normal((256, 512)) / np.sqrt(512)).astype(bf)  # [N, K]
    got = f64(dec._residual(t(x), t(a), t(w)))
    want = R.to_bf16(x.astype(np.float64) + R.linear(a, w))
    off = np.mean(got != want)
    assert off < 2e-3, f"residual: {off:.2e} of the bf16 outputs differ from bf16(x + a @ w^T)"
    print("ok")
""")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed here")
def test_torch_attention_and_residual_round_once_like_the_kernels():
    # fp32 attention and fp32 residual adds: the bf16 outputs equal the rounded float64 result but for
    # fp32 summation-order ties (< 0.2%); SDPA on bf16 (~17%) or addmm on bf16 CUDA tensors (~20%) do not
    run = subprocess.run([sys.executable, "-c", _OPS_SCRIPT], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


def test_twin_ops_groups_a_projection_with_its_row_scales_and_reduce_and_tallies_differences():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import twin_ops

    names = ["embed", "L0.qkv.rms", "L0.qkv", "L0.qkv.reduce", "L0.attention", "L0.o_proj", "L0.o_proj.reduce",
             "lm_head.rms", "lm_head"]
    launches = [SimpleNamespace(name=n) for n in names]
    groups = twin_ops.op_groups(launches)
    assert [g for g, _ in groups] == ["embed", "L0.qkv", "L0.attention", "L0.o_proj", "lm_head"]
    assert [len(ls) for _, ls in groups] == [1, 3, 1, 2, 2]
    tally = twin_ops.Tally()
    ref = np.array([[1.0, 2.0, 3.0, 4.0]])  # exact in bf16
    tally.add("op", ref, ref + [[0, 0, 0, 2 ** -5]], ref)  # torch one bf16 ulp off in 1 of 4
    (row,) = tally.rows(B=1)
    assert (row["rg_ne_torch"], row["rg_ne_ref"], row["torch_ne_ref"]) == (0.25, 0.0, 0.25)
    assert row["max_rel"] == pytest.approx(2 ** -5 / 4)


def test_run_forced_feeds_the_forced_tokens_and_free_rows_their_own_argmax():
    P, n, V = 3, 4, 11
    prompts = [[1, 2, 3], [4, 5, 6]]
    forced = [[7, 8, 9, 10], None]  # row 1 runs free
    seen = []

    def step(tokens, positions):  # argmax of every row: (token + 2) % V
        seen.append((tokens.tolist(), positions.tolist()))
        out = np.zeros((len(tokens), V), np.float32)  # [B, V]
        out[np.arange(len(tokens)), (tokens + 2) % V] = 1.0
        return out

    logits = run_forced(step, prompts, forced, n)
    assert len(logits) == P - 1 + n and logits[0].shape == (2, V)
    assert [p for _, p in seen] == [[t, t] for t in range(P - 1 + n)]
    row0 = [t[0] for t, _ in seen]
    row1 = [t[1] for t, _ in seen]
    assert row0 == [1, 2, 3, 7, 8, 9]  # the prompt, then the forced tokens (the last one is decided, never fed)
    assert row1 == [4, 5, 6, 8, 10, 1]  # its own choices: 6 + 2, 8 + 2, (10 + 2) % 11
    with pytest.raises(ValueError, match="4 tokens"):
        run_forced(step, prompts, [[7, 8], None], n)


def test_row_noise_is_the_largest_difference_of_one_row(rng):
    a = _logits(rng, 5, 3, 8)
    b = [x.copy() for x in a]
    b[2][0, 4] += 0.125
    b[3][1, 0] -= 9.0  # another row: not looked at
    assert row_noise(a, b) == pytest.approx(0.125)
    assert row_noise(a, b, row=1) == pytest.approx(9.0)


def test_forced_verdict_bounds_the_logits_and_the_margins_of_disagreements(rng):
    P, n, B, V = 2, 3, 2, 6
    rg = _logits(rng, P - 1 + n, B, V)
    tokens = [[int(np.argmax(rg[P - 1 + i][b])) for i in range(n)] for b in range(B)]
    twin = [x + 0.01 * rng.standard_normal(x.shape).astype(np.float32) for x in rg]
    v = forced_verdict(tokens, rg, twin, tau=0.1, prompt_len=P)
    small = max(float(np.abs(a - b).max()) for a, b in zip(rg, twin))
    assert (v.bound, v.decisions, v.max_diff) == (0.2, B * n, pytest.approx(small))
    assert v.disagreements == 0 and v.worst_margin == 0.0 and v.passed
    assert "PASS" in v.line("x B=2") and "0/6 decisions" in v.line("x B=2")
    assert not forced_verdict(tokens, rg, twin, tau=small / 2.5, prompt_len=P).passed  # (a): logits too far

    # the twin prefers another token at one decision: it moves both top tokens half their gap (and 1e-3) apart
    s, b = P - 1 + 1, 1
    order = np.argsort(rg[s][b])  # ascending
    top, second = int(order[-1]), int(order[-2])
    gap = float(rg[s][b][top] - rg[s][b][second])
    flipped = [x.copy() for x in rg]
    flipped[s][b, top] -= gap / 2 + 1e-3
    flipped[s][b, second] += gap / 2 + 1e-3  # max |dlogit| = gap / 2 + 1e-3
    near = forced_verdict(tokens, rg, flipped, tau=gap, prompt_len=P)  # a near-tie at this noise: passes
    assert (near.disagreements, near.worst_margin, near.passed) == (1, pytest.approx(gap), True)
    far = forced_verdict(tokens, rg, flipped, tau=0.45 * gap, prompt_len=P)  # (a) holds, (b) does not
    assert far.max_diff <= far.bound < far.worst_margin and not far.passed
    assert "MISS" in far.line("x")


_FORCED_SCRIPT = textwrap.dedent("""
    import numpy as np, torch
    from rawgraphs.compare import TorchDecoder
    from rawgraphs.compare.agreement import forced_verdict, row_noise, run_forced
    from rawgraphs.model import ModelConfig, ReferenceModel, Weights, make_block_tables

    cfg = ModelConfig.preset("tiny")
    w = Weights.random(cfg, 0)
    P, N, B = 6, 32, 8
    prompts = [[(t + 7 * b) % cfg.vocab for t in (1, 10, 100, 200, 300, 400)] for b in range(B)]

    def reference(rows, bf16=True):  # 'rawgraphs': the reference, rounding where the kernels do
        m = ReferenceModel(cfg, w, 3 * rows, bf16_activations=bf16)
        tables = make_block_tables([[3 * b, 3 * b + 1, 3 * b + 2] for b in range(rows)], 3)
        return lambda tokens, positions: m.step(tokens, positions, tables).astype(np.float32)

    class NoMlpResidual(TorchDecoder):  # forgets x in x + m @ w_down^T
        def _residual(self, x, a, w):
            if w.shape[1] == self.cfg.ffn_dim:
                return self._mm_f32(a, w).to(torch.bfloat16)
            return super()._residual(x, a, w)

    def twin(cls=TorchDecoder, c=cfg):
        tm = cls(c, w, B, 48, device="cpu")
        return lambda tokens, positions: (tm.step_eager(tokens, positions), tm.read_logits(B))[1]

    rg = run_forced(reference(B), prompts, [None] * B, N)  # rawgraphs runs free
    tokens = [[int(np.argmax(rg[P - 1 + n][b])) for n in range(N)] for b in range(B)]
    # the CPU has no cross-batch noise (rows are bit-identical at any B); tau here: row 0 against the
    # all-float64 reference on the same tokens, the size of the bf16 roundings themselves
    tau = row_noise(rg, run_forced(reference(1, bf16=False), prompts[:1], tokens[:1], N))
    assert 0 < tau < 0.1, tau
    for name, step, want in [("real", twin(), True),
                             ("rope theta / 2", twin(c=cfg.replace(rope_theta=cfg.rope_theta / 2)), False),
                             ("no MLP residual", twin(NoMlpResidual), False)]:
        v = forced_verdict(tokens, rg, run_forced(step, prompts, tokens, N), tau, P)
        assert v.passed == want, (name, v)
        print(v.line(name))
    print("ok")
""")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed here")
def test_forced_verdict_passes_the_torch_twin_and_fails_broken_ones_on_cpu():
    # tiny, forced inputs: the real twin differs from the bf16 reference by ~0.02 (2 tau ~ 0.05); a twin with
    # rope theta halved by ~0.5, one without the MLP residual by ~6
    run = subprocess.run([sys.executable, "-c", _FORCED_SCRIPT], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
