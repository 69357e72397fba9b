"""The benchmark harness on the CPU: statistics, JSON records, tables, summaries, plots, progress bar."""

import io
import json
import math

import numpy as np
import pytest

from rawgraphs.bench import (
    SCHEMA_VERSION,
    BenchResult,
    Summary,
    collect_metadata,
    format_cell,
    format_table,
    load_json,
    make_row,
    markdown_table,
    metadata_line,
    plot_bars,
    plot_lines,
    progress,
    render_summary,
    time_gpu_queued,
    time_host,
    validate,
)


def _result() -> BenchResult:
    meta = {"date_utc": "2026-01-02T03:04:05+00:00", "hostname": "box", "python": "3.11.7",
            "packages": {"numpy": "2.0.0", "cuda-bindings": "13.3.0", "torch": None}, "nvrtc": "13.0",
            "driver": "13.0", "git": {"rev": "0123456789abcdef", "dirty": True},
            "device": {"name": "NVIDIA H200", "arch": "sm_90", "sm_count": 132, "memory_bytes": 150 * 2**30}}
    rows = [make_row([5.0, 4.0, 6.0], kernel="noop", method="raw packed"),
            make_row([5.5, 4.5, 6.5], kernel="noop", method="rawgraphs")]
    rows[1]["ratio"] = 1.1
    return BenchResult("launch_overhead", meta, {"iters": 2000}, rows, ["rawgraphs / raw packed: 1.10x"])


def test_summary_of_known_samples():
    s = Summary.of([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert (s.n, s.median, s.mean, s.min) == (10, 5.5, 5.5, 1.0)
    assert s.p10 == pytest.approx(1.9) and s.p90 == pytest.approx(9.1)  # linear interpolation
    assert s.stdev == pytest.approx(math.sqrt(55 / 6))  # sample stdev (ddof=1)
    one = Summary.of([3.25])
    assert (one.n, one.median, one.p10, one.p90, one.stdev) == (1, 3.25, 3.25, 3.25, 0.0)
    assert Summary.from_dict(s.as_dict()) == s


def test_summary_median_is_robust_to_an_outlier():
    s = Summary.of([2.0] * 9 + [1000.0])
    assert s.median == 2.0 and s.min == 2.0 and s.mean > 100


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [[1.0, 2.0]]])
def test_summary_rejects_bad_samples(bad):
    with pytest.raises(ValueError):
        Summary.of(bad)


def test_time_host_returns_one_positive_sample_per_repeat():
    calls, syncs = [], []
    samples = time_host(lambda: calls.append(1), warmup=3, iters=7, repeats=4, sync=lambda: syncs.append(1))
    assert len(samples) == 4 and all(s > 0 for s in samples)
    assert len(calls) == 3 + 7 * 4 and len(syncs) == 1 + 4  # sync after warm-up and after each repeat
    with pytest.raises(ValueError):
        time_host(lambda: None, iters=0)


def test_time_gpu_queued_orders_hold_events_and_work_per_repeat(monkeypatch):
    """Each sample is the span between two events around one call, recorded right after the blocker so the span
    starts when the GPU reaches the work; warm-up calls run unqueued first, and the events are closed even when a
    call raises (stand-in events: the order of calls is what is under test)."""
    import rawgraphs.bench.timing as timing

    log = []

    class FakeEvent:
        count = 0

        def __init__(self):
            FakeEvent.count += 1
            self.name = "start" if FakeEvent.count % 2 else "end"

        @classmethod
        def create(cls, timing=False):
            assert timing
            return cls()

        def record(self, stream):
            log.append(f"{self.name}.record")

        def synchronize(self):
            log.append(f"{self.name}.sync")

        def elapsed_ms(self, other):
            return 0.25

        def close(self):
            log.append(f"{self.name}.close")

    monkeypatch.setattr(timing, "Event", FakeEvent)
    samples = time_gpu_queued(lambda: log.append("fn"), "stream", lambda: log.append("hold"), repeats=2, warmup=1)
    assert samples == [250.0, 250.0]
    one = ["hold", "start.record", "fn", "end.record", "end.sync"]
    assert log == ["fn", *one, *one, "start.close", "end.close"]

    def fails_when_timed():  # the warm-up call passes; the first timed one raises
        if "hold" in log:
            raise RuntimeError("launch failed")

    log.clear()
    with pytest.raises(RuntimeError, match="launch failed"):
        time_gpu_queued(fails_when_timed, "stream", lambda: log.append("hold"), repeats=2)
    assert log == ["hold", "start.record", "start.close", "end.close"]


