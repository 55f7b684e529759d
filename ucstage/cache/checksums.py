"""The checksum a GCS or Azure copy is checked against: the one the store
keeps, carried by the listed entry's version (:mod:`ucstage.cloudfs`).

S3 copies are checked against the ETag when it is an MD5, inferred
(:mod:`ucstage.cache.integrity`). GCS (``md5Hash``, else ``crc32c``: a
composite object has only the CRC32C) and Azure (``Content-MD5``) say the
checksum outright, in the listing obstore does not give: so the listing's
version carries it, and :func:`expect` hands it to the GET when the object
the GET read is the one listed (the same GCS generation, the same Azure ETag).
An object replaced since it was listed gets the size check and is stamped
with its new marker, so its copy never passes for the entry. An Azure blob
the store keeps no checksum for (committed from blocks without
``Content-MD5``) is read in ranges checked by the MD5 Azure gives of each
(:mod:`ucstage.cache.azranges`) on the object-store engine.

Interface (beside :func:`ucstage.cache.integrity.expect_md5`):
``expect(source, meta, listed) -> Expect | None`` (None: not a GCS or Azure
source, S3's rule applies); ``judge(source, key, expect, got) -> Verdict``;
the running digest of a check is :func:`ucstage.cache.integrity.hasher`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .. import cloudfs
from . import integrity

__all__ = ["Expect", "expect", "judge", "listed_expect"]


class Expect(NamedTuple):
    check: str
    """``"md5"``, ``"crc32c"``, or '' for the size check only."""
    want: str
    """The digest (hex) the bytes must have; '' for the size check."""
    stamp: str
    """The version to stamp on the copy: the listed one while the object is
    the one listed, else the store's new marker."""


def listed_expect(listed: str, seen: str) -> Expect:
    """The check a copy of the entry listed as ``listed`` gets, the object
    read being at marker ``seen``: the strongest checksum the listing carries
    while the object is the one listed, else the size check."""
    if not listed or cloudfs.marker(listed) != seen:
        return Expect("", "", seen)
    found = cloudfs.sums(listed)
    for check in ("md5", "crc32c"):
        if found.get(check):
            return Expect(check, found[check], listed)
    return Expect("", "", listed)


def expect(source: str, meta: Any, listed: str) -> Expect | None:
    """What a GET of a GCS or Azure object (``meta``: obstore's) is checked
    against, given the entry's listed version; None for other stores."""
    kind = source.split("://", 1)[0]
    if kind not in ("gs", "az"):
        return None
    got = str(meta.get("version") or "") if kind == "gs" else \
        str(meta.get("e_tag") or "").strip('"')
    return listed_expect(listed, got)


def judge(source: str, key: str, want: Expect, got: str) -> integrity.Verdict:
    """The verdict on a copy whose bytes' digest is ``got`` ('' when not
    hashed). The store's own checksum is no inference: a mismatch is always a
    bad transfer (or a bad replica) and never cached, however often it repeats.

    Raises:
        integrity.Mismatch: the digests differ.
    """
    if not want.check:
        integrity.TALLY.add("size")
        return integrity.Verdict("size")
    if got != want.want:
        integrity.TALLY.add("mismatches")
        raise integrity.Mismatch(key, want.check, want.want, got)
    integrity.TALLY.add(want.check)
    return integrity.Verdict(want.check, f"{want.check}:{got}")
