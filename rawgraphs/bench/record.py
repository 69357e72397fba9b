"""What a benchmark run was: metadata of the machine and software, parameters and rows of raw samples.

Every benchmark writes one :class:`BenchResult` as JSON (``schema_version`` :data:`SCHEMA_VERSION`);
:func:`load_json` reads it back and :func:`validate` names the first key that is missing or of the wrong type.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .stats import Summary

__all__ = ["SCHEMA_VERSION", "BenchResult", "collect_metadata", "load_json", "make_row", "validate"]

SCHEMA_VERSION = 1

# Distribution names whose versions every result records (None when not installed). CuPy ships under one
# name per CUDA major; torch is read from its metadata only, so recording it never imports it.
_PACKAGES = {"numpy": ("numpy",), "cuda-bindings": ("cuda-bindings",), "cuda-core": ("cuda-core",),
             "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"), "torch": ("torch",)}


def _version(dists: Sequence[str]) -> str | None:
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


_TREE_UNTRACKED_MAX = 1 << 20  # bytes: larger untracked files (a checkpoint beside the code) stay out of the tree id


def _git(repo: Path) -> dict | None:
    """``{"rev", "dirty", "tree"}`` of the checkout at ``repo``, or None outside a git checkout / without git.

    ``tree`` is the git tree id of the files as they are: the tracked ones as edited, plus untracked files git does
    not ignore up to :data:`_TREE_UNTRACKED_MAX` bytes. A result so names its source even when ``rev`` is stale or
    the tree dirty (the device machine runs a copy of the working tree whose ``.git`` may be older):
    ``git log --format='%h %T'`` finds the commit of the same content. It is computed through a throwaway index,
    which leaves unreachable blobs behind (``git gc`` drops them); absent where that fails (a read-only ``.git``).
    """
    def run(*args: str, where: Path = repo, env: dict | None = None, stdin: str | None = None) -> str:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=True,
                              timeout=30, env=env, input=stdin).stdout.strip()
    try:
        rev = run("rev-parse", "HEAD")
        dirty = bool(run("status", "--porcelain", "--untracked-files=no"))
        top = Path(run("rev-parse", "--show-toplevel"))  # paths below are relative to it, wherever repo is
    except (OSError, subprocess.SubprocessError):
        return None
    out = {"rev": rev, "dirty": dirty}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        try:
            run("read-tree", "HEAD", where=top, env=env)
            run("add", "-u", where=top, env=env)
            new = [f for f in run("ls-files", "--others", "--exclude-standard", "-z", where=top, env=env).split("\0")
                   if f and (top / f).is_file() and (top / f).stat().st_size <= _TREE_UNTRACKED_MAX]
            if new:
                run("add", "--pathspec-from-file=-", "--pathspec-file-nul", where=top, env=env, stdin="\0".join(new))
            out["tree"] = run("write-tree", where=top, env=env)
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def _gpu() -> tuple[str | None, dict | None]:
    """(driver CUDA version, device description) or (None, None) without a driver / device."""
    from cuda.bindings import driver

    from ..context import device, driver_version, gpu_available
    from ..errors import NoDriverError

    try:
        drv = "{}.{}".format(*driver_version())
    except NoDriverError:
        return None, None
    if not gpu_available():
        return drv, None
    d = device()
    sms = d.attribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    return drv, {"name": d.name, "arch": d.arch, "sm_count": sms, "memory_bytes": d.total_memory,
                 "ordinal": d.ordinal}


def collect_metadata(repo: str | Path | None = None, import_torch: bool = False) -> dict:
    """Metadata of this run: date, host, Python, package versions, NVRTC, driver, device, git revision.

    ``device`` and ``driver`` are None on a machine without a GPU / driver. ``repo`` is the checkout whose
    revision is recorded (default: the one this package lives in). torch is never imported unless
    ``import_torch`` is set; then ``torch_cuda`` records the CUDA version torch was built with.
    """
    from ..compiler import nvrtc_version

    repo = Path(repo) if repo is not None else Path(__file__).resolve().parents[2]
    drv, dev = _gpu()
    meta = {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _version(dists) for name, dists in _PACKAGES.items()},
        "nvrtc": "{}.{}".format(*nvrtc_version()),
        "driver": drv,
        "device": dev,
        "git": _git(repo),
    }
    if import_torch:
        import torch
        meta["torch_cuda"] = torch.version.cuda
    return meta


def make_row(samples: Sequence[float], unit: str = "us", **fields) -> dict:
    """One result row: the labelling ``fields`` (method, size, ...), the raw samples and their summary."""
    samples = [float(s) for s in samples]
    return {**fields, "unit": unit, "samples": samples, "summary": Summary.of(samples).as_dict()}


@dataclass
class BenchResult:
    """One benchmark run: its name, run metadata, parameters, rows (raw samples + summary) and notes."""

    benchmark: str
    metadata: dict
    params: dict = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The JSON document, with ``schema_version``."""
        return {"schema_version": SCHEMA_VERSION, "benchmark": self.benchmark, "metadata": self.metadata,
                "params": self.params, "rows": self.rows, "notes": self.notes}

    @classmethod
    def from_dict(cls, doc: dict) -> BenchResult:
        """Validate ``doc`` (see :func:`validate`) and build the result."""
        validate(doc)
        return cls(doc["benchmark"], doc["metadata"], doc["params"], doc["rows"], doc["notes"])

    def write_json(self, path: str | Path) -> Path:
        """Validate and write to ``path`` (parent folders created; whole or not at all); returns the path. A
        non-finite number in the parameters or notes is written as a string ("nan", "inf"): JSON has none, and
        losing the whole result to one would hide the run that produced it."""
        doc = _json_safe(self.to_dict())
        validate(doc)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, path)
        return path


