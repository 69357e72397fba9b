"""The decode benchmark scripts on the CPU: arguments, --help, the no-GPU exit, and their pure helpers."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rawgraphs.context import gpu_available
from rawgraphs.model import ModelConfig
from rawgraphs.model.decode import DecodeModel

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = ("decode", "batch_sweep", "padding_cost", "memory_cost", "device_loop")
sys.path.insert(0, str(BENCH))  # the scripts import their shared `common` module as a sibling

import batch_sweep  # noqa: E402
import common  # noqa: E402
import device_loop  # noqa: E402
import memory_cost  # noqa: E402
import padding_cost  # noqa: E402


def run_script(name, *args):
    return subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_runs_and_names_the_common_flags(name):
    r = run_script(name, "--help")
    assert r.returncode == 0, r.stderr
    assert "--out" in r.stdout and "--quick" in r.stdout


@pytest.mark.skipif(gpu_available(), reason="with a GPU the script would run the benchmark")
@pytest.mark.parametrize("name", SCRIPTS)
def test_without_a_gpu_prints_one_sentence_and_exits_0(name, tmp_path):
    r = run_script(name, "--quick", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and "GPU" in lines[0] and lines[0].endswith(".")
    assert not any(tmp_path.iterdir())


def test_common_parser_defaults_and_flags(tmp_path):
    ap = common.parser("doc line\n\nmore")
    assert ap.parse_args([]).out == Path("out") and not ap.parse_args([]).quick
    opts = ap.parse_args(["--out", str(tmp_path), "--quick"])
    assert opts.out == tmp_path and opts.quick
    with pytest.raises(SystemExit):
        ap.parse_args(["--bogus"])


def test_verdict_and_timing_counts():
    assert common.verdict(True) == "PASS" and common.verdict(False) == "MISS"
    quick, full = common.timing(True), common.timing(False)
    assert quick["iters"] * quick["repeats"] < full["iters"] * full["repeats"]


def test_checks_remember_failures(capsys):
    checks = common.Checks()
    assert checks(True, "fine") and not checks(False, "broken")
    assert checks.failed == ["broken"] and common.finish(checks) == 1
    out = capsys.readouterr().out
    assert "check ok: fine" in out and "CHECK FAILED: broken" in out
    assert common.finish(common.Checks()) == 0


def test_the_json_says_which_self_checks_failed(tmp_path):
    """A run whose checks failed must not leave a JSON that reads as clean: the failures are among its notes."""
    checks = common.Checks()
    checks(True, "fine")
    checks(False, "graph vs eager: tokens differ")
    path = common.write_result("decode", tmp_path, {}, [], ["a note"], checks)
    notes = json.loads(path.read_text())["notes"]
    assert notes == ["a note", "self-check FAILED (numbers may be wrong): graph vs eager: tokens differ"]
    ok = common.Checks()
    ok(True, "fine")
    assert ok.notes() == ["self-checks: none failed (1 passed)"] and common.Checks().notes() == [
        "self-checks: none failed"]


def test_check_same_step_needs_bit_identical_finite_outputs():
    import numpy as np
    tok, logits = np.array([3, 4]), np.array([[1.0, 2.0], [0.5, -1.0]], np.float32)
    checks = common.Checks()
    assert common.check_same_step(checks, "same", (tok, logits), (tok.copy(), logits.copy()))
    assert not common.check_same_step(checks, "off by one ulp", (tok, logits), (tok, np.nextafter(logits, 9)))
    assert not common.check_same_step(checks, "nan", (tok, logits * np.nan), (tok, logits * np.nan))
    assert len(checks.failed) == 2


def test_padding_cost_helpers():
    assert padding_cost.capture_sizes(True)[-1] == 64 and padding_cost.capture_sizes(False)[-1] == 256
    assert 48 in padding_cost.capture_sizes(True)
    assert padding_cost.interpolate((32, 48), (2.0, 4.0), 36) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        padding_cost.interpolate((32, 48), (2.0, 4.0), 64)
    assert padding_cost.seed_estimate(37, 48, 0.5) == pytest.approx((48 / 37 - 1) * 0.5)
    cfg = ModelConfig.preset("1b")
    f = padding_cost.kv_fraction(cfg, 37, 513)
    kv = cfg.kv_bytes_per_token() * 37 * 513
    assert f == pytest.approx(kv / (kv + cfg.weight_bytes())) and 0 < f < 1


def test_memory_cost_sizes_and_static_bytes():
    assert len(memory_cost.SIZES) == 15 and memory_cost.capture_sizes(True)[-1] == 64
    cfg = ModelConfig.preset("small")
    plan = DecodeModel(cfg, None, max_batch=4, plan_only=True)
    want = sum(getattr(plan, n).nbytes for n in memory_cost.STATIC_BUFFERS)
    assert memory_cost.static_bytes(plan) == want
    assert plan.logits.nbytes == 4 * cfg.vocab * 4  # fp32 [B, V] is among them
    per_size = memory_cost.per_size_static_bytes(cfg, (1, 2, 4))
    assert per_size[0] < per_size[1] < per_size[2] == want  # each sized for its own batch


def test_batch_sweep_trend_and_sweeps():
    assert batch_sweep.falls_with_batch([1.5, 1.3, 1.1])
    assert batch_sweep.falls_with_batch([1.5, 1.52, 1.1])  # a rise within the slack
    assert not batch_sweep.falls_with_batch([1.5, 1.8, 1.1])
    assert not batch_sweep.falls_with_batch([1.1, 1.1])
    models, Bs = batch_sweep.sweep(False)
    assert models == ("small", "1b") and Bs == [1, 2, 4, 8, 16, 32, 64]


def test_device_loop_sweeps():
    assert device_loop.sweep(True) == (("small",), (16, 128))
    assert device_loop.sweep(False) == (("small", "1b"), (16, 128, 512))
    assert device_loop.EOS_NEVER < 0


def test_device_loop_reference_covers_the_loops_contexts():
    """The loop's reference replays are timed at the middle step of every 64 the loop runs (step i at position + i),
    weighted by the steps each stands for, and the inputs are staged back as they were afterwards."""
    staged = []

    class Model:
        def set_inputs(self, tokens, positions, tables, stream):
            staged.append(int(positions[0]))

    inputs = (np.array([7], np.int32), np.array([512], np.int32), np.zeros((1, 4), np.int32))
    for N, want in [(16, 512 + 8), (128, (512 + 32 + 512 + 96) / 2), (100, (64 * 544 + 36 * (512 + 64 + 18)) / 100)]:
        staged.clear()
        got = device_loop.replay_us_over(Model(), inputs, N, None, lambda: float(staged[-1]))  # us = position
        assert got == pytest.approx(want) and staged[-1] == 512, (N, staged)


@pytest.mark.skipif(gpu_available(), reason="with a GPU the child would compile and time the twin")
def test_compare_torch_compile_child_failure_comes_back_as_a_message():
    import compare_torch  # torch itself is imported only inside the child

    child = compare_torch.compile_in_child("tiny", 1, 1, 0)
    assert set(child) == {"message"} and child["message"].startswith("torch.compile child failed (exit 1)")
    assert "Error" in child["message"]  # the child's last lines name why (no torch here, or no GPU)


def test_compare_torch_target_is_read_against_the_plain_twin():
    import compare_torch

    def row(method, us, model="1b", batch=1):
        return {"model": model, "batch": batch, "method": method, "summary": {"median": us}}

    rows = [row("rawgraphs graph", 560.0), row("torch CUDAGraph", 2200.0), row(compare_torch.PLAIN, 1000.0),
            row("rawgraphs graph", 1.0, batch=8), row(compare_torch.PLAIN, 1000.0, batch=8)]
    line = compare_torch.target_line(rows)
    assert line.startswith("target rawgraphs graph <= 0.25x torch CUDAGraph (plain twin) at B=1 on 1b: MISS")
    assert "560.0 us vs 1000.0 us = 0.560x" in line and "2200.0 us: 0.255x" in line
    rows[2] = row(compare_torch.PLAIN, 2300.0)
    assert ": PASS (" in compare_torch.target_line(rows)
    assert "not measured" in compare_torch.target_line([r for r in rows if r["model"] == "small"])


@pytest.mark.parametrize("preset,B", [("1b", 1), ("small", 8), ("tiny", 3)])
def test_step_costs_launch_bytes_add_up_to_the_floors_step_bytes(preset, B):
    """step_costs.py's bytes per launch, over the layers plus the LM head, are the bytes the decode floor counts
    (rawgraphs.bench.bandwidth.step_bytes) less the two norms per layer and the final norm (a few KB it leaves out),
    so its excess column is measured against the same floor as the decode benchmark's."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from step_costs import launch_bytes

    from rawgraphs.bench.bandwidth import step_bytes

    cfg = ModelConfig.preset(preset)
    nb = launch_bytes(cfg, B, 512)
    layer = sum(v for k, v in nb.items() if k != "lm_head")
    norms = 2 * cfg.dim * (2 * cfg.n_layers + 1)
    assert cfg.n_layers * layer + nb["lm_head"] + norms == step_bytes(cfg, [512] * B)
    assert nb["attention"] == 2 * B * 512 * cfg.kv_dim * 2


