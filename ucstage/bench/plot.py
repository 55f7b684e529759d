"""``ucstage bench --plot``: MB/s against workers as a PNG.

Kept apart from the driver because it is the only part that needs
matplotlib (an optional extra, imported when a chart is drawn), and it only
draws a finished report. Re-exported as :func:`ucstage.bench.plot`.
"""

from __future__ import annotations

import os

from ..errors import MissingDependency
from ..units import format_bytes
from .report import BenchReport

__all__ = ["plot"]


def plot(report: BenchReport, path: str, *, title: str | None = None) -> str:
    """Write a PNG of MB/s against workers, one line per mode; return ``path``.

    Raises:
        MissingDependency: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as exc:
        raise MissingDependency("ucstage.bench.plot needs matplotlib",
                                hint="pip install 'ucstage[plot]'") from exc
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    try:
        for mode in report.modes:
            runs = sorted((r for r in report.results if r.mode == mode), key=lambda r: r.workers)
            if runs:
                ax.plot([r.workers for r in runs], [r.mb_per_s for r in runs], marker="o",
                        label=mode)
        rec = report.recommendation
        if rec.workers is not None:
            ax.axvline(rec.workers, color="grey", linestyle=":", linewidth=1,
                       label=f"recommended ({rec.mode}): {rec.workers}")
        ax.set_xlabel("workers (concurrent readers)" if "loader" not in report.modes
                      else "workers (reader threads / DataLoader num_workers)")
        # Warm reads are often 100x direct ones: a linear axis would flatten
        # the modes the user is choosing between.
        ax.set_ylabel("MB/s (log scale)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: ""))
        ax.set_xticks(report.workers)
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_title(title or f"ucstage bench {report.source}\n{report.sample_files:,} files, "
                     f"{format_bytes(report.sample_bytes)}", fontsize=9)
        fig.tight_layout()
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
