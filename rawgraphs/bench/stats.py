"""Summary statistics of raw timing samples (the raw samples are always kept next to them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np

__all__ = ["Summary", "summarize"]


@dataclass(frozen=True)
class Summary:
    """Median, mean, min, 10th/90th percentile, sample standard deviation and count of some samples.

    Percentiles interpolate linearly between order statistics (NumPy's default); ``stdev`` is the sample
    standard deviation (``ddof=1``), 0.0 for a single sample.
    """

    n: int
    median: float
    mean: float
    min: float
    p10: float
    p90: float
    stdev: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Summary:
        """Summarize ``samples``; raises ValueError when there are none or one is not finite."""
        a = np.asarray(samples, dtype=np.float64)  # [n]
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"need a non-empty 1-D sequence of samples, got shape {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError("samples must be finite (no NaN or inf)")
        p10, p50, p90 = np.percentile(a, [10, 50, 90])
        stdev = float(np.std(a, ddof=1)) if a.size > 1 else 0.0
        return cls(int(a.size), float(p50), float(a.mean()), float(a.min()), float(p10), float(p90), stdev)

    @classmethod
    def from_dict(cls, d: dict) -> Summary:
        """The inverse of :meth:`as_dict`."""
        return cls(**{f.name: d[f.name] for f in fields(cls)})

    def as_dict(self) -> dict:
        """Plain dict for JSON."""
        return asdict(self)


def summarize(samples: Sequence[float]) -> Summary:
    """Shorthand for :meth:`Summary.of`."""
    return Summary.of(samples)
