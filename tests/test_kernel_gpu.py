"""Eager launches on the GPU: exact values on random data, foreign arrays as arguments, errors that lose nothing."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from rawgraphs import ClosedError, CudaError, DeviceBuffer, Graph, HostBuffer, LaunchShape, Module, Stream

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def basic(dev):
    return Module.from_file("basic")


def grid_for(n):
    return LaunchShape(((n + 255) // 256,), (256,))


def test_axpb_writes_exact_values(basic, stream, rng):
    n = 1000  # not a multiple of the block: the tail guard matters
    x = rng.standard_normal(n).astype(np.float32)
    xb, out = DeviceBuffer.from_numpy(x), DeviceBuffer(n + 64, np.float32)
    out.fill_bytes(0xFF)  # poison, including 64 elements past n that must stay untouched
    k = basic.kernel("axpb")
    k.launch(grid_for(n), k.args(out=out, x=xb, a=1.5, b=-0.25, n=n), stream)
    stream.synchronize()
    got = out.to_numpy()
    np.testing.assert_array_equal(got[:n], np.float32(1.5) * x + np.float32(-0.25))
    assert np.isnan(got[n:]).all()  # 0xFFFFFFFF is a NaN: never written


def test_stream_query_is_false_while_work_is_queued_and_true_after(stream):
    from rawgraphs.bench import Blocker
    hold = Blocker(stream, launches=50)  # ~3 ms of GPU work on an H200: far longer than the host's next call
    hold()
    assert stream.query() is False
    stream.synchronize()
    assert stream.query() is True
    hold.close()


def test_int64_arguments_and_positional_binding(basic, stream):
    n = 300
    out = DeviceBuffer(n, np.int64)
    out.fill_bytes(0xAB)
    k = basic.kernel("fill64")
    start, step = -(2**40) + 7, 3**20
    k.launch(grid_for(n), k.args(out, start, step, n), stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), start + np.arange(n, dtype=np.int64) * step)


def test_cupy_array_is_a_kernel_argument(basic, stream, rng):
    cp = pytest.importorskip("cupy")
    n = 777
    x = rng.standard_normal(n).astype(np.float32)
    xc, outc = cp.asarray(x), cp.full(n, cp.nan, dtype=cp.float32)
    k = basic.kernel("axpb")
    args = k.args(out=outc, x=xc, a=2.0, b=1.0, n=n)
    k.launch(grid_for(n), args, stream)
    stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(outc), np.float32(2) * x + np.float32(1))
    assert args.refs["x"].owner is xc  # the block pins the CuPy array it points into


def test_cupy_queues_in_order_on_our_stream_through_the_stream_protocol(dev, basic, stream, rng):
    """``cupy.cuda.Stream.from_external`` reads ``Stream.__cuda_stream__``: a CuPy op on it runs after our queued
    kernel (with the stream held busy first, an op on any other stream would run before it), and borrowing CuPy's
    stream back gives our handle."""
    cp = pytest.importorskip("cupy")
    from rawgraphs.bench import Blocker
    n = 4099
    x = rng.standard_normal(n).astype(np.float32)
    xb, out = DeviceBuffer.from_numpy(x), DeviceBuffer(n, np.float32)
    cps = cp.cuda.Stream.from_external(stream)
    assert cps.ptr == int(stream)
    mem = cp.cuda.UnownedMemory(int(out), out.nbytes, out, device_id=dev.ordinal)
    view = cp.ndarray((n,), cp.float32, cp.cuda.MemoryPointer(mem, 0))
    warm = cp.ones(n, cp.float32)
    with cps:
        warm *= 3  # compiles CuPy's kernel now: a first-use compile would outlast the blocker below
    stream.synchronize()
    hold = Blocker(stream, launches=200)  # ~15 ms of queued work ahead of ours
    hold()
    k = basic.kernel("axpb")
    k.launch(grid_for(n), k.args(out=out, x=xb, a=2.0, b=0.5, n=n), stream)
    with cps:
        view *= 3  # on our stream: after axpb
    assert stream.query() is False  # still queued behind the blocker, so the order above is the stream's
    stream.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), (np.float32(2) * x + np.float32(0.5)) * np.float32(3))
    assert int(Stream.borrow(cps)) == int(stream)
    hold.close()


TORCH_SCRIPT = """
import numpy as np, torch
from rawgraphs import Module, Stream
k = Module.from_file("basic").kernel("add")
n, s = 513, Stream.create()
g = torch.Generator().manual_seed(3)
x, y = (torch.randn(n, generator=g).cuda() for _ in range(2))
out = torch.full((n,), float("nan"), device="cuda")
torch.cuda.synchronize()
args = k(((n + 255) // 256,), (256,), out, x, y, n, stream=s)
s.synchronize()
assert args.refs["x"].owner is x
np.testing.assert_array_equal(out.cpu().numpy(), (x + y).cpu().numpy())
print("torch ok")
"""


def test_torch_tensor_is_a_kernel_argument():
    """In a subprocess: on the GPU machine a pytest plugin breaks `import torch` inside pytest's process."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed here")
    p = subprocess.run([sys.executable, "-c", TORCH_SCRIPT], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "torch ok" in p.stdout, p.stdout + p.stderr


def test_bad_launch_raises_and_stream_stays_usable(basic, stream, rng):
    n = 64
    x = DeviceBuffer.from_numpy(rng.standard_normal(n).astype(np.float32))
    out = DeviceBuffer(n, np.float32)
    k = basic.kernel("axpb")
    args = k.args(out=out, x=x, a=1.0, b=0.0, n=n)
    with pytest.raises(CudaError) as ei:
        k.launch(LaunchShape((1,), (1024,), shared=1 << 30), args, stream)  # 1 GiB of shared memory
    assert ei.value.name.startswith("CUDA_ERROR_")
    k.launch(grid_for(n), args, stream)  # nothing was lost
    stream.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), x.to_numpy())


STATIC_SHARED_SRC = """
extern "C" __global__ void both(float* out) {  // 32 KiB static + the launch's dynamic shared memory
    __shared__ float st[8192];
    extern __shared__ float dyn[];
    const int n = 8192;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { st[i] = i; dyn[i] = 2 * i; }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = st[n - 1 - i] + dyn[i];
}
"""


def test_dynamic_shared_beside_static_over_48k(stream):
    """32 KiB static + 32 KiB dynamic is over the 48 KiB a kernel gets without opting in: the launch opts in
    (eagerly and as a graph node) instead of failing with INVALID_VALUE."""
    k = Module.from_source(STATIC_SHARED_SRC, name="static_shared.cu").kernel("both")
    want = np.arange(8191, -1, -1, dtype=np.float32) + 2 * np.arange(8192, dtype=np.float32)  # [8192]
    shape = LaunchShape((1,), (256,), shared=32 * 1024)
    out = DeviceBuffer(8192, np.float32)
    k.launch(shape, k.args(out=out), stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), want)
    g = Graph()
    out2 = DeviceBuffer(8192, np.float32)
    g.add_kernel(Module.from_source(STATIC_SHARED_SRC, name="static_shared.cu").kernel("both"), shape,
                 {"out": out2})
    exe = g.instantiate()
    exe.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(out2.to_numpy(), want)


