"""Graphs on the GPU: explicit == captured == eager, in-place updates hit exactly what they name, failed updates
report reason and node, every node kind works, and repeated create/destroy leaks nothing."""

import gc
import weakref

import numpy as np
import pytest

from rawgraphs import DeviceBuffer, Event, Graph, GraphUpdateError, HostBuffer, LaunchShape, Module, Stream, device

pytestmark = pytest.mark.gpu
N = 1000
SHAPE = LaunchShape(((N + 255) // 256,), (256,))


@pytest.fixture(scope="module")
def k(dev):
    m = Module.from_file("basic")
    return {name: m.kernel(name) for name in ("axpb", "add", "fill64", "noop")}


@pytest.fixture
def bufs(rng):
    """x, y random inputs; a, b, c, d outputs poisoned with NaN."""
    x = DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32))
    y = DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32))
    outs = {n: DeviceBuffer(N, np.float32) for n in "abcd"}
    for o in outs.values():
        o.fill_bytes(0xFF)
    return {"x": x, "y": y, **outs}


def expected(b, s1=2.0, s2=-1.0):
    x, y = b["x"].to_numpy(), b["y"].to_numpy()
    f = np.float32
    a = f(s1) * x + f(1.0)
    bb = f(s2) * y + f(0.5)
    c = a + bb
    return {"a": a, "b": bb, "c": c, "d": f(0.5) * c + f(0.0)}


def diamond_explicit(k, b, s1=2.0, s2=-1.0):
    """a = s1*x+1 and b = s2*y+0.5 in parallel; c = a+b; d = 0.5*c."""
    g = Graph()
    na = g.add_kernel(k["axpb"], SHAPE, {"out": b["a"], "x": b["x"], "a": s1, "b": 1.0, "n": N}, name="a")
    nb = g.add_kernel(k["axpb"], SHAPE, {"out": b["b"], "x": b["y"], "a": s2, "b": 0.5, "n": N}, name="b")
    nc = g.add_kernel(k["add"], SHAPE, {"out": b["c"], "x": b["a"], "y": b["b"], "n": N}, deps=[na, nb], name="c")
    g.add_kernel(k["axpb"], SHAPE, {"out": b["d"], "x": b["c"], "a": 0.5, "b": 0.0, "n": N}, deps=nc, name="d")
    return g


def diamond_launches(k, b, stream, side):
    """The same DAG as launches, b on a forked side stream joined back with events."""
    fork, join = Event.create(timing=False), Event.create(timing=False)
    k["axpb"].launch(SHAPE, k["axpb"].args(out=b["a"], x=b["x"], a=2.0, b=1.0, n=N), stream)
    fork.record(stream)
    side.wait(fork)
    k["axpb"].launch(SHAPE, k["axpb"].args(out=b["b"], x=b["y"], a=-1.0, b=0.5, n=N), side)
    join.record(side)
    stream.wait(join)
    k["add"].launch(SHAPE, k["add"].args(out=b["c"], x=b["a"], y=b["b"], n=N), stream)
    k["axpb"].launch(SHAPE, k["axpb"].args(out=b["d"], x=b["c"], a=0.5, b=0.0, n=N), stream)


def check_all(b, want):
    for name, v in want.items():
        np.testing.assert_array_equal(b[name].to_numpy(), v, err_msg=name)


def test_explicit_captured_and_eager_agree(k, bufs, stream):
    want = expected(bufs)
    side = Stream.create()
    diamond_launches(k, bufs, stream, side)
    stream.synchronize()
    check_all(bufs, want)
    for builder in ("explicit", "captured"):
        for name in "abcd":
            bufs[name].fill_bytes(0xFF)
        if builder == "explicit":
            g = diamond_explicit(k, bufs)
        else:
            with Graph.capture(stream) as g:
                diamond_launches(k, bufs, stream, side)
            assert [n.kernel.name for n in g.nodes] == ["axpb", "axpb", "add", "axpb"]  # side-stream node too
        assert g.node_count() >= 4
        exe = g.instantiate()
        exe.launch(stream)
        stream.synchronize()
        check_all(bufs, want)


