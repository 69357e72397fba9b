#!/usr/bin/env bash
# The bench call for the next session (second of two, fired at once after dev_probe.sh so the machine is still
# warm): `bench all` on an H200 (`bench decode sweep compare` on an H100 or with LIMIT < 300) of TREE (default `.`,
# main; scratch/ab/unitop where the probe won and is to be merged), in LIMIT s. Its JSON, PNG, summary.md and
# bench.log come back as one bench.tgz: the README refresh issue 7 asks for.
set -u
export PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
TREE=${TREE:-.}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
if grep -q H200 "$OUT/card.txt" && [ "${LIMIT:-330}" -ge 300 ]; then WHAT=all; else WHAT="decode sweep compare"; fi
# A tree of its own gives the results' metadata.git.tree the tree's id (main + the patch: what a merge commits).
[ "$TREE" = . ] || (cd "$TREE" && git init -q && git add -A && git -c user.name=dev -c user.email=dev@local commit -qm t)
mkdir -p "$OUT/bench"
(cd "$TREE" && timeout "${LIMIT:-330}" python3 -m rawgraphs bench $WHAT --out "$OUT/bench") > "$OUT/bench/bench.log" 2>&1
echo "bench $WHAT on $TREE exit $?"; grep -E "ok after|failed" "$OUT/bench/bench.log" | tail -12
grep -hE "target" "$OUT/bench/summary.md" | grep -E "floor|0.15 ms|0.25x" | head -4
(cd "$OUT" && tar czf bench.tgz bench && rm -rf bench)
