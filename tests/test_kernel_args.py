"""Signatures parsed from source and packed argument blocks, byte for byte, without a GPU."""

import ctypes
import struct

import numpy as np
import pytest

from rawgraphs.kernel import LaunchShape
from rawgraphs.kernel_args import KernelArgs
from rawgraphs.memory import DeviceView, as_view
from rawgraphs.signature import Param, Signature, launchable, parse_signatures, resolve

SRC = """
// a comment with __global__ void fake(int x) inside must be ignored
extern "C" __global__ void __launch_bounds__(256) k(const __nv_bfloat16* __restrict__ x, int n,
        long long big, float eps, unsigned long long seed, double d, unsigned u, int* out) {}
/* __global__ void also_fake(float y) */
extern "C" __global__ void none() {}
"""


def sig():
    return parse_signatures(SRC)["k"]


def test_signatures_are_read_from_source():
    sigs = parse_signatures(SRC)
    assert set(sigs) == {"k", "none"}
    assert sig().params == (Param("x", "ptr"), Param("n", "i32"), Param("big", "i64"), Param("eps", "f32"),
                            Param("seed", "u64"), Param("d", "f64"), Param("u", "u32"), Param("out", "ptr"))
    assert sigs["none"].params == ()


def test_unsupported_parameter_type_is_a_clear_error_for_that_kernel_only():
    sigs = parse_signatures('extern "C" __global__ void k(short s) {}\n'
                            'extern "C" __global__ void r(int& s) {}\n'
                            'extern "C" __global__ void ok(float* y, int n = 3) {}')
    assert sigs["ok"].params == (Param("y", "ptr"), Param("n", "i32"))  # a default value is not the name
    assert set(launchable(sigs)) == {"ok"}
    for name, msg in (("k", "parameter 's' has unsupported type 'short'"), ("r", "reference parameter 's'")):
        with pytest.raises(ValueError, match=msg):
            resolve(sigs, (), name)


def test_block_layout_is_natural_alignment_and_little_endian():
    a = KernelArgs(sig(), x=0x7F00_0000_1000, n=-3, big=-(2**40), eps=0.5, seed=2**64 - 1, d=1.25, u=2**32 - 1,
                   out=0x7F00_0000_2000)
    raw = bytes(a._buf)
    assert raw[0:8] == struct.pack("<Q", 0x7F00_0000_1000)
    assert raw[8:12] == struct.pack("<i", -3)
    assert raw[16:24] == struct.pack("<q", -(2**40))  # 8-aligned after the 4-byte int
    assert raw[24:28] == struct.pack("<f", 0.5)
    assert raw[32:40] == struct.pack("<Q", 2**64 - 1)
    assert raw[40:48] == struct.pack("<d", 1.25)
    assert raw[48:52] == struct.pack("<I", 2**32 - 1)
    assert raw[56:64] == struct.pack("<Q", 0x7F00_0000_2000)
    # the void*[] the driver reads points at each field
    ptrs = (ctypes.c_void_p * 8).from_address(a.address)
    base = ctypes.addressof(a._buf)
    assert [p - base for p in ptrs] == [0, 8, 16, 24, 32, 40, 48, 56]


def test_in_place_update_rewrites_only_named_bytes():
    a = KernelArgs(sig(), 1, 2, 3, 4.0, 5, 6.0, 7, 8)
    before = bytes(a._buf)
    a.set(n=99)
    after = bytes(a._buf)
    changed = [i for i in range(len(before)) if before[i] != after[i]]
    assert changed and all(8 <= i < 12 for i in changed)
    assert a["n"] == 99 and a.raw("n") == 99
    address = a.address
    a["eps"] = 0.125
    assert a.address == address and a.raw("eps") == 0.125  # same block, same address


def test_copy_is_an_independent_block_with_the_same_bytes_values_and_pins():
    view = DeviceView(0x4560, (2,), np.int32)
    a = KernelArgs(sig(), x=0x7F00_0000_1000, n=-3, big=7, eps=0.5, seed=9, d=1.25, u=3, out=view)
    b = a.copy()
    assert b.data() == a.data() and b.values() == a.values() and b.refs["out"] is view
    assert b.address != a.address and ctypes.addressof(b._buf) != ctypes.addressof(a._buf)
    ptrs = (ctypes.c_void_p * 8).from_address(b.address)  # the copy's void*[] points into its own block
    base = ctypes.addressof(b._buf)
    assert [p - base for p in ptrs] == [0, 8, 16, 24, 32, 40, 48, 56]
    b.set(n=5, eps=2.0)
    assert a["n"] == -3 and a.raw("eps") == 0.5 and b.raw("n") == 5 and b.raw("eps") == 2.0
    a.set(out=0x9990)
    assert b.raw("out") == 0x4560 and b.refs["out"] is view  # the original's later changes stay its own