@pytest.mark.parametrize("blocks, threads", [(2, 256), (16, 16)])
def test_cluster_launch_eager_explicit_and_captured(k, bufs, stream, blocks, threads):
    """A launch in one thread block cluster of all its blocks runs eagerly, as an explicit node (the cluster is a
    node attribute, read back from the driver) and captured, with the same result; set_launch keeps the cluster.
    16 blocks are above the portable 8: the kernel is opted in by its first launch (the driver refuses without)."""
    from cuda.bindings import driver
    shape = LaunchShape((blocks,), (threads,), cluster=(blocks, 1, 1))
    assert shape.nonportable == (blocks > 8)
    covered = blocks * threads  # 512 / 256 of the 1000 elements
    args = dict(out=bufs["a"], x=bufs["x"], a=3.0, b=0.25, n=N)
    want = np.float32(3.0) * bufs["x"].to_numpy() + np.float32(0.25)
    attr = driver.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    for how in ("eager", "explicit", "captured"):
        bufs["a"].fill_bytes(0xFF)
        if how == "eager":
            k["axpb"].launch(shape, k["axpb"].args(**args), stream)
        else:
            if how == "explicit":
                g = Graph()
                g.add_kernel(k["axpb"], shape, args, name="c")
            else:
                with Graph.capture(stream) as g:
                    k["axpb"].launch(shape, k["axpb"].args(**args), stream)
            got = driver.cuGraphKernelNodeGetAttribute(g.nodes[0].handle, attr)
            assert got[0] == driver.CUresult.CUDA_SUCCESS and got[1].clusterDim.x == blocks
            exe = g.instantiate()
            exe.launch(stream)
        stream.synchronize()
        a = bufs["a"].to_numpy()
        np.testing.assert_array_equal(a[:covered], want[:covered], err_msg=how)
        assert np.isnan(a[covered:]).all()  # the grid covers only those
    exe.set_launch(g.nodes[0], grid=(4 * blocks,))
    assert exe._rec(g.nodes[0]).shape.cluster == (blocks, 1, 1)
    exe.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(bufs["a"].to_numpy(), want)


def test_set_args_pointer_swap_writes_new_buffer_only(k, bufs, stream, rng):
    exe = diamond_explicit(k, bufs).instantiate()
    exe.launch(stream)
    stream.synchronize()
    old_d = bufs["d"].to_numpy()
    new = DeviceBuffer(N, np.float32)
    new.fill_bytes(0xFF)
    bufs["d"].fill_bytes(0xFF)
    exe.set_args("d", out=new)
    exe.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(new.to_numpy(), old_d)
    assert np.isnan(bufs["d"].to_numpy()).all()  # the old target is no longer written
    assert exe.args_of("d")["out"] is new


def test_set_args_scalar_changes_only_its_node(k, bufs, stream):
    g = diamond_explicit(k, bufs)
    exe = g.instantiate()
    exe.launch(stream)
    stream.synchronize()
    before = {n: bufs[n].to_numpy() for n in "abcd"}
    exe.set_args("b", a=3.0)
    exe.launch(stream)
    stream.synchronize()
    want = expected(bufs, s2=3.0)
    np.testing.assert_array_equal(bufs["a"].to_numpy(), before["a"])  # untouched node, same output
    check_all(bufs, {n: want[n] for n in "bcd"})
    assert g.node("b").args["a"] == -1.0  # the graph's own record is not the executable's


def test_batched_update_of_every_node_of_a_kernel(k, bufs, stream):
    exe = diamond_explicit(k, bufs).instantiate()
    assert exe.set_args_where("axpb", b=0.0) == 3
    exe.launch(stream)
    stream.synchronize()
    x, y = bufs["x"].to_numpy(), bufs["y"].to_numpy()
    c = np.float32(2) * x + np.float32(-1) * y
    np.testing.assert_array_equal(bufs["d"].to_numpy(), np.float32(0.5) * c)
    with pytest.raises(TypeError, match="no argument"):
        exe.set_args_where("axpb", scale=1.0)
    with pytest.raises(TypeError, match="share one signature"):  # axpb and add: no one packing fits both
        exe.set_args_many(["a", "c"], n=N)
    assert exe.args_of("a")["b"] == 0.0 and exe.args_of("c")["n"] == N  # nothing half-applied


def test_set_launch_and_disable(k, bufs, stream):
    exe = diamond_explicit(k, bufs).instantiate()
    exe.set_launch("a", grid=(2,))  # only the first 512 elements
    exe.set_enabled("b", False)
    exe.launch(stream)
    stream.synchronize()
    a = bufs["a"].to_numpy()
    want = expected(bufs)["a"]
    np.testing.assert_array_equal(a[:512], want[:512])
    assert np.isnan(a[512:]).all()
    assert np.isnan(bufs["b"].to_numpy()).all()


def test_update_from_graph_with_new_arguments(k, bufs, stream):
    exe = diamond_explicit(k, bufs).instantiate()
    exe.update(diamond_explicit(k, bufs, s1=-4.0, s2=0.25))
    exe.launch(stream)
    stream.synchronize()
    check_all(bufs, expected(bufs, s1=-4.0, s2=0.25))
    assert exe.args_of("a")["a"] == -4.0


