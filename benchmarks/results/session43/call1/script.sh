#!/usr/bin/env bash
# Prepared in session 42 (trees in scratch/ab; carry scratch; ~5 min). Rebuild the trees with
#   python3 benchmarks/diagnostics/ab_trees.py prepare base=main rso=rows-staged-once xo=gemv-x-once \
#     both=x-once-both r3k=probe-rows3-k768
# - rso: gemv_rows stages its 2-3 rows at once (one block reduction for all rows' sums of squares, each thread's first
#   16 bytes of every row kept in registers: x read once at K = 2048). 1b B = 3 (1.08 ms) sits far above B = 2 (0.85).
# - xo: gemv's stage_x keeps a thread's first 16 bytes of x from the RMSNorm sums to the store (k0 = 0): the B = 1
#   path (and gemv_rows' R = 2-3 on main's staging) reads x once at K <= 2048. gemv: 8 bytes of spill.
# - both: rso + xo. r3k (probe, on rso): gemv_rows takes 3 rows from K = 768 (small B = 3).
# All bit-identical by construction (the same sums in the same order): the unit-stream tests compare bytes with B = 1's.
# B = 8 is the control (gemv_mma, the same SASS in every tree).
set -u
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
cd scratch/ab/both
PYTHONPATH=. timeout 120 python3 -m pytest -q -m gpu tests/test_kernels_proj.py tests/test_decode_gpu.py \
  -p no:cacheprovider -rfE > "$OUT/both_gpu.log" 2>&1
echo "both GPU tests exit $?: $(tail -1 "$OUT/both_gpu.log")"; grep -E "^(FAILED|ERROR)" "$OUT/both_gpu.log" | head -5
for tool in memcheck racecheck; do
  PYTHONPATH=. timeout 90 compute-sanitizer --tool $tool --error-exitcode 7 python3 -m pytest -q -m gpu \
    tests/test_kernels_proj.py -k "unit_stream or fused_input" -p no:cacheprovider > "$OUT/both_$tool.log" 2>&1
  echo "$tool exit $? (7: errors): $(grep -E 'SUMMARY|passed|failed' "$OUT/both_$tool.log" | tr '\n' ' ')"
done
cd ../../..
echo "elapsed $(( $(date +%s) - T0 )) s"
python3 benchmarks/diagnostics/ab_trees.py run --trees base,rso,xo,both,r3k --batches 1,2,3,8 --presets small,1b \
  --rounds 3 --deadline 170 > "$OUT/ab.log" 2>&1
tail -8 "$OUT/ab.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
tar czf "$OUT/logs.tgz" -C "$OUT" both_gpu.log both_memcheck.log both_racecheck.log && rm -f "$OUT"/both_*.log
