#!/usr/bin/env bash
# The probe call for the next session (first of two; the second is dev_bench.sh): probe-unit-by-op against main and
# its layout control pad6 (trees from `ab_trees.py prepare`, in scratch/ab; see benchmarks/NOTES.md session 47).
# In order of value, each step capped by what is left of LIMIT s:
#   1. A/B of the graph step at B = 1, small and 1b, three rounds;
#   2. the unitop tree's full GPU suite (main's merged gemv_unit and gemv_mma split with it);
#   3. memcheck, then racecheck, of its unit-kernel tests;
#   4. Nsight Compute per kernel of one small B = 1 replay on base and unitop: time, instructions executed and every
#      stall reason per issued instruction (no_instruction = instruction fetch), to say why a smaller B = 1 kernel
#      runs faster. Isolated, serialized kernels; clocks left alone; caches not flushed.
# Writes 7 files to $OUT (a call brings back at most 8).
set -u
export PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
left() { echo $(( ${LIMIT:-420} - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); echo $(( l > $1 ? $1 : (l > 1 ? l : 1) )); }
stamp() { echo "elapsed $(( $(date +%s) - T0 )) s"; }
ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
timeout $(cap 110) python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad6,unitop --batches 1 \
  --presets small,1b --rounds 3 --deadline $(( $(cap 110) - 6 )) > "$OUT/ab_unitop.log" 2>&1
tail -2 "$OUT/ab_unitop.log"; stamp
cd scratch/ab/unitop
timeout $(cap 115) python3 -m pytest -q -m gpu tests -p no:cacheprovider -rfE > "$OUT/unitop_gpu.log" 2>&1
echo "unitop tree GPU suite exit $?: $(tail -1 "$OUT/unitop_gpu.log")"
grep -E "^(FAILED|ERROR)" "$OUT/unitop_gpu.log" | head -5; stamp
for tool in memcheck racecheck; do
  sel=unit; [ $tool = racecheck ] && sel="unit_stream and (98-40 or 2304-768)"
  timeout $(cap 40) compute-sanitizer --tool $tool --error-exitcode 7 python3 -m pytest -q -m gpu \
    tests/test_kernels_proj.py -k "$sel" -p no:cacheprovider > "$OUT/${tool}_unitop.log" 2>&1
  echo "$tool (unitop unit tests) exit $?: $(grep -E 'SUMMARY|passed|failed' "$OUT/${tool}_unitop.log" | tr '\n' ' ')"
done; stamp
M="gpu__time_duration.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active"
mkdir -p "$OUT/ncu"
for t in base unitop; do
  (cd "$ROOT/scratch/ab/$t" && timeout $(cap 80) ncu --clock-control none --cache-control none \
     --profile-from-start off --metrics "$M" --csv --page raw --print-units base \
     python3 benchmarks/profile_step.py --model small --batch 1 --graph > "$OUT/ncu/$t.csv" 2> "$OUT/ncu/$t.err"
   echo "ncu $t exit $?: $(grep -c '^"[0-9]' "$OUT/ncu/$t.csv") kernels")
done
python3 "$ROOT/benchmarks/diagnostics/ncu_stalls.py" "$OUT/ncu" base unitop | tee "$OUT/ncu_summary.txt"
(cd "$OUT" && tar czf ncu.tgz ncu && rm -rf ncu); stamp
