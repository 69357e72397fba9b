"""Device-side updates of a device-updatable kernel node: a kernel in the graph sets another node's grid and a
scalar argument from device data (cudaGraphKernelNodeSetGridDim / SetParam), e.g. to grow a grid with the context."""

import numpy as np
import pytest

from rawgraphs import DeviceBuffer, Graph, LaunchShape, Module

pytestmark = pytest.mark.gpu
N_MAX = 4096
ONE = LaunchShape(1, 1)


def written(buf):
    return int(np.count_nonzero(~np.isnan(buf.to_numpy())))


def test_a_kernel_grows_another_nodes_grid_and_sets_its_scalar(dev, stream, rng):
    basic, du = Module.from_file("basic"), Module.from_file("device_update")
    axpb = basic.kernel("axpb")
    x = DeviceBuffer.from_numpy(rng.standard_normal(N_MAX).astype(np.float32))
    out = DeviceBuffer(N_MAX, np.float32)
    count = DeviceBuffer.from_numpy(np.array([1000], np.int32))       # needs 4 blocks of 256
    scale = DeviceBuffer.from_numpy(np.array([-3.5], np.float32))
    g = Graph()
    grow = g.add_kernel(du.kernel("set_grid_from"), ONE, {"node": 0, "count": count, "per_block": 256}, name="grow")
    scal = g.add_kernel(du.kernel("set_scalar_from"), ONE, {"node": 0, "value": scale, "offset": 0}, deps=grow,
                        name="scale")
    work = g.add_kernel(axpb, LaunchShape(1, 256), {"out": out, "x": x, "a": 1.0, "b": 0.0, "n": N_MAX},
                        deps=scal, name="work")
    handle = g.make_device_updatable(work)
    assert handle != 0
    exe = g.instantiate()
    exe.set_args("grow", node=handle)
    exe.set_args("scale", node=handle, offset=work.args.offset("a"))
    seen = []
    for _ in range(2):  # the first launch may already see the update or only the next one: both are recorded
        out.fill_bytes(0xFF)
        exe.launch(stream)
        stream.synchronize()
        seen.append(written(out))
    assert seen[-1] == 1024, f"elements written per launch: {seen}"
    got = out.to_numpy()[:1024]
    np.testing.assert_array_equal(got, np.float32(-3.5) * x.to_numpy()[:1024])
    print(f"device-side update visible in launch 1: {seen[0] == 1024} (elements written per launch: {seen})")


# ---- DeviceArgUpdater: batched, stream-ordered argument updates of many nodes ------------------------------

def _chain(axpb, x, bufs, n, b=1.0):
    """n dependent axpb nodes (node i adds b), every node device-updatable; the result is in bufs[n % 2]."""
    g, prev = Graph(), None
    for i in range(n):
        prev = g.add_kernel(axpb, LaunchShape(1, 256), {"out": bufs[(i + 1) % 2], "x": x if i == 0 else bufs[i % 2],
                                                         "a": 1.0, "b": b, "n": 256}, deps=prev)
        g.make_device_updatable(prev)
    return g


def _run(exe, stream, bufs, n):
    for buf in bufs:
        buf.fill_bytes(0xFF, stream)
    exe.launch(stream)
    stream.synchronize()
    return bufs[n % 2].to_numpy()


