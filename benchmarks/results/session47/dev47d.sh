#!/usr/bin/env bash
# Session 47's last-chance call (~240 s of device time left after the start): the A/B of probe-unit-by-op at B = 1
# against base and its layout control pad6 (two rounds), the unitop tree's full GPU suite, then memcheck of its unit
# tests as time allows. Trees from `ab_trees.py prepare` (scratch/ab).
set -u
export PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
left() { echo $(( ${LIMIT:-235} - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); echo $(( l > $1 ? $1 : (l > 1 ? l : 1) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
timeout 80 python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad6,unitop --batches 1 \
  --presets small,1b --rounds 2 --deadline 74 > "$OUT/ab_unitop.log" 2>&1
tail -2 "$OUT/ab_unitop.log"; echo "elapsed $(( $(date +%s) - T0 )) s"
cd scratch/ab/unitop
timeout $(cap 110) python3 -m pytest -q -m gpu tests -p no:cacheprovider -rfE > "$OUT/unitop_gpu.log" 2>&1
echo "unitop tree GPU suite exit $?: $(tail -1 "$OUT/unitop_gpu.log")"; grep -E "^(FAILED|ERROR)" "$OUT/unitop_gpu.log" | head -5
echo "elapsed $(( $(date +%s) - T0 )) s"
timeout $(cap 40) compute-sanitizer --tool memcheck --error-exitcode 7 python3 -m pytest -q -m gpu \
  tests/test_kernels_proj.py -k "unit" -p no:cacheprovider > "$OUT/memcheck_unitop.log" 2>&1
echo "memcheck (unitop unit tests) exit $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck_unitop.log" | tr '\n' ' ')"
echo "elapsed $(( $(date +%s) - T0 )) s"