def test_use_after_close_is_refused(dev, stream):
    mod = Module.from_file("basic")
    k = mod.kernel("noop")
    mod.close()
    mod.close()  # idempotent
    with pytest.raises(ClosedError):
        k.launch(LaunchShape(1, 1), k.args(), stream)
    s = Stream.create()
    s.close()
    with pytest.raises(ClosedError):
        s.synchronize()
    live = Module.from_file("basic").kernel("noop")
    with pytest.raises(ClosedError, match="Stream was closed"):  # the hot path passes the handle unchecked
        live.launch(LaunchShape(1, 1), live.args(), s)
    g = Graph()
    g.add_kernel(live, LaunchShape(1, 1), {})
    with pytest.raises(ClosedError, match="Stream was closed"):
        g.instantiate().launch(s)
    buf, host = DeviceBuffer(4, np.float32), HostBuffer(4, np.float32)
    buf.close()
    host.close()
    for use in (buf.to_numpy, lambda: buf.fill_bytes(0), lambda: buf.zero(stream),
                lambda: buf.copy_from(np.ones(4, np.float32)), lambda: Graph().add_memset(buf, 0),
                lambda: DeviceBuffer(4, np.float32).upload_async(host, 16, stream)):
        with pytest.raises(ClosedError, match="was closed"):
            use()
    stream.synchronize()  # nothing reached the driver: the stream is fine


SYMBOL_SRC = """
__device__ float gain[4];
extern "C" __global__ void scaled(float* out, const float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gain[i % 4] * x[i];
}
"""


def test_device_variable_is_read_and_written_through_its_symbol(stream, rng):
    mod = Module.from_source(SYMBOL_SRC, "symbol.cu")
    gain = mod.symbol("gain", np.float32)
    assert gain.shape == (4,) and gain.nbytes == 16
    g = rng.standard_normal(4).astype(np.float32)
    gain.copy_from(g)
    np.testing.assert_array_equal(gain.to_numpy(), g)
    x = rng.standard_normal(1000).astype(np.float32)
    xb, out = DeviceBuffer.from_numpy(x), DeviceBuffer(1000, np.float32)
    k = mod.kernel("scaled")
    k.launch(grid_for(1000), k.args(out=out, x=xb, n=1000), stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), np.tile(g, 250) * x)
    with pytest.raises(CudaError, match="NOT_FOUND"):
        mod.symbol("no_such_variable")
    with pytest.raises(ValueError, match="16 bytes"):
        mod.symbol("gain", np.dtype("V3"))
    mod.close()
    with pytest.raises(ClosedError):
        mod.symbol("gain")


def test_unknown_kernel_names_the_ones_that_exist(basic):
    with pytest.raises(KeyError, match="axpb"):
        basic.kernel("axbp")


def test_stated_signature_is_checked_against_the_source(basic):
    k = basic.kernel("axpb", expect="out: ptr, x: ptr, a: f32, b: f32, n: i32")
    assert k is basic.kernel("axpb", expect="axpb(out: ptr, x: ptr, a: f32, b: f32, n: i32)")
    with pytest.raises(TypeError, match=r"stated signature \(out: ptr, x: ptr, a: f32, b: f32, n: i64\) does not"):
        basic.kernel("axpb", expect="out: ptr, x: ptr, a: f32, b: f32, n: i64")


def test_event_elapsed_time_is_positive(basic, stream):
    from rawgraphs import Event
    a, b = Event.create(), Event.create()
    k = basic.kernel("noop")
    a.record(stream)
    for _ in range(10):
        k.launch(LaunchShape(1, 1), k.args(), stream)
    b.record(stream)
    b.synchronize()
    assert a.elapsed_ms(b) > 0


def test_kernel_attributes_are_reported(basic):
    attrs = basic.kernel("axpb").attributes()
    assert 0 < attrs["registers"] <= 255 and attrs["local_bytes"] == 0 and attrs["max_threads"] >= 256
