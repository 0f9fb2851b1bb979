"""S3 response timestamps parsed by the standard library are the datetimes botocore's own
parser gives, for every form a store sends; anything else still goes to botocore's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from botocore.utils import parse_timestamp as botocore_timestamp

from traind.storage.s3.client import parse_timestamp


@pytest.mark.parametrize("raw", [
    "Tue, 01 Dec 2026 16:56:17 GMT",  # a header: Last-Modified, Expires
    "2026-12-01T16:56:17.000Z",  # a listing's LastModified
    "2026-12-01T16:56:17Z",
    "2026-12-01T18:56:17.123+02:00",
])
def test_the_usual_forms_agree_with_botocore_and_are_utc_aware(raw: str) -> None:
    """HTTP dates and ISO 8601 with a zone parse to botocore's value, timezone-aware."""
    parsed = parse_timestamp(raw)
    assert parsed == botocore_timestamp(raw)
    assert parsed.utcoffset() is not None
    assert parsed.astimezone(UTC) == datetime(
        2026, 12, 1, 16, 56, 17, parsed.microsecond, tzinfo=UTC)


@pytest.mark.parametrize("raw", [1764608177, "1764608177", "2026-12-01T16:56:17",
                                 "Tue, 01 Dec 2026 16:56:17 -0000"])
def test_other_forms_are_left_to_botocore(raw: str | int) -> None:
    """Epoch seconds, and dates without a zone, come out exactly as botocore parses them."""
    parsed = parse_timestamp(raw)
    expected = botocore_timestamp(raw)
    assert (parsed, parsed.tzinfo is None) == (expected, expected.tzinfo is None)
