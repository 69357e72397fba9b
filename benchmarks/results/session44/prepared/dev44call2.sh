#!/usr/bin/env bash
# Session 44, call 2, on main after the merge of rows-split-rso: the full GPU suite, `bench decode sweep`, memcheck of
# the kernel tests, racecheck of the gemv_rows2/3 unit-stream tests, then `bench compare` in what is left of LIMIT s.
# After the suite: probe-gemv-unit (B = 1's unit stream as a kernel of its own) A/B at B = 1 with its layout control.
set -u
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
left() { echo $(( ${LIMIT:-330} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
git log --oneline -1 | cut -c1-60
PYTHONPATH=. timeout 130 python3 -m pytest -q -m gpu tests -p no:cacheprovider -rfE > "$OUT/gpu_tests.log" 2>&1
echo "GPU suite exit $?: $(tail -1 "$OUT/gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -5
(cd scratch/ab/unit && PYTHONPATH=. timeout 60 python3 -m pytest -q -m gpu tests/test_decode_gpu.py -p no:cacheprovider \
   -rfE > "$OUT/unit_gpu.log" 2>&1; echo "unit decode GPU tests exit $?: $(tail -1 "$OUT/unit_gpu.log")")
timeout 90 python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad60,unit --batches 1 --presets small,1b \
  --rounds 3 --deadline 80 > "$OUT/ab_unit.log" 2>&1
tail -2 "$OUT/ab_unit.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
PYTHONPATH=. timeout 60 python3 -m rawgraphs bench decode sweep --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench decode sweep exit $?"; grep -E "ok after|graph  |^small|^1b" "$OUT/bench.log" | tail -30
echo "elapsed $(( $(date +%s) - T0 )) s"
PYTHONPATH=. timeout $(( $(left) > 90 ? 90 : $(left) )) compute-sanitizer --tool memcheck --error-exitcode 7 \
  python3 -m pytest -q -m gpu tests/test_kernels_proj.py tests/test_kernels_attn.py -p no:cacheprovider \
  > "$OUT/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck.log" | tr '\n' ' ')"
PYTHONPATH=. timeout $(( $(left) > 60 ? 60 : $(left) )) compute-sanitizer --tool racecheck --error-exitcode 7 \
  python3 -m pytest -q -m gpu tests/test_kernels_proj.py -k "rows_unit_stream and (768 or 98)" -p no:cacheprovider \
  > "$OUT/racecheck_rows.log" 2>&1
echo "racecheck (rows kernels) exit $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|passed|failed' \
  "$OUT/racecheck_rows.log" | tr '\n' ' ')"
echo "elapsed $(( $(date +%s) - T0 )) s"
if (( $(left) > 40 )); then
  PYTHONPATH=. timeout $(left) python3 -m rawgraphs bench compare --out "$OUT/bench" > "$OUT/compare.log" 2>&1
  echo "bench compare exit $?"; grep -E "x torch|0\.[0-9]+x|tokens" "$OUT/compare.log" | tail -12
fi
echo "elapsed $(( $(date +%s) - T0 )) s"
