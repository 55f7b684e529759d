"""Delta tables written by deltalake whose logs are then edited so that an
``add`` names a file another way: outside the table (``../``, percent-encoded
``..``, a ``file:`` URI or a plain absolute path elsewhere, a link out of the
folder) or inside it by an absolute path (which must keep working).

The file outside is a real Parquet file of the table's schema holding ids no
table row has (1000..1009), so a reader that followed the path would read
rows that are not the table's; its first bytes are ``PAR1``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

ESCAPES = ("dotdot", "encoded-dotdot", "file-uri", "hadoop-uri", "absolute", "link-out")
"""Ways an add can name a file outside the table."""
INSIDE = ("file-uri", "hadoop-uri", "absolute", "through-alias")
"""Ways an add can name its own file by an absolute path."""


@dataclass
class EditedTable:
    root: str
    """The table's folder."""
    names: list[str]
    """Each commit's data file, as deltalake named it (relative)."""
    secret: str
    """The Parquet file outside the table."""

    def commit(self, version: int) -> str:
        return os.path.join(self.root, "_delta_log", f"{version:020d}.json")

    def repoint(self, version: int, path: str) -> None:
        """Commit ``version``'s add now names ``path`` (its only add)."""
        commit = self.commit(version)
        with open(commit, encoding="utf-8") as f:
            actions = [json.loads(line) for line in f if line.strip()]
        adds = [a for a in actions if "add" in a]
        assert len(adds) == 1, adds
        adds[0]["add"]["path"] = path
        with open(commit, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(a) + "\n" for a in actions))

    def escape(self, how: str) -> str:
        """Commit 1's add names the file outside, ``how`` (one of :data:`ESCAPES`);
        the path as the log now says it."""
        rel = os.path.relpath(self.secret, self.root)
        logged = {
            "dotdot": rel,
            "encoded-dotdot": rel.replace("..", "%2E%2E"),
            "file-uri": "file://" + quote(self.secret),
            "hadoop-uri": "file:" + quote(self.secret),
            "absolute": self.secret,
            "link-out": "link.parquet",
        }[how]
        if how == "link-out":
            os.symlink(self.secret, os.path.join(self.root, "link.parquet"))
        self.repoint(1, logged)
        return logged

    def inside(self, how: str) -> str:
        """Commit 1's add names its own file absolutely, ``how`` (one of :data:`INSIDE`)."""
        own = os.path.join(self.root, self.names[1])
        if how == "through-alias":  # the same folder by another name (a link to it)
            alias = self.root + "-alias"
            os.symlink(self.root, alias)
            own = os.path.join(alias, self.names[1])
        logged = {"file-uri": "file://" + quote(own), "hadoop-uri": "file:" + quote(own),
                  "absolute": own, "through-alias": "file://" + quote(own)}[how]
        self.repoint(1, logged)
        return logged


def ids(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64())})


def two_commit_table(base: Path) -> EditedTable:
    """Table ``base/t``: ids 0..9 (commit 0), then ids 10..19 (commit 1); the
    file outside at ``base/secret/x.parquet``."""
    from deltalake import write_deltalake

    root = str(base / "t")
    write_deltalake(root, ids(0, 10))
    write_deltalake(root, ids(10, 10), mode="append")
    names = []
    for version in (0, 1):
        with open(os.path.join(root, "_delta_log", f"{version:020d}.json"),
                  encoding="utf-8") as f:
            names += [json.loads(line)["add"]["path"] for line in f if '"add"' in line]
    os.makedirs(base / "secret")
    secret = str(base / "secret" / "x.parquet")
    pq.write_table(ids(1000, 10), secret)
    return EditedTable(root, names, secret)


def typed_partition_table(n: int) -> pa.Table:
    """``n`` rows with a column of every type a Delta partition takes (int,
    long, date, timestamp, timestamp_ntz, boolean, decimal, string), nulls
    and characters a path must escape among their values, and an ``id``."""
    import datetime as dt
    from decimal import Decimal

    utc = dt.timezone.utc
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "i": pa.array([i % 3 if i % 5 else None for i in range(n)], pa.int32()),
        "l": pa.array([(i % 2) * 2**40 for i in range(n)], pa.int64()),
        "d": pa.array([dt.date(2024, 1, 1 + i % 2) for i in range(n)]),
        "ts": pa.array([dt.datetime(2024, 5, 1, 12, i % 2, 7, 123456, tzinfo=utc)
                        for i in range(n)], pa.timestamp("us", tz="UTC")),
        "ntz": pa.array([dt.datetime(1999, 12, 31, 23, 59, i % 2) for i in range(n)],
                        pa.timestamp("us")),
        "b": pa.array([i % 2 == 0 for i in range(n)]),
        "dec": pa.array([Decimal("1.05") if i % 2 else Decimal("10.50") for i in range(n)],
                        pa.decimal128(6, 2)),
        "s": pa.array([["a b/c=d%", None, "é,x"][i % 3] for i in range(n)]),
    })
