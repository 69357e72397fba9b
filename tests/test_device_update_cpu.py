"""The record DeviceArgUpdater writes is the driver's cudaGraphKernelNodeUpdate (kernels/device_update.cu checks
its size with a static_assert at compile time, which test_compiler runs on every kernel file)."""

from rawgraphs.compiler import kernel_dir
from rawgraphs.device_update import UPDATE_DTYPE
from rawgraphs.signature import parse_signatures


def test_update_record_layout():
    # driver_types.h: node (8), field (enum, 4) + 4 pad, then the parameter union member pValue, offset, size
    assert UPDATE_DTYPE.itemsize == 40
    assert [UPDATE_DTYPE.fields[f][1] for f in ("node", "field", "value", "offset", "size")] == [0, 8, 16, 24, 32]
    source = (kernel_dir() / "device_update.cu").read_text()
    assert "sizeof(cudaGraphKernelNodeUpdate) == 40" in source
    assert str(parse_signatures(source)["apply_updates"]) == "apply_updates(updates: ptr, count: u64)"
