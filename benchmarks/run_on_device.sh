#!/usr/bin/env bash
# On the GPU machine: every GPU test, the sanitizers, the demos, exercise E and the benchmark suite; results in
# $OUT/results.tgz. Used for the README's results. PART picks what runs (a call is limited to 10 minutes):
#   OUT=out PART=tests bash benchmarks/run_on_device.sh     GPU tests, memcheck, demos, break, update rules
#   OUT=out PART=race bash benchmarks/run_on_device.sh      racecheck over every kernel at small shapes (~100x slower
#                                                            than the tests: it ran past 150 s in sessions 9 and 10)
#   OUT=out PART=bench bash benchmarks/run_on_device.sh     python -m rawgraphs bench all (args passed on, e.g. --quick)
#   OUT=out bash benchmarks/run_on_device.sh [--quick]      all three
# TESTS="tests/test_x.py ..." narrows the GPU tests.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
OUT=${OUT:-out}
PART=${PART:-all}
R="$OUT/results"
mkdir -p "$R"
python3 -m rawgraphs info
if [ "$PART" = tests ] || [ "$PART" = all ]; then
  timeout 300 python3 -m pytest -q -m gpu ${TESTS:-tests/} -p no:cacheprovider -rfs > "$R/gpu_tests.log" 2>&1
  echo "gpu tests: $(tail -1 "$R/gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$R/gpu_tests.log"
  KERNEL_TESTS="tests/test_kernels_proj.py tests/test_kernels_attn.py"
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 7 python3 -m pytest -q -m gpu $KERNEL_TESTS \
    -p no:cacheprovider > "$R/memcheck.log" 2>&1
  echo "memcheck exit $? (7: errors found, 124: timed out): $(grep -E 'ERROR SUMMARY|passed|failed' "$R/memcheck.log" | tr '\n' ' ')"
  timeout 200 python3 -m rawgraphs demo --model 1b --tokens 32 --loop 16 --update > "$R/demo_1b.log" 2>&1
  echo "demo 1b exit $?"; tail -22 "$R/demo_1b.log"
  timeout 100 python3 -m rawgraphs demo --model small --batch 37 --tokens 8 > "$R/demo_small_b37.log" 2>&1
  echo "demo small B=37 exit $?"; tail -8 "$R/demo_small_b37.log"
  timeout 60 python3 -m rawgraphs break --json "$R/break.json" > "$R/break.log" 2>&1
  echo "break exit $?"; tail -12 "$R/break.log"
  timeout 60 python3 benchmarks/update_rules.py --out "$R" 2>&1 | tail -9
fi
if [ "$PART" = race ] || [ "$PART" = all ]; then
  # every kernel (each gemv test runs every kernel at many B) at small shapes; gemv's any-grid tests have their own run
  RACE_DEFAULT="99-40 or (2304-768 and not any_grid) or argmax or sample or rope or rmsnorm or silu or embedding or 37-4-2 or 3-6-2 or 3-16-2-128"
  timeout 540 compute-sanitizer --tool racecheck --error-exitcode 7 python3 -m pytest -q -m gpu \
    tests/test_kernels_proj.py tests/test_kernels_attn.py -p no:cacheprovider -k "${RACECHECK_K:-$RACE_DEFAULT}" \
    > "$R/racecheck.log" 2>&1
  echo "racecheck exit $? (7: hazards, 124: timed out): $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|passed|failed' "$R/racecheck.log" | tr '\n' ' ')"
fi
if [ "$PART" = bench ] || [ "$PART" = all ]; then
  timeout 540 python3 -m rawgraphs bench all --out "$R" "$@" > "$R/bench.log" 2>&1
  echo "bench exit $?"; grep -E "PASS|MISS|exit|suite|CHECK" "$R/bench.log"
fi
tar czf "$OUT/results.tgz" -C "$OUT" results
