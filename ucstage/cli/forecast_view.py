"""``ucstage shard-plan --epochs``: the network forecast, as JSON and as tables."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..cache.paths import default_root
from ..cache.space import free_bytes
from ..sharding import Forecast
from .output import format_bytes, table, truncated_rows

__all__ = ["forecast_json", "render_forecast"]


def _disk_free() -> tuple[str, int]:
    """This machine's cache folder (or its nearest existing parent) and its free bytes:
    the disk a node's share lands on, if this is one of the job's nodes."""
    path = default_root()
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return default_root(), free_bytes(path)


def forecast_json(forecasts: dict[str, Forecast], scope: str,
                   cap: int | None) -> dict[str, Any]:
    """``forecast`` of docs/json.md#the-network-forecast---epochs."""
    first = forecasts[scope]
    root, free = _disk_free()
    return {"epochs": len(first.epochs), "first_epoch": first.epochs[0],
            "shuffle_scope": scope, "max_bytes": cap, "cache_dir": root, "disk_free": free,
            "scopes": {name: f.to_json(cap) for name, f in forecasts.items()}}


def render_forecast(console: Console, forecasts: dict[str, Forecast], scope: str,
                     cap: int | None) -> None:
    f = forecasts[scope]
    other_name = next(name for name in forecasts if name != scope)
    other = forecasts[other_name]
    console.print()
    console.print(f"[bold]Network forecast[/] over {len(f.epochs)} epochs "
                  f"({f.epochs[0]}..{f.epochs[-1]}): files a node reads that it did not read "
                  "in an earlier epoch")
    cols = ["epoch", "node", "reads", f"new ({scope})", "new bytes", f"new ({other_name})",
            "new bytes "]
    t = table(*cols)
    rows, cut = truncated_rows(list(zip(f.rows, other.rows, strict=True)))
    for pair in rows:
        if pair is None:
            t.add_row(f"… {cut} more", *[""] * (len(cols) - 1))
            continue
        mine, theirs = pair
        t.add_row(str(mine.epoch), str(mine.node), f"{mine.files:,}", f"{mine.new_files:,}",
                  format_bytes(mine.new_bytes), f"{theirs.new_files:,}",
                  format_bytes(theirs.new_bytes))
    console.print(t)
    later = [e for e in f.epochs[1:]]
    for name, g in ((scope, f), (other_name, other)):
        after = sum(g.epoch_new(e)[0] for e in later)
        after_bytes = sum(g.epoch_new(e)[1] for e in later)
        tail = (f"; after epoch {f.epochs[0]}: {after:,} files ({format_bytes(after_bytes)})"
                if later else "")
        console.print(f"  {name + ' scope:':<14} the job fetches {g.new_files:,} files "
                      f"({format_bytes(g.new_bytes)}){tail}")
    if f.node_count > 1 and f.epochs and scope == "node":
        console.print("  [green]✓[/] under the node scope each node reads the same files "
                      "every epoch: its cache serves every epoch after the first")
    shares = [(i, b) for i, b in enumerate(f.share_bytes)]
    biggest = max(shares, key=lambda x: x[1]) if shares else (0, 0)
    console.print(f"  cache a node needs for every epoch: up to "
                  f"{format_bytes(biggest[1])} (node {biggest[0]}, {f.share_files[biggest[0]]:,} "
                  "files)")
    over = f.over(cap)
    if over:
        names = ", ".join(str(i) for i in over[:8]) + (" …" if len(over) > 8 else "")
        console.print(f"  [red]✗[/] node shares over the cap of {format_bytes(cap or 0)} "
                      f"(nodes {names}): those nodes evict and fetch again every epoch; "
                      "raise the cap or add nodes")
    elif cap is not None:
        console.print(f"  [green]✓[/] every node's share fits under the cap of "
                      f"{format_bytes(cap)}")
    root, free = _disk_free()
    if biggest[1] > free:
        console.print(f"  [yellow]![/] the largest share does not fit in the "
                      f"{format_bytes(free)} free here ({escape(root)}); if this machine is "
                      "one of the job's nodes, give its cache a larger disk")