def test_sass_same_as_ignores_label_numbering_only():
    """sass_count.py --same-as compares kernels with branch labels and internal call targets renumbered in order of
    first use (what differs between two compiles of the same code in different modules), and nothing else."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from sass_count import normalized

    a = ["@!P0 BRA `(.L_x_7)", "CALL.REL.NOINC `($__internal_3_$__cuda_sm3x_div_rn_noftz_f32_slowpath)",
         "BRA `(.L_x_9)"]
    b = ["@!P0 BRA `(.L_x_2713)", "CALL.REL.NOINC `($__internal_18_$__cuda_sm3x_div_rn_noftz_f32_slowpath)",
         "BRA `(.L_x_2714)"]
    assert normalized(a) == normalized(b)
    assert normalized(a) != normalized([*b[:2], "BRA `(.L_x_2713)"])  # a different target is a different program
    assert normalized(["IADD3 R9, R9, 0x1, RZ"]) != normalized(["VIADD R9, R9, 0x1"])


def test_sass_count_warns_off_the_device_nvrtc():
    """sass_count.py says when the NVRTC it compiles with is not the device's (13.0), whose counts and placement are
    the ones an A/B on the device sees, and is silent with 13.0."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from sass_count import version_warning

    assert version_warning((13, 0)) is None
    assert "NVRTC 13.5 here, the device compiles with 13.0" in version_warning((13, 5))
    assert "nvidia-cuda-nvrtc==13.0.88" in version_warning((12, 8))


