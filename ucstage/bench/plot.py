"""``ucstage bench --plot``: MiB/s against workers as a PNG.

Kept apart from the driver because it is the only part that needs
matplotlib (an optional extra, imported when a chart is drawn), and it only
draws a finished report. Re-exported as :func:`ucstage.bench.plot`.
"""

from __future__ import annotations

import math
import os

from ..errors import InvalidArgument, MissingDependency
from ..units import format_bytes
from .report import BenchReport

__all__ = ["log_ticks", "plot"]

_MIB = 1024 * 1024


def log_ticks(low: float, high: float) -> list[float]:
    """Labelled values of a log axis spanning ``low``..``high``: 1, 2 and 5 times
    each power of ten, from the step at or below ``low`` to the one at or above ``high``.

    A log axis labelled only at decades leaves a chart whose lines sit between
    two labels 10x apart unreadable; 1-2-5 steps keep every value within 2.5x
    of a label.
    """
    if low <= 0 or high <= 0:
        raise ValueError(f"a log axis needs positive values, got {low:g}..{high:g}")
    low, high = min(low, high), max(low, high)
    steps = [m * 10.0**e for e in range(math.floor(math.log10(low)) - 1,
                                        math.ceil(math.log10(high)) + 1) for m in (1, 2, 5)]
    first = max(i for i, v in enumerate(steps) if v <= low * (1 + 1e-9))
    last = min(i for i, v in enumerate(steps) if v >= high * (1 - 1e-9))
    if first == last:  # every value on one step: show the steps around it too
        first, last = first - 1, last + 1
    return steps[first:last + 1]


def check_destination(path: str) -> None:
    """Refuse a chart path that is not a ``.png`` in an existing folder: a
    typo'd folder is an error, never made (as for a scratch folder).

    Raises:
        InvalidArgument: the name or its folder is wrong.
    """
    if not path.lower().endswith(".png"):
        raise InvalidArgument(f"--plot writes a PNG; give a file name ending in .png, got {path}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidArgument(f"--plot {path}: folder {folder} does not exist",
                              hint="create it first, or write the chart elsewhere")


def plot(report: BenchReport, path: str, *, title: str | None = None) -> str:
    """Write a PNG of MiB/s against workers, one line per mode; return ``path``.

    Raises:
        MissingDependency: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    except ImportError as exc:
        raise MissingDependency("ucstage.bench.plot needs matplotlib",
                                hint="pip install 'ucstage[plot]'") from exc
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    try:
        rates: list[float] = []
        for mode in report.modes:
            runs = sorted((r for r in report.results if r.mode == mode), key=lambda r: r.workers)
            if runs:
                mib = [r.mb_per_s * 1e6 / _MIB for r in runs]  # JSON's MB/s, drawn in MiB/s
                rates.extend(v for v in mib if v > 0)
                ax.plot([r.workers for r in runs], mib, marker="o", label=mode)
        rec = report.recommendation
        if rec.workers is not None:
            ax.axvline(rec.workers, color="grey", linestyle=":", linewidth=1,
                       label=f"recommended: num_workers={rec.workers} ({rec.mode})")
        ax.set_xlabel("workers (concurrent readers)" if "loader" not in report.modes
                      else "workers (reader threads / DataLoader num_workers)")
        # Warm reads are often 100x direct ones: a linear axis would flatten
        # the modes the user is choosing between.
        ax.set_ylabel("MiB/s (log scale)")
        ax.set_yscale("log")
        if rates:
            ticks = log_ticks(min(rates), max(rates))
            ax.set_ylim(ticks[0], ticks[-1])
            ax.yaxis.set_major_locator(FixedLocator(ticks))
            ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,g}"))
        ax.set_xticks(report.workers)
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_title(title or f"ucstage bench {report.source}\n{report.sample_files:,} files, "
                     f"{format_bytes(report.sample_bytes)}", fontsize=9)
        fig.tight_layout()
        check_destination(path)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
