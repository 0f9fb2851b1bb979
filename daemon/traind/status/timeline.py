"""The recent life of each checkpoint (written → snapshot → committed or dropped) and the
upload history the status page charts, kept from the daemon's own events.

Thread-safe: upload bytes arrive from worker threads, log events from anywhere.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Literal, TypedDict

Stage = Literal["snapshot", "queued", "committed", "dropped"]
HISTORY = 6 * 3600.0  # seconds of upload and time-to-safe history kept for the chart
BUCKET = 10.0  # seconds of upload bytes summed into one point of the chart


class TimelineEntry(TypedDict):
    """One checkpoint: when the trainer finished writing it (its newest file), when its
    snapshot was taken, and when it became safe (committed) or was let go (dropped)."""

    tag: str
    step: int
    bytes: int
    stage: Stage
    written_at: float
    staged_at: float
    done_at: float | None
    safe_seconds: float | None


class HistoryInfo(TypedDict):
    """Upload bytes per ``BUCKET`` seconds (bucket start, bytes) and each commit's
    time-to-safe (commit time, seconds), oldest first, over the last ``HISTORY`` seconds."""

    bucket: float
    upload: list[tuple[float, int]]
    safe: list[tuple[float, float]]


class Timeline:
    """The last ``size`` checkpoints this daemon saw, and the history behind the chart."""

    def __init__(self, size: int = 30, clock: Callable[[], float] = time.time) -> None:
        self._size = size
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, TimelineEntry] = OrderedDict()
        self._upload: deque[list[float]] = deque()
        self._safe: deque[tuple[float, float]] = deque()
        self._saves: deque[float] = deque(maxlen=2)

    def staged(self, tag: str, step: int, nbytes: int, since_last_write: float) -> None:
        """A snapshot of ``tag`` was taken ``since_last_write`` seconds after its newest
        file was written."""
        now = self._clock()
        with self._lock:
            written = now - max(0.0, since_last_write)
            self._entries.pop(tag, None)
            self._entries[tag] = TimelineEntry(
                tag=tag, step=step, bytes=nbytes, stage="snapshot", written_at=written,
                staged_at=now, done_at=None, safe_seconds=None,
            )
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
            self._saves.append(written)

    def queued(self, tag: str) -> None:
        """``tag``'s snapshot is final and waits for upload."""
        with self._lock:
            if (entry := self._entries.get(tag)) is not None and entry["stage"] == "snapshot":
                entry["stage"] = "queued"

    def committed(self, tag: str) -> float | None:
        """``tag`` is in the store; return its seconds from written to safe (None when this
        daemon did not see it written)."""
        now = self._clock()
        with self._lock:
            if (entry := self._entries.get(tag)) is None:
                return None
            seconds = max(0.0, now - entry["written_at"])
            entry["stage"], entry["done_at"], entry["safe_seconds"] = "committed", now, seconds
            self._safe.append((now, seconds))
            self._trim(now)
            return seconds

    def dropped(self, tag: str) -> None:
        """``tag`` was let go before it was stored."""
        with self._lock:
            if (entry := self._entries.get(tag)) is not None:
                entry["stage"], entry["done_at"] = "dropped", self._clock()

    def sent(self, nbytes: int) -> None:
        """``nbytes`` more reached the store."""
        now = self._clock()
        start = now - now % BUCKET
        with self._lock:
            if self._upload and self._upload[-1][0] == start:
                self._upload[-1][1] += nbytes
            else:
                self._upload.append([start, float(nbytes)])
                self._trim(now)

    def entries(self) -> list[TimelineEntry]:
        """Oldest first, copies."""
        with self._lock:
            return [TimelineEntry(**e) for e in self._entries.values()]

    def history(self) -> HistoryInfo:
        """The chart's points."""
        with self._lock:
            self._trim(self._clock())
            return HistoryInfo(bucket=BUCKET,
                               upload=[(t, int(b)) for t, b in self._upload],
                               safe=list(self._safe))

    def seconds_since_last_save(self) -> float | None:
        """Seconds since the trainer finished writing its newest checkpoint (None before)."""
        with self._lock:
            return max(0.0, self._clock() - self._saves[-1]) if self._saves else None

    def save_interval(self) -> float | None:
        """Seconds between the trainer's last two saves (None before two)."""
        with self._lock:
            return self._saves[1] - self._saves[0] if len(self._saves) == 2 else None

    def newest_unsafe_seconds(self) -> float:
        """How long the newest checkpoint has been written without being safe; 0 when it is
        committed (or dropped: that is counted and alerted on by itself) or none was seen."""
        with self._lock:
            if not self._entries:
                return 0.0
            newest = max(self._entries.values(), key=lambda e: e["step"])
            if newest["stage"] in ("committed", "dropped"):
                return 0.0
            return max(0.0, self._clock() - newest["written_at"])

    def _trim(self, now: float) -> None:
        while self._upload and self._upload[0][0] < now - HISTORY:
            self._upload.popleft()
        while self._safe and self._safe[0][0] < now - HISTORY:
            self._safe.popleft()