def test_sass_count_finds_each_loop_by_its_backward_branch():
    """sass_count.py --loops: labels index the instructions of their own kernel; a branch back to a label closes a
    loop [label, branch], a forward branch does not."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from sass_count import listing, loops

    sass = """.text.k:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
.L_x_1:
        /*0020*/                   FFMA R3, R3, R4, R5 ;
        /*0030*/              @P0 BRA `(.L_x_1) ;
        /*0040*/              @P1 BRA `(.L_x_0) ;
        /*0050*/              @P2 BRA `(.L_x_2) ;
.L_x_2:
        /*0060*/                   EXIT ;
.text.other:
.L_x_3:
        /*0000*/                   BRA `(.L_x_3) ;
"""
    code, labels = listing(sass)
    assert labels == {"k": {".L_x_0": 1, ".L_x_1": 2, ".L_x_2": 6}, "other": {".L_x_3": 0}}
    assert loops(code["k"], labels["k"]) == [(2, 3), (1, 4)]  # the inner loop first; the forward branch is none
    assert loops(code["other"], labels["other"]) == [(0, 0)]


def test_sass_count_names_the_model_template_instantiations(capsys):
    """sass_count.py's table and --kernel know attention's instantiations by name expression, as its docstring says
    (until session 24 the table and --kernel compiled them out). Needs nvdisasm (the CUDA
    toolkit, or ``pip install nvidia-cuda-nvdisasm``)."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    import sass_count

    try:
        sass_count.nvdisasm()
    except SystemExit:
        pytest.skip("no nvdisasm here (pip install nvidia-cuda-nvdisasm)")
    kernels, layout = sass_count.compiled(sass_count.kernel_dir() / "attention.cu", "sm_90")
    assert "attention<128,1,true>" in kernels and "attention_combine" in kernels
    assert any(i.startswith("EXIT") or " EXIT" in i for i in kernels["attention<128,1,true>"])
    assert kernels.keys() <= layout.keys()  # every kernel placed, under the same name


