"""rawgraphs: raw, inspectable CUDA graphs for LLM decode, over cuda-python.

Compile kernels with NVRTC (:mod:`rawgraphs.compiler`), read their signatures from the source
(:mod:`rawgraphs.signature`), pack their arguments (:mod:`rawgraphs.kernel_args`), launch them eagerly
(:mod:`rawgraphs.kernel`), record them into graphs node by node or by stream capture (:mod:`rawgraphs.graph`,
:mod:`rawgraphs.capture`) and update an instantiated graph's pointers and scalars in place
(:mod:`rawgraphs.executable`).
"""

from .capture import capture
from .compiler import Program, compile_file, compile_source
from .context import Device, Event, Stream, device, gpu_available
from .errors import CaptureError, ClosedError, CompileError, CudaError, GraphUpdateError, NoDriverError, check
from .executable import GraphExec
from .graph import Graph, Node
from .kernel import Kernel, LaunchShape, Module
from .kernel_args import KernelArgs
from .memory import DeviceBuffer, DeviceView, HostBuffer, as_view
from .signature import Signature

__version__ = "0.1.0"

__all__ = [
    "capture", "Program", "compile_file", "compile_source", "Device", "Event", "Stream", "device",
    "gpu_available", "CaptureError", "ClosedError", "CompileError", "CudaError", "GraphUpdateError",
    "NoDriverError", "check", "GraphExec", "Graph", "Node", "Kernel", "KernelArgs", "LaunchShape", "Module",
    "Signature", "DeviceBuffer", "DeviceView", "HostBuffer", "as_view",
]