def test_device_array_views_pack_their_pointer_and_are_pinned():
    class FakeCupy:
        __cuda_array_interface__ = {"shape": (4, 2), "typestr": "<f4", "data": (0xDEAD_BEE0, False), "version": 3}

    arr = FakeCupy()
    a = KernelArgs(sig(), x=arr, n=1, big=1, eps=1.0, seed=1, d=1.0, u=1, out=DeviceView(0x1230, (2,), np.int32))
    assert a.raw("x") == 0xDEAD_BEE0 and a.raw("out") == 0x1230
    assert a.refs["x"].owner is arr  # keeps the foreign array alive
    assert as_view(arr).shape == (4, 2) and as_view(arr).dtype == np.float32


def test_non_contiguous_views_are_refused():
    class Strided:
        __cuda_array_interface__ = {"shape": (4, 2), "typestr": "<f4", "data": (16, False), "version": 3,
                                    "strides": (4, 16)}

    with pytest.raises(ValueError, match="C-contiguous"):
        as_view(Strided())


@pytest.mark.parametrize("shape, exc, msg", [((-4, -2), ValueError, ">= 0"), ((4.7,), TypeError, "sequence of ints"),
                                             (4.0, TypeError, "an int or"), ((2, None), TypeError, "an int or")])
def test_bad_shapes_are_refused_not_truncated(shape, exc, msg):
    with pytest.raises(exc, match=msg):
        DeviceView(0x1000, shape, np.float32)
    assert DeviceView(0x1000, (np.int64(2), 3), np.float32).nbytes == 24


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(n=1), TypeError, "missing argument"),
    (dict(x=1, n=1, big=1, eps=1.0, seed=1, d=1.0, u=1, out=1, extra=2), TypeError, "no argument 'extra'"),
    (dict(x="0x10", n=1, big=1, eps=1.0, seed=1, d=1.0, u=1, out=1), TypeError, "device pointer"),
    (dict(x=1, n=1.5, big=1, eps=1.0, seed=1, d=1.0, u=1, out=1), TypeError, "needs an int"),
    (dict(x=1, n=True, big=1, eps=1.0, seed=1, d=1.0, u=1, out=1), TypeError, "needs an int"),
    (dict(x=1, n=2**31, big=1, eps=1.0, seed=1, d=1.0, u=1, out=1), ValueError, "out of range"),
    (dict(x=1, n=1, big=1, eps="1", seed=1, d=1.0, u=1, out=1), TypeError, "needs a number"),
    (dict(x=1, n=1, big=1, eps=1.0, seed=-1, d=1.0, u=1, out=1), ValueError, "out of range"),
    (dict(x=1, n=1, big=1, eps=1e300, seed=1, d=1.0, u=1, out=1), ValueError, "'eps' .* = 1e.300 does not fit in f32"),
    (dict(x=1, n=1, big=1, eps=1.0, seed=1, d=10**400, u=1, out=1), ValueError, "'d' .* does not fit in f64"),
])
def test_bad_arguments_are_refused_before_the_driver(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        KernelArgs(sig(), **kwargs)
    good = dict(x=1, n=1, big=1, eps=1.0, seed=1, d=1.0, u=1, out=1)
    bad = {k: v for k, v in kwargs.items() if k in good and v != good[k]}
    if bad:  # an update of a good block says the same, and changes nothing
        a = KernelArgs(sig(), **good)
        before = bytes(a._buf)
        with pytest.raises(exc, match=msg):
            a.set(**bad)
        assert bytes(a._buf) == before


def test_float32_limits_pass_as_the_kernel_would_read_them():
    a = KernelArgs(sig(), x=1, n=1, big=1, eps=float(np.finfo(np.float32).max), seed=1, d=1.0, u=1, out=1)
    a.set(eps=float("inf"))
    assert a.raw("eps") == float("inf")
    a.set(eps=float("nan"))
    assert np.isnan(a.raw("eps"))


def test_failed_update_changes_nothing():
    a = KernelArgs(sig(), 1, 2, 3, 4.0, 5, 6.0, 7, 8)
    before = bytes(a._buf)
    with pytest.raises(ValueError):
        a.set(n=5, u=-1)  # the second value is bad: the first must not be written either
    assert bytes(a._buf) == before and a["n"] == 2


def test_too_many_positional_and_duplicates():
    with pytest.raises(TypeError, match="takes 8 arguments"):
        KernelArgs(sig(), *range(9))
    with pytest.raises(TypeError, match="twice"):
        KernelArgs(sig(), 1, x=2)


def test_signature_text_round_trip_and_stated_signature():
    s = Signature.parse("k(x: ptr, n: i32)")
    assert s.name == "k" and s.params == (Param("x", "ptr"), Param("n", "i32"))
    assert str(s) == "k(x: ptr, n: i32)"
    a = KernelArgs(s, x=1, n=2)
    for read in (lambda: a["zz"], lambda: a.offset("zz"), lambda: a.raw("zz")):
        with pytest.raises(KeyError, match=r"k\(\) has no argument 'zz'; its arguments are x, n"):
            read()
    bare = Signature.parse(" x: ptr,n:i32 ")  # the form Module.kernel(expect=) documents: no name
    assert bare.name == "" and bare.params == s.params
    assert Signature.parse("k()").params == Signature.parse("").params == ()
    with pytest.raises(ValueError, match="unknown type"):
        Param("x", "int")
    for bad in ("x ptr", "k(x: ptr,)", "x: ptr: i32", "k(: ptr)"):
        with pytest.raises(ValueError, match="is not 'name: type'"):
            Signature.parse(bad)


@pytest.mark.parametrize("grid, block, shared, msg", [
    ((0,), (1,), 0, "positive"), ((1,), (1025,), 0, "1024"), ((1,), (32, 32, 2), 0, "1024"),
    ((1, 1, 1, 1), (1,), 0, "1 to 3"), ((1,), (1,), -1, ">= 0"),
])
def test_launch_shape_validation(grid, block, shared, msg):
    with pytest.raises(ValueError, match=msg):
        LaunchShape(grid, block, shared)
    assert LaunchShape(4, (8, 2)).block == (8, 2, 1)


def test_launch_shape_cluster():
    s = LaunchShape((1, 16, 32), 128, cluster=(1, 1, 8))
    assert s.cluster == (1, 1, 8) and s.clustered and not LaunchShape(4, 32).clustered
    assert LaunchShape(8, 32, cluster=2).cluster == (2, 1, 1)
    # launch_ex (cuLaunchKernelEx instead of cuLaunchKernel) is set by either attribute and is not a field
    assert s.launch_ex and LaunchShape(4, 32, pdl=True).launch_ex and not LaunchShape(4, 32).launch_ex
    assert LaunchShape(4, 32) == LaunchShape(4, 32) and "launch_ex" not in repr(s)
    # above 8 blocks (the portable limit) up to 16 with the kernel's non-portable opt-in (Kernel.prepare)
    assert not s.nonportable and LaunchShape((16,), 32, cluster=(16,)).nonportable
    assert LaunchShape((1, 12, 9), 128, cluster=(1, 1, 9)).nonportable and "nonportable" not in repr(s)
    for grid, cluster in [((1, 16, 12), (1, 1, 8)), ((32,), (32,)), ((17,), (17,)), ((4, 8), (4, 8)), ((4,), (0,))]:
        with pytest.raises(ValueError, match="cluster"):
            LaunchShape(grid, 128, cluster=cluster)


def test_cluster_value_fills_both_attribute_value_types():
    from cuda.bindings import driver

    from rawgraphs.kernel import cluster_value
    for value in (driver.CUlaunchAttributeValue(), driver.CUkernelNodeAttrValue()):
        got = cluster_value((2, 1, 4), value)
        assert got is value and (got.clusterDim.x, got.clusterDim.y, got.clusterDim.z) == (2, 1, 4)


def test_resolve_names_plain_kernels_and_compiled_template_instantiations():
    """Module.kernel's lookup without a GPU: a plain kernel by name; a template only by a name expression compiled
    in, with its template's parameters; a bare template, one not compiled in, a plain kernel spelled as a template
    and an unknown name are refused by name (KeyError saying what exists)."""
    from rawgraphs.signature import launchable, resolve
    src = """
    template <int N, bool F> __global__ void __launch_bounds__(128) t(float* y, int n) {}
    extern "C" __global__ void plain(float* y, float a) {}
    """
    sigs = parse_signatures(src)
    compiled = ("t<4,true>",)
    assert resolve(sigs, compiled, "plain") is sigs["plain"]
    inst = resolve(sigs, compiled, "t<4,true>")
    assert inst.name == "t<4,true>" and inst.params == sigs["t"].params and not inst.template
    assert set(launchable(sigs, compiled)) == {"plain", "t<4,true>"}
    with pytest.raises(KeyError, match=r"t is a template kernel.*t<4,true>"):
        resolve(sigs, compiled, "t")
    with pytest.raises(KeyError, match=r"'t<8,true>': t is a template kernel"):
        resolve(sigs, compiled, "t<8,true>")
    with pytest.raises(KeyError, match="none: pass name_expressions="):
        resolve(sigs, (), "t<4,true>")
    with pytest.raises(KeyError, match="plain is not a template kernel"):
        resolve(sigs, compiled, "plain<1>")
    with pytest.raises(KeyError, match=r"no kernel 'other'.*\['plain', 't'\]"):
        resolve(sigs, compiled, "other")
