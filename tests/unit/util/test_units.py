"""Human-written durations and sizes."""

from __future__ import annotations

import pytest

from traind.util.units import format_size, parse_duration, parse_positive_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("10m", 600),
        ("1.5h", 5400),
        ("250ms", 0.25),
        ("2d", 172800),
        (5, 5),
        ("7", 7),
        (" 3 S ", 3),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    """Every unit converts to seconds."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64MiB", 64 * 1024**2),
        ("1GB", 10**9),
        ("512k", 512_000),
        ("2KiB", 2048),
        (100, 100),
        ("1.5GiB", int(1.5 * 1024**3)),
        ("10b", 10),
    ],
)
def test_sizes(text: object, size: int) -> None:
    """Binary and decimal units convert to bytes."""
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["ten seconds", "5 parsecs", "-3s", True, None, "1x"])
def test_bad_duration_names_the_value(bad: object) -> None:
    """A bad duration's error quotes it and says what is allowed."""
    with pytest.raises(ValueError, match=r"duration|negative") as info:
        parse_duration(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 10**400, "9" * 400])
def test_durations_are_finite(bad: object) -> None:
    """nan, infinity and numbers too large for a float are not durations."""
    with pytest.raises(ValueError, match="finite"):
        parse_duration(bad)


def test_positive_duration_refuses_zero() -> None:
    """An interval or timeout of 0 is refused; any positive duration passes."""
    for zero in (0, 0.0, "0s", "0ms"):
        with pytest.raises(ValueError, match="longer than 0"):
            parse_positive_duration(zero)
    assert parse_positive_duration("250ms") == pytest.approx(0.25)


@pytest.mark.parametrize("bad", ["lots", "5 parsecs", -1, True, "1.5.2MB", "9" * 400 + "GiB"])
def test_bad_size_names_the_value(bad: object) -> None:
    """A bad size's error quotes it and says what is allowed."""
    with pytest.raises(ValueError, match=r"size|negative"):
        parse_size(bad)


def test_format_size() -> None:
    """Sizes print in binary units."""
    assert format_size(512) == "512 B"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(3 * 1024**3) == "3.0 GiB"
