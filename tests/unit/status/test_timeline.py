"""The checkpoint timeline and chart history the status page shows, with the clock passed in."""

from __future__ import annotations

from traind.status.timeline import BUCKET, HISTORY, Timeline

T0 = 1_700_000_040.0  # a bucket boundary


def clocked() -> tuple[Timeline, list[float]]:
    """A timeline whose clock the test moves."""
    now = [T0]
    return Timeline(size=3, clock=lambda: now[0]), now


def test_a_checkpoint_from_written_to_safe() -> None:
    """Written (by its newest file), snapshot, queued, committed: time-to-safe counts from
    the write."""
    timeline, now = clocked()
    timeline.staged("checkpoint-2", 2, 100, since_last_write=1.5)
    timeline.queued("checkpoint-2")
    assert timeline.entries()[0]["stage"] == "queued"
    now[0] += 10
    assert timeline.newest_unsafe_seconds() == 11.5
    assert timeline.committed("checkpoint-2") == 11.5
    (entry,) = timeline.entries()
    assert entry == {"tag": "checkpoint-2", "step": 2, "bytes": 100, "stage": "committed",
                     "written_at": T0 - 1.5, "staged_at": T0, "done_at": T0 + 10,
                     "safe_seconds": 11.5}
    assert timeline.newest_unsafe_seconds() == 0.0
    assert timeline.history()["safe"] == [(T0 + 10, 11.5)]


def test_unknown_and_dropped_checkpoints() -> None:
    """A commit of a checkpoint not seen written has no time-to-safe; a dropped one is not
    'unsafe' (it has its own alert)."""
    timeline, _ = clocked()
    assert timeline.committed("checkpoint-9") is None
    timeline.staged("checkpoint-1", 1, 5, 0.0)
    timeline.dropped("checkpoint-1")
    assert timeline.entries()[0]["stage"] == "dropped"
    assert timeline.newest_unsafe_seconds() == 0.0


def test_only_the_last_few_are_kept() -> None:
    """The timeline is bounded; the oldest go first."""
    timeline, _ = clocked()
    for n in range(1, 6):
        timeline.staged(f"checkpoint-{n}", n, 1, 0.0)
    assert [e["step"] for e in timeline.entries()] == [3, 4, 5]


def test_save_cadence() -> None:
    """Seconds since the last save and between the last two; None until known."""
    timeline, now = clocked()
    assert (timeline.seconds_since_last_save(), timeline.save_interval()) == (None, None)
    timeline.staged("checkpoint-1", 1, 1, 0.0)
    now[0] += 30
    timeline.staged("checkpoint-2", 2, 1, 2.0)
    now[0] += 5
    assert timeline.save_interval() == 28.0
    assert timeline.seconds_since_last_save() == 7.0


def test_upload_bytes_per_bucket_over_the_last_hours() -> None:
    """Bytes sent are summed per bucket; buckets older than the history go."""
    timeline, now = clocked()
    timeline.sent(10)
    now[0] += BUCKET / 2
    timeline.sent(5)
    now[0] += BUCKET
    timeline.sent(7)
    assert timeline.history()["upload"] == [(T0, 15), (T0 + BUCKET, 7)]
    now[0] += HISTORY
    assert timeline.history()["upload"] == []
