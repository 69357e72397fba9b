#!/usr/bin/env bash
# Session 45, call 1, on main c6e64e5 (rows-split-rso merged in session 44, not run on a GPU since the merge):
# the full GPU suite; on an H200 `bench all` (issues #4 and #7 state their targets there), on an H100 `bench decode
# sweep`; probe-gemv-unit's projection, decode and trace GPU tests and its A/B at B = 1 against main and its
# layout control (scratch/ab: base, pad49, unit); racecheck of gemv_rows2/3; probe-mma-split's GPU tests and A/B
# (small B = 3-16 against main and pad18); then memcheck of the kernel tests in what is left.
set -u
export PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
left() { echo $(( ${LIMIT:-560} - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); echo $(( l > $1 ? $1 : (l > 1 ? l : 1) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
git log --oneline -1 | cut -c1-60
timeout 150 python3 -m pytest -q -m gpu tests -p no:cacheprovider -rfE --durations=5 > "$OUT/gpu_tests.log" 2>&1
echo "GPU suite exit $?: $(tail -1 "$OUT/gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -5
echo "elapsed $(( $(date +%s) - T0 )) s"
mkdir -p "$OUT/bench"
if grep -q H200 "$OUT/card.txt"; then WHAT=all; else WHAT="decode sweep"; fi
timeout $(cap 330) python3 -m rawgraphs bench $WHAT --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench $WHAT exit $?"; grep -E "ok after|All|benchmarks ran|failed" "$OUT/bench.log" | tail -12
echo "elapsed $(( $(date +%s) - T0 )) s"
(cd scratch/ab/unit && timeout $(cap 90) python3 -m pytest -q -m gpu tests/test_kernels_proj.py tests/test_decode_gpu.py \
   tests/test_trace.py -p no:cacheprovider -rfE > "$OUT/unit_gpu.log" 2>&1; echo "unit proj+decode+trace GPU tests exit $?: \
$(tail -1 "$OUT/unit_gpu.log")"; grep -E "^(FAILED|ERROR)" "$OUT/unit_gpu.log" | head -5)
timeout $(cap 100) python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad49,unit --batches 1 \
  --presets small,1b --rounds 3 --deadline $(( $(cap 100) - 5 )) > "$OUT/ab_unit.log" 2>&1
tail -12 "$OUT/ab_unit.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
timeout $(cap 60) compute-sanitizer --tool racecheck --error-exitcode 7 \
  python3 -m pytest -q -m gpu tests/test_kernels_proj.py -k "rows_unit_stream and (768 or 98)" -p no:cacheprovider \
  > "$OUT/racecheck_rows.log" 2>&1
echo "racecheck (rows kernels) exit $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|passed|failed' \
  "$OUT/racecheck_rows.log" | tr '\n' ' ')"
(cd scratch/ab/mma && timeout $(cap 80) python3 -m pytest -q -m gpu tests/test_kernels_proj.py tests/test_decode_gpu.py \
   -p no:cacheprovider -rfE > "$OUT/mma_gpu.log" 2>&1; echo "mma proj+decode GPU tests exit $?: $(tail -1 "$OUT/mma_gpu.log")"
   grep -E "^(FAILED|ERROR)" "$OUT/mma_gpu.log" | head -5)
timeout $(cap 80) python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad18,mma --batches 3,4,8,9,12,16 \
  --presets small --rounds 3 --deadline $(( $(cap 80) - 5 )) > "$OUT/ab_mma.log" 2>&1
tail -9 "$OUT/ab_mma.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
timeout $(cap 90) compute-sanitizer --tool memcheck --error-exitcode 7 \
  python3 -m pytest -q -m gpu tests/test_kernels_proj.py tests/test_kernels_attn.py -p no:cacheprovider \
  > "$OUT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck.log" | tr '\n' ' ')"
(cd "$OUT" && tar czf bench.tgz bench && rm -rf bench)
echo "elapsed $(( $(date +%s) - T0 )) s"
