"""The benchmark harness every ``benchmarks/*.py`` script uses.

- :mod:`.timing`: ``time_gpu`` (CUDA events), ``time_gpu_queued`` (one call behind a ``Blocker``) and ``time_host``
  (``perf_counter_ns``); for benchmarks only,
  never in tests.
- :mod:`.stats`: ``Summary`` of raw samples (median, mean, min, p10, p90, stdev, n).
- :mod:`.record`: run metadata, ``BenchResult`` rows of raw samples + summary, JSON with a schema version.
- :mod:`.report`: aligned tables, a markdown summary of many results, PNG plots, a progress bar.
"""

from .record import SCHEMA_VERSION, BenchResult, collect_metadata, load_json, make_row, validate
from .report import (
    format_cell,
    format_table,
    markdown_table,
    metadata_line,
    plot_bars,
    plot_lines,
    progress,
    render_summary,
    result_columns,
)
from .stats import Summary, summarize
from .timing import Blocker, time_gpu, time_gpu_queued, time_host

__all__ = [
    "SCHEMA_VERSION",
    "BenchResult",
    "Blocker",
    "Summary",
    "collect_metadata",
    "format_cell",
    "format_table",
    "load_json",
    "make_row",
    "markdown_table",
    "metadata_line",
    "plot_bars",
    "plot_lines",
    "progress",
    "render_summary",
    "result_columns",
    "summarize",
    "time_gpu",
    "time_gpu_queued",
    "time_host",
    "validate",
]
