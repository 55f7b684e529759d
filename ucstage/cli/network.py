"""The summary lines of what the
network did (hedges, timeouts, checksum mismatches, the checks a store allows)."""

from __future__ import annotations

from rich.console import Console

from .. import cloudfs
from ..cache.reports import WarmReport

__all__ = ["network_summary"]


def network_summary(console: Console, report: WarmReport) -> None:
    """What the network did to the copies, when it did anything: late
    requests hedged, requests past the deadline, checksum mismatches, and a
    store whose ETags give no checksum."""
    counts = [f"{n:,} {text}" for n, text in (
        (report.hedged, "late requests hedged"), (report.timeouts, "requests past the deadline"),
        (report.mismatches, "checksum mismatches retried")) if n]
    if counts:
        console.print(f"network: {', '.join(counts)}", markup=False)
    checks = report.check_counts()
    if checks["size"] and not checks["md5"] and not checks["crc32c"]:
        cloud = cloudfs.parse(report.source)
        why = ("its ETags are not MD5s (SSE-KMS?)" if report.etags_not_md5
               else "the store keeps no checksum of these objects (Azure blobs "
                    "committed from blocks without Content-MD5)" if cloud is not None
               else "no plain-MD5 ETags (multipart uploads)")
        console.print(f"checked: by size only, {why}", markup=False)