def test_update_pins_what_the_new_graphs_other_nodes_point_at(stream, rng):
    """After update(graph), a memcpy node reads the new graph's host buffer: the executable must keep it alive."""
    dst = DeviceBuffer(N, np.float32)

    def copy_graph(values):
        host = HostBuffer(N, np.float32)
        host.array[:] = values
        g = Graph()
        g.add_memcpy(dst, host)
        return g, weakref.ref(host)

    first = rng.standard_normal(N).astype(np.float32)
    second = rng.standard_normal(N).astype(np.float32)
    exe = copy_graph(first)[0].instantiate()
    g2, host2 = copy_graph(second)
    exe.update(g2)
    del g2
    gc.collect()
    assert host2() is not None
    exe.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(dst.to_numpy(), second)


def test_update_refused_for_topology_change_names_reason_and_node(k, bufs, stream):
    exe = diamond_explicit(k, bufs).instantiate()
    g2 = diamond_explicit(k, bufs)
    g2.add_kernel(k["noop"], LaunchShape(1, 1), {}, deps=g2.node("d"), name="extra")
    with pytest.raises(GraphUpdateError) as ei:
        exe.update(g2)
    assert ei.value.reason == "TOPOLOGY_CHANGED" and ei.value.node == "extra"
    assert ei.value.name == "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"
    g4 = Graph()  # same nodes, one edge fewer (c no longer waits for b): the driver refuses it
    na = g4.add_kernel(k["axpb"], SHAPE, {"out": bufs["a"], "x": bufs["x"], "a": 2.0, "b": 1.0, "n": N})
    g4.add_kernel(k["axpb"], SHAPE, {"out": bufs["b"], "x": bufs["y"], "a": -1.0, "b": 0.5, "n": N}, name="b")
    nc = g4.add_kernel(k["add"], SHAPE, {"out": bufs["c"], "x": bufs["a"], "y": bufs["b"], "n": N}, deps=na)
    g4.add_kernel(k["axpb"], SHAPE, {"out": bufs["d"], "x": bufs["c"], "a": 0.5, "b": 0.0, "n": N}, deps=nc)
    with pytest.raises(GraphUpdateError) as ei:
        exe.update(g4)
    assert ei.value.reason == "TOPOLOGY_CHANGED" and ei.value.node == "b"  # from the driver, through ctypes
    exe.launch(stream)  # the executable is unchanged and still right
    stream.synchronize()
    check_all(bufs, expected(bufs))


def test_update_may_change_a_kernel_function(k, bufs, stream):
    """Driver 580 (CUDA 13.0) accepts a different function at the same node (benchmarks/update_rules.py)."""
    exe = diamond_explicit(k, bufs).instantiate()
    g3 = Graph()  # same topology, but node "c" launches axpb instead of add
    na = g3.add_kernel(k["axpb"], SHAPE, {"out": bufs["a"], "x": bufs["x"], "a": 2.0, "b": 1.0, "n": N})
    nb = g3.add_kernel(k["axpb"], SHAPE, {"out": bufs["b"], "x": bufs["y"], "a": -1.0, "b": 0.5, "n": N})
    nc = g3.add_kernel(k["axpb"], SHAPE, {"out": bufs["c"], "x": bufs["a"], "a": 1.0, "b": 0.0, "n": N},
                       deps=[na, nb], name="swapped")
    g3.add_kernel(k["axpb"], SHAPE, {"out": bufs["d"], "x": bufs["c"], "a": 0.5, "b": 0.0, "n": N}, deps=nc)
    exe.update(g3)
    exe.launch(stream)
    stream.synchronize()
    a = expected(bufs)["a"]
    np.testing.assert_array_equal(bufs["c"].to_numpy(), a)  # c is now a copy of a, not a + b
    np.testing.assert_array_equal(bufs["d"].to_numpy(), np.float32(0.5) * a)
    exe.set_args(exe.graph.nodes[2], a=3.0)  # the executable's record now describes axpb at node c
    exe.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(bufs["c"].to_numpy(), np.float32(3) * a)


def test_every_node_kind(k, stream, rng):
    n = 256
    host_in = HostBuffer(n, np.float32)
    host_in.array[:] = rng.standard_normal(n).astype(np.float32)
    host_out = HostBuffer(n, np.float32)
    host_out.array[:] = np.nan
    dev_in, dev_out = DeviceBuffer(n, np.float32), DeviceBuffer(n, np.float32)
    ev = Event.create(timing=False)
    g = Graph()
    up = g.add_memcpy(dev_in, host_in, name="h2d")
    scratch = g.add_mem_alloc(n * 4, deps=up, name="alloc")
    zero = g.add_memset(dev_out, 0, deps=up, element_size=4)
    child = Graph()
    child.add_kernel(k["axpb"], LaunchShape(1, 256), {"out": scratch.ptr, "x": dev_in, "a": 3.0, "b": 2.0, "n": n})
    ch = g.add_child(child, deps=[scratch, zero])
    rec = g.add_event_record(ev, deps=ch)
    wait = g.add_event_wait(ev, deps=rec)
    add = g.add_kernel(k["add"], LaunchShape(1, 256), {"out": dev_out, "x": scratch.ptr, "y": dev_in, "n": n},
                       deps=wait)
    free = g.add_mem_free(scratch, deps=add)
    join = g.add_empty(deps=[free])
    g.add_memcpy(host_out, dev_out, deps=join, name="d2h")
    exe = g.instantiate()
    for _ in range(2):  # graph memory is freed and re-mapped each launch
        exe.launch(stream)
        stream.synchronize()
        x = host_in.array
        np.testing.assert_array_equal(host_out.array, (np.float32(3) * x + np.float32(2)) + x)
    kinds = [d["kind"] for d in g.describe()]
    assert kinds == ["memcpy", "mem_alloc", "memset", "child", "event_record", "event_wait", "kernel",
                     "mem_free", "empty", "memcpy"]


