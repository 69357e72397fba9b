#!/usr/bin/env bash
# Prepared in session 44 (carry scratch; ~6-7 min). Rebuild the trees first:
#   python3 benchmarks/diagnostics/ab_trees.py prepare base=main pad60=probe-layout-pad60k unit=probe-gemv-unit \
#     pad19=probe-layout-pad19k mma=probe-mma-split tc=probe-tc-split
# Session 44 found one gemv_rows kernel per row count 5-11% faster at B = 2-3. The same split for the other kernels
# that hold several runtime-picked paths:
# - unit: gemv_unit, B = 1's unit stream alone (3776 SASS, 48 registers; gemv 8008 / 64). B = 1 only. Control pad60
#   (every kernel moved +60416 B as unit moves them; splitk_reduce unmoved in both).
# - mma: gemv_mma / gemv_mma16 / gemv_mma32 by pass width (1912 / 2216 / 2840 SASS against 5752; static shared 4.6 /
#   8.6 / 16.6 KiB against 30; the 2-per-SM cap asks 80 KiB). B = 2-16 where the plans run gemv_mma. Control pad19
#   (gemm_tc*, rms_input moved +19456 B as mma moves them).
# - tc: gemm_tc32 (gemm_tc's 32-row tiles, B = 17-32) apart from gemm_tc (64-row tiles). pad19 is a rough control
#   (tc moves rms_input +11264 B).
set -u
export PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
for t in unit mma tc; do
  (cd scratch/ab/$t && timeout 90 python3 -m pytest -q -m gpu tests/test_kernels_proj.py tests/test_decode_gpu.py \
     -p no:cacheprovider -rfE > "$OUT/${t}_gpu.log" 2>&1
   echo "$t GPU tests exit $?: $(tail -1 "$OUT/${t}_gpu.log")"; grep -E "^(FAILED|ERROR)" "$OUT/${t}_gpu.log" | head -5)
done
echo "elapsed $(( $(date +%s) - T0 )) s"
python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad60,unit,pad19,mma,tc --batches 1,4,8,12,16,24,32 \
  --presets small,1b --rounds 3 --deadline $(( 560 - ($(date +%s) - T0) )) > "$OUT/ab_split2.log" 2>&1
tail -15 "$OUT/ab_split2.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
