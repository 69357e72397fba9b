"""GPU tests are marked ``gpu`` and skip, with the reason, on machines without an NVIDIA driver or device."""

import numpy as np
import pytest

from rawgraphs.context import gpu_available

HAS_GPU = gpu_available()
NO_GPU_REASON = "no NVIDIA GPU/driver on this machine (GPU tests run on the H200 device machine)"


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A fresh seeded generator per test (random, never-zero data)."""
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def dev():
    from rawgraphs.context import device
    return device()


@pytest.fixture
def stream(dev):
    from rawgraphs.context import Stream
    with Stream.create() as s:
        yield s
        s.synchronize()


@pytest.fixture
def records():
    """Block-trace records (kernels/pdl.cuh's, ``rawgraphs.model.trace.RECORD``) from tuples; the fields past a
    tuple's end are 0 (not recorded), as in records saved before a field existed."""
    from rawgraphs.model.trace import RECORD

    return lambda rows: np.array([tuple(r) + (0,) * (len(RECORD.names) - len(r)) for r in rows], dtype=RECORD)