def _json_safe(obj):
    """``obj`` with every non-finite float replaced by its string."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def load_json(path: str | Path) -> BenchResult:
    """Read and validate a result written by :meth:`BenchResult.write_json`."""
    return BenchResult.from_dict(json.loads(Path(path).read_text()))


_NUMBER = (int, float)
_TOP = {"schema_version": int, "benchmark": str, "metadata": dict, "params": dict, "rows": list,
        "notes": list}
_META = {"date_utc": str, "hostname": str, "python": str, "packages": dict, "nvrtc": str,
         "driver": (str, type(None)), "device": (dict, type(None)), "git": (dict, type(None))}
_DEVICE = {"name": str, "arch": str, "sm_count": int, "memory_bytes": int}
_GIT = {"rev": str, "dirty": bool}
_SUMMARY = {"n": int, "median": _NUMBER, "mean": _NUMBER, "min": _NUMBER, "p10": _NUMBER, "p90": _NUMBER,
            "stdev": _NUMBER}


def _bad(key: str, want: str, value) -> ValueError:
    return ValueError(f"benchmark result: key {key!r} should be {want}, got {type(value).__name__}")


def _is(value, typ) -> bool:
    return isinstance(value, typ) and (typ is bool or not isinstance(value, bool))  # True is no number


def _need(obj: dict, spec: dict, where: str) -> None:
    for key, typ in spec.items():
        name = f"{where}{key}"
        if key not in obj:
            raise ValueError(f"benchmark result: missing key {name!r}")
        if not _is(obj[key], typ):
            want = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            raise _bad(name, want, obj[key])


def validate(doc: dict) -> None:
    """Check a result document's required keys and types; raise ValueError naming the first bad key."""
    if not _is(doc, dict):
        raise _bad("<document>", "a JSON object", doc)
    _need(doc, _TOP, "")
    if doc["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"benchmark result: key 'schema_version' is {doc['schema_version']}, "
                         f"this rawgraphs reads {SCHEMA_VERSION}")
    meta = doc["metadata"]
    _need(meta, _META, "metadata.")
    if meta["device"] is not None:
        _need(meta["device"], _DEVICE, "metadata.device.")
    if meta["git"] is not None:
        _need(meta["git"], _GIT, "metadata.git.")
        if "tree" in meta["git"]:  # optional: results written before it existed have none
            _need(meta["git"], {"tree": str}, "metadata.git.")
    for i, row in enumerate(doc["rows"]):
        where = f"rows[{i}]"
        if not _is(row, dict):
            raise _bad(where, "dict", row)
        _need(row, {"unit": str, "samples": list, "summary": dict}, where + ".")
        for j, sample in enumerate(row["samples"]):
            if not _is(sample, _NUMBER):
                raise _bad(f"{where}.samples[{j}]", "a number", sample)
        _need(row["summary"], _SUMMARY, where + ".summary.")
    for i, note in enumerate(doc["notes"]):
        if not _is(note, str):
            raise _bad(f"notes[{i}]", "str", note)
