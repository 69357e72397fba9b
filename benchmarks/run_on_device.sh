#!/usr/bin/env bash
# On the GPU machine: every GPU test, the sanitizers, the demos, exercise E and the benchmark suite; results in
# $OUT/results.tgz, the only file left under $OUT (the device tool returns at most 8 files a call: session 28 lost 13
# of 21 loose ones). Used for the README's results. PART picks what runs (a call is limited to 10 minutes):
#   OUT=out PART=tests bash benchmarks/run_on_device.sh     GPU tests, memcheck, demos, break, update rules
#   OUT=out PART=race bash benchmarks/run_on_device.sh      racecheck over every kernel at small shapes (~100x slower
#                                                            than the tests)
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
  timeout 180 compute-sanitizer --tool memcheck --error-exitcode 7 python3 -m pytest -q -m gpu $KERNEL_TESTS \
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
  # Every kernel once, at small shapes: test_gemv[99-40] runs gemv, gemv_mma, gemm_tc and splitk_reduce at every B;
  # any_grid 64-9000 wraps gemv's cp.async rings; inactive 768-2048 runs gemm_tc's cp.async pipeline over 32 K tiles,
  # plain and with X_RMSNORM applied to each landed tile; merges 98-200 gemm_tc's in-kernel split-K merge.
  # (The keyword selection of sessions 9-10 also matched the 1b-sized silu and any-grid tests and ran past 150 s.)
  RACE_DEFAULT="(embedding and 512-64) or (rmsnorm_and and 768-37) or (silu_mul and 192) or (gemv_silu and 198-40)"
  RACE_DEFAULT="$RACE_DEFAULT or (test_gemv and 99-40) or (any_grid and (98-40 or 64-9000))"
  RACE_DEFAULT="$RACE_DEFAULT or (inactive and (98-40 or 768-2048-plain or 768-2048-rmsnorm)) or (merges and 98-200)"
  RACE_DEFAULT="$RACE_DEFAULT or (argmax and 5-32001) or (sample and 2-1001) or 37-4-2 or 3-6-2 or 3-16-2-128"
  timeout 540 compute-sanitizer --tool racecheck --error-exitcode 7 python3 -m pytest -q -m gpu \
    tests/test_kernels_proj.py tests/test_kernels_attn.py -p no:cacheprovider -k "${RACECHECK_K:-$RACE_DEFAULT}" \
    > "$R/racecheck.log" 2>&1
  echo "racecheck exit $? (7: hazards, 124: timed out): $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|passed|failed' "$R/racecheck.log" | tr '\n' ' ')"
fi
if [ "$PART" = bench ] || [ "$PART" = all ]; then
  timeout 540 python3 -m rawgraphs bench all --out "$R" "$@" > "$R/bench.log" 2>&1
  echo "bench exit $?"; grep -E "PASS|MISS|exit|suite|CHECK" "$R/bench.log"
fi
tar czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$R"
