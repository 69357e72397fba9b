"""What a decode step's weight bytes cost *in situ*, and what is left of the step without them: the step (explicit
nodes, B rows at context 512) timed as it is, then with one kind of projection weight (or all four) shared by every
layer, so that from the second layer on that kind is read from L2 instead of HBM. The sharing is an
``exe.retarget`` of the instantiated step (every layer's pointer to its own weights moved to layer 0's), so the
nodes, grids and kernels are the same; only the addresses the weights come from change. The outputs are those of
another model, only the time counts.

"all" shares the four kinds: what remains is the step's latency skeleton (launch boundaries, input staging,
reductions, attention's chain and its K/V bytes, the LM head's 49-131 MB) plus the weights' L2 reads. It means
that only where a layer's shared bytes stay in L2 between layers (small: 14.2 MB a layer, inside the H100's 50 MB
L2); 1b's do not (gate_up alone is 46 MB; a layer 103 MB), so its rows move by no more than the run-to-run spread.
H100, session 37 (``results/session37/shared_weights_*.log``): small B=1 207.5 us, all shared 199.5 us (8.0 us
saved of 51.7 us of HBM reads spared); 1b B=1 739.6 -> 735.6 us.

Run from the repository root: ``PYTHONPATH=. python3 benchmarks/diagnostics/shared_weights.py [preset [B]]``
(default ``small 1``).
"""

import sys

import numpy as np

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/diagnostics")
from common import CONTEXT, build_model, fill_kv_random, step_inputs
from step_costs import replay_us

from rawgraphs.bench.bandwidth import copy_bandwidth_gbs
from rawgraphs.context import Stream

WEIGHTS = {"qkv": "w_qkv", "o_proj": "w_o", "gate_up": "w_gate_up", "down": "w_down"}  # kind -> _Layer attribute


def shared_mapping(layers, kinds) -> dict:
    """``exe.retarget`` mapping that points every layer's weights of ``kinds`` at the first layer's."""
    unknown = set(kinds) - set(WEIGHTS)
    if unknown:
        raise ValueError(f"unknown weight kinds {sorted(unknown)}; known: {sorted(WEIGHTS)}")
    first = layers[0]
    return {getattr(layer, WEIGHTS[k]): getattr(first, WEIGHTS[k]) for k in kinds for layer in layers[1:]}


def main(preset: str = "small", B: int = 1) -> None:
    model = build_model(preset, B, CONTEXT + 16)
    stream = Stream.create()
    rng = np.random.default_rng(0)
    fill_kv_random(model, rng)
    model.set_inputs(*step_inputs(model, B, CONTEXT, rng), stream)
    launches = model.step_launches(B)
    gbs = copy_bandwidth_gbs(stream)
    whole = replay_us(launches, stream)
    n = model.cfg.n_layers
    print(f"{preset} B={B}, context {CONTEXT}: {len(launches)} launches, step {whole:.1f} us; copy bandwidth "
          f"{gbs:.0f} GB/s")
    print(f"  {'shared by every layer':24s} {'MB/layer':>9s} {'step us':>8s} {'saved us':>9s} {'HBM bytes us':>13s} "
          f"{'saved/bytes':>12s}")
    for kinds in [[k] for k in WEIGHTS] + [list(WEIGHTS)]:
        mapping = shared_mapping(model.layers, kinds)
        per_layer = sum(getattr(model.layers[0], WEIGHTS[k]).nbytes for k in kinds)

        def share(exe, mapping=mapping):  # one node per layer and kind reads each weight at this B
            changed = exe.retarget(mapping)
            if changed != len(mapping):
                raise RuntimeError(f"retarget moved {changed} nodes, expected {len(mapping)}")

        us = replay_us(launches, stream, share)
        bytes_us = (n - 1) * per_layer / (gbs * 1e3)  # what the HBM reads it spares take at copy bandwidth
        print(f"  {'+'.join(kinds) if len(kinds) < 4 else 'all':24s} {per_layer / 1e6:9.2f} {us:8.1f} "
              f"{whole - us:9.1f} {bytes_us:13.1f} {(whole - us) / bytes_us:12.2f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "small", int(args[1]) if len(args) > 1 else 1)
