"""Prometheus metrics for one daemon, in a private registry (no process-wide globals)."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from traind import __version__

# Commits take from seconds (a LoRA adapter) to most of an hour (a 70B model over a WAN).
COMMIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, float("inf"))

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


_Kind = type[Counter] | type[Gauge] | type[Histogram]
_TABLE: tuple[tuple[str, _Kind, str, str, tuple[str, ...]], ...] = (
    ("uploaded_bytes", Counter, "traind_uploaded_bytes_total",
     "Bytes sent to the storage backend.", ()),
    ("committed_bytes", Counter, "traind_committed_bytes_total",
     "Bytes in checkpoints committed.", ()),
    ("checkpoints_committed", Counter, "traind_checkpoints_committed_total",
     "Checkpoints committed (manifest written).", ()),
    ("checkpoints_dropped", Counter, "traind_checkpoints_dropped_total",
     "Checkpoints let go unstored to keep output_dir's filesystem from filling.", ()),
    ("child_restarts", Counter, "traind_child_restarts_total",
     "Restarts of a supervised child.", ("child",)),
    ("child_exits", Counter, "traind_child_exits_total",
     "Exits of a supervised child, by exit code (negative: killed by that signal).",
     ("child", "code")),
    ("upload_failures", Counter, "traind_upload_failures_total",
     "Attempts to store a checkpoint that failed (each is retried later).", ()),
    ("storage_retries", Counter, "traind_storage_retries_total",
     "Store operations retried after a passing failure, by backend.", ("backend",)),
    ("commit_seconds", Histogram, "traind_commit_seconds",
     "Seconds from upload start to manifest written.", ()),
    ("save_to_safe_seconds", Histogram, "traind_save_to_safe_seconds",
     "Seconds from the trainer's last write into a checkpoint to its commit.", ()),
    ("child_hangs", Counter, "traind_child_hangs_total",
     "Times a supervised child was found hung (vLLM stalled, trainer without progress) "
     "and restarted.", ("child",)),
    ("disk_free", Gauge, "traind_disk_free_bytes",
     "Free bytes on output_dir's filesystem.", ()),
    ("disk_floor", Gauge, "traind_disk_floor_bytes",
     "The free-space floor below which unstored snapshots are let go (0: none).", ()),
    ("queue_depth", Gauge, "traind_queue_depth",
     "Complete checkpoints waiting for upload.", ()),
    ("parts_missing", Gauge, "traind_parts_missing",
     "Multi-node runs: other nodes' parts still missing from the checkpoints whose part "
     "this node stored (0 once each is committed).", ()),
    ("last_committed_step", Gauge, "traind_last_committed_step",
     "Step of the newest committed checkpoint.", ()),
    ("last_commit_timestamp", Gauge, "traind_last_commit_timestamp_seconds",
     "Unix time of the newest commit.", ()),
    ("child_up", Gauge, "traind_child_up",
     "1 while the supervised child is RUNNING (ready), else 0.", ("child",)),
    ("child_state", Gauge, "traind_child_state",
     "The supervised child's state: 1 for the one it is in, 0 for the others.",
     ("child", "state")),
)
"""Every counter, gauge and histogram: the attribute, its kind, name, help and labels."""


class Metrics:
    """What the daemon counts; each method is one fact the daemon reports.

    Methods are thread-safe (``uploaded`` may be called from upload worker threads).
    """

    uploaded_bytes: Counter
    committed_bytes: Counter
    checkpoints_committed: Counter
    checkpoints_dropped: Counter
    child_restarts: Counter
    child_exits: Counter
    upload_failures: Counter
    storage_retries: Counter
    commit_seconds: Histogram
    save_to_safe_seconds: Histogram
    child_hangs: Counter
    disk_free: Gauge
    disk_floor: Gauge
    queue_depth: Gauge
    parts_missing: Gauge
    last_committed_step: Gauge
    last_commit_timestamp: Gauge
    child_up: Gauge
    child_state: Gauge

    def __init__(self, clock: Callable[[], float] = time.time,
                 child_states: Sequence[str] = ()) -> None:
        # The ``*_created`` series (a counter's creation time) double the page and nobody
        # graphs them; the switch is prometheus_client's own, for the whole process.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = r = CollectorRegistry()
        self._clock = clock
        self._child_states = tuple(child_states)
        """Every state a child can be in, each exported (1 for the current one, else 0)."""
        self._last_commit: float | None = None
        for attr, kind, name, text, labels in _TABLE:
            metric = (Histogram(name, text, labels, registry=r, buckets=COMMIT_BUCKETS)
                      if kind is Histogram else kind(name, text, labels, registry=r))
            setattr(self, attr, metric)
        Info("traind_build", "The running traind: its version and Python's.", registry=r).info(
            {"version": __version__, "python": platform.python_version()}
        )
        self._since_save: Callable[[], float | None] = lambda: None
        self._save_interval: Callable[[], float | None] = lambda: None
        self._unsafe: Callable[[], float | None] = lambda: 0.0
        for name, text, fn in (
            ("traind_seconds_since_last_commit", "Seconds since the newest commit.",
             self.seconds_since_last_commit),
            ("traind_seconds_since_last_save",
             "Seconds since the trainer finished writing its newest checkpoint.",
             lambda: self._since_save()),
            ("traind_save_interval_seconds",
             "Seconds between the trainer's last two checkpoint saves.",
             lambda: self._save_interval()),
            ("traind_newest_checkpoint_unsafe_seconds",
             "Seconds the newest checkpoint has been written but not committed (0: it is safe).",
             lambda: self._unsafe()),
        ):
            r.register(_Computed(name, text, fn))

    def committed(self, step: int, nbytes: int, seconds: float) -> None:
        """A checkpoint of ``nbytes`` at ``step`` was committed after ``seconds``."""
        self.checkpoints_committed.inc()
        self.committed_bytes.inc(nbytes)
        self.commit_seconds.observe(seconds)
        self.last_commit(step, self._clock())

    def last_commit(self, step: int, at: float) -> None:
        """Record the newest commit without counting it (e.g. from the journal at start-up)."""
        self.last_committed_step.set(step)
        self.last_commit_timestamp.set(at)
        self._last_commit = at

    def safe_after(self, seconds: float) -> None:
        """A checkpoint became safe ``seconds`` after the trainer finished writing it."""
        self.save_to_safe_seconds.observe(seconds)

    def hung(self, child: str) -> None:
        """The supervised ``child`` was found hung (and is restarted)."""
        self.child_hangs.labels(child=child).inc()

    def set_saves(
        self, since_last: Callable[[], float | None], interval: Callable[[], float | None],
        unsafe: Callable[[], float | None],
    ) -> None:
        """Read the trainer's save cadence and the newest checkpoint's unsafe age from these
        at every scrape (None: no sample)."""
        self._since_save, self._save_interval, self._unsafe = since_last, interval, unsafe

    def set_disk(self, free: Callable[[], float], floor: Callable[[], float]) -> None:
        """Read output_dir's free bytes and the floor from these at every scrape."""
        self.disk_free.set_function(free)
        self.disk_floor.set_function(floor)

    def uploaded(self, nbytes: int) -> None:
        """``nbytes`` more were sent to the store."""
        self.uploaded_bytes.inc(nbytes)

    def dropped(self) -> None:
        """A checkpoint's snapshot was let go before it was stored (the disk was full)."""
        self.checkpoints_dropped.inc()

    def restarted(self, child: str) -> None:
        """The supervised ``child`` was restarted."""
        self.child_restarts.labels(child=child).inc()

    def child_exited(self, child: str, code: int) -> None:
        """The supervised ``child`` exited with ``code``."""
        self.child_exits.labels(child=child, code=str(code)).inc()

    def upload_failed(self) -> None:
        """An attempt to store a checkpoint failed."""
        self.upload_failures.inc()

    def storage_retried(self, backend: str) -> None:
        """A store operation of ``backend`` (s3, ssh) is being retried."""
        self.storage_retries.labels(backend=backend).inc()

    def child_in(self, child: str, state: str, *, up: bool) -> None:
        """The supervised ``child`` is now in ``state`` (``up``: it runs)."""
        self.child_up.labels(child=child).set(1 if up else 0)
        for s in self._child_states or (state,):
            self.child_state.labels(child=child, state=s).set(1 if s == state else 0)

    def add_child(self, child: str) -> None:
        """Export ``child``'s restart counter at 0 before its first restart."""
        self.child_restarts.labels(child=child)

    def set_queue_depth(self, fn: Callable[[], float]) -> None:
        """Read the queue depth from ``fn`` at every scrape."""
        self.queue_depth.set_function(fn)

    def set_parts_missing(self, fn: Callable[[], float]) -> None:
        """Read the count of missing parts from ``fn`` at every scrape."""
        self.parts_missing.set_function(fn)

    def seconds_since_last_commit(self) -> float | None:
        """Seconds since the newest commit, or None before the first one."""
        return None if self._last_commit is None else max(0.0, self._clock() - self._last_commit)

    def render(self) -> bytes:
        """Every metric in the Prometheus text exposition format (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)


class _Computed(Collector):
    """A gauge computed at scrape by ``fn``; absent while ``fn`` returns None."""

    def __init__(self, name: str, help: str, fn: Callable[[], float | None]) -> None:
        self._name, self._help, self._fn = name, help, fn

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self._name, self._help)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self._name, self._help)
        if (value := self._fn()) is not None:
            family.add_metric([], value)
        yield family
