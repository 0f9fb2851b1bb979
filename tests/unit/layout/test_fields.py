"""layout/fields.py: what a JSON object read back from the store may hold."""

from __future__ import annotations

import pytest

from traind.errors import IntegrityError
from traind.layout import fields


@pytest.mark.parametrize(("data", "problem"), [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"n": NaN}', "is not a number JSON allows"),
    (b"[1]", "not a JSON object"),
])
def test_parse_refuses_in_one_line(data: bytes, problem: str) -> None:
    """Deep nesting, NaN and a non-object are one IntegrityError naming what was read."""
    with pytest.raises(IntegrityError, match=rf"malformed thing: .*{problem}"):
        fields.parse(data, "thing")


def test_read_checks_each_field() -> None:
    """A step at 2**63, an infinite time or a missing key is refused naming the field."""
    def build(raw: dict[str, object]) -> tuple[int, float]:
        return fields.count(raw, "step"), fields.real(raw, "at")

    assert fields.read(b'{"step": 3, "at": 1.5}', "thing", build) == (3, 1.5)
    with pytest.raises(IntegrityError, match="step 9223372036854775808 is not an integer"):
        fields.read(b'{"step": 9223372036854775808, "at": 0}', "thing", build)
    with pytest.raises(IntegrityError, match=r"at .* is not a finite number"):
        fields.read(b'{"step": 1, "at": 1e999}', "thing", build)
    with pytest.raises(IntegrityError, match="no 'at'"):
        fields.read(b'{"step": 1}', "thing", build)
