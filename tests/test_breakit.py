"""The "break it" exercise (rawgraphs.breakit): the plan without a GPU, and on the GPU every forbidden call
breaks its capture with a CUDA error while the streams and an earlier graph keep working."""

import pytest

from rawgraphs import breakit
from rawgraphs.context import gpu_available


@pytest.mark.skipif(gpu_available(), reason="a GPU is present: main() runs the exercise instead of the plan")
def test_main_without_gpu_prints_the_plan(capsys):
    assert breakit.main([]) == 0
    text = capsys.readouterr().out
    assert "needs an NVIDIA GPU" in text
    for case in breakit.CASES:
        assert f"({case.key}) {case.title}: {case.tried}" in text


def test_cases_are_the_eight_of_the_exercise():
    assert [c.key for c in breakit.CASES] == ["i", "ii", "iii", "iv", "v", "vi", "vii", "viii"]
    assert [c.key for c in breakit.CASES if c.blocking] == ["vi"]  # only legacy work needs a blocking stream


@pytest.mark.gpu
def test_every_case_breaks_loudly_and_leaves_everything_usable():
    rows = breakit.run_all()
    assert [r["case"] for r in rows] == [f"({c.key}) {c.title}" for c in breakit.CASES]
    for r in rows:
        assert r["error"].startswith("CUDA_ERROR_"), r
        assert r["stream_ok"] and r["other_graph_ok"], r
        assert breakit.healthy(r)
    by_key = {c.key: r for c, r in zip(breakit.CASES, rows, strict=True)}
    assert by_key["v"]["error"] == "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"
    assert by_key["vi"]["error"] == "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"
    assert by_key["iv"]["invalidated"] and by_key["ii"]["invalidated"]
    for key in ("i", "iii", "vii"):  # rawgraphs refused the call before the driver saw it: still valid
        assert not by_key[key]["invalidated"] and "ACTIVE" in by_key[key]["status"]


@pytest.mark.gpu
def test_main_prints_the_table_and_writes_json(tmp_path, capsys):
    import json

    path = tmp_path / "break.json"
    assert breakit.main(["--json", str(path)]) == 0
    text = capsys.readouterr().out
    assert "other graph ok" in text and "UNEXPECTED" not in text
    doc = json.loads(path.read_text())
    assert len(doc["rows"]) == len(breakit.CASES) and doc["metadata"]["device"] is not None