def test_sass_count_places_each_function_in_its_module():
    """sass_count.text_layout reads each function's code from the cubin NVRTC gives (no GPU, no nvdisasm): offsets
    from the module's first code, 128-byte aligned, in sequence without overlap, and a second kernel defined after
    the first placed ahead of it (NVRTC lays kernels out in reverse order of definition: what session 43's layout
    probe relied on)."""
    pytest.importorskip("elftools", reason="pyelftools reads the cubin (the test extra installs it)")
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from sass_count import text_layout

    from rawgraphs.compiler import compile_source

    body = 'extern "C" __global__ void {}(float* p) {{ p[threadIdx.x] = p[threadIdx.x] * 2.0f + {}; }}\n'
    one = text_layout(bytes(compile_source(body.format("first", 1), "one.cu", arch="sm_90").cubin))
    two = text_layout(bytes(compile_source(body.format("first", 1) + body.format("second", 2), "two.cu",
                                           arch="sm_90").cubin))
    assert set(one) == {"first"} and one["first"][0] == 0 and one["first"][1] > 0
    assert set(two) == {"first", "second"}
    (a, (a_at, a_size)), (b, (b_at, _)) = sorted(two.items(), key=lambda item: item[1][0])
    assert (a, b) == ("second", "first") and a_at == 0
    assert b_at >= a_at + a_size and b_at % 128 == 0


def test_sass_count_verdict_says_what_changed_and_how_far_it_moved():
    """sass_count's --same-as line: the same code moved within its module is told apart from code left in place."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from sass_count import verdict

    code = ["FADD R0, R0, R1", "EXIT"]
    assert verdict(code, code, (4608, 256), (128, 256)) == "same, moved +4480 B"
    assert verdict(code, code, (128, 256), (128, 256)) == "same"
    assert verdict(code, code[:1], (0, 256), (0, 128)) == "DIFF 2 vs 1"
    assert verdict(["BRA `(.L_x_7)"], ["BRA `(.L_x_2713)"], (0, 16), (0, 16)) == "same"  # labels renumbered
    assert verdict(code, None, (0, 256), None) == "only here" and verdict(None, code, None, (0, 1)) == "only there"


def test_boundary_trace_splits_a_launchs_work_into_release_skew_and_block_time(records):
    """boundary_trace.py's per-launch quantities from two traced launches (ns): the critical path to the next
    release, the release skew, and a gemv's busy time per block, which with the skew bounds its work."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from boundary_trace import boundaries

    from rawgraphs.model.trace import launch_spans

    recs = records([(7, 0, 0, 1000, 3000, 0), (7, 1 << 32 | 1, 100, 1400, 4400, 50),  # gemv: busy 2000, 3000
                     (8, 0, 2000, 5000, 0, 0), (8, 1, 2100, 5300, 0, 0)])  # attention: no exits
    (row,) = boundaries(launch_spans(recs, ["L0.gate_up", "L0.attention"]))
    assert row["kind"] == "gate_up" and row["critical"] == 4.0 and row["sits"] == 1.0 and row["skew"] == 0.4
    assert row["work"] == 3.4 and row["tail"] == 1.4 and row["handoff"] == 0.6
    assert (row["busy"], row["busy_max"]) == (2.5, 3.0) and row["work"] <= row["skew"] + row["busy_max"]


