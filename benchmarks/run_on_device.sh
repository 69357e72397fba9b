#!/usr/bin/env bash
# One call on the GPU machine: every GPU test, the demos, exercise E and the benchmark suite; results in $OUT.
# Used for the README's results:  OUT=out [TESTS="tests/test_x.py ..."] bash benchmarks/run_on_device.sh [--quick]
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
OUT=${OUT:-out}
mkdir -p "$OUT/results"
python3 -m rawgraphs info
timeout 300 python3 -m pytest -q -m gpu ${TESTS:-tests/} -p no:cacheprovider -rf > "$OUT/results/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/results/gpu_tests.log")"; grep -E "^FAILED" "$OUT/results/gpu_tests.log"
timeout 200 python3 -m rawgraphs demo --model 1b --tokens 32 --loop 16 --update > "$OUT/results/demo_1b.log" 2>&1
echo "demo 1b exit $?"; tail -22 "$OUT/results/demo_1b.log"
timeout 100 python3 -m rawgraphs demo --model small --batch 37 --tokens 8 > "$OUT/results/demo_small_b37.log" 2>&1
echo "demo small B=37 exit $?"; tail -8 "$OUT/results/demo_small_b37.log"
timeout 60 python3 -m rawgraphs break --json "$OUT/results/break.json" > "$OUT/results/break.log" 2>&1
echo "break exit $?"; tail -12 "$OUT/results/break.log"
timeout 60 python3 benchmarks/update_rules.py --out "$OUT/results" 2>&1 | tail -9
timeout 420 python3 -m rawgraphs bench all --out "$OUT/results" "$@" > "$OUT/results/bench.log" 2>&1
echo "bench exit $?"; grep -E "PASS|MISS|exit|suite|CHECK" "$OUT/results/bench.log"
tar czf "$OUT/results.tgz" -C "$OUT" results
