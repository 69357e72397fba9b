#!/usr/bin/env bash
# Session 45, call 2 (after dev45call1.sh, same prepared trees): probe-rows-only (gemv_rows2/3 without their general
# body, stacked on probe-gemv-unit, every kernel at the unit tree's offsets) - its projection and decode GPU tests,
# racecheck and memcheck of its unit-stream tests, and its A/B at B = 2 / 3 against the unit tree (no control tree:
# nothing else moved); then memcheck of main's kernel tests in what is left (dev45call1.sh runs it last, if at all).
set -u
export PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
left() { echo $(( ${LIMIT:-400} - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); echo $(( l > $1 ? $1 : (l > 1 ? l : 1) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
(cd scratch/ab/rows && timeout $(cap 90) python3 -m pytest -q -m gpu tests/test_kernels_proj.py tests/test_decode_gpu.py \
   -p no:cacheprovider -rfE > "$OUT/rows_gpu.log" 2>&1; echo "rows proj+decode GPU tests exit $?: $(tail -1 "$OUT/rows_gpu.log")"
 grep -E "^(FAILED|ERROR)" "$OUT/rows_gpu.log" | head -5
 for tool in racecheck memcheck; do
   timeout $(cap 60) compute-sanitizer --tool $tool --error-exitcode 7 python3 -m pytest -q -m gpu \
     tests/test_kernels_proj.py -k "unit_stream and (768 or 98)" -p no:cacheprovider > "$OUT/${tool}_rows.log" 2>&1
   echo "$tool (unit-stream tests, rows tree) exit $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|passed|failed' \
     "$OUT/${tool}_rows.log" | tr '\n' ' ')"
 done)
echo "elapsed $(( $(date +%s) - T0 )) s"
timeout $(cap 100) python3 benchmarks/diagnostics/ab_trees.py run --trees unit,rows --batches 1,2,3 --presets small,1b \
  --rounds 3 --deadline $(( $(cap 100) - 5 )) > "$OUT/ab_rows.log" 2>&1
tail -8 "$OUT/ab_rows.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
if (( $(left) > 60 )); then
  timeout $(cap 90) compute-sanitizer --tool memcheck --error-exitcode 7 \
    python3 -m pytest -q -m gpu tests/test_kernels_proj.py tests/test_kernels_attn.py -p no:cacheprovider \
    > "$OUT/memcheck.log" 2>&1
  echo "memcheck (main) exit $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck.log" | tr '\n' ' ')"
fi
echo "elapsed $(( $(date +%s) - T0 )) s"