def test_refused_names_and_dependencies_add_no_driver_node(k, bufs, stream):
    """A node refused by rawgraphs (a name taken, a dependency of another graph) must not reach the driver's graph,
    where it would run at every launch unseen."""
    g, other = diamond_explicit(k, bufs), Graph()
    stray = other.add_empty(name="stray")
    for add in (lambda: g.add_kernel(k["axpb"], SHAPE, {"out": bufs["a"], "x": bufs["x"], "a": 9.0, "b": 9.0, "n": N},
                                     name="a"),
                lambda: g.add_empty(name="c"), lambda: g.add_memset(bufs["d"], 0, name="d"),
                lambda: g.add_empty(deps=stray)):
        with pytest.raises(ValueError, match="already exists|not a node of this graph"):
            add()
        assert g.node_count() == len(g.nodes) == 4
    exe = g.instantiate()
    exe.launch(stream)
    stream.synchronize()
    check_all(bufs, expected(bufs))


def test_inspection_lists_kernels_shapes_args_and_dot(k, bufs, tmp_path):
    g = diamond_explicit(k, bufs)
    desc = {d["name"]: d for d in g.describe()}
    assert desc["c"]["kernel"] == "add" and desc["c"]["deps"] == ["a", "b"]
    assert desc["a"]["grid"] == (4, 1, 1) and desc["a"]["args"]["a"] == 2.0
    assert desc["a"]["args"]["out"] == hex(bufs["a"].ptr)
    text = open(g.dot(str(tmp_path / "g.dot"))).read()
    assert "digraph" in text and "axpb" in text
    exe = g.instantiate()
    assert exe.instantiate_ms > 0
    assert [d["name"] for d in exe.describe()] == ["a", "b", "c", "d"]


def test_graph_close_keeps_executables_working(k, bufs, stream):
    g = diamond_explicit(k, bufs)
    exe = g.instantiate()
    g.close()
    exe.set_args("b", a=3.0)  # node handles of the closed graph still name the nodes
    exe.launch(stream)
    stream.synchronize()
    check_all(bufs, {n: expected(bufs, s2=3.0)[n] for n in "bcd"})


def test_ten_thousand_cycles_leak_nothing(k, stream):
    n = 256
    out = DeviceBuffer(n, np.float32)
    dev = device()

    def cycle():
        g = Graph()
        a = g.add_kernel(k["fill64"], LaunchShape(1, 256), {"out": out, "start": 1, "step": 2, "n": n // 2})
        g.add_kernel(k["noop"], LaunchShape(1, 1), {}, deps=a)
        exe = g.instantiate()
        exe.launch(stream)
        exe.close()
        g.close()
        return weakref.ref(g), weakref.ref(exe)

    for _ in range(100):
        cycle()
    stream.synchronize()
    gc.collect()
    free0 = dev.memory_info()[0]
    for _ in range(10_000):
        refs = cycle()
    stream.synchronize()
    gc.collect()
    free1 = dev.memory_info()[0]
    assert abs(free0 - free1) <= 2 << 20, f"device memory moved by {free0 - free1} bytes"
    assert refs[0]() is None and refs[1]() is None


def test_retarget_swaps_every_pointer_to_a_buffer(k, bufs, stream, rng):
    exe = diamond_explicit(k, bufs).instantiate()
    x2 = DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32))
    d2 = DeviceBuffer(N, np.float32)
    d2.fill_bytes(0xFF)
    bufs["d"].fill_bytes(0xFF)
    assert exe.retarget({bufs["x"]: x2, bufs["d"].ptr: d2}) == 2  # node a reads x; node d writes d
    exe.launch(stream)
    stream.synchronize()
    want = expected({**bufs, "x": x2})
    np.testing.assert_array_equal(d2.to_numpy(), want["d"])
    assert np.isnan(bufs["d"].to_numpy()).all()
