"""Delta table names and the local warehouse.

Table names are ``catalog.schema.table``. Each part is a plain identifier
(letters, digits, ``_``, not starting with a digit) or a backtick-quoted one
(any characters but ``/`` and NUL; a backtick inside is written twice, as in
Spark SQL). Anything else is refused before it reaches Spark: a name is never
passed on as SQL text, only re-quoted part by part.

A TABLE argument containing ``/`` (or a ``file://`` URL) is a Delta table path.
Where no catalog serves Delta (the embedded Spark server, a training job),
``$UCSTAGE_WAREHOUSE/<catalog>/<schema>/<table>`` is the table's folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from ..errors import InvalidArgument
from ..volumes.location import entry_name_problem, is_volumes_path, resolve

__all__ = [
    "WAREHOUSE_ENV",
    "TableName",
    "is_table_path",
    "local_table_path",
    "parse_table_name",
    "warehouse_path",
]

WAREHOUSE_ENV = "UCSTAGE_WAREHOUSE"

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

@dataclass(frozen=True)
class TableName:
    """A validated three-part table name."""

    catalog: str
    schema: str
    table: str

    @property
    def parts(self) -> tuple[str, str, str]:
        return (self.catalog, self.schema, self.table)

    def quoted(self) -> str:
        """The name for Spark SQL: every part backtick-quoted, backticks doubled."""
        return ".".join("`" + p.replace("`", "``") + "`" for p in self.parts)

    def __str__(self) -> str:
        return ".".join(p if _PLAIN.fullmatch(p) else "`" + p.replace("`", "``") + "`"
                        for p in self.parts)


def _bad(name: str, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"invalid table name {name!r}: {why}",
        hint="use catalog.schema.table (letters, digits, _; quote other names in backticks, "
             "e.g. main.`my-schema`.events), or a Delta table path containing /",
    )


def parse_table_name(name: str) -> TableName:
    """Parse and validate ``catalog.schema.table``.

    Raises:
        InvalidArgument: not exactly three valid parts.
    """
    parts: list[str] = []
    i, n = 0, len(name)
    while True:
        if i < n and name[i] == "`":
            j, buf = i + 1, []
            while True:
                if j >= n:
                    raise _bad(name, "unterminated backtick")
                if name[j] == "`":
                    if j + 1 < n and name[j + 1] == "`":
                        buf.append("`")
                        j += 2
                        continue
                    break
                buf.append(name[j])
                j += 1
            part = "".join(buf)
            if not part.strip():
                raise _bad(name, "an empty quoted part")
            why = entry_name_problem(part)  # each part is a folder of the warehouse
            if why is not None:
                raise _bad(name, f"part {part!r} cannot name a folder: {why}")
            i = j + 1
        else:
            m = _PLAIN.match(name, i)
            if m is None:
                where = f"at {name[i:i + 10]!r}" if i < n else "at the end"
                raise _bad(name, f"expected an identifier or a `quoted` part {where}")
            part = m.group(0)
            i = m.end()
        parts.append(part)
        if i == n:
            break
        if name[i] != ".":
            raise _bad(name, f"unexpected {name[i]!r} after {part!r}")
        i += 1
    if len(parts) != 3:
        raise _bad(name, f"{len(parts)} part{'s' if len(parts) != 1 else ''}, "
                         "expected catalog.schema.table")
    return TableName(*parts)


def is_table_path(table: str) -> bool:
    """A TABLE argument is a path when it has a ``/`` outside backticks or is a URL."""
    if "://" in table:
        return True
    return "/" in re.sub(r"`(?:[^`]|``)*`", "", table)


def local_table_path(table: str) -> str:
    """An absolute local folder for a Delta table path or ``file://`` URL.

    Raises:
        InvalidArgument: an object-store URL (Spark here has no s3a/gcs/abfs).
    """
    if table.startswith("file://"):
        return os.path.abspath(unquote(urlparse(table).path))
    if is_volumes_path(table.removeprefix("dbfs:")):
        # Through $UCSTAGE_VOLUMES_ROOT when it maps /Volumes to a folder (the
        # literal path otherwise: the platform's FUSE mount).
        volume = resolve(table, must_exist=False)
        if volume.is_local:
            return volume.root
    if "://" in table:
        raise InvalidArgument(
            f"cannot export {table}: Spark here reads only local or mounted paths",
            hint="give the table's catalog name to a Spark Connect server that reads Delta "
                 "(SPARK_REMOTE=sc://HOST:PORT), or export from a local or mounted copy of "
                 "the table",
        )
    return os.path.abspath(os.path.expanduser(table))


def warehouse_path(name: TableName) -> str | None:
    """``$UCSTAGE_WAREHOUSE/<catalog>/<schema>/<table>``, or None when the variable is unset."""
    root = os.environ.get(WAREHOUSE_ENV, "")
    if not root:
        return None
    return os.path.join(local_table_path(root) if "://" in root else os.path.abspath(root),
                        *name.parts)