def test_time_gpu_queued_checks_counts_before_touching_anything():
    called = []
    for bad in ({"repeats": 0}, {"repeats": 3, "warmup": -1}):
        with pytest.raises(ValueError):
            time_gpu_queued(lambda: called.append("fn"), None, lambda: called.append("hold"), **bad)
    assert called == []  # no launch and no blocker was enqueued for a refused request


def test_make_row_keeps_samples_and_summary():
    row = make_row([3, 1, 2], method="a", size=64)
    assert row["method"] == "a" and row["size"] == 64 and row["unit"] == "us"
    assert row["samples"] == [3.0, 1.0, 2.0] and row["summary"]["median"] == 2.0


def test_json_round_trip(tmp_path):
    r = _result()
    path = r.write_json(tmp_path / "sub" / "r.json")
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == SCHEMA_VERSION
    back = load_json(path)
    assert back == r
    assert back.rows[1]["samples"] == [5.5, 4.5, 6.5]


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d.pop("benchmark"), "benchmark"),
    (lambda d: d.update(schema_version=99), "schema_version"),
    (lambda d: d.update(rows={}), "rows"),
    (lambda d: d["metadata"].pop("hostname"), "metadata.hostname"),
    (lambda d: d["metadata"].update(driver=13), "metadata.driver"),
    (lambda d: d["metadata"]["device"].update(sm_count="132"), "metadata.device.sm_count"),
    (lambda d: d["metadata"]["git"].pop("dirty"), "metadata.git.dirty"),
    (lambda d: d["rows"][1].pop("summary"), "rows[1].summary"),
    (lambda d: d["rows"][0]["samples"].append("fast"), "rows[0].samples[3]"),
    (lambda d: d["rows"][0]["summary"].update(n=True), "rows[0].summary.n"),
    (lambda d: d["notes"].append(3), "notes[1]"),
])
def test_validation_names_the_bad_key(tmp_path, mutate, key):
    doc = _result().to_dict()
    validate(doc)
    mutate(doc)
    with pytest.raises(ValueError, match=f"'{__import__('re').escape(key)}'"):
        validate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="benchmark result"):
        load_json(path)


def test_a_non_finite_parameter_is_written_as_a_string_not_lost(tmp_path):
    r = _result()
    r.params.update(tau=float("nan"), worst={"diff": float("inf")})
    back = load_json(r.write_json(tmp_path / "r.json"))
    assert back.params["tau"] == "nan" and back.params["worst"] == {"diff": "inf"}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind


