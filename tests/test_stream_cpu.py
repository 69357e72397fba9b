"""Stream.borrow and Stream.legacy on the CPU: wrapping a handle needs no driver call, and a stream we do not own is
never destroyed."""

from types import SimpleNamespace

import pytest
from cuda.bindings import driver

from rawgraphs import context
from rawgraphs.context import Stream
from rawgraphs.errors import ClosedError


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


def test_a_closed_streams_handle_refuses_every_driver_call(monkeypatch):
    """Launches pass ``stream.handle`` to the driver unchecked (the hot path); after close the handle itself raises
    ClosedError when the binding converts it, before any driver call sees a destroyed (or reused) handle."""
    destroyed = []
    monkeypatch.setattr(context, "_destroy_stream", destroyed.append)
    s = Stream(driver.CUstream(0x7F00_5678), owned=True)
    s.close()
    assert [int(h) for h in destroyed] == [0x7F00_5678]
    for call in (lambda: driver.cuGraphLaunch(driver.CUgraphExec(), s.handle),
                 lambda: driver.cuStreamSynchronize(s.handle), lambda: int(s), s.synchronize, s.query):
        with pytest.raises(ClosedError, match="this Stream was closed"):
            call()
    s.close()  # idempotent


def test_cuda_stream_protocol_round_trip():
    """``__cuda_stream__`` gives (version 0, handle), what cuda.core and CuPy 14's ``Stream.from_external`` read;
    ``borrow`` reads it first, from any object that has it, and refuses a version it does not know."""
    s = Stream.borrow(0x7F00_4321)
    assert s.__cuda_stream__() == (0, 0x7F00_4321)
    again = Stream.borrow(s)
    assert int(again) == 0x7F00_4321 and not again.owned
    other = SimpleNamespace(__cuda_stream__=lambda: (0, 0x55), ptr=9)  # the protocol wins over .ptr
    assert int(Stream.borrow(other)) == 0x55
    with pytest.raises(ValueError, match="version 1"):
        Stream.borrow(SimpleNamespace(__cuda_stream__=lambda: (1, 0x55)))


def test_cuda_stream_protocol_refuses_a_closed_stream(monkeypatch):
    monkeypatch.setattr(context, "_destroy_stream", lambda handle: None)
    s = Stream(driver.CUstream(0x7F00_8765), owned=True)
    s.close()
    with pytest.raises(ClosedError, match="this Stream was closed"):
        s.__cuda_stream__()
