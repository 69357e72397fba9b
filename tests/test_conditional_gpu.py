"""Conditional nodes on the GPU: IF, IF/ELSE, WHILE, SWITCH steered by device data; bodies built explicitly and by
capture; a conditional inside a captured graph; a failed body capture leaves everything usable."""

import numpy as np
import pytest

from rawgraphs import CaptureError, ClosedError, CudaError, DeviceBuffer, Graph, LaunchShape, Module, Stream
from rawgraphs.conditional import add_conditional, capture_conditional, create_handle

pytestmark = pytest.mark.gpu
N = 256
ONE = LaunchShape(1, 1)
ROW = LaunchShape(1, 256)


@pytest.fixture(scope="module")
def k(dev):
    basic, cond = Module.from_file("basic"), Module.from_file("conditional")
    return {n: basic.kernel(n) for n in ("axpb", "add")} | {
        n: cond.kernel(n) for n in ("set_if", "set_switch", "count_down")}


def scalar(v):
    return DeviceBuffer.from_numpy(np.array([v], np.int32))


def axpb(k, out, x, a):
    return {"out": out, "x": x, "a": a, "b": 0.0, "n": N}


@pytest.mark.parametrize("kind", ["if", "if_else"])
@pytest.mark.parametrize("flag", [0, 1, 7])
def test_if_and_if_else_follow_a_device_flag(k, stream, rng, kind, flag):
    x = DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32))
    out = DeviceBuffer(N, np.float32)
    out.fill_bytes(0xFF)
    g = Graph()
    h = create_handle(g, default=0)
    setter = g.add_kernel(k["set_if"], ONE, {"handle": h, "flag": scalar(flag)})
    cond = add_conditional(g, kind, handle=h, deps=setter)
    cond.bodies[0].add_kernel(k["axpb"], ROW, axpb(k, out, x, 2.0))
    if kind == "if_else":
        cond.bodies[1].add_kernel(k["axpb"], ROW, axpb(k, out, x, -3.0))
    g.instantiate().launch(stream)
    stream.synchronize()
    got, xs = out.to_numpy(), x.to_numpy()
    if flag:
        np.testing.assert_array_equal(got, np.float32(2) * xs)
    elif kind == "if_else":
        np.testing.assert_array_equal(got, np.float32(-3) * xs)
    else:
        assert np.isnan(got).all()  # the IF body did not run


@pytest.mark.parametrize("trips", [1, 2, 9, 40])
def test_while_runs_the_body_as_often_as_device_data_says(k, stream, trips):
    acc = DeviceBuffer.from_numpy(np.zeros(N, np.float32))
    ones = DeviceBuffer.from_numpy(np.ones(N, np.float32))
    counter = scalar(trips)
    g = Graph()
    loop = add_conditional(g, "while", default=1)
    body = loop.bodies[0]
    step = body.add_kernel(k["add"], ROW, {"out": acc, "x": acc, "y": ones, "n": N})
    body.add_kernel(k["count_down"], ONE, {"handle": loop.handle, "counter": counter}, deps=step)
    g.instantiate().launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(acc.to_numpy(), np.full(N, trips, np.float32))
    assert counter.to_numpy()[0] == 0


def test_an_unused_handle_fails_instantiation_with_the_drivers_reason(k, stream, rng):
    """The driver's instantiate result (not only INVALID_VALUE) reaches the error, and the graph stays buildable."""
    x = DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32))
    out = DeviceBuffer(N, np.float32)
    g = Graph()
    h = create_handle(g, default=1)
    try:
        g.instantiate().close()
    except CudaError as e:
        assert "instantiate result: CONDITIONAL_HANDLE_UNUSED" in str(e)
    else:  # the driver documents only that an unused handle "may" fail instantiation
        pytest.skip("this driver instantiates a graph with an unused conditional handle")
    add_conditional(g, "if", handle=h).bodies[0].add_kernel(k["axpb"], ROW, axpb(k, out, x, 2.0))
    g.instantiate().launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), np.float32(2) * x.to_numpy())


