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
