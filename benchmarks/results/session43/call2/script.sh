#!/usr/bin/env bash
# Session 43, call 2: does a kernel's place in the module move the step? Call 1 put rows-staged-once (only gemv_rows'
# SASS changed) at +1.4% on small B = 1, which runs no gemv_rows. base2 is main again (tree-to-tree noise); pad1 / pad2
# are main plus an unused kernel that shifts every kernel's place in gemv.cu's module by 9984 / 4480 bytes (every used
# kernel's SASS the same, sass_count --same-as).
set -u
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
python3 benchmarks/diagnostics/ab_trees.py run --trees base,base2,pad1,pad2,rso --batches 1,2,3 --presets small,1b \
  --rounds 3 --deadline 200 > "$OUT/ab_layout.log" 2>&1
tail -7 "$OUT/ab_layout.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
