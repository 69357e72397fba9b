"""Error translation of CUresult / cudaError_t / nvrtcResult values, without a GPU."""

import pytest
from cuda.bindings import driver, nvrtc, runtime

from rawgraphs.errors import CaptureError, CudaError, GraphUpdateError, NoDriverError, check, error_from


def test_success_returns_values():
    ok = driver.CUresult.CUDA_SUCCESS
    assert check((ok,)) is None
    assert check((ok, 7)) == 7
    assert check((ok, 1, 2)) == (1, 2)


def test_driver_error_carries_name_code_hint_and_call():
    err = driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    with pytest.raises(CudaError) as ei:
        check((err, None), "cuStreamSynchronize")
    e = ei.value
    assert e.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" and e.code == int(err)
    assert e.call == "cuStreamSynchronize" and "capturing" in e.hint
    assert "cuStreamSynchronize: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" in str(e)


def test_runtime_error_is_named_like_the_driver():
    e = error_from(runtime.cudaError_t.cudaErrorInvalidValue)
    assert e.name == "CUDA_ERROR_INVALID_VALUE" and e.code == 1


def test_nvrtc_error_has_nvrtc_description():
    e = error_from(nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION, "nvrtcCompileProgram")
    assert e.name == "NVRTC_ERROR_INVALID_OPTION" and "option" in e.description.lower()


def test_missing_driver_becomes_no_driver_error():
    from rawgraphs.context import gpu_available, init
    if gpu_available():
        pytest.skip("this machine has a driver")
    with pytest.raises(NoDriverError, match="no NVIDIA driver was found") as ei:
        init.__wrapped__()  # bypass the cache: the real first driver call
    assert isinstance(ei.value, CudaError) and "install an NVIDIA driver" in ei.value.hint


def test_capture_and_update_errors_explain_themselves():
    base = error_from(driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
    e = CaptureError(base, "ACTIVE", "cuStreamEndCapture")
    assert "capture status: ACTIVE" in str(e) and "join" in e.hint
    u = GraphUpdateError("TOPOLOGY_CHANGED", "extra")
    assert u.reason == "TOPOLOGY_CHANGED" and u.node == "extra" and "at node extra" in str(u)


def test_a_refused_instantiation_names_the_drivers_reason_and_node():
    from types import SimpleNamespace

    from rawgraphs.executable import _instantiate_error
    from rawgraphs.graph import Graph
    p = driver.CUDA_GRAPH_INSTANTIATE_PARAMS()
    p.result_out = driver.CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED
    p.hErrNode_out = driver.CUgraphNode(0x1234)
    graph = SimpleNamespace(_by_key={0x1234: SimpleNamespace(name="loop")}, nodes=[])
    e = _instantiate_error(driver.CUresult.CUDA_ERROR_INVALID_VALUE, p, graph)
    assert e.name == "CUDA_ERROR_INVALID_VALUE" and e.call == "cuGraphInstantiateWithParams"
    assert "[instantiate result: CONDITIONAL_HANDLE_UNUSED at node 'loop']" in str(e)
    assert "no conditional node uses it" in e.hint
    p.hErrNode_out = driver.CUgraphNode(0x99)  # a node the graph does not know (made outside rawgraphs)
    assert "at a node rawgraphs did not make (0x99)" in str(_instantiate_error(0, p, graph))
    body = Graph.__new__(Graph)  # a conditional body the graph's node pins: its nodes are found too
    body._by_key, body.nodes = {0x99: SimpleNamespace(name="step", pins=())}, []
    graph.nodes = [SimpleNamespace(name="loop", pins=(body,))]
    assert "at node 'step'" in str(_instantiate_error(0, p, graph))
    p.result_out = driver.CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_SUCCESS  # refused before the nodes
    assert "instantiate result" not in str(_instantiate_error(driver.CUresult.CUDA_ERROR_INVALID_VALUE, p, graph))
