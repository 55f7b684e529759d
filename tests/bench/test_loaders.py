"""benchmarks.epochs loaders' summary: which way its ratios point, against the
ceiling and the targets, on rows of known figures (the runs themselves need
scripts/remote-volume.sh and the `bench` extra; docs/benchmarks.md)."""

from __future__ import annotations

from typing import Any

from benchmarks.epochs import loaders_markdown, loaders_summary


def _rows() -> list[dict[str, Any]]:
    seconds = {"ucstage fuse": (4.0, 0.05), "ucstage s3": (5.0, 0.10), "platform": (8.0, 0.06),
               "litdata s3": (4.0, 0.40), "plain": (10.0, None), "loop 256": (2.0, None),
               "s5cmd": (3.0, None)}
    rows = []
    for rnd in (1, 2, 3):
        for loader, (first, later) in seconds.items():
            slower = 1.0 if rnd != 2 else 1.5  # one noisy round: medians ignore it
            rows.append({"set": "small", "workers": 4, "round": rnd, "loader": loader,
                         "epoch1_s": first * slower, "later_s": later})
    return rows


def test_ratios_are_the_others_seconds_over_ucstages() -> None:
    s = loaders_summary(_rows(), "small", 4)
    t = s["targets"]
    assert t["epoch 1 vs plain torch"]["ratio"] == 2.5 and t["epoch 1 vs plain torch"]["met"]
    assert t["epoch 1 vs the platform's loader"]["ratio"] == 2.0
    assert t["epoch 1 over s3:// vs litData"]["ratio"] == 0.8
    assert not t["epoch 1 over s3:// vs litData"]["met"]
    assert t["later epochs vs the platform's loader"]["ratio"] == 1.2
    assert not t["later epochs over s3:// vs the platform's loader"]["met"]  # 0.6 < 0.9
    assert s["ceiling_s"] == 2.0  # the faster bare client of each round
    assert s["of_ceiling"]["ucstage fuse"] == 0.5 and s["of_ceiling"]["plain"] == 0.2
    assert s["median"]["plain"]["later_s"] is None
    text = loaders_markdown({"small w4": s}, {"small": 3000}, 3)
    assert "| epoch 1 over s3:// vs litData | 0.80x |" in text and "missed" in text
