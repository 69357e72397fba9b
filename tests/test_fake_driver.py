"""The GPU tests whose kernels tools/fakecuda emulates, run on this machine against it (a CPU stand-in for
libcuda.so.1; tools/fakecuda/README.md). Graphs built and captured, updated in place and refused, conditional
bodies, device-side node updates and ``rawgraphs break`` then run end to end through cuda.bindings on a machine
without a GPU, and the tests' values are real: the fake runs axpb/add/fill64, the conditional setters and the
device-side updates on the host. What it cannot show (the model's kernels, timing, the real driver's own
answers) stays with the GPU run."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tools" / "fakecuda"
TESTS = ("test_graph_gpu.py", "test_capture_gpu.py", "test_conditional_gpu.py", "test_device_update_gpu.py",
         "test_breakit.py", "test_cubin.py::test_a_declaration_an_option_changed_is_refused_by_module_kernel")


@pytest.fixture(scope="module")
def fake_dir(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build tools/fakecuda")
    out = tmp_path_factory.mktemp("fakecuda")
    p = subprocess.run([str(FAKE / "build.sh")], env={**os.environ, "FAKECUDA_DIR": str(out)},
                       capture_output=True, text=True, timeout=120)
    if p.returncode and "no cuda.h" in p.stderr:
        pytest.skip(f"tools/fakecuda needs cuda.h: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    return out


def test_gpu_tests_of_graphs_capture_and_updates_pass_on_the_fake_driver(fake_dir):
    env = {**os.environ, "FAKECUDA_DIR": str(fake_dir)}
    p = subprocess.run([str(FAKE / "run.sh"), sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p",
                        "no:cacheprovider", *(f"tests/{t}" for t in TESTS)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (p.stdout + p.stderr)[-4000:]
    assert p.returncode == 0, tail
    passed = re.search(r"(\d+) passed", p.stdout)
    assert passed and int(passed.group(1)) >= 50, tail  # 51 pass (one skips: the fake takes an unused handle)
    assert "not emulate" not in p.stderr, tail  # every kernel these tests launch ran on the host


def test_an_entry_point_the_fake_does_not_implement_fails_by_name(fake_dir, tmp_path):
    """The stand-in refuses what it cannot model rather than answering with uninitialised outputs."""
    script = ("from cuda.bindings import driver as d\n"
              "d.cuInit(0)\n"
              "print(d.cuMemPrefetchAsync.__name__, d.cuCtxGetLimit(d.CUlimit.CU_LIMIT_STACK_SIZE)[0].name)\n")
    env = {**os.environ, "FAKECUDA_DIR": str(fake_dir)}
    p = subprocess.run([str(FAKE / "run.sh"), sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "CUDA_ERROR_NOT_SUPPORTED" in p.stdout
    assert "fakecuda: cuCtxGetLimit is not implemented" in p.stderr
