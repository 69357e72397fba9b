"""The command line on a machine without a GPU: every command says so plainly and still does what it can."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rawgraphs.bench.record import BenchResult, collect_metadata, make_row
from rawgraphs.bench.suite import write_summary
from rawgraphs.cli import build_parser
from rawgraphs.context import gpu_available

no_gpu = pytest.mark.skipif(gpu_available(), reason="checks the GPU-less behaviour")


def run(*args):
    p = subprocess.run([sys.executable, "-m", "rawgraphs", *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


@no_gpu
def test_info_names_versions_and_says_there_is_no_gpu():
    rc, out = run("info")
    assert rc == 0 and "cuda-bindings" in out and "nvrtc" in out
    assert "no NVIDIA driver was found" in out


@no_gpu
def test_compile_prints_a_table_of_every_kernel(tmp_path):
    rc, out = run("compile", "--arch", "sm_90")
    from rawgraphs.compiler import nvrtc_version
    major, minor = nvrtc_version()
    assert rc == 0 and f"with NVRTC {major}.{minor}; registers and memory as ptxas reports them" in out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.endswith(("0", "1", "2", "3", "4", "5",
                                                                                       "6", "7", "8", "9"))}
    for kernel in ("gemv", "attention_combine", "attention<128,1,true>", "decode_loop_tail", "axpb"):
        assert kernel in rows, kernel
    # regs, spill bytes, static smem: gemv at its 64-register bound, no spills; the preloading attention above 120
    assert rows["gemv"][-3:] == ["64", "0", "512"] and 120 <= int(rows["attention<128,1,true>"][-3]) <= 128


@no_gpu
def test_demo_without_gpu_compiles_and_prints_the_plan():
    rc, out = run("demo", "--model", "1b", "--batch", "8")
    assert rc == 0
    assert out.count("No NVIDIA GPU") == 1 and "decode step plan, B=8" in out
    assert "kernels per step" in out and "floor" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("L0.", "lm_head"))}
    # gemm_tc_narrow from B = 4 on 1b's weights, with its pipeline's 54 KiB of shared memory: below B = 9 even o's
    # grid of 256 blocks runs uncapped (capped: 80 KiB)
    assert rows["L0.qkv"][1] == "gemm_tc_narrow" and rows["L0.qkv"][-4:-2] == ["54.0", "KiB"]
    assert rows["L0.o_proj"][1:5] == ["gemm_tc_narrow", "(1,", "32,", "8)"]
    assert rows["L0.o_proj"][-4:-2] == ["54.0", "KiB"]
    # what each launch must read and its time at 4.27 TB/s: qkv's [3 x 2048, 2048] bf16 weights; the layer's K and V
    # of 8 rows at the demo's context (prompt 6 + 32 new tokens = 38) and 16 heads of 128: 2 x 16 x 128 x 2 B x 38 x 8
    assert rows["L0.qkv"][-2:] == ["25.17", "5.89"] and rows["lm_head"][-2:] == ["131.07", "30.70"]
    assert rows["L0.attention"][-2:] == [f"{2 * 16 * 128 * 2 * 38 * 8 / 1e6:.2f}", "0.58"]


@no_gpu
def test_bench_and_break_without_gpu_say_so():
    rc, out = run("bench", "all", "--out", "unused")
    assert rc == 0 and "no NVIDIA GPU" in out
    rc, out = run("break")
    assert rc == 0 and "unjoined fork" in out


def test_parser_rejects_unknown_benchmarks_and_models():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "everything"])
    args = build_parser().parse_args(["demo", "--model", "tiny", "--tokens", "5", "--batch", "37"])
    assert (args.model, args.tokens, args.batch) == ("tiny", 5, 37)


def test_summary_renders_every_result(tmp_path):
    BenchResult("decode", collect_metadata(), {"B": 1}, [make_row([510.0, 490.0, 500.0], mode="graph")]).write_json(
        tmp_path / "decode.json")
    (tmp_path / "notes.json").write_text("{}")  # not a result: skipped, not fatal
    text = write_summary(tmp_path).read_text()
    assert "## decode" in text
    assert "graph" in text and "500" in text


def test_suite_runs_scripts_in_order_passes_quick_and_counts_failures(tmp_path, monkeypatch, capsys):
    """run_suite with stand-in scripts (the GPU check forced on): each runs in its own process from the checkout's
    root with --out (and --quick only where the script takes it), a failing one is counted and named, the rest
    still run, and summary.md is written."""
    import rawgraphs.bench.suite as suite
    import rawgraphs.context

    bdir = tmp_path / "benchmarks"
    bdir.mkdir()
    log = tmp_path / "calls.txt"
    for name, script in suite.BENCHMARKS.items():
        rc = 3 if name == "graph" else 0
        (bdir / f"{script}.py").write_text(
            "import os, sys\n"
            f"open({str(log)!r}, 'a').write({script!r} + ' ' + ' '.join(sys.argv[1:]) + ' ' + os.getcwd() + '\\n')\n"
            f"sys.exit({rc})\n")
    monkeypatch.setattr(suite, "benchmarks_dir", lambda: bdir)
    monkeypatch.setattr(rawgraphs.context, "gpu_available", lambda: True)
    out = tmp_path / "out"

    assert suite.run_suite(["launch", "graph", "decode"], out, quick=True) == 1
    calls = [line.split() for line in log.read_text().splitlines()]
    assert [c[0] for c in calls] == ["launch_overhead", "graph_overheads", "decode"]
    assert calls[0][1:] == ["--out", str(out), str(tmp_path)]  # launch_overhead takes no --quick
    assert calls[2][1:] == ["--out", str(out), "--quick", str(tmp_path)]
    assert (out / "summary.md").is_file()
    assert "suite: 2/3 benchmarks ok" in capsys.readouterr().out

    log.unlink()
    assert suite.run_suite(["all"], out) == 1
    assert [line.split()[0] for line in log.read_text().splitlines()] == list(suite.BENCHMARKS.values())
    assert "FAILED: graph" in capsys.readouterr().out
    assert "**FAILED: graph**" in (out / "summary.md").read_text()

    pid_file = tmp_path / "child.pid"  # a hang is stopped with the children it started; the rest still run
    (bdir / "decode.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n")
    monkeypatch.setattr(suite, "TIMEOUT_S", 2)
    assert suite.run_suite(["decode", "launch"], out) == 1
    assert "| decode | FAILED (stopped after 2 s) |" in (out / "summary.md").read_text()
    state = Path(f"/proc/{pid_file.read_text()}/status")
    for _ in range(50):  # killed: gone, or a zombie until it is reaped
        if not state.exists() or "State:\tZ" in state.read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail("the hung benchmark's child process outlived it")


@pytest.mark.parametrize("args, message", [
    (["--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (["--tokens", "x"], "argument --tokens: 'x' is not an int"),
    (["--loop", "-3"], "argument --loop: must be >= 0, got -3"),
    (["--prompt-ids", "a,b"], "--prompt-ids must be comma-separated token ids in [0, 32000), got 'a,b'"),
    (["--model", "/no/such/folder"], "--model '/no/such/folder' is not a folder with an HF config.json"),
    (["--model", "tiny", "--tokens", "1000"], "need a context of 1007, past the model's max_seq_len 256"),
])
def test_demo_refuses_bad_arguments_with_one_line_not_a_traceback(args, message):
    rc, out = run("demo", *args)
    assert rc != 0 and message in out and "Traceback" not in out


def test_summary_names_failed_runs_keeps_stale_files_out_and_labels_mixed_units(tmp_path):
    old = tmp_path / "launch_overhead.json"
    BenchResult("launch_overhead", collect_metadata(), {}, [make_row([5.0], unit="us", case="old")]).write_json(old)
    os.utime(old, (1, 1))  # written long before the suite started
    rows = [make_row([1.5, 2.5], unit="ms", case="capture"), make_row([0.5, 0.7], unit="us", case="update")]
    BenchResult("graph_overheads", collect_metadata(), {}, rows).write_json(tmp_path / "graph_overheads.json")
    text = write_summary(tmp_path, [("launch", "FAILED (exit 1)", 3.0), ("graph", "ok", 9.0)], since=100.0).read_text()
    assert "**FAILED: launch**" in text and "| launch | FAILED (exit 1) |" in text
    assert "Not from this run (older files in the folder, not shown): launch_overhead.json" in text
    assert "## launch_overhead" not in text and "## graph_overheads" in text
    assert "| case | median | p10 | p90 | n | unit |" in text and "| ms |" in text and "| us |" in text