def test_updater_sets_many_nodes_in_stream_order(dev, stream, rng):
    from rawgraphs.device_update import DeviceArgUpdater
    axpb = Module.from_file("basic").kernel("axpb")
    x_host = rng.integers(-100, 100, 256).astype(np.float32)  # integer-valued: every sum below is exact
    x, bufs, n = DeviceBuffer.from_numpy(x_host), [DeviceBuffer(256, np.float32) for _ in range(2)], 40
    g = _chain(axpb, x, bufs, n)
    exe = g.instantiate()
    up = DeviceArgUpdater(exe, g.nodes[:30], stream)
    np.testing.assert_array_equal(_run(exe, stream, bufs, n), x_host + np.float32(n))
    assert up.set(stream, b=2.0) == 30
    np.testing.assert_array_equal(_run(exe, stream, bufs, n), x_host + np.float32(n + 30))
    assert exe.args_of(g.nodes[0])["b"] == 2.0 and exe.args_of(g.nodes[35])["b"] == 1.0
    # stream order with no host wait between: each launch sees the batch queued before it
    out = DeviceBuffer(256, np.float32)
    add = Module.from_file("basic").kernel("add")
    acc = DeviceBuffer.from_numpy(np.zeros(256, np.float32))
    for b in (3.0, 5.0, 7.0):
        up.set(stream, b=b)
        exe.launch(stream)
        add.launch(LaunchShape(1, 256), add.args(out=out, x=acc, y=bufs[n % 2], n=256), stream)
        add.launch(LaunchShape(1, 256), add.args(out=acc, x=out, y=x, n=256), stream)  # acc += result + x
    stream.synchronize()
    want = np.zeros(256, np.float32)
    for b in (3.0, 5.0, 7.0):
        want = (want + (x_host + np.float32(30 * b + 10))) + x_host
    np.testing.assert_array_equal(acc.to_numpy(), want)
    up.close()
    exe.close()


def test_updater_swaps_a_pointer_and_survives_host_updates(dev, stream, rng):
    """A pointer swap writes into the new buffer and not the old; a host-side update of other fields in
    between (uploaded at the next launch) keeps the device-side value (the updater re-uploads first)."""
    from rawgraphs.device_update import DeviceArgUpdater
    axpb = Module.from_file("basic").kernel("axpb")
    x_host = rng.standard_normal(256).astype(np.float32)
    x, old, new = (DeviceBuffer.from_numpy(x_host), DeviceBuffer(256, np.float32), DeviceBuffer(256, np.float32))
    g = Graph()
    node = g.add_kernel(axpb, LaunchShape(1, 256), {"out": old, "x": x, "a": 2.0, "b": 0.5, "n": 256})
    g.make_device_updatable(node)
    exe = g.instantiate()
    up = DeviceArgUpdater(exe, [node], stream)
    exe.set_args(node, a=3.0)  # host-side, before the device-side batch
    up.set(stream, out=new)
    for buf in (old, new):
        buf.fill_bytes(0xFF, stream)
    exe.launch(stream)
    stream.synchronize()
    assert np.isnan(old.to_numpy()).all()
    np.testing.assert_array_equal(new.to_numpy(), np.float32(3.0) * x_host + np.float32(0.5))
    exe.set_args(node, b=-1.0)  # the block holds out=new: pushing it keeps the swap
    new.fill_bytes(0xFF, stream)
    exe.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(new.to_numpy(), np.float32(3.0) * x_host + np.float32(-1.0))
    up.close()
    exe.close()


def test_updater_refuses_bad_nodes_and_use_after_close(dev, stream, rng):
    from rawgraphs.device_update import DeviceArgUpdater
    from rawgraphs.errors import ClosedError
    basic = Module.from_file("basic")
    x, out = DeviceBuffer(256, np.float32), DeviceBuffer(256, np.float32)
    g = Graph()
    plain = g.add_kernel(basic.kernel("axpb"), LaunchShape(1, 256), {"out": out, "x": x, "a": 1.0, "b": 0.0, "n": 256})
    other = g.add_kernel(basic.kernel("add"), LaunchShape(1, 256), {"out": out, "x": x, "y": x, "n": 256}, deps=plain)
    g.make_device_updatable(other)
    exe = g.instantiate()
    with pytest.raises(ValueError, match="make_device_updatable"):
        DeviceArgUpdater(exe, [plain], stream)
    with pytest.raises(TypeError, match="one signature"):
        DeviceArgUpdater(exe, [other, plain], stream)
    up = DeviceArgUpdater(exe, [other], stream)
    with pytest.raises(TypeError, match="no argument 'b'"):
        up.set(stream, b=1.0)
    up.close()
    with pytest.raises(ClosedError):
        up.set(stream, n=128)
    up2 = DeviceArgUpdater(exe, [other], stream)
    exe.close()
    with pytest.raises(ClosedError):
        up2.set(stream, n=128)
    up2.close()
