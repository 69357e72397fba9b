"""benchmarks/frameworks.py on the CPU: the chain reference, the helpers, and the measuring plumbing driven by
host-side fake frameworks (a wrong result must cost its row loudly, never get timed)."""

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rawgraphs.context import gpu_available

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))  # the scripts import their shared modules as siblings

import frameworks as fw  # noqa: E402

X = np.random.default_rng(3).integers(1, 100, 256).astype(np.float32)  # [256], integer-valued, never zero
COUNTS = {"build": 2, "rounds": 2, "gpu": 2, "update": 3}


# ---- pure helpers -------------------------------------------------------------------------------------------
def test_chain_reference_zero_nodes_is_a_copy_of_x():
    y = fw.chain_reference(X, 1.5, -0.25, 0)
    assert np.array_equal(y, X) and y is not X and y.dtype == np.float32


def test_chain_reference_with_a_one_adds_b_n_times_exactly():
    assert np.array_equal(fw.chain_reference(X, 1.0, 1.0, 350), X + np.float32(350))
    assert np.array_equal(fw.chain_reference(X, 1.0, 2.0, 10), X + np.float32(20))


def test_chain_reference_rounds_the_product_then_the_sum_like_the_kernel():
    a, b = np.float32(1.1), np.float32(0.3)
    y = X.copy()
    for _ in range(3):
        y = np.float32(a * y) + b  # float32 product, float32 sum: no fused multiply-add
    got = fw.chain_reference(X, 1.1, 0.3, 3)
    assert got.dtype == np.float32 and np.array_equal(got, y)
    assert not np.array_equal(got, X)


def test_chain_reference_leaves_its_input_alone():
    x = X.copy()
    fw.chain_reference(x, 2.0, 1.0, 5)
    assert np.array_equal(x, X)


@pytest.mark.parametrize("nodes, iters", [(1, 100), (10, 100), (200, 100), (350, 57), (1000, 20), (5000, 10)])
def test_graph_launch_iters_stay_between_10_and_100(nodes, iters):
    assert fw.graph_launch_iters(nodes) == iters


def test_optional_returns_the_module_or_none_with_a_note():
    notes = []
    assert fw.optional("json", notes).__name__ == "json" and notes == []
    assert fw.optional("no_such_module_rawgraphs", notes) is None
    assert len(notes) == 1 and "no_such_module_rawgraphs is not installed" in notes[0]


def test_failures_record_the_name_and_error_and_return_none(capsys):
    fails = fw.Failures()
    assert fails.attempt("fine", lambda: 7) == 7
    assert fails.attempt("broken thing", lambda: 1 / 0) is None
    assert fails.failed == ["broken thing: ZeroDivisionError: division by zero"]
    assert "FAILED broken thing" in capsys.readouterr().out


def test_expect_names_poison_left_in_the_output():
    fw.expect(X.copy(), X, "same")
    poisoned = X.copy()
    poisoned[:5] = np.nan
    with pytest.raises(AssertionError, match="5 NaN of 256"):
        fw.expect(poisoned, X, "half done")
    with pytest.raises(AssertionError, match=r"max \|error\| 1.0"):
        fw.expect(X + 1, X, "off by one")


# ---- measuring plumbing with host-side fakes ----------------------------------------------------------------
class FakeDevice:
    """A 'device' chain on the host: a built graph computes chain_reference with its own, updatable b."""

    def __init__(self, wrong: bool = False):
        self.out, self.wrong, self.launches = None, wrong, 0

    def build(self, n, b):
        state = {"b": b}

        def launch():
            self.launches += 1
            self.out = fw.chain_reference(X, fw.A, state["b"], n) + np.float32(self.wrong)

        return fw.Built(launch, nodes=list(range(n)), exe=state)

    def result(self, n):
        return self.out

    def poison(self):
        self.out = np.full_like(X, np.nan)

    def route(self, name):
        return fw.Route(name, "fake route", fw.SAME_CUBIN, self.build, self.result, self.poison)

    def eager_check(self, launch):
        self.poison()
        launch()
        return self.out

    def eager(self):
        def launch():
            self.out = X + np.float32(fw.B) + np.float32(self.wrong)
        return launch


def fake_bench():
    return SimpleNamespace(stream=SimpleNamespace(synchronize=lambda: None), chain=SimpleNamespace(x_host=X))


def slow(launch):
    def run():
        time.sleep(20e-6)
        launch()
    return run


def gpu_us(launch):
    launch()
    return [2.0, 4.0]


