"""One expectation and one verdict per GET, whatever the store
(ucstage/engines/checks.py), and the MD5 evidence kept where the caller says.

The fault-proxy tests (tests/cache/test_faults.py, tests/cloud/) drive these
through real stores; these pin the rule the merge of the S3 inference and
the GCS/Azure stored checksums keeps in one place."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from ucstage.engines import checks

BODY = b"the object's bytes"
MD5 = hashlib.md5(BODY).hexdigest()


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    checks.forget()
    yield
    checks.forget()


def test_s3_expects_its_etag_when_it_is_a_plain_md5() -> None:
    want = checks.expect("s3://bucket", {"e_tag": f'"{MD5}"'}, "")
    assert want == checks.Expect("md5", MD5, MD5, inferred=True)
    multipart = checks.expect("s3://bucket", {"e_tag": '"0123-2"'}, "")
    assert multipart == checks.Expect("", "", "0123-2", inferred=True)


def test_gcs_and_azure_expect_the_listed_checksum_while_the_object_is_the_one_listed() -> None:
    listed = f"1700;md5={MD5}"
    assert checks.expect("gs://b", {"version": "1700"}, listed) == \
        checks.Expect("md5", MD5, listed)
    # Replaced since it was listed: the size only, stamped with the new marker.
    assert checks.expect("gs://b", {"version": "1800"}, listed) == checks.Expect("", "", "1800")
    assert checks.expect("az://c", {"e_tag": '"0x8D"'}, "0x8D;crc32c=abcd") == \
        checks.Expect("crc32c", "abcd", "0x8D;crc32c=abcd")


def test_a_stored_checksum_mismatch_always_fails_and_never_marks_the_source() -> None:
    want = checks.expect("gs://b", {"version": "1"}, f"1;md5={MD5}")
    for _ in range(checks.NOT_MD5_READS + 1):
        with pytest.raises(checks.Mismatch):
            checks.judge("gs://b", "k", want, "f" * 32)
    assert checks.marked() == set()
    verdict = checks.judge("gs://b", "k", want, MD5)
    assert (verdict.check, verdict.checksum) == ("md5", f"md5:{MD5}")


def test_an_inferred_md5_that_matched_is_kept_where_the_caller_says(tmp_path: Path) -> None:
    kept: list[str] = []

    def evidence(source: str) -> str:
        kept.append(source)
        return str(tmp_path / "evidence" / source.replace("://", "_"))

    want = checks.expect("s3://bucket", {"e_tag": f'"{MD5}"'}, "")
    assert checks.judge("s3://bucket", "a", want, MD5, evidence=evidence).check == "md5"
    assert (tmp_path / "evidence" / "s3_bucket").is_file()
    # Another process of the caller (this one, forgetting): the kept match
    # makes a repeated mismatch a corrupt object, not ETags that are not MD5s.
    checks.forget()
    other = checks.expect("s3://bucket", {"e_tag": '"' + "e" * 32 + '"'}, "")
    with pytest.raises(checks.Mismatch):
        checks.judge("s3://bucket", "b", other, MD5, evidence=evidence)
    with pytest.raises(checks.Mismatch, match="corrupt"):
        checks.judge("s3://bucket", "b", other, MD5, evidence=evidence)
    assert checks.marked() == set() and kept


def test_without_evidence_a_repeated_mismatch_marks_the_source_not_md5() -> None:
    other = checks.expect("s3://other", {"e_tag": '"' + "e" * 32 + '"'}, "")
    for _ in range(checks.NOT_MD5_READS - 1):
        with pytest.raises(checks.Mismatch):
            checks.judge("s3://other", "b", other, MD5)
    assert checks.judge("s3://other", "b", other, MD5).check == "size"
    assert checks.marked() == {"s3://other"}
    # Marked: later expectations of the source are the size only.
    assert checks.expect("s3://other", {"e_tag": f'"{MD5}"'}, "").check == ""
