"""The cubin's parameter sizes against the signatures read from the source (rawgraphs/cubin.py): every shipped
kernel agrees, and a declaration a ``-D`` option changed is refused (on the CPU, and through Module.kernel)."""

import pytest

from rawgraphs.compiler import compile_file, compile_source, kernel_files
from rawgraphs.cubin import check_signature, param_sizes
from rawgraphs.kernel import Module
from rawgraphs.model.decode import KERNEL_FILES
from rawgraphs.signature import launchable, parse_signatures

TWO_WAYS = r"""
#ifdef WIDE
extern "C" __global__ void k(double* out, long long n, double a) { if (n) out[0] = a; }
#else
extern "C" __global__ void k(float* out, int n, float a) { if (n) out[0] = a; }
#endif
extern "C" __global__ void none() {}
"""


@pytest.mark.parametrize("path", kernel_files(), ids=lambda p: p.stem)
def test_every_shipped_kernel_takes_the_parameters_its_source_declares(path):
    names = KERNEL_FILES.get(path.stem, ())
    program = compile_file(path, name_expressions=names)
    sizes = param_sizes(program.cubin)
    kernels = launchable(parse_signatures(path.read_text()), program.lowered)
    assert kernels and set(names) <= set(kernels)
    for name, sig in kernels.items():
        symbol = program.lowered.get(name, name)
        assert len(sizes[symbol]) == len(sig.params), name
        check_signature(sizes, symbol, sig)


def test_sizes_follow_the_types():
    sizes = param_sizes(compile_source(TWO_WAYS, "two_ways.cu").cubin)
    assert sizes["k"] == (8, 4, 4) and sizes["none"] == ()
    assert param_sizes(compile_source(TWO_WAYS, "two_ways.cu", options=("-DWIDE",)).cubin)["k"] == (8, 8, 8)


def test_a_declaration_an_option_changed_is_refused():
    sig = parse_signatures(TWO_WAYS)["k"]  # the last declaration: float* out, int n, float a
    check_signature(param_sizes(compile_source(TWO_WAYS, "two_ways.cu").cubin), "k", sig)
    wide = param_sizes(compile_source(TWO_WAYS, "two_ways.cu", options=("-DWIDE",)).cubin)
    with pytest.raises(TypeError, match=r"\[8, 4, 4\] bytes, but the compiled kernel takes \[8, 8, 8\]"):
        check_signature(wide, "k", sig)


@pytest.mark.gpu
def test_a_declaration_an_option_changed_is_refused_by_module_kernel():
    """The same refusal through Module.kernel (it loads the module, so it needs the driver); the plain build loads."""
    with pytest.raises(TypeError, match=r"\[8, 4, 4\] bytes, but the compiled kernel takes \[8, 8, 8\]"):
        Module.from_source(TWO_WAYS, "two_ways.cu", options=("-DWIDE",)).kernel("k")
    assert str(Module.from_source(TWO_WAYS, "two_ways.cu").kernel("k").signature) == "k(out: ptr, n: i32, a: f32)"


def test_not_a_cubin_is_refused():
    with pytest.raises(ValueError, match="not a 64-bit ELF"):
        param_sizes(b"\x7fELF\x01" + bytes(64))
