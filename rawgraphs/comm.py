"""NCCL communicators for tensor parallelism: one rank per process, in-place sum all-reduces on a rawgraphs
stream, and the processes that hold the ranks.

An all-reduce is ordinary stream work: enqueued on a capturing stream it is recorded into the graph like our
kernels (NCCL supports stream capture; CUDA Programming Guide, "Creating a Graph Using Stream Capture").

Binding: CuPy's ``cupy.cuda.nccl`` (CuPy is already a dependency, so no ctypes layer of our own). It loads the
NCCL library of the ``nvidia-nccl-cu13`` wheel: the ``tp`` extra (torch brings the same wheel). Without it,
:func:`nccl_available` is False and making a :class:`Communicator` raises :class:`NcclUnavailableError`; the
plain (communicator-less) model never needs NCCL.

Each rank's process sees exactly one GPU (``CUDA_VISIBLE_DEVICES`` set before CUDA starts), so it is device 0
there and every ``device()`` call of rawgraphs means that GPU.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import queue
import traceback
import warnings
from collections.abc import Callable

import ml_dtypes
import numpy as np

from .errors import CudaError
from .memory import as_view

__all__ = ["NCCL_RESULTS", "NcclError", "NcclUnavailableError", "Communicator", "nccl_available",
           "nccl_version", "unique_id", "run_ranks"]

# ncclResult_t (nccl.h): NCCL's own names for its results
NCCL_RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
                4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress"}
_HINTS = {
    "ncclUnhandledCudaError": "a CUDA call inside NCCL failed: is a GPU visible to this process? Run with "
                              "NCCL_DEBUG=INFO for the CUDA error.",
    "ncclSystemError": "a system call failed (sockets, shared memory /dev/shm, ...): run with NCCL_DEBUG=INFO.",
    "ncclInvalidUsage": "a call out of order (e.g. ranks issuing different collectives, or a rank used after "
                        "destroy): every rank must issue the same collectives in the same order.",
    "ncclRemoteError": "another rank failed or went away.",
}
_NCCL_TYPES = {np.dtype(np.float32): "NCCL_FLOAT32", np.dtype(ml_dtypes.bfloat16): "NCCL_BFLOAT16",
               np.dtype(np.float16): "NCCL_FLOAT16", np.dtype(np.float64): "NCCL_FLOAT64",
               np.dtype(np.int32): "NCCL_INT32", np.dtype(np.int64): "NCCL_INT64"}
INIT_TIMEOUT_S = 300.0  # how long a rank waits for rank 0's unique id


class NcclError(CudaError):
    """An NCCL call failed. ``name`` is NCCL's result name (e.g. ``ncclInvalidUsage``), ``code`` its value."""

    def __init__(self, code: int, call: str, detail: str = ""):
        name = NCCL_RESULTS.get(int(code), f"ncclResult{int(code)}")
        super().__init__(name, code, detail or name, hint=_HINTS.get(name), call=call)


class NcclUnavailableError(RuntimeError):
    """NCCL cannot be loaded in this environment (tensor parallelism needs it; the plain model does not)."""


def _nccl():
    """CuPy's NCCL binding module, or :class:`NcclUnavailableError` saying how to get it."""
    try:
        with warnings.catch_warnings():  # CuPy warns when libnccl is missing; the error below says it better
            warnings.filterwarnings("ignore", message=r"\s*nccl library could not be loaded", category=UserWarning)
            from cupy.cuda import nccl
    except ImportError as e:
        raise NcclUnavailableError(f"CuPy is not importable ({e}); tensor parallelism uses cupy.cuda.nccl") from e
    if not nccl.available:
        raise NcclUnavailableError(
            "NCCL is not available to CuPy (libnccl.so.2 not found): pip install 'rawgraphs[tp]' (the "
            "nvidia-nccl-cu13 wheel). The plain model (no communicator, one GPU) needs no NCCL.")
    return nccl


def _call(call: str, fn, *args):
    """``fn(*args)``, with CuPy's NcclError turned into ours (named by NCCL's result)."""
    nccl = _nccl()
    try:
        return fn(*args)
    except nccl.NcclError as e:
        raise NcclError(e.status, call, str(e)) from None


def nccl_available() -> bool:
    """True when NCCL loads through CuPy. Never raises."""
    try:
        _nccl()
        return True
    except NcclUnavailableError:
        return False


def nccl_version() -> tuple[int, int, int]:
    """The loaded NCCL library's version, e.g. ``(2, 27, 7)``."""
    v = _call("ncclGetVersion", _nccl().get_version)
    return v // 10000, v // 100 % 100, v % 100


def unique_id() -> bytes:
    """A new NCCL unique id (128 bytes): made by rank 0, sent to every other rank, used once by all."""
    return bytes(_call("ncclGetUniqueId", _nccl().get_unique_id))