def test_measure_eager_times_checked_launches_and_drops_a_wrong_one():
    good, bad = FakeDevice(), FakeDevice(wrong=True)
    frameworks = [
        fw.Framework(fw.RAW, fw.SAME_CUBIN, {("axpb", "raw x"): good.eager(), ("noop", "raw x"): lambda: None},
                     [], [], good.eager_check),
        fw.Framework("rawgraphs", fw.SAME_CUBIN, {("axpb", "rawgraphs z"): slow(good.eager())}, [], [],
                     good.eager_check),
        fw.Framework("bad", fw.TORCH_KERNEL, {("axpb", "bad y"): bad.eager()}, [], [], bad.eager_check),
    ]
    fails = fw.Failures()
    rows, table = fw.measure_eager(frameworks, fake_bench(), iters=3, repeats=2, fails=fails)
    assert [(r["kernel"], r["method"]) for r in rows] == [("axpb", "raw x"), ("noop", "raw x"),
                                                          ("axpb", "rawgraphs z")]
    assert all(len(r["samples"]) == 2 and r["unit"] == "us" for r in rows)
    ratios = [t["ratio to raw"] for t in table]
    assert ratios[:2] == [1.0, 1.0] and ratios[2] > 1.0  # the reference is the raw framework, not "raw..."
    assert len(fails.failed) == 1 and fails.failed[0].startswith("eager bad y (axpb): AssertionError")


def test_measure_chain_rows_per_route_and_a_wrong_route_is_not_timed():
    good, bad = FakeDevice(), FakeDevice(wrong=True)
    fails = fw.Failures()
    rows, table = fw.measure_chain([good.route(fw.RAW), bad.route("other")], 10, fake_bench(), COUNTS, gpu_us,
                                   fails)
    assert [r["question"] for r in rows] == ["graph build + instantiate", "graph host per launch",
                                             "graph GPU per node"]
    assert rows[0]["unit"] == "ms" and len(rows[0]["samples"]) == COUNTS["build"]
    assert len(rows[1]["samples"]) == COUNTS["rounds"]
    assert rows[2]["samples"] == [0.2, 0.4]  # GPU us per replay / 10 nodes
    assert len(table) == 1 and table[0]["nodes"] == 10 and table[0]["ratio to raw"] == 1.0
    assert len(fails.failed) == 1 and "other fake route (10 nodes)" in fails.failed[0]
    assert bad.launches == 1  # launched once for the check, never timed


def test_measure_updates_checks_each_route_and_reports_missing_apis():
    dev = FakeDevice()
    route = dev.route(fw.RAW)

    def setter(built, n):
        return lambda b: built.exe.update(b=b)

    updates = [fw.Update(fw.RAW, "set params", route, setter),
               fw.Update("cupy", "none public: recapture + instantiate", route, None, recapture=True),
               fw.Update("cuda.core", "graph[node].update", route, None),
               fw.Update("broken", "forgets the value", route, lambda built, n: lambda b: None)]
    fails = fw.Failures()
    rows, table = fw.measure_updates(updates, fake_bench(), COUNTS["update"], fails)
    assert [(r["framework"], r["nodes"], len(r["samples"])) for r in rows] == [(fw.RAW, 350, 3), ("cupy", 350, 3)]
    by = {t["framework"]: t for t in table}
    assert by[fw.RAW]["ratio to raw"] == 1.0 and by[fw.RAW]["ms for 350"] > 0
    assert by["cupy"]["ratio to raw"] > 0
    assert by["cuda.core"]["us/node"] is None and "not available" in by["cuda.core"]["api"]
    assert "broken" not in by
    assert len(fails.failed) == 1 and "update broken forgets the value" in fails.failed[0]


def test_draw_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    eager = [{"kernel": "axpb", "method": m, "host us": v, "p10": v - 0.5, "p90": v + 0.5}
             for m, v in (("raw", 4.0), ("torch", 9.0))]
    graphs = [{"framework": f, "route": "capture", "nodes": n, "host us/launch": 3.0 + n / 100}
              for f in ("raw", "cupy") for n in fw.NODES]
    path = fw.draw(tmp_path / "sub" / "frameworks.png", eager, graphs, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the script ---------------------------------------------------------------------------------------------
def run_script(*args):
    return subprocess.run([sys.executable, str(BENCH / "frameworks.py"), *args], capture_output=True, text=True,
                          timeout=120)


def test_help_names_the_common_flags():
    r = run_script("--help")
    assert r.returncode == 0, r.stderr
    assert "--out" in r.stdout and "--quick" in r.stdout


@pytest.mark.skipif(gpu_available(), reason="with a GPU the script would run the benchmark")
def test_without_a_gpu_says_so_and_exits_0(tmp_path):
    r = run_script("--quick", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "needs an NVIDIA GPU" in r.stdout and not list(tmp_path.iterdir())
