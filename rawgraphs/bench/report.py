"""Turning results into text and pictures: aligned tables, a markdown summary, PNG plots, a progress bar.

matplotlib is imported only inside the plot helpers (the ``[bench]`` extra) and always draws with the Agg
backend, so nothing here needs a display.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from .record import BenchResult

__all__ = [
    "format_cell",
    "format_table",
    "markdown_table",
    "metadata_line",
    "plot_bars",
    "plot_lines",
    "progress",
    "render_summary",
    "result_columns",
]

# A column is a row key ("method"), a dotted key into a nested dict ("summary.median") or (key, header).
Column = str | tuple[str, str]


def format_cell(value) -> str:
    """Ints plain, floats with 2 decimals (3 significant digits below 0.01), None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.3g}" if 0 < abs(value) < 0.01 else f"{value:.2f}"
    return str(value)


def _get(row: Mapping, key: str):
    if key in row:  # a column named with a dot ("GraphExec.launch us") is a key, not a path
        return row[key]
    value = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _grid(rows: Sequence[Mapping], columns: Sequence[Column]
          ) -> tuple[list[str], list[list[str]], list[bool]]:
    """Headers, formatted cells and which columns are numeric (right-aligned)."""
    keys = [c if isinstance(c, str) else c[0] for c in columns]
    headers = [c if isinstance(c, str) else c[1] for c in columns]
    raw = [[_get(r, k) for k in keys] for r in rows]
    numeric = [all(isinstance(r[i], (int, float)) or r[i] is None for r in raw) and bool(raw)
               for i in range(len(keys))]
    return headers, [[format_cell(v) for v in r] for r in raw], numeric


