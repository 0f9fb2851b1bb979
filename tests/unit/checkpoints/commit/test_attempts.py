"""Failed attempts per checkpoint: backoff grows per failure, missing files are sent again
at once the first time only, and a forgotten tag starts over."""

from __future__ import annotations

from traind.checkpoints.commit.attempts import Attempts
from traind.errors import MissingFilesError, StorageError


def test_each_failure_waits_longer_up_to_the_cap() -> None:
    """The pause after the n-th failure is within the jittered backoff of n, capped."""
    attempts = Attempts(1.0, 4.0)
    delays = [attempts.retry_later("checkpoint-1", StorageError("down")) for _ in range(5)]
    assert 0.5 <= delays[0] <= 1.0
    assert all(d <= 4.0 for d in delays)
    assert delays[-1] >= 2.0


def test_missing_files_go_again_at_once_the_first_time_only() -> None:
    """The first time a store lacks files they are sent again now; then with backoff."""
    attempts = Attempts(1.0, 4.0)
    missing = MissingFilesError("checkpoint-1", ["a.bin"], "store")
    assert attempts.files_missing("checkpoint-1", missing) == 0.0
    assert "checkpoint-1" in attempts
    assert attempts.files_missing("checkpoint-1", missing) > 0.0


def test_a_forgotten_tag_counts_from_one_again() -> None:
    """forget: the next failure is the first one again."""
    attempts = Attempts(1.0, 4.0)
    assert attempts.failed("checkpoint-1") == 1
    assert attempts.failed("checkpoint-1") == 2
    attempts.forget("checkpoint-1")
    assert "checkpoint-1" not in attempts
    assert attempts.failed("checkpoint-1") == 1
