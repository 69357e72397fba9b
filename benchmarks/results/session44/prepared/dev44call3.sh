#!/usr/bin/env bash
# Session 44, call 3 (the budget's last ~190 s): main's full GPU suite after the merge of rows-split-rso, then
# probe-gemv-unit (B = 1's unit stream as a kernel of its own) against main and its layout control at B = 1.
set -u
export PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
git log --oneline -1 | cut -c1-60
timeout 105 python3 -m pytest -q -m gpu tests -p no:cacheprovider -rfE > "$OUT/gpu_tests.log" 2>&1
echo "GPU suite exit $?: $(tail -1 "$OUT/gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -5
echo "elapsed $(( $(date +%s) - T0 )) s"
(cd scratch/ab/unit && timeout 35 python3 -m pytest -q -m gpu tests/test_decode_gpu.py -p no:cacheprovider -x \
   > "$OUT/unit_gpu.log" 2>&1; echo "unit decode GPU tests exit $?: $(tail -1 "$OUT/unit_gpu.log")")
timeout $(( 178 - ($(date +%s) - T0) )) python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad60,unit \
  --batches 1 --presets small,1b --rounds 2 --deadline $(( 172 - ($(date +%s) - T0) )) > "$OUT/ab_unit.log" 2>&1
tail -2 "$OUT/ab_unit.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