def format_table(rows: Sequence[Mapping], columns: Sequence[Column], title: str | None = None) -> str:
    """An aligned plain-text table of ``rows`` (dicts), one line per row, numbers right-aligned."""
    headers, cells, numeric = _grid(rows, columns)
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(items: Sequence[str]) -> str:
        return "  ".join(s.rjust(w) if num else s.ljust(w)
                         for s, w, num in zip(items, widths, numeric)).rstrip()

    out = [title] if title else []
    out += [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(out)


def markdown_table(rows: Sequence[Mapping], columns: Sequence[Column]) -> str:
    """The same table as GitHub markdown."""
    headers, cells, numeric = _grid(rows, columns)
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---:" if num else "---" for num in numeric) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(out)


def result_columns(rows: Sequence[Mapping]) -> list[Column]:
    """Columns for rows made by ``make_row``: label fields, median/p10/p90/n of the samples, other numbers."""
    labels, extras = [], []
    for row in rows:
        for k, v in row.items():
            if k in ("unit", "samples", "summary") or k in labels or k in extras:
                continue
            (labels if isinstance(v, str) else extras).append(k)
    units = {row.get("unit") for row in rows}
    unit = f" ({next(iter(units))})" if len(units) == 1 else ""
    stats = [(f"summary.{s}", f"{s}{unit}") for s in ("median", "p10", "p90")] + [("summary.n", "n")]
    return [*labels, *stats, *(["unit"] if len(units) > 1 else []), *extras]  # mixed units: a column says which


def metadata_line(meta: Mapping) -> str:
    """One line: device, driver, NVRTC, package versions, git revision, date."""
    dev = meta.get("device")
    gib = dev["memory_bytes"] / 2**30 if dev else 0
    parts = [f"device: {dev['name']} ({dev['arch']}, {dev['sm_count']} SMs, {gib:.0f} GiB)"
             if dev else "device: none (CPU only)",
             f"driver: CUDA {meta.get('driver') or '-'}", f"NVRTC {meta.get('nvrtc') or '-'}"]
    parts += [f"{name} {v}" for name, v in meta.get("packages", {}).items() if v]
    git = meta.get("git")
    if git:
        notes = (["dirty"] if git["dirty"] else []) + ([f"tree {git['tree'][:10]}"] if "tree" in git else [])
        parts.append(f"git {git['rev'][:10]}" + (f" ({', '.join(notes)})" if notes else ""))
    else:
        parts.append("git: -")
    parts.append(meta.get("date_utc", "-"))
    return " · ".join(parts)


def render_summary(results: Sequence[BenchResult], title: str = "rawgraphs benchmarks",
                   runs: Sequence[tuple[str, str, float]] = (), stale: Sequence[str] = ()) -> str:
    """Markdown: the suite's runs and their status (failures first in a line of their own), then one section per
    benchmark with its metadata line, parameters, table and notes."""
    out = [f"# {title}", ""]
    failed = [name for name, status, _ in runs if status != "ok"]
    if runs:
        out += [f"**FAILED: {', '.join(failed)}** (their results below may be missing or wrong)" if failed
                else f"All {len(runs)} benchmarks ran without error.", ""]
        out += [markdown_table([{"benchmark": n, "status": s, "seconds": round(t, 1)} for n, s, t in runs],
                               ["benchmark", "status", "seconds"]), ""]
    if stale:
        out += [f"Not from this run (older files in the folder, not shown): {', '.join(stale)}", ""]
    for r in results:
        out += [f"## {r.benchmark}", "", metadata_line(r.metadata), ""]
        if r.params:
            out += ["Parameters: " + ", ".join(f"`{k}={v}`" for k, v in r.params.items()), ""]
        if r.rows:
            out += [markdown_table(r.rows, result_columns(r.rows)), ""]
        out += [f"- {n}" for n in r.notes] + ([""] if r.notes else [])
    return "\n".join(out)


def _figure(title: str, xlabel: str, ylabel: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)  # attaches the Agg canvas: no pyplot, no global backend state
    ax = fig.add_subplot()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def plot_lines(path: str | Path, x: Sequence[float], series: Mapping[str, Sequence[float]], *,
               title: str = "", xlabel: str = "", ylabel: str = "", logx: bool = False,
               logy: bool = False) -> Path:
    """One line per entry of ``series`` (label -> y values over ``x``), written as a PNG; returns the path."""
    fig, ax = _figure(title, xlabel, ylabel)
    for label, y in series.items():
        if len(y) != len(x):
            raise ValueError(f"series {label!r} has {len(y)} points, x has {len(x)}")
        ax.plot(x, y, marker="o", label=label)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    if series:
        ax.legend()
    return _save(fig, path)


def plot_bars(path: str | Path, labels: Sequence[str], values: Sequence[float], *, title: str = "",
              ylabel: str = "", low: Sequence[float] | None = None,
              high: Sequence[float] | None = None) -> Path:
    """Bars of ``values`` with optional ``low``/``high`` whiskers (e.g. p10/p90), written as a PNG."""
    if len(values) != len(labels):
        raise ValueError(f"{len(labels)} labels for {len(values)} values")
    fig, ax = _figure(title, "", ylabel)
    err = None
    if low is not None and high is not None:
        err = [[v - lo for v, lo in zip(values, low)], [hi - v for v, hi in zip(values, high)]]
    ax.bar(range(len(values)), values, yerr=err, capsize=4)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    return _save(fig, path)


def progress(items: Iterable, total: int | None = None, label: str = "", stream: TextIO | None = None,
             width: int = 30) -> Iterator:
    """Yield ``items`` while drawing ``label [#####.....] i/total`` on stderr; silent when not a TTY."""
    stream = stream if stream is not None else sys.stderr
    if total is None:
        total = len(items) if hasattr(items, "__len__") else 0
    if not (stream.isatty() and total > 0):
        yield from items
        return
    drawn = -1
    for i, item in enumerate(items, 1):
        yield item
        filled = min(width, width * i // total)
        if filled != drawn or i == total:  # redraw only when the bar moves: cheap inside long loops
            drawn = filled
            stream.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {i}/{total}")
            stream.flush()
    stream.write("\n")
    stream.flush()
