#!/usr/bin/env bash
# Prepared in session 43 (carry scratch; ~4 min). Rebuild the trees first:
#   python3 benchmarks/diagnostics/ab_trees.py prepare base=main pad72=probe-layout-pad72k split=rows-split \
#     srso=rows-split-rso rso=rows-staged-once
# - split: gemv_rows2 / gemv_rows3, one kernel per row count in place of gemv_rows; every other gemv.cu kernel's SASS
#   unchanged but moved +71296 B in the module.
# - pad72: main plus an unused kernel moving them by exactly that (the layout control for split).
# - srso: split + rows-staged-once (moved +76544 B). rso: rows-staged-once alone (small B = 2 -2.6 to -3.2%, 1b B = 2
#   +0.9 to +1.4% in session 43).
# B = 1 runs none of the changed kernels: there every tree but base shows only its layout.
set -u
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
for t in split srso; do
  (cd scratch/ab/$t && PYTHONPATH=. timeout 100 python3 -m pytest -q -m gpu tests/test_kernels_proj.py \
     tests/test_decode_gpu.py -p no:cacheprovider -rfE > "$OUT/${t}_gpu.log" 2>&1
   echo "$t GPU tests exit $?: $(tail -1 "$OUT/${t}_gpu.log")"; grep -E "^(FAILED|ERROR)" "$OUT/${t}_gpu.log" | head -5)
done
echo "elapsed $(( $(date +%s) - T0 )) s"
python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad72,split,srso,rso --batches 1,2,3 --presets small,1b \
  --rounds 3 --deadline 150 > "$OUT/ab_split.log" 2>&1
tail -7 "$OUT/ab_split.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