def test_block_placement_reads_a_launch_by_grid_thirds(records):
    """block_placement.py: per kind, medians over layers of each grid third's entry / arrival / release / exit in us
    from the launch's first release (blocks sorted by index, whatever the record order), the exit spread, and the
    SMs by how many blocks they held with their last exit."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from block_placement import by_kind


    rows = []
    for layer, late in ((0, 2000), (1, 4000)):  # two layers of one kind; blocks 1 and 2 placed `late` ns later
        g = 10 + layer
        for blk, sm in ((2, 1), (0, 0), (1, 1)):  # records out of block order
            shift = late if blk else 0
            rows.append((g, sm << 32 | blk, 100 + shift, 1000 + shift, 5000 + shift, 50 + shift))
    got = by_kind(records(rows), ["L0.gate_up", "L1.gate_up"])["gate_up"]
    assert got["entered"] == [-0.95, 2.05, 2.05] and got["arrived"] == [-0.9, 2.1, 2.1]  # medians of 2 and 4 us
    assert got["released"] == [0.0, 3.0, 3.0] and got["exit"] == [4.0, 7.0, 7.0]
    assert got["exit_p0_p50_p100"] == [4.0, 7.0, 7.0] and got["within_sm_sd"] == 0.0 and got["sm_mean_sd"] == 1.5
    assert got["sms_holding"] == [130, 1, 1, 0, 0]  # SM 0 holds block 0, SM 1 blocks 1 and 2, the rest none
    last = got["last_exit_holding"]
    assert last[1:3] == [4.0, 7.0] and all(math.isnan(last[k]) for k in (0, 3, 4))
    with pytest.raises(ValueError, match="2 launches, the names 1"):
        by_kind(records(rows), ["L0.gate_up"])


def test_block_placement_lists_the_launches_of_chosen_layers(records):
    """block_placement.py --layers: the chosen layers' launches in step order, first/last times in us from the
    step's first arrival; other layers are left out."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from block_placement import layer_lines


    recs = records([(5, 0, 500, 900, 0, 0),                                     # L0.attention: no entry / exit
                     (6, 0, 1000, 2000, 4000, 250), (6, 1 << 32 | 1, 1500, 2500, 6500, 750),  # L1.o_proj
                     (7, 0, 7000, 8000, 0, 0)])
    lines = layer_lines(recs, ["L0.attention", "L1.o_proj", "L2.qkv"], [1])
    assert lines == ["L1.o_proj     n=   2 arr    0.50/   1.00 rel    1.50/   2.00 ent   -0.25/   0.25 "
                     "exit    3.50/   6.00 busy 3.00"]
    assert [ln.split()[0] for ln in layer_lines(recs, ["L0.attention", "L1.o_proj", "L2.qkv"], [0, 2])] == [
        "L0.attention", "L2.qkv"]


