"""NVRTC to cubin without a GPU: every shipped kernel, the cache, compile errors with file and line."""

import io
import os
import time
from pathlib import Path

import numpy as np
import pytest

from rawgraphs.compiler import compile_file, compile_source, kernel_files, resource_usage
from rawgraphs.errors import CompileError
from rawgraphs.signature import parse_signatures

KERNELS = [p.stem for p in kernel_files()]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAWGRAPHS_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", KERNELS)
def test_every_kernel_compiles_to_cubin(name, arch):
    prog = compile_file(name, arch=arch)
    assert prog.cubin[:4] == b"\x7fELF" and prog.arch == arch
    assert parse_signatures(kernel_files()[KERNELS.index(name)].read_text())  # it has entry points


def test_compile_leaves_the_shared_one_byte_bytes_alone():
    """A clean compile's log is one byte (its NUL): NVRTC must write it into a buffer of our own, not into
    CPython's shared b" " (then every b" " * n in the process, NumPy's .npy header padding among them, is NULs)."""
    prog = compile_source('extern "C" __global__ void k(float* o) { o[0] = 1.f; }', "k.cu", arch="sm_90",
                          use_cache=False)
    assert prog.log == "" and prog.cubin[:4] == b"\x7fELF"
    n = 4  # a variable: `b" " * 4` would be folded when this file was compiled, before NVRTC ran
    assert b" " * n == bytes([32, 32, 32, 32])
    npy = io.BytesIO()
    np.save(npy, np.arange(3))
    head = npy.getvalue()[10:npy.getvalue().index(b"\n")]  # after magic, version and length: b" " * padlen ends it
    assert head.endswith(b" ") and b"\0" not in head


def test_second_compile_is_a_cache_hit_and_faster():
    src = 'extern "C" __global__ void k(float* o, int n) { if (threadIdx.x < n) o[threadIdx.x] = 1.f; }'
    t0 = time.perf_counter()
    first = compile_source(src, "k.cu", arch="sm_90")
    t1 = time.perf_counter()
    second = compile_source(src, "k.cu", arch="sm_90")
    t2 = time.perf_counter()
    assert not first.cache_hit and second.cache_hit and first.cubin == second.cubin
    assert t2 - t1 < (t1 - t0) / 5
    assert not compile_source(src, "k.cu", arch="sm_90", options=("-DX=1",)).cache_hit  # options are keyed


def test_cached_compile_keeps_the_log():
    """The compile log (here ptxas' report, --ptxas-options=-v) comes back from the cache with the cubin, so
    resource_usage reads a cache hit as it reads the compile that filled it."""
    src = 'extern "C" __global__ void k(float* o, int n) { if (threadIdx.x < n) o[threadIdx.x] = 1.f; }\n'
    first = compile_source(src, "u.cu", arch="sm_90", options=("--ptxas-options=-v",))
    second = compile_source(src, "u.cu", arch="sm_90", options=("--ptxas-options=-v",))
    assert not first.cache_hit and second.cache_hit and "Used" in first.log and second.log == first.log
    logs = list(Path(os.environ["RAWGRAPHS_CACHE"]).glob("u-sm_90-*.log"))
    assert [p.read_text() for p in logs] == [first.log]
    logs[0].unlink()  # an entry written before logs were kept: compiled again, and whole again
    third = compile_source(src, "u.cu", arch="sm_90", options=("--ptxas-options=-v",))
    assert not third.cache_hit and logs[0].read_text() == third.log  # (ptxas' compile time in it differs)


def test_resource_usage_names_template_instantiations(tmp_path):
    src = tmp_path / "u.cu"
    src.write_text('template <int N>\n__global__ void t(float* o) { o[threadIdx.x] = N * o[threadIdx.x]; }\n'
                   'extern "C" __global__ void k(float* o, int n) { if (threadIdx.x < n) o[threadIdx.x] = 1.f; }\n')
    usage = resource_usage(src, name_expressions=("t<3>", "t<5>"))
    assert set(usage) == {"t<3>", "t<5>", "k"} and all(r > 0 for r, _ in usage.values())


def test_changed_header_is_not_served_from_cache():
    src = '#include "h.cuh"\nextern "C" __global__ void k(float* o) { o[0] = V; }'
    a = compile_source(src, "k.cu", arch="sm_90", headers={"h.cuh": "#define V 1.f"})
    b = compile_source(src, "k.cu", arch="sm_90", headers={"h.cuh": "#define V 2.f"})
    assert not b.cache_hit and a.cubin != b.cubin


def test_compile_error_shows_log_file_and_line():
    src = 'extern "C" __global__ void k(float* o) {\n  o[0] = 1.f;\n  undefined_thing(o);\n}\n'
    with pytest.raises(CompileError) as ei:
        compile_source(src, "broken.cu", arch="sm_90")
    e = ei.value
    assert e.filename == "broken.cu" and e.line == 3 and "undefined_thing" in e.log
    assert "broken.cu:3" in str(e)


def test_an_error_in_a_header_names_the_header_and_its_line():
    src = '#include "h.cuh"\nextern "C" __global__ void k(float* o) { o[0] = f(); }'
    with pytest.raises(CompileError) as ei:
        compile_source(src, "k.cu", arch="sm_90", headers={"h.cuh": "__device__ float f() {\n  return oops;\n}"},
                       use_cache=False)
    assert (ei.value.error_file, ei.value.line) == ("h.cuh", 2) and "h.cuh:2" in str(ei.value)


def test_one_option_or_name_expression_may_be_a_plain_string():
    src = ('template <int N> __global__ void fill(float* o) { o[threadIdx.x] = N * SCALE; }\n')
    prog = compile_source(src, "s.cu", arch="sm_90", options="-DSCALE=2", name_expressions="fill<4>")
    assert "-DSCALE=2" in prog.options and set(prog.lowered) == {"fill<4>"}


def test_arch_suffixes_nvrtc_accepts():
    prog = compile_source('extern "C" __global__ void k(float* o) { o[0] = 1.f; }', "a.cu", arch="sm_90a")
    assert prog.arch == "sm_90a" and prog.cubin


def test_templated_kernel_lowered_names():
    src = ('template <int N> __global__ void fill(float* o) { o[threadIdx.x] = N; }\n'
           'template __global__ void fill<4>(float*);')
    prog = compile_source(src, "t.cu", arch="sm_90", name_expressions=("fill<4>", "fill<8>"))
    assert prog.lowered["fill<4>"].startswith("_Z") and prog.lowered["fill<4>"] != prog.lowered["fill<8>"]


def test_bad_arch_is_rejected():
    with pytest.raises(ValueError, match="sm_90"):
        compile_source("", "x.cu", arch="hopper")
