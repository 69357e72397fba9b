"""Stream.borrow and Stream.legacy on the CPU: wrapping a handle needs no driver call, and a stream we do not own is
never destroyed."""

from types import SimpleNamespace

from cuda.bindings import driver

from rawgraphs.context import Stream


def test_borrow_takes_handles_from_cupy_torch_ints_and_custreams():
    handle = 0x7F00_1234
    sources = [SimpleNamespace(ptr=handle),          # cupy.cuda.Stream
               SimpleNamespace(cuda_stream=handle),  # torch.cuda.Stream
               handle, driver.CUstream(handle)]
    for src in sources:
        s = Stream.borrow(src)
        assert int(s) == handle and not s.owned
        s.close()  # a borrowed stream is left alone: closing is a no-op and the handle stays usable
        assert int(s._live()) == handle


def test_borrow_prefers_torch_cuda_stream_over_ptr():
    assert int(Stream.borrow(SimpleNamespace(cuda_stream=7, ptr=9))) == 7


def test_legacy_is_the_legacy_default_stream_and_not_owned():
    s = Stream.legacy()
    assert int(s) == int(driver.CUstream(driver.CU_STREAM_LEGACY)) and not s.owned