def test_block_placement_tabulates_units_per_sm_of_the_unit_stream(records):
    """block_placement.py --preset: each block's units from the unit stream's block-major order, and per SM load its
    SMs and their last exit (us from the launch's first release); a launch whose plan is not the unit stream, or
    records of another grid, are not guessed at."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from block_placement import block_units, load_table


    assert block_units(10, 2, warps=4).tolist() == [6, 4]  # groups 0, 1 own two units (g and g + 8), the rest one
    gate_up = block_units(5632, 396)  # 1b gate_up: 5632 row pairs over 3168 warps
    assert gate_up.sum() == 5632 and set(gate_up[:308]) == {16} and set(gate_up[308:]) == {8}
    # 1b o_proj (256 blocks of 8 units): blocks 0-2 on SM 0, block 3 on SM 1; released at 1000 ns
    rows = [(7, 0 << 32 | b, 500, 1000, 1000 + 1000 * t, 100) for b, t in ((0, 3), (1, 4), (2, 9))]
    rows.append((7, 1 << 32 | 3, 500, 1000, 6000, 100))
    assert load_table(records(rows), ["L0.o_proj"], "1b") == {"o_proj": {8: (1, 5.0), 24: (1, 9.0)}}
    assert load_table(records(rows), ["L0.o_proj"], "small") == {"o_proj": {8: (1, 5.0), 24: (1, 9.0)}}  # 96 x 8
    assert load_table(records(rows), ["L0.attention"], "1b") == {}  # not a gemv
    far = [(7, 0 << 32 | 300, 500, 1000, 2000, 100)]
    with pytest.raises(ValueError, match="block 300 in the records, the 1b plan has 256"):
        load_table(records(far), ["L0.o_proj"], "1b")


def test_ab_trees_prepares_refs_and_the_working_tree_and_tabulates_rounds(tmp_path, monkeypatch):
    """ab_trees.py prepare extracts each ref (and "." with its untracked files; REF+PATCH: the ref with a diff
    applied), less the committed results, into scratch/ab/NAME with the baseline first; the table gives every
    round and each tree's median against the baseline's."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    import ab_trees

    assert ab_trees.parse_spec("main") == ("main", "main") and ab_trees.parse_spec(".") == ("head", ".")
    assert ab_trees.parse_spec("new=origin/x") == ("new", "origin/x")
    assert ab_trees.parse_spec("origin/x") == ("origin_x", "origin/x")
    with pytest.raises(ValueError, match="NAME=REF"):
        ab_trees.parse_spec("a b=main")

    monkeypatch.chdir(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], check=True)
    Path("k.cu").write_text("v1\n")
    Path("benchmarks/results").mkdir(parents=True)
    Path("benchmarks/results/old.json").write_text("{}\n")  # committed results stay out of the trees
    subprocess.run([*git, "add", "k.cu", "benchmarks"], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    Path("k.cu").write_text("v2\n")       # a modified tracked file
    Path("new.py").write_text("x = 1\n")  # an untracked one
    with pytest.raises(ValueError, match="must differ"):
        ab_trees.prepare(["a=HEAD", "a=."])
    diff = subprocess.run(["git", "diff", "HEAD"], check=True, capture_output=True, text=True).stdout
    Path("probe.patch").write_text(diff)  # k.cu v1 -> v2, as a probe kept as a diff
    with pytest.raises(ValueError, match="no such patch file"):
        ab_trees.prepare(["base=HEAD", "p=HEAD+missing.patch"])
    ab_trees.prepare(["base=HEAD", ".", "p=HEAD+probe.patch"])
    root = Path("scratch/ab")
    assert (root / "ORDER").read_text().split() == ["base", "head", "p"]
    assert (root / "base/k.cu").read_text() == "v1\n" and not (root / "base/new.py").exists()
    assert (root / "head/k.cu").read_text() == "v2\n" and (root / "head/new.py").read_text() == "x = 1\n"
    assert (root / "p/k.cu").read_text() == "v2\n" and not (root / "p/new.py").exists()
    assert not list(root.glob("*/benchmarks/results/*"))

    rows = [{"tag": t, "preset": p, "B": 8, "us": us, "round": r}
            for r, (a, b) in enumerate([(100.0, 90.0), (102.0, 92.0)], 1) for t, us in (("base", a), ("head", b))
            for p in ("1b", "small")]
    lines = ab_trees.table(rows, ["base", "head"]).splitlines()
    assert lines == ["small B=8: base=100.0/102.0  head=90.0/92.0 (-9.9%)",
                     "1b B=8: base=100.0/102.0  head=90.0/92.0 (-9.9%)"]


def test_ab_trees_run_alternates_trees_and_stops_at_its_deadline(tmp_path, monkeypatch, capsys):
    """ab_trees.py run times every tree in each round, trees alternating; with a deadline a run starts only while
    the longest run so far still fits and its timeout is cut to the time left; a timed-out run keeps the rows it
    printed."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    import ab_trees

    monkeypatch.chdir(tmp_path)
    Path("scratch/ab").mkdir(parents=True)
    Path("scratch/ab/ORDER").write_text("base\nnew\n")
    now, calls = [0.0], []

    def fake_run(cmd, cwd, env, capture_output, text, timeout):  # a tree's ab_steps.py: 30 s, or past its timeout
        tag = env["AB_TAG"]
        calls.append((tag, timeout))
        if tag == "new" and len(calls) == 4:
            now[0] += timeout
            raise subprocess.TimeoutExpired(cmd, timeout, output=b'{"tag": "new", "preset": "1b", "B": 1, "us": 1}\n')
        now[0] += 30.0
        line = json.dumps({"tag": tag, "preset": "1b", "B": 1, "us": 100.0 + len(calls), "kernels": ["gemv"]})
        return subprocess.CompletedProcess(cmd, 0, stdout=line + "\n", stderr="")

    monkeypatch.setattr(ab_trees.subprocess, "run", fake_run)
    rows = ab_trees.run("1", "1b", rounds=3, timeout=150.0, clock=lambda: now[0])
    assert [(r["tag"], r["round"], r["us"]) for r in rows] == [
        ("base", 1, 101.0), ("new", 1, 102.0), ("base", 2, 103.0), ("new", 2, 1), ("base", 3, 105.0),
        ("new", 3, 106.0)]
    assert "kernels" not in rows[0] and [t for _, t in calls] == [150.0] * 6
    assert "new, round 2: timed out after 150 s" in capsys.readouterr().out

    now[0], calls[:] = 0.0, []  # 30 s runs against 100 s: the fourth would end past it, so it never starts
    rows = ab_trees.run("1", "1b", rounds=3, timeout=150.0, deadline=100.0, clock=lambda: now[0])
    assert [(r["tag"], r["round"]) for r in rows] == [("base", 1), ("new", 1), ("base", 2)]
    assert [t for _, t in calls] == [100.0, 70.0, 40.0]
    assert "deadline: 100 s reached, round 2 stops before new" in capsys.readouterr().out
    assert ab_trees.table(rows, ["base", "new"]) == "1b B=1: base=101.0/103.0  new=102.0 (+0.0%)"

    now[0], calls[:] = 0.0, []  # the hung run (150 s) does not stop the runs after it from starting
    rows = ab_trees.run("1", "1b", rounds=3, timeout=150.0, deadline=300.0, clock=lambda: now[0])
    assert [t for _, t in calls] == [150.0, 150.0, 150.0, 150.0, 60.0, 30.0]
    assert len(rows) == 6 and rows[3]["us"] == 1

    # --trees: some prepared trees, in the order given (the first is the baseline); unknown or repeated names refused
    Path("scratch/ab/ORDER").write_text("base\nnew\nother\n")
    assert ab_trees.chosen(None) == ["base", "new", "other"] and ab_trees.chosen("other,base") == ["other", "base"]
    for bad in ("base,nope", "base,base"):
        with pytest.raises(ValueError, match="prepared: \\['base', 'new', 'other'\\]"):
            ab_trees.chosen(bad)
    now[0], calls[:] = 0.0, []
    ab_trees.run("1", "1b", rounds=1, timeout=150.0, clock=lambda: now[0], names=ab_trees.chosen("other,base"))
    assert [tag for tag, _ in calls] == ["other", "base"]


def test_shared_weights_mapping_points_later_layers_at_the_first():
    """shared_weights.py's retarget mapping moves each later layer's weights of the chosen kinds, and only those,
    to layer 0's; an unknown kind is refused by name."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from types import SimpleNamespace

    from shared_weights import WEIGHTS, shared_mapping

    layers = [SimpleNamespace(**{a: 1000 * i + j for j, a in enumerate(WEIGHTS.values())}) for i in range(4)]
    m = shared_mapping(layers, ["gate_up"])
    assert m == {1002: 2, 2002: 2, 3002: 2}
    m = shared_mapping(layers, list(WEIGHTS))
    assert len(m) == 3 * 4 and set(m.values()) == {0, 1, 2, 3} and all(k >= 1000 for k in m)
    with pytest.raises(ValueError, match="unknown weight kinds \\['lm_head'\\]"):
        shared_mapping(layers, ["qkv", "lm_head"])


def test_broadcast_read_spans_are_medians_from_each_blocks_release():
    """broadcast_read.py's columns from stamps [pairs, blocks, (release, input in, ring landed)] in ns: medians over
    blocks and pairs of input-in and ring-landed minus the block's own release, and per pair the first release to
    the last block's input."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from broadcast_read import spans

    t = np.array([[(1000, 1600, 3000), (1200, 2000, 2200)],
                  [(5000, 5400, 9000), (5100, 5700, 6100)]], dtype=np.uint64)
    s = spans(t)
    assert abs(s["x_us"] - 0.6) < 1e-12                               # medians of 600, 800, 400, 600
    assert abs(s["ring_us"] - 1.5) < 1e-12                            # of 2000, 1000, 4000, 1000
    assert abs(s["span_us"] - 0.85) < 1e-12                           # of 1000, 700


def test_ncu_stalls_names_a_steps_launches_by_op_and_reads_raw_csv(tmp_path):
    """ncu_stalls.py names launches by their place in a B = 1 step (embed, L x 5 layer ops, LM head, argmax) only
    where the count fits that shape, reads ncu's raw CSV (header, units row, one row per kernel, thousands
    separators), and reports per op the median time in us, instructions and stalls per issue."""
    sys.path.insert(0, str(BENCH / "diagnostics"))
    from ncu_stalls import load, op_names, summary

    assert op_names(63)[:7] == ["embed", "qkv", "attention", "o", "gate_up", "down", "qkv"]
    assert op_names(63)[-3:] == ["down", "lm_head", "argmax"]
    assert op_names(64) is None and op_names(3) is None
    head = ["ID", "Kernel Name", "gpu__time_duration.sum", "smsp__inst_executed.sum",
            "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio",
            "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"]
    kernels = ["embedding", *(["gemv_unit", "attention", "gemv_unit", "gemv_unit", "gemv_unit"] * 2), "gemv_unit",
               "argmax"]
    rows = [head, ["", "", "nsecond", "inst", "", ""]]
    rows += [[str(i), f"{k}(int)", f"{1000 + 100 * i:,}", "2,048", f"{0.1 * i:.2f}", "3.5"]
             for i, k in enumerate(kernels)]
    p = tmp_path / "base.csv"
    p.write_text("==PROF== Connected\n" + "\n".join(",".join(f'"{c}"' for c in r) for r in rows) + "\n")
    per = load(p)
    assert list(per) == ["embed:embedding", "qkv:gemv_unit", "attention:attention", "o:gemv_unit",
                         "gate_up:gemv_unit", "down:gemv_unit", "lm_head:gemv_unit", "argmax:argmax"]
    assert per["o:gemv_unit"]["gpu__time_duration.sum"] == [1300.0, 1800.0]
    line = next(s for s in summary(per) if s.startswith("o:gemv_unit"))
    assert "  2 " in line and "1.55 us" in line and "2048 inst" in line and "no_instruction=0.55" in line
    empty = tmp_path / "none.csv"
    empty.write_text("==ERROR== no kernels were profiled\n")
    with pytest.raises(ValueError, match="no profiled kernels"):
        load(empty)
