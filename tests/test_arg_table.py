"""An executable's argument tables and batched updates, without a GPU: the executable is built from its records
(``GraphExec._set_records``, what instantiate and update call) and the driver call is replaced by a recorder."""

import struct
from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

import rawgraphs.executable as executable
from rawgraphs.arg_table import tables_for
from rawgraphs.errors import CudaError
from rawgraphs.graph import Node
from rawgraphs.kernel import LaunchShape
from rawgraphs.kernel_args import KernelArgs
from rawgraphs.signature import parse_signatures

SRC = """
extern "C" __global__ void axpb(float* out, const float* x, float a, float b, int n) {}
extern "C" __global__ void axpb2(float* out, const float* x, float a, float b, int n) {}
extern "C" __global__ void scale(float* out, double s) {}
"""
SIGS = parse_signatures(SRC)
RNG = np.random.default_rng(7)


def f32() -> float:
    """A random float that f32 and f64 fields hold exactly."""
    return float(np.float32(RNG.standard_normal()))


def make_nodes(kernels: list[str]) -> list[Node]:
    """Kernel nodes with random pointers and scalars (no GPU: a null function, made-up handles)."""
    nodes = []
    for i, name in enumerate(kernels):
        sig = SIGS[name]
        vals = {"out": int(RNG.integers(1, 2**40)) * 256, "x": int(RNG.integers(1, 2**40)) * 256,
                "a": f32(), "b": f32(), "n": int(RNG.integers(1, 999)),
                "s": f32()}
        args = KernelArgs(sig, **{p.name: vals[p.name] for p in sig.params})
        nodes.append(Node(driver.CUgraphNode(0x1000 + i), "kernel", f"{name}{i}",
                          kernel=SimpleNamespace(function=driver.CUfunction()), shape=LaunchShape(1, 32), args=args))
    return nodes


class Recorder:
    """Stands in for cuGraphExecKernelNodeSetParams: records (node key, kernelParams) and fails at call ``fail``."""

    def __init__(self, fail: int | None = None):
        self.calls, self.fail = [], fail

    def __call__(self, exe, node, params):
        self.calls.append((int(node), params.kernelParams))
        if len(self.calls) - 1 == self.fail:
            return (driver.CUresult.CUDA_ERROR_INVALID_VALUE,)
        return (driver.CUresult.CUDA_SUCCESS,)


@pytest.fixture
def exe_of(monkeypatch):
    def build(nodes, fail=None):
        rec = Recorder(fail)
        monkeypatch.setattr(executable, "_set_params", rec)
        exe = executable.GraphExec.__new__(executable.GraphExec)
        exe.handle, exe.host_updates = driver.CUgraphExec(), 0
        exe._finalizer = SimpleNamespace(alive=True)
        exe._set_records(zip(nodes, nodes))
        return exe, rec
    return build


def fields(exe, node) -> dict:
    """A node's fields read back from its block's bytes."""
    args = exe._rec(node).args
    return {p.name: args.raw(p.name) for p in args.signature.params}


def test_tables_group_by_parameter_list_and_rows_keep_order():
    nodes = make_nodes(["axpb", "scale", "axpb2", "axpb", "scale"])
    tables, rows = tables_for([n.args for n in nodes])
    assert tables[0] is tables[2] is tables[3] and tables[1] is tables[4] and tables[0] is not tables[1]
    assert rows == [0, 0, 1, 2, 1]
    assert tables[0].size == KernelArgs.layout(SIGS["axpb"])[0] == 28 and tables[0].blocks.shape == (3, 32)


def test_adopted_block_lives_in_its_row_and_is_independent(exe_of):
    nodes = make_nodes(["axpb", "scale", "axpb"])
    exe, _ = exe_of(nodes)
    rec = exe._rec(nodes[2])
    assert bytes(rec.table.blocks[rec.row, :rec.table.size]) == nodes[2].args.data()
    assert rec.args.address != nodes[2].args.address and rec.params.kernelParams == rec.args.address
    exe.set_args(nodes[2], b=0.5)
    assert struct.unpack_from("<f", rec.table.blocks[rec.row], rec.args.offset("b"))[0] == 0.5
    assert rec.table.values["b"][1] == 0.5
    assert exe.args_of(nodes[2])["b"] == 0.5 and nodes[2].args["b"] != 0.5  # the graph's own record is untouched
    assert exe.args_of(nodes[0]) == nodes[0].args.values()  # the other row too


@pytest.mark.parametrize("pick", [slice(1, 5), slice(0, 8, 3)], ids=["consecutive", "strided"])
def test_set_args_many_writes_every_picked_row_and_calls_the_driver_per_node(exe_of, pick):
    nodes = make_nodes(["axpb", "axpb2"] * 4)
    exe, rec = exe_of(nodes)
    before = {n.name: fields(exe, n) for n in nodes}
    picked = nodes[pick]
    assert exe.set_args_many(picked, b=-2.25, n=77) == len(picked)
    assert rec.calls == [(n.key, exe._rec(n).args.address) for n in picked]
    for n in nodes:
        want = dict(before[n.name], b=-2.25, n=77) if n in picked else before[n.name]
        assert fields(exe, n) == want
        assert exe.args_of(n)["b"] == want["b"] and exe.args_of(n)["n"] == want["n"]
    assert exe.set_args_many(picked, b=1.5) == len(picked) and fields(exe, picked[-1])["b"] == 1.5  # cached batch
    assert len(exe._batches) == 1


