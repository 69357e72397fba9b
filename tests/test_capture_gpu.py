"""The seed's "break it" exercise: every way to break a capture raises CaptureError with the CUDA error name, and
afterwards the stream, the context and other graphs still work."""

import numpy as np
import pytest
from cuda.bindings import driver

from rawgraphs import CaptureError, DeviceBuffer, Event, Graph, LaunchShape, Module, Stream
from rawgraphs.capture import capture_status

pytestmark = pytest.mark.gpu
N = 512
SHAPE = LaunchShape((2,), (256,))


@pytest.fixture(scope="module")
def axpb(dev):
    return Module.from_file("basic").kernel("axpb")


@pytest.fixture
def healthy(axpb, stream, rng):
    """An instantiated graph made before the breakage, and a check that it and the stream still work."""
    x = DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32))
    out = DeviceBuffer(N, np.float32)
    with Graph.capture(stream) as g:
        axpb.launch(SHAPE, axpb.args(out=out, x=x, a=3.0, b=1.0, n=N), stream)
    exe = g.instantiate()

    def still_works():
        assert capture_status(stream) == "NONE"
        out.fill_bytes(0xFF)
        exe.launch(stream)  # the other graph
        stream.synchronize()
        np.testing.assert_array_equal(out.to_numpy(), np.float32(3) * x.to_numpy() + np.float32(1))
        out.fill_bytes(0xFF)
        axpb.launch(SHAPE, axpb.args(out=out, x=x, a=3.0, b=1.0, n=N), stream)  # eager on the same stream
        stream.synchronize()
        np.testing.assert_array_equal(out.to_numpy(), np.float32(3) * x.to_numpy() + np.float32(1))

    return x, out, still_works


def launch_one(axpb, stream, x, out):
    axpb.launch(SHAPE, axpb.args(out=out, x=x, a=2.0, b=0.0, n=N), stream)


def test_sync_during_capture(axpb, stream, healthy):
    x, out, still_works = healthy
    with pytest.raises(CaptureError) as ei:
        with Graph.capture(stream):
            launch_one(axpb, stream, x, out)
            stream.synchronize()
    assert ei.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    assert ei.value.call == "cuStreamSynchronize" and "INVALIDATED" in ei.value.status
    still_works()


def test_allocation_during_capture(axpb, stream, healthy):
    x, out, still_works = healthy
    with pytest.raises(CaptureError) as ei:
        with Graph.capture(stream):
            launch_one(axpb, stream, x, out)
            DeviceBuffer(1 << 20, np.uint8)
    assert ei.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" and ei.value.call == "cuMemAlloc"
    still_works()


def test_item_style_read_back_is_refused(axpb, stream, healthy):
    x, out, still_works = healthy
    with pytest.raises(CaptureError, match="NOT be recorded") as ei:
        with Graph.capture(stream):
            launch_one(axpb, stream, x, out)
            out.to_numpy()[0]  # .item(): would read stale data now, not at replay
    assert "to_numpy" in ei.value.call
    still_works()


def test_data_dependent_host_branch_is_refused(axpb, stream, healthy):
    x, out, still_works = healthy
    with pytest.raises(CaptureError):
        with Graph.capture(stream):
            launch_one(axpb, stream, x, out)
            if out.to_numpy()[0] > 0:  # the branch would be decided once, at capture
                launch_one(axpb, stream, x, out)
    still_works()


def test_synchronous_host_copy_is_refused_not_silently_run(axpb, stream, healthy, rng):
    x, out, still_works = healthy
    before = x.to_numpy()
    with pytest.raises(CaptureError, match="cuMemcpyHtoD"):
        with Graph.capture(stream):
            x.copy_from(rng.standard_normal(N).astype(np.float32))
    np.testing.assert_array_equal(x.to_numpy(), before)  # nothing ran behind the capture's back
    still_works()


def test_synchronous_memset_is_refused_not_silently_run(axpb, stream, healthy):
    x, out, still_works = healthy
    before = x.to_numpy()
    with pytest.raises(CaptureError, match="fill_bytes.*memset node"):
        with Graph.capture(stream):
            x.fill_bytes(0)
    np.testing.assert_array_equal(x.to_numpy(), before)
    still_works()


def test_unjoined_fork(axpb, stream, healthy):
    x, out, still_works = healthy
    side = Stream.create()
    fork = Event.create(timing=False)
    with pytest.raises(CaptureError) as ei:
        with Graph.capture(stream):
            fork.record(stream)
            side.wait(fork)
            launch_one(axpb, side, x, out)  # never joined back into `stream`
    assert ei.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNJOINED" and ei.value.call == "cuStreamEndCapture"
    assert capture_status(side) == "NONE"
    still_works()


def test_legacy_stream_work(axpb, stream, healthy):
    x, out, still_works = healthy
    blocking = Stream.create(non_blocking=False)  # a blocking stream joins the legacy stream implicitly
    with pytest.raises(CaptureError) as ei:
        with Graph.capture(blocking):
            launch_one(axpb, blocking, x, out)
            launch_one(axpb, Stream.legacy(), x, out)
    assert ei.value.name == "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"
    still_works()


def test_python_error_inside_capture_propagates_unchanged(axpb, stream, healthy):
    x, out, still_works = healthy
    with pytest.raises(ZeroDivisionError):
        with Graph.capture(stream):
            launch_one(axpb, stream, x, out)
            raise ZeroDivisionError("a Python error inside the capture")
    still_works()


def test_raw_driver_query_during_capture(stream, healthy):
    _, _, still_works = healthy
    with pytest.raises(CaptureError) as ei:
        with Graph.capture(stream) as g:
            ev = Event.create()
            ev.record(stream)
            ev.query()
    assert ei.value.name in ("CUDA_ERROR_CAPTURED_EVENT", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
    assert g._closed
    err, = driver.cuCtxSynchronize()  # the context is fine
    assert err == driver.CUresult.CUDA_SUCCESS
    still_works()