def test_write_json_refuses_an_invalid_result(tmp_path):
    r = _result()
    r.notes.append(None)
    with pytest.raises(ValueError, match="notes"):
        r.write_json(tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_format_cell():
    assert [format_cell(v) for v in (7, 2.0, 3.14159, 0.001234, None, "x", True)] == \
        ["7", "2.00", "3.14", "0.00123", "-", "x", "yes"]
    assert format_cell(np.float64(1.5)) == "1.50"  # NumPy floats are floats


def test_format_table_aligns_columns():
    rows = [{"method": "raw packed", "s": {"median": 4.567}, "ratio": 1.0, "n": 20},
            {"method": "cupy", "s": {"median": 12.0}, "ratio": 2.6279, "n": 5}]
    text = format_table(rows, ["method", ("s.median", "us"), "ratio", "n"], title="T")
    assert text.splitlines() == [
        "T",
        "method         us  ratio   n",
        "----------  -----  -----  --",
        "raw packed   4.57   1.00  20",
        "cupy        12.00   2.63   5",
    ]
    assert "| cupy | 12.00 | 2.63 | 5 |" in markdown_table(rows, ["method", ("s.median", "us"), "ratio", "n"])


def test_a_column_named_with_a_dot_is_a_key_not_a_path():
    rows = [{"nodes": 10, "GraphExec.launch us": 2.29, "sub": {"x": 1.5}}]
    text = format_table(rows, ["nodes", "GraphExec.launch us", "sub.x"])
    assert text.splitlines()[-1].split() == ["10", "2.29", "1.50"]


def test_render_summary_has_table_and_metadata():
    r = _result()
    md = render_summary([r, BenchResult("empty", r.metadata)])
    assert "## launch_overhead" in md and "## empty" in md
    assert "| kernel | method | median (us) | p10 (us) | p90 (us) | n | ratio |" in md
    assert "| noop | rawgraphs | 5.50 |" in md
    line = metadata_line(r.metadata)
    assert line in md
    for part in ("NVIDIA H200", "sm_90", "132 SMs", "CUDA 13.0", "NVRTC 13.0", "cuda-bindings 13.3.0",
                 "git 0123456789 (dirty)", "2026-01-02T03:04:05+00:00"):
        assert part in line
    assert "torch" not in line  # not installed -> not listed
    assert "- rawgraphs / raw packed: 1.10x" in md and "`iters=2000`" in md


def test_metadata_without_gpu(tmp_path, monkeypatch):
    import rawgraphs.context
    from rawgraphs.errors import NoDriverError

    def no_driver():
        raise NoDriverError("test")

    monkeypatch.setattr(rawgraphs.context, "driver_version", no_driver)  # as on a machine with no driver
    monkeypatch.setattr(rawgraphs.context, "gpu_available", lambda: False)
    meta = collect_metadata()
    assert meta["device"] is None and meta["driver"] is None
    assert meta["packages"]["numpy"] == np.__version__ and meta["packages"]["cuda-bindings"]
    assert meta["nvrtc"].count(".") == 1
    assert meta["git"] is None or len(meta["git"]["rev"]) == 40
    assert "device: none (CPU only)" in metadata_line(meta)
    assert collect_metadata(repo=tmp_path)["git"] is None  # not a git checkout
    BenchResult("cpu", meta).write_json(tmp_path / "cpu.json")  # a GPU-less record is valid


def test_git_tree_names_the_files_as_they_are(tmp_path):
    """metadata.git.tree is the tree id of the work tree's content, committed or not: equal to HEAD's tree on a
    clean checkout, and to the tree of the commit that a dirty checkout's edits would make (a changed file, a new
    one; an ignored one and an untracked one over the size limit left out), from the top folder or a subfolder."""
    import subprocess

    from rawgraphs.bench.record import _TREE_UNTRACKED_MAX, _git

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("scratch/\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("z = 0\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    clean = _git(tmp_path)
    assert clean == {"rev": git("rev-parse", "HEAD"), "dirty": False, "tree": git("rev-parse", "HEAD^{tree}")}
    (tmp_path / "a.py").write_text("x = 2\n")
    (tmp_path / "b.py").write_text("y = 3\n")
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "c.py").write_text("ignored\n")
    (tmp_path / "weights.bin").write_bytes(b"\0" * (_TREE_UNTRACKED_MAX + 1))  # a big untracked file: left out
    dirty = _git(tmp_path)
    assert _git(tmp_path / "pkg") == dirty  # from a subfolder: the same whole-checkout tree
    (tmp_path / "weights.bin").unlink()
    assert dirty["rev"] == clean["rev"] and dirty["dirty"] and dirty["tree"] != clean["tree"]
    assert git("status", "--porcelain") != ""  # the throwaway index left the real one alone
    git("add", "-A")
    git("commit", "-qm", "two")
    assert dirty["tree"] == git("rev-parse", "HEAD^{tree}")
    assert "git " + dirty["rev"][:10] + " (dirty, tree " + dirty["tree"][:10] + ")" in metadata_line(
        {"git": dirty, "packages": {}})


def test_metadata_does_not_import_torch():
    import sys
    had_torch = "torch" in sys.modules
    collect_metadata()
    assert ("torch" in sys.modules) == had_torch


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_plots_write_png(tmp_path):
    series = {"eager": [9, 9, 9, 9], "graph": [4, 3, 2, 2]}
    lines = plot_lines(tmp_path / "a" / "lines.png", [1, 2, 4, 8], series, title="t", xlabel="batch",
                       ylabel="us", logx=True)
    bars = plot_bars(tmp_path / "bars.png", ["a", "b"], [5.0, 6.0], low=[4.0, 5.0], high=[6.0, 7.5])
    assert _is_png(lines) and _is_png(bars)
    with pytest.raises(ValueError, match="series 'x'"):
        plot_lines(tmp_path / "x.png", [1, 2], {"x": [1]})


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_is_quiet_when_not_a_tty():
    out = _Stream(tty=False)
    assert list(progress(range(50), label="x", stream=out)) == list(range(50))
    assert out.getvalue() == ""


def test_progress_draws_on_a_tty():
    out = _Stream(tty=True)
    assert list(progress(iter(range(10)), total=10, label="run", stream=out, width=10)) == list(range(10))
    text = out.getvalue()
    assert text.endswith("\rrun [##########] 10/10\n") and "run [#.........] 1/10" in text
