#!/usr/bin/env bash
# Session 47's follow-up call: why does a smaller B = 1 gemv kernel run faster? Nsight Compute reads, per kernel of
# one small B = 1 graph replay, the time, instructions executed and every stall reason per issued instruction
# (no_instruction = instruction fetch) on the base and unitop trees (scratch/ab, from `ab_trees.py prepare`).
# Isolated, serialized kernels (ncu), clocks left alone, caches not flushed. Writes ncu_<tree>.csv and a summary.
set -u
export PYTHONPATH=. PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
M="gpu__time_duration.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active"
for t in base unitop; do
  (cd scratch/ab/$t && timeout ${TLIM:-200} ncu --clock-control none --cache-control none --profile-from-start off \
     --metrics "$M" --csv --page raw --print-units base python3 benchmarks/profile_step.py --model small --batch 1 --graph \
     > "$OUT/ncu_$t.csv" 2> "$OUT/ncu_$t.err"; echo "ncu $t exit $?: $(grep -c '^"[0-9]' "$OUT/ncu_$t.csv") kernels")
done
python3 - "$OUT" <<'PY' | tee "$OUT/ncu_summary.txt"
import csv, collections, sys
OPS = ["qkv", "attention", "o", "gate_up", "down"]
def label(i, n, name):  # a small B = 1 step is embed, 12 x OPS, LM head, argmax (63 launches)
    if n != 63:
        return name
    return "embed" if i == 0 else "lm_head" if i == 61 else "argmax" if i == 62 else OPS[(i - 1) % 5]
def load(p):
    rows = list(csv.reader(l for l in open(p) if l.startswith('"')))
    hdr, data = rows[0], rows[2:]  # row 1 holds the units (base units: ns)
    ix = {h: i for i, h in enumerate(hdr)}
    per = collections.defaultdict(lambda: collections.defaultdict(list))
    for j, r in enumerate(data):
        key = f"{label(j, len(data), '')}:{r[ix['Kernel Name']].split('(')[0]}"
        for h, i in ix.items():
            if h.startswith(("gpu__", "smsp__")):
                per[key][h].append(float(r[i].replace(",", "") or 0))
    return per
med = lambda v: sorted(v)[len(v) // 2]
for t in ("base", "unitop"):
    per = load(f"{sys.argv[1]}/ncu_{t}.csv")
    tot = sum(sum(m["gpu__time_duration.sum"]) for m in per.values()) / 1e3
    print(f"== {t}: sum of isolated kernel times {tot:.1f} us; op:kernel, launches, median us, inst, stalls per issue")
    for k, m in per.items():
        st = {s.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""): med(v)
              for s, v in m.items() if "stalled" in s}
        top = sorted(st.items(), key=lambda kv: -kv[1])[:6]
        print(f"{k:28s} {len(m['gpu__time_duration.sum']):3d} {med(m['gpu__time_duration.sum']) / 1e3:7.2f} "
              f"{med(m['smsp__inst_executed.sum']):9.0f} " + " ".join(f"{a}={b:.2f}" for a, b in top)
              + f" | no_instruction={st.get('no_instruction', 0):.2f} branch_resolving={st.get('branch_resolving', 0):.2f}")
PY
