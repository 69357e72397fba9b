#!/usr/bin/env bash
# Session 45, the last of the device budget: probe-gemv-unit's full GPU suite (main + gemv_unit: it covers main's
# merged rows kernels too), then its A/B at B = 1 against main and its layout control, in LIMIT s.
set -u
export PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
T0=$(date +%s)
left() { echo $(( ${LIMIT:-160} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
(cd scratch/ab/unit && timeout 100 python3 -m pytest -q -m gpu tests -p no:cacheprovider -rfE > "$OUT/unit_gpu.log" 2>&1
 echo "unit tree GPU suite exit $?: $(tail -1 "$OUT/unit_gpu.log")"; grep -E "^(FAILED|ERROR)" "$OUT/unit_gpu.log" | head -5)
echo "elapsed $(( $(date +%s) - T0 )) s"
timeout $(left) python3 benchmarks/diagnostics/ab_trees.py run --trees base,pad49,unit --batches 1 \
  --presets small,1b --rounds 3 --deadline $(( $(left) - 3 )) > "$OUT/ab_unit.log" 2>&1
tail -12 "$OUT/ab_unit.log"
echo "elapsed $(( $(date +%s) - T0 )) s"
