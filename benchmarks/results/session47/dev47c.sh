#!/usr/bin/env bash
# Session 47's short call (the device was lent for at most ~420 s): dev47.sh reordered and trimmed. The A/B of
# probe-unit-by-op at B = 1 against base and its layout control pad6, the unitop tree's full GPU suite, `bench decode
# compare` on the A/B's winner (unitop where it won small B = 1 by > 1% with pad6 within 1%, else main), then
# memcheck and racecheck of the unitop unit tests as time allows. Trees from `ab_trees.py prepare` (scratch/ab).
set -u
export PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
left() { echo $(( ${LIMIT:-400} - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); echo $(( l > $1 ? $1 : (l > 1 ? l : 1) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
timeout 100 python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad6,unitop --batches 1 \
  --presets small,1b --rounds 3 --deadline 92 > "$OUT/ab_unitop.log" 2>&1
tail -2 "$OUT/ab_unitop.log"; echo "elapsed $(( $(date +%s) - T0 )) s"
(cd scratch/ab/unitop && timeout 130 python3 -m pytest -q -m gpu tests -p no:cacheprovider -rfE \
   > "$OUT/unitop_gpu.log" 2>&1; echo "unitop tree GPU suite exit $?: $(tail -1 "$OUT/unitop_gpu.log")"
 grep -E "^(FAILED|ERROR)" "$OUT/unitop_gpu.log" | head -5)
echo "elapsed $(( $(date +%s) - T0 )) s"
BT=.; python3 - "$OUT/ab_unitop.log" <<'PY' && BT=scratch/ab/unitop
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
med = lambda t: statistics.median(r["us"] for r in rows if r["tag"] == t and r["preset"] == "small")
b, p, u = med("base"), med("pad6"), med("unitop")
sys.exit(0 if u < 0.99 * b and abs(p / b - 1) < 0.01 else 1)
PY
# A tree of its own gives the results' metadata.git.tree the probe tree's id (that of main + the patch), not main's.
[ "$BT" = . ] || (cd $BT && git init -q && git add -A && git -c user.name=dev -c user.email=dev@local commit -qm unitop)
echo "bench tree: $BT"; mkdir -p "$OUT/bench"
(cd $BT && timeout $(cap 110) python3 -m rawgraphs bench decode compare --out "$OUT/bench") > "$OUT/bench.log" 2>&1
echo "bench decode compare exit $?"; grep -E "ok after|failed" "$OUT/bench.log" | tail -4
grep -hE "target" "$OUT/bench/summary.md" | grep -E "floor|0.15 ms|0.25x" | head -4
(cd "$OUT" && tar czf bench.tgz bench && rm -rf bench)
echo "elapsed $(( $(date +%s) - T0 )) s"
(cd scratch/ab/unitop && timeout $(cap 40) compute-sanitizer --tool memcheck --error-exitcode 7 \
   python3 -m pytest -q -m gpu tests/test_kernels_proj.py -k "unit" -p no:cacheprovider \
   > "$OUT/memcheck_unitop.log" 2>&1
 echo "memcheck (unitop unit tests) exit $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck_unitop.log" \
   | tr '\n' ' ')"
 timeout $(cap 35) compute-sanitizer --tool racecheck --error-exitcode 7 python3 -m pytest -q -m gpu \
   tests/test_kernels_proj.py -k "unit_stream and (98-40 or 2304-768)" -p no:cacheprovider \
   > "$OUT/racecheck_unitop.log" 2>&1
 echo "racecheck (unitop unit-stream tests) exit $?: $(grep -E 'RACECHECK SUMMARY|passed|failed' \
   "$OUT/racecheck_unitop.log" | tr '\n' ' ')")
echo "elapsed $(( $(date +%s) - T0 )) s"