@pytest.mark.parametrize("value", [0, 1, 2, 5, -1])
def test_switch_picks_the_branch_named_by_device_data(k, stream, rng, value):
    x = DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32))
    out = DeviceBuffer(N, np.float32)
    out.fill_bytes(0xFF)
    g = Graph()
    h = create_handle(g, default=0)
    setter = g.add_kernel(k["set_switch"], ONE, {"handle": h, "value": scalar(value), "n": 3})
    sw = add_conditional(g, "switch", handle=h, cases=3, deps=setter)
    for case, body in enumerate(sw.bodies):
        body.add_kernel(k["axpb"], ROW, axpb(k, out, x, float(case + 1)))
    g.instantiate().launch(stream)
    stream.synchronize()
    got = out.to_numpy()
    if 0 <= value < 3:
        np.testing.assert_array_equal(got, np.float32(value + 1) * x.to_numpy())
    else:
        assert np.isnan(got).all()  # out of range: no branch


def test_bodies_by_capture_and_a_conditional_inside_a_captured_graph(k, stream, rng):
    x = DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32))
    out = DeviceBuffer(N, np.float32)
    out.fill_bytes(0xFF)
    side = Stream.create()
    with Graph.capture(stream) as g:
        k["axpb"].launch(ROW, k["axpb"].args(**axpb(k, out, x, 1.0)), stream)
        cond = capture_conditional(stream, "if", default=0)
        k["add"].launch(ROW, k["add"].args(out=out, x=out, y=x, n=N), stream)  # after the IF node
    with Graph.capture(side, into=cond.bodies[0]):
        k["axpb"].launch(ROW, k["axpb"].args(**axpb(k, out, out, 10.0)), side)
    assert [n.kernel.name for n in cond.bodies[0].nodes] == ["axpb"]
    exe = g.instantiate()
    exe.launch(stream)
    stream.synchronize()
    xs = x.to_numpy()
    np.testing.assert_array_equal(out.to_numpy(), xs + xs)  # default 0: the body was skipped
    with Graph.capture(stream) as g2:  # default 1 runs the body: out = 10 * x, then + x
        k["axpb"].launch(ROW, k["axpb"].args(**axpb(k, out, x, 1.0)), stream)
        cond2 = capture_conditional(stream, "if", default=1)
        k["add"].launch(ROW, k["add"].args(out=out, x=out, y=x, n=N), stream)
    with Graph.capture(side, into=cond2.bodies[0]):
        k["axpb"].launch(ROW, k["axpb"].args(**axpb(k, out, out, 10.0)), side)
    g2.instantiate().launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), np.float32(10) * xs + xs)


def test_failed_capture_into_a_body_is_a_clear_error_and_the_process_stays_usable(k, stream, rng):
    x = DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32))
    out = DeviceBuffer(N, np.float32)
    g = Graph()
    cond = add_conditional(g, "if", default=1)
    with pytest.raises(CaptureError) as ei:
        with Graph.capture(stream, into=cond.bodies[0]):
            k["axpb"].launch(ROW, k["axpb"].args(**axpb(k, out, x, 5.0)), stream)
            stream.synchronize()
    assert ei.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" and "build that graph again" in ei.value.hint
    with pytest.raises(ClosedError):  # the driver invalidated the body, so the parent is not instantiated
        g.instantiate()
    g2 = Graph()  # the process, the stream and new graphs work
    cond2 = add_conditional(g2, "if", default=1)
    with Graph.capture(stream, into=cond2.bodies[0]):
        k["axpb"].launch(ROW, k["axpb"].args(**axpb(k, out, x, 5.0)), stream)
    g2.instantiate().launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), np.float32(5) * x.to_numpy())


def test_python_error_inside_a_body_capture_removes_only_its_nodes(k, stream, rng):
    x = DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32))
    out = DeviceBuffer(N, np.float32)
    g = Graph()
    cond = add_conditional(g, "if", default=1)
    body = cond.bodies[0]
    first = body.add_kernel(k["axpb"], ROW, axpb(k, out, x, 3.0), name="kept")
    with pytest.raises(KeyError):
        with Graph.capture(stream, into=body):
            k["add"].launch(ROW, k["add"].args(out=out, x=out, y=x, n=N), stream)
            raise KeyError("user bug")
    assert body.nodes == [first] and body.node_count() == 1
    g.instantiate().launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), np.float32(3) * x.to_numpy())