class Communicator:
    """One rank of an NCCL communicator on this process's current device (make it with :meth:`init`).

    ``close()`` destroys it (idempotent); CuPy's object destroys it too if it is dropped unclosed. Close it
    only after every graph that captured its collectives is gone.
    """

    def __init__(self, comm, rank: int, size: int):
        self._comm, self.rank, self.size = comm, rank, size

    @classmethod
    def init(cls, uid: bytes, rank: int, size: int) -> Communicator:
        """Join communicator ``uid`` as ``rank`` of ``size`` (``ncclCommInitRank``: blocks until every rank
        has joined)."""
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is outside 0..{size - 1} of a {size}-rank communicator")
        if len(uid) != 128:
            raise ValueError(f"an NCCL unique id has 128 bytes, got {len(uid)}")
        nccl = _nccl()
        from .context import device
        device()  # the primary context current on this thread: NCCL's runtime calls use it
        return cls(_call("ncclCommInitRank", nccl.NcclCommunicator, size, uid, rank), rank, size)

    @classmethod
    def single(cls) -> Communicator:
        """A one-rank communicator: tensor parallelism of 1 through the same path as any other."""
        return cls.init(unique_id(), 0, 1)

    def all_reduce(self, buf, stream, count: int | None = None) -> None:
        """Sum ``buf``'s first ``count`` elements (default all) over the ranks, in place, on ``stream``."""
        if self._comm is None:
            raise ValueError("this Communicator was closed")
        view = as_view(buf)
        n = view.nbytes // view.dtype.itemsize
        count = n if count is None else count
        if not 0 < count <= n:
            raise ValueError(f"all_reduce of {count} elements on a buffer of {n}")
        name = _NCCL_TYPES.get(view.dtype)
        if name is None:
            raise TypeError(f"NCCL all-reduce of {view.dtype} is not supported here; one of "
                            f"{sorted(str(d) for d in _NCCL_TYPES)}")
        nccl = _nccl()
        _call("ncclAllReduce", self._comm.allReduce, view.ptr, view.ptr, count, getattr(nccl, name),
              nccl.NCCL_SUM, int(stream))

    def check_async(self) -> None:
        """Raise :class:`NcclError` if NCCL reported an asynchronous error (a peer failed, a timeout)."""
        if self._comm is not None:
            _call("ncclCommGetAsyncError", self._comm.check_async_error)

    def close(self) -> None:
        """Destroy the communicator (idempotent)."""
        comm, self._comm = self._comm, None
        if comm is not None:
            _call("ncclCommDestroy", comm.destroy)

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}{', closed' if self._comm is None else ''})"


# ---- one process per GPU -----------------------------------------------------------------------------------
def _visible_gpus() -> list[str]:
    """The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES entries."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    from .context import gpu_available
    if not gpu_available():
        return []
    from cuda.bindings import driver

    from .errors import check
    return [str(i) for i in range(check(driver.cuDeviceGetCount(), "cuDeviceGetCount"))]


def _rank_main(rank: int, size: int, gpu: str, ids, results, job: bytes) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # before CUDA starts in this (spawned, fresh) process
    try:
        fn, args = pickle.loads(job)  # only now: importing fn's module may start CUDA
        if rank == 0:
            uid = unique_id()
            for _ in range(size - 1):
                ids.put(uid)
        else:
            uid = ids.get(timeout=INIT_TIMEOUT_S)
        with Communicator.init(uid, rank, size) as comm:
            result = pickle.dumps(fn(comm, *args))  # here, so an unpicklable result is this rank's error
            gc.collect()  # graphs that captured comm's collectives are destroyed before the communicator
        results.put((rank, True, result))
    except BaseException:  # noqa: B036 - reported to the parent, which raises it
        results.put((rank, False, traceback.format_exc()))


def run_ranks(fn: Callable, size: int, *args) -> list:
    """Run ``fn(comm, *args)`` in ``size`` spawned processes, one per GPU, and return each rank's result.

    Rank 0 makes the NCCL unique id and sends it to the others; each process joins the communicator on its
    own GPU. ``fn`` and its results must be picklable (a module-level function; its module is imported in each
    rank only after that rank's GPU is chosen). If any rank fails, the others are terminated and a
    RuntimeError carries the failing rank's traceback.
    """
    gpus = _visible_gpus()
    if size < 1 or size > len(gpus):
        raise ValueError(f"tensor parallelism {size} needs {size} GPUs; this machine shows {len(gpus)}")
    _nccl()  # NcclUnavailableError, with the fix, before any process starts
    ctx = mp.get_context("spawn")  # a fresh process per rank: CUDA cannot be forked
    ids, results = ctx.Queue(), ctx.Queue()
    job = pickle.dumps((fn, args))
    procs = [ctx.Process(target=_rank_main, args=(r, size, gpus[r], ids, results, job), daemon=True)
             for r in range(size)]
    for p in procs:
        p.start()
    out: dict[int, object] = {}
    try:
        while len(out) < size:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"tensor-parallel rank {dead[0]} of {size} died (exit code "
                                       f"{procs[dead[0]].exitcode}) without a result") from None
                continue
            if not ok:
                raise RuntimeError(f"tensor-parallel rank {rank} of {size} failed:\n{value}")
            out[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=30 if len(out) == size else 0)
            if p.is_alive():
                p.terminate()  # a rank stuck in a collective whose peer failed
                p.join()
    return [out[r] for r in range(size)]
