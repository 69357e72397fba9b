"""Graph step time of this tree's decode model (explicit nodes, context 512, CUDA-event median of replays) for
presets x batch sizes, one JSON line each: the A/B timer of sessions 15-19.

``ab_trees.py`` runs it over several trees and tabulates the rounds; by hand, A/B two trees in one device call,
alternating so the host and the GPU's state are shared::

    git archive BASE | tar xf - -C scratch/c1        # the baseline tree (scratch/ is git-ignored; carry it)
    for round in 1 2; do
      (cd scratch/c1 && AB_TAG=base PYTHONPATH=.:benchmarks python3 benchmarks/diagnostics/ab_steps.py)
      AB_TAG=new PYTHONPATH=.:benchmarks python3 benchmarks/diagnostics/ab_steps.py
    done

Environment: ``AB_BATCHES`` (default ``1,2,3,4``), ``AB_PRESETS`` (default ``small,1b``), ``AB_CONTEXT`` (default
512: every row's context; at most 4095, the presets' max_seq_len less the new token), ``AB_TAG`` (names the tree in
the output). Run from a tree's root. Calls differ by ~3 us at B = 1 on the H200; compare within one call.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/diagnostics")
from common import CONTEXT, build_model, fill_kv_random, step_inputs
from step_costs import replay_us

from rawgraphs.context import Stream


def main() -> None:
    batches = [int(b) for b in os.environ.get("AB_BATCHES", "1,2,3,4").split(",")]
    context = int(os.environ.get("AB_CONTEXT", CONTEXT))
    stream = Stream.create()
    for preset in os.environ.get("AB_PRESETS", "small,1b").split(","):
        model = build_model(preset, max(batches), context + 16)
        rng = np.random.default_rng(0)
        fill_kv_random(model, rng)
        for B in batches:
            model.set_inputs(*step_inputs(model, B, context, rng), stream)
            launches = model.step_launches(B)
            kinds = sorted({ln.kernel.name for ln in launches})
            print(json.dumps({"tag": os.environ.get("AB_TAG", "?"), "preset": preset, "B": B, "context": context,
                              "us": round(replay_us(launches, stream), 1), "kernels": kinds}), flush=True)
        del model


if __name__ == "__main__":
    main()
