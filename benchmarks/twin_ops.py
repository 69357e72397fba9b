"""twin_ops: rawgraphs' kernels against the PyTorch twin's ops, op by op, on the very same inputs (issue 7).

For each prompt step (6 tokens) of a ``small`` model at B = 1 and 8, the decode step's launches run one op at a
time (a projection and its split-K reduce count as one op). Before each op the script reads the kernels' input
buffers (``x``, ``qkv``, ``q``, ``attn``, ``gu``, the KV cache); after it, the kernel's output. The twin's torch
op (``rawgraphs.compare.torch_model``) runs on those same inputs, and both are compared with the float64
reference op rounded where the kernel stores (bf16, or fp32 for the logits). Two torch formulations the twin
no longer uses are measured beside it: ``F.scaled_dot_product_attention`` on bf16 and ``torch.addmm`` on bf16.

Columns: the fraction of output elements where rawgraphs and torch differ, where each differs from the rounded
reference, and ``max |rg - torch| / max |ref|``. fp32 summation order alone flips ~1e-4..1e-3 of bf16 roundings;
a rounding point that differs shows up as 0.1-0.2.

Run: ``python benchmarks/twin_ops.py [--out DIR]``; prints one table, writes ``DIR/twin_ops.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from rawgraphs.bench import BenchResult, collect_metadata, format_table
from rawgraphs.compare.torch_model import TorchDecoder, _attention, _rmsnorm, _rope, bf16_bits
from rawgraphs.context import Stream, device, gpu_available
from rawgraphs.model import ModelConfig, Weights, make_block_tables
from rawgraphs.model import reference as R
from rawgraphs.model.decode import DecodeModel

PROMPT = [1, 10, 100, 200, 300, 400]
BATCHES = (1, 8)
MAX_LEN = 48


class Tally:
    """Element counts per op: rawgraphs != torch, rawgraphs != reference, torch != reference, and the worst
    ``|rg - torch| / max |ref|``."""

    def __init__(self):
        self.ops: dict[str, list] = {}

    def add(self, op: str, rg, tw, ref_f64: np.ndarray, bf16: bool = True) -> None:
        rg, tw = np.asarray(rg, np.float64), np.asarray(tw, np.float64)
        ref = R.to_bf16(ref_f64) if bf16 else ref_f64.astype(np.float32).astype(np.float64)
        s = self.ops.setdefault(op, [0, 0, 0, 0, 0.0])
        s[0] += int(np.sum(rg != tw))
        s[1] += int(np.sum(rg != ref))
        s[2] += int(np.sum(tw != ref))
        s[3] += rg.size
        s[4] = max(s[4], float(np.abs(rg - tw).max() / np.abs(ref_f64).max()))

    def rows(self, B: int) -> list[dict]:
        return [{"batch": B, "op": op, "rg_ne_torch": a / n, "rg_ne_ref": b / n, "torch_ne_ref": c / n,
                 "max_rel": mx, "elements": n} for op, (a, b, c, n, mx) in self.ops.items()]


def op_groups(launches) -> list[tuple[str, list]]:
    """Consecutive launches of one op (``L3.qkv.rms``, ``L3.qkv`` and ``L3.qkv.reduce``) grouped under its name."""
    groups: list[tuple[str, list]] = []
    for ln in launches:
        name = ln.name.removesuffix(".reduce").removesuffix(".rms")
        if groups and groups[-1][0] == name:
            groups[-1][1].append(ln)
        else:
            groups.append((name, [ln]))
    return groups


def compare_batch(rg: DecodeModel, tm: TorchDecoder, w: Weights, B: int, stream: Stream) -> list[dict]:
    """Run the prompt steps op by op for ``B`` rows and tally every op of every layer."""
    import torch
    import torch.nn.functional as F

    c = rg.cfg
    H, hd = c.n_heads, c.head_dim

    def T(a):  # a bf16 host array -> a CUDA bf16 tensor with the same bits
        return torch.from_numpy(bf16_bits(np.asarray(a).astype(ml_dtypes.bfloat16))).view(torch.bfloat16).cuda()

    def N(x):  # a tensor -> float64 host array
        return x.float().cpu().numpy().astype(np.float64)

    tally = Tally()
    prompts = [[(t + 7 * b) % c.vocab for t in PROMPT] for b in range(B)]
    tables = make_block_tables([[3 * b, 3 * b + 1, 3 * b + 2] for b in range(B)], rg.max_blocks)
    groups = op_groups(rg.step_launches(B))
    for t in range(len(PROMPT)):
        pos = np.full(B, t)
        rg.set_inputs([p[t] for p in prompts], pos, tables, stream)
        pos_t = torch.from_numpy(pos).cuda()
        cos, sin = tm.cos[pos_t][:, None], tm.sin[pos_t][:, None]  # [B, 1, hd/2]
        for name, launches in groups:
            layer = int(name.split(".")[0][1:]) if name.startswith("L") else None
            op, lw = name.split(".")[-1], (w.layers[layer] if layer is not None else None)
            stream.synchronize()
            x_in, qkv_in, gu_in = rg.x.to_numpy()[:B], rg.qkv.to_numpy()[:B], rg.gu.to_numpy()[:B]
            attn_in = rg.attn.to_numpy()[:B]
            for ln in launches:
                ln.kernel.launch(ln.shape, ln.args, stream)
            stream.synchronize()
            if op == "qkv":
                tw = N(F.linear(_rmsnorm(T(x_in), T(lw.attn_norm), c.rms_norm_eps), T(lw.w_qkv)))
                ref = R.linear(R.to_bf16(R.rmsnorm(x_in, lw.attn_norm, c.rms_norm_eps)), lw.w_qkv)
                tally.add("rmsnorm + qkv", rg.qkv.to_numpy()[:B], tw, ref)
            elif op == "attention":  # RoPE and the KV append are fused into the attention kernel
                qv = qkv_in[:, :c.q_dim].reshape(B, H, hd)  # [B, H, hd] before RoPE
                q_ref = R.to_bf16(R.rope(qv, pos, c.rope_theta))  # as the kernel rounds it
                q_tw = _rope(T(qv), cos, sin)
                kc, vc = rg.layers[layer].k_cache.to_numpy(), rg.layers[layer].v_cache.to_numpy()  # appended
                keys = np.stack([R._gather(kc, tables[b], t + 1) for b in range(B)]).transpose(0, 2, 1, 3)
                vals = np.stack([R._gather(vc, tables[b], t + 1) for b in range(B)]).transpose(0, 2, 1, 3)
                mask = torch.zeros((B, 1, 1, t + 1), device="cuda")  # [B, 1, 1, T]: every slot visible
                ref = R.paged_attention(q_ref, kc, vc, tables, pos + 1).reshape(B, -1)  # [B, H*hd]
                out = rg.attn.to_numpy()[:B]
                twin = _attention(q_tw, T(keys), T(vals), mask, hd ** -0.5)  # [B, H*hd]
                tally.add("rope + attention, fp32 (twin)", out, N(twin), ref)
                sdpa = F.scaled_dot_product_attention(q_tw.unsqueeze(2), T(keys), T(vals),
                                                      attn_mask=mask.to(torch.bfloat16))  # [B, H, 1, hd]
                tally.add("rope + attention, SDPA bf16 (old)", out, N(sdpa.reshape(B, -1)), ref)
            elif op in ("o_proj", "down"):  # gu holds silu(gate) * up (gate_up's epilogue)
                a_in = attn_in if op == "o_proj" else gu_in
                wt = T(lw.w_o if op == "o_proj" else lw.w_down)
                ref = x_in.astype(np.float64) + R.linear(a_in, lw.w_o if op == "o_proj" else lw.w_down)
                a = T(a_in)
                out = rg.x.to_numpy()[:B]
                label = "o_proj + residual" if op == "o_proj" else "down + residual"
                tally.add(f"{label} (twin)", out, N(tm._residual(T(x_in), a, wt)), ref)
                tally.add(f"{label}, addmm bf16 (old)", out, N(torch.addmm(T(x_in), a, wt.t())), ref)
            elif op == "gate_up":  # its epilogue applies silu(gate) * up
                gate, up = F.linear(_rmsnorm(T(x_in), T(lw.mlp_norm), c.rms_norm_eps), T(lw.w_gate_up)).chunk(2, -1)
                tw = N((F.silu(gate.float()) * up.float()).to(torch.bfloat16))
                gu = R.to_bf16(R.linear(R.to_bf16(R.rmsnorm(x_in, lw.mlp_norm, c.rms_norm_eps)), lw.w_gate_up))
                tally.add("rmsnorm + gate_up + silu*up", rg.gu.to_numpy()[:B], tw, R.silu_mul(gu))
            elif op == "lm_head":
                h = _rmsnorm(T(x_in), T(w.final_norm), c.rms_norm_eps)
                ref = R.linear(R.to_bf16(R.rmsnorm(x_in, w.final_norm, c.rms_norm_eps)), w.lm_head)
                tally.add("rmsnorm + lm_head (fp32)", rg.logits.to_numpy()[:B], N(tm._mm_f32(h, T(w.lm_head))), ref,
                          bf16=False)
    return tally.rows(B)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results", help="folder for twin_ops.json")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("torch") is None or not gpu_available():
        print("twin_ops needs torch and an NVIDIA GPU; this machine lacks one of them, so nothing ran.")
        return 0
    device()  # the primary context first: torch's tensors are created in it afterwards
    cfg = ModelConfig.preset("small")
    w = Weights.random(cfg, 0)
    rg = DecodeModel(cfg, w, max_batch=max(BATCHES), kv_tokens=MAX_LEN)
    tm = TorchDecoder(cfg, w, max(BATCHES), MAX_LEN)
    rows = []
    with Stream.create() as stream:
        for B in BATCHES:
            rows += compare_batch(rg, tm, w, B, stream)
    print(format_table(rows, ["batch", "op", ("rg_ne_torch", "rg != torch"), ("rg_ne_ref", "rg != ref"),
                              ("torch_ne_ref", "torch != ref"), ("max_rel", "max |rg-torch|/max|ref|")],
                       title=f"small, {len(PROMPT)} prompt steps, every layer: fraction of outputs that differ"))
    result = BenchResult("twin_ops", collect_metadata(import_torch=True),
                         params={"model": "small", "prompt": PROMPT, "batches": BATCHES,
                                 "matmul_flags": tm.matmul_flags, "ops": rows})  # counts, not timed samples
    print(f"wrote {result.write_json(Path(args.out) / 'twin_ops.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
