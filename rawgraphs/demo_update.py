"""``python -m rawgraphs demo --update``: change an instantiated decode graph in place, without recapture.

Three swaps, each checked against a freshly captured graph of the new configuration (tokens and logits must be
bit-identical) and timed next to what recapture + instantiate costs:
1. the whole weight set (a second seeded model) via ``GraphExec.retarget``;
2. the KV-cache pool (every layer's K and V) via ``retarget``; the old pool is then poisoned to prove it is
   no longer read;
3. a scalar, RMSNorm's eps, on every node that takes one, via ``set_args_many``.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from .bench.report import format_table
from .context import Stream
from .memory import DeviceBuffer
from .model import ModelConfig, Weights
from .model.decode import DecodeModel
from .model.generate import generate, model_step


def _weights_map(a: DecodeModel, b: DecodeModel) -> dict:
    pairs = [(a.embed, b.embed), (a.final_norm, b.final_norm)]
    if a.lm_head is not a.embed:
        pairs.append((a.lm_head, b.lm_head))
    for la, lb in zip(a.layers, b.layers):
        pairs += [(getattr(la, n), getattr(lb, n)) for n in ("w_qkv", "w_o", "w_gate_up", "w_down", "attn_norm",
                                                            "mlp_norm")]
    return dict(pairs)


def _set_eps(exe, eps: float) -> int:
    """Give every kernel node with an ``eps`` argument (norms, fused or not) the new value."""
    by_kernel: dict[str, list] = {}
    for node in exe.graph.nodes:
        if node.kind == "kernel" and "eps" in node.kernel.signature.names:
            by_kernel.setdefault(node.kernel.name, []).append(node)
    return sum(exe.set_args_many(nodes, eps=eps) for nodes in by_kernel.values())


def _decode(model, prompts, n, stream, run):
    return generate(model, prompts, n, keep_logits=True, step=model_step(model, len(prompts), stream, run=run))


def _same(a, b) -> bool:
    return a.tokens == b.tokens and all(np.array_equal(x, y) for x, y in zip(a.logits, b.logits))


def run_update_demo(cfg: ModelConfig, weights: Weights, prompts: list[list[int]], n_new: int, seed: int) -> bool:
    """Run the three swaps; print a table; True when every swap equals a fresh capture of the new setup."""
    B, stream = len(prompts), Stream.create()
    kv = len(prompts[0]) + n_new
    model = DecodeModel(cfg, weights, max_batch=B, kv_tokens=kv)
    t0 = time.perf_counter()
    exe = model.capture(B, stream).instantiate()
    recapture_ms = (time.perf_counter() - t0) * 1e3
    rows = []

    def swap(what, fresh_model, change):
        t = time.perf_counter()
        nodes = change()
        ms = (time.perf_counter() - t) * 1e3
        fresh_exe = fresh_model.capture(B, stream).instantiate()
        got = _decode(model, prompts, n_new, stream, lambda: exe.launch(stream))
        want = _decode(fresh_model, prompts, n_new, stream, lambda: fresh_exe.launch(stream))
        rows.append({"update": what, "nodes": nodes, "update ms": ms, "recapture+instantiate ms": recapture_ms,
                     "speedup": recapture_ms / ms, "equals fresh capture": _same(got, want)})
        return got

    other = DecodeModel(cfg, Weights.random(cfg, seed + 1), max_batch=B, kv_tokens=kv)
    swap("weights -> second seeded model", other, lambda: exe.retarget(_weights_map(model, other)))
    exe.retarget(_weights_map(other, model))  # back to the model's own weights

    old = [(layer.k_cache, layer.v_cache) for layer in model.layers]
    new = [(DeviceBuffer(k.shape, k.dtype), DeviceBuffer(v.shape, v.dtype)) for k, v in old]
    got = swap("KV-cache pool -> new buffers", model,
               lambda: exe.retarget({o: n for pair_o, pair_n in zip(old, new) for o, n in zip(pair_o, pair_n)}))
    for k, v in old:  # poison the old pool: the retargeted graph must not read it
        k.fill_bytes(0xFF)
        v.fill_bytes(0xFF)
    again = _decode(model, prompts, n_new, stream, lambda: exe.launch(stream))
    rows[-1]["equals fresh capture"] &= _same(got, again)

    eps = cfg.rms_norm_eps * 100
    eps_model = DecodeModel(replace(cfg, rms_norm_eps=eps), weights, max_batch=B, kv_tokens=kv)
    swap(f"rmsnorm eps {cfg.rms_norm_eps:g} -> {eps:g}", eps_model, lambda: _set_eps(exe, eps))

    print(format_table(rows, ["update", "nodes", "update ms", "recapture+instantiate ms", "speedup",
                              "equals fresh capture"], title="in-place updates of an instantiated decode graph"))
    return all(r["equals fresh capture"] for r in rows)
