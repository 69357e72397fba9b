#!/usr/bin/env bash
# Session 43, call 3: rows-staged-once won small B = 2 (-3.2%) and lost 1b B = 2 (+1.4%) against main, where pad2 (main's
# kernels shifted in the module as rso's are; call 2) moved neither. rsok stages rows at once only where K <= 8 x the
# block's threads (one load a row per thread), so 1b's down (K = 5632) stages row by row as on main. Its projection and
# decode GPU tests first.
set -u
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
cd scratch/ab/rsok
PYTHONPATH=. timeout 120 python3 -m pytest -q -m gpu tests/test_kernels_proj.py tests/test_decode_gpu.py \
  -p no:cacheprovider -rfE > "$OUT/rsok_gpu.log" 2>&1
echo "rsok GPU tests exit $?: $(tail -1 "$OUT/rsok_gpu.log")"; grep -E "^(FAILED|ERROR)" "$OUT/rsok_gpu.log" | head -5
cd ../../..
echo "elapsed $(( $(date +%s) - T0 )) s"
python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad2,rso,rsok --batches 2,3 --presets small,1b \
  --rounds 3 --deadline 120 > "$OUT/ab_rsok.log" 2>&1
tail -4 "$OUT/ab_rsok.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