def test_set_args_many_pins_the_new_pointer_target(exe_of):
    nodes = make_nodes(["axpb"] * 3)
    exe, _ = exe_of(nodes)
    target = SimpleNamespace(__cuda_array_interface__={"shape": (4,), "typestr": "<f4", "data": (0x7000, False),
                                                       "version": 3})
    exe.set_args_many(nodes, x=target)
    for n in nodes:
        assert fields(exe, n)["x"] == 0x7000 and exe._rec(n).args.refs["x"].owner is target


def test_refused_node_keeps_old_values_from_it_on_and_names_it(exe_of):
    nodes = make_nodes(["axpb"] * 6)
    exe, rec = exe_of(nodes, fail=3)
    before = {n.name: fields(exe, n) for n in nodes}
    with pytest.raises(CudaError, match=r"axpb3\) in a batched update: the 3 node\(s\) before it took the new "
                                        r"values, it and the 2 after it did not"):
        exe.set_args_many(nodes, a=9.0)
    for i, n in enumerate(nodes):
        want = dict(before[n.name], a=9.0) if i < 3 else before[n.name]
        assert fields(exe, n) == want and exe.args_of(n)["a"] == want["a"]
    rec.fail = None  # the executable is still usable
    assert exe.set_args_many(nodes, a=1.0) == 6 and all(fields(exe, n)["a"] == 1.0 for n in nodes)


def test_refused_set_args_leaves_the_node_as_it_was(exe_of):
    nodes = make_nodes(["axpb"] * 2)
    exe, rec = exe_of(nodes, fail=0)
    before, pinned = fields(exe, nodes[0]), exe._rec(nodes[0]).args.refs["x"]
    target = SimpleNamespace(__cuda_array_interface__={"shape": (4,), "typestr": "<f4", "data": (0x7000, False),
                                                       "version": 3})
    with pytest.raises(CudaError, match=r"cuGraphExecKernelNodeSetParams\(axpb0\)"):
        exe.set_args(nodes[0], a=9.0, x=target)
    assert fields(exe, nodes[0]) == before and exe.args_of(nodes[0])["a"] == before["a"]
    assert exe._rec(nodes[0]).args.refs["x"] is pinned  # the old target, which the driver's node still reads
    exe.set_args(nodes[0], a=9.0, x=target)  # the executable is still usable
    assert fields(exe, nodes[0]) == dict(before, a=9.0, x=0x7000)


def test_one_node_or_name_given_to_set_args_many_is_refused(exe_of):
    nodes = make_nodes(["axpb"] * 2)
    exe, rec = exe_of(nodes)
    for one in (nodes[0], "axpb0"):  # a name must not be read as a list of one-letter names
        with pytest.raises(TypeError, match="a list of kernel nodes or node names; for one node use set_args"):
            exe.set_args_many(one, a=1.0)
    assert rec.calls == []


def test_bad_batches_are_refused_before_any_byte_changes(exe_of):
    nodes = make_nodes(["axpb", "scale"])
    exe, rec = exe_of(nodes)
    before = [fields(exe, n) for n in nodes]
    with pytest.raises(TypeError, match="share one signature"):
        exe.set_args_many(nodes, n=3)
    with pytest.raises(TypeError, match="no argument 'eps'"):
        exe.set_args_many(nodes[:1], eps=1.0)
    with pytest.raises(TypeError, match="takes kernel nodes or node names"):
        exe.set_args_many([["axpb0"]], n=3)
    assert exe.set_args_many([], n=3) == 0
    assert [fields(exe, n) for n in nodes] == before and rec.calls == []


def test_update_rebuilds_the_tables_and_forgets_cached_batches(exe_of):
    nodes = make_nodes(["axpb"] * 3)
    exe, _ = exe_of(nodes)
    exe.set_args_many(nodes, b=4.0)
    source = make_nodes(["axpb"] * 3)
    exe._set_records(zip(nodes, source))  # what update does once the driver took the new graph
    assert not exe._batches and [fields(exe, n) for n in nodes] == [s.args.values() for s in source]


def test_retarget_moves_every_matching_pointer_once_and_each_node_once(exe_of):
    nodes = make_nodes(["axpb", "scale", "axpb2", "axpb"])
    exe, rec = exe_of(nodes)
    a, b = fields(exe, nodes[0])["out"], fields(exe, nodes[1])["out"]
    exe.set_args(nodes[0], x=b)  # node 0: out = a, x = b (two fields to move, one driver call)
    exe.set_args(nodes[3], x=a)
    rec.calls.clear()
    before = {n.name: fields(exe, n) for n in nodes}
    assert exe.retarget({a: b, b: a}) == 3  # a swap: each field moves once
    swap = {a: b, b: a}
    for n in nodes:
        want = {k: swap.get(v, v) if k in ("out", "x") else v for k, v in before[n.name].items()}
        assert fields(exe, n) == want and exe.args_of(n)["out"] == want["out"]
    assert sorted(key for key, _ in rec.calls) == sorted(nodes[i].key for i in (0, 1, 3))


def test_retarget_refused_node_and_later_ones_keep_their_pointers(exe_of):
    nodes = make_nodes(["axpb"] * 4)
    exe, rec = exe_of(nodes)
    target = 0x5000
    for n in nodes:
        exe.set_args(n, x=target)
    rec.calls.clear()
    rec.fail = 2
    with pytest.raises(CudaError, match=r"axpb2\) in retarget: the 2 node\(s\) before it were retargeted, it and "
                                        r"the 1 after it were not"):
        exe.retarget({target: 0x9000})
    assert [fields(exe, n)["x"] for n in nodes] == [0x9000, 0x9000, target, target]
    assert [exe.args_of(n)["x"] for n in nodes] == [0x9000, 0x9000, target, target]
    with pytest.raises(TypeError, match="needs a device pointer"):
        exe.retarget({target: "not a pointer"})
