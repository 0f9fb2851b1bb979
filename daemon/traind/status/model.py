"""The JSON document ``/status`` serves, and builders that make it from plain values.

Times are Unix seconds (``committed_at``, ``next_prune``, ``errors[].time``); durations are
seconds (``uptime``, ``eta``); sizes are bytes; ``rate`` is bytes per second.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any, Literal, NotRequired, Protocol, TypedDict

from traind.status.timeline import HistoryInfo, TimelineEntry
from traind.util.progress import Progress

DaemonState = Literal["starting", "waiting_for_store", "running", "stopping"]


class ChildInfo(TypedDict):
    """A supervised child: supervisord's state name, its pid while it runs, its last exit."""

    name: str
    state: str
    pid: int | None
    uptime: float
    restarts: int
    last_exit: int | None


class WatcherInfo(TypedDict):
    """Checkpoints complete and waiting for upload (``queued``), and ones still being
    written that the watcher follows (``tracked``)."""

    queued: int
    tracked: int


class UploadInfo(TypedDict):
    """The checkpoint being uploaded now; ``eta`` is None until a rate is known."""

    tag: str
    bytes_done: int
    bytes_total: int
    rate: float
    eta: float | None


class CommittedInfo(TypedDict):
    """A checkpoint safely in the store."""

    tag: str
    step: int
    bytes: int
    committed_at: float


class DroppedInfo(TypedDict):
    """A checkpoint let go unstored to keep output_dir's filesystem from filling."""

    tag: str
    step: int
    bytes: int
    dropped_at: float


class HeldInfo(TypedDict):
    """A checkpoint waiting on another writer's claim (its upload uncommitted): stored
    once that writer commits, or taken over at ``stale_at`` if it stops renewing."""

    tag: str
    holder: str
    renewed_at: float
    stale_at: float


class PartsInfo(TypedDict):
    """A checkpoint of a multi-node job whose part this host stored: the nodes whose parts
    are in the store and those still missing (the checkpoint is not committed yet)."""

    tag: str
    step: int
    node_rank: int
    present: list[int]
    missing: list[int]


class ResumeWaitInfo(TypedDict):
    """A multi-node host waiting, since ``since``, for the resume point every host's trainer
    starts from: the nodes whose start request node 0 still misses (None: node 0 has not
    counted this host's request yet)."""

    node_rank: int
    since: float
    missing: list[int] | None


class ErrorInfo(TypedDict):
    """A recent error: when, the log event, its fields as one line, and its hint (what to
    do, or what traind does about it) when the event has one."""

    time: float
    event: str
    message: str
    hint: NotRequired[str]


class PruneInfo(TypedDict):
    """A committed checkpoint the next retention pass will delete, and why."""

    tag: str
    step: int
    reason: str


class StatusSnapshot(TypedDict):
    """The whole ``/status`` document."""

    run: str
    state: DaemonState
    pid: int
    uptime: float
    backend: str
    children: list[ChildInfo]
    watcher: WatcherInfo
    upload: UploadInfo | None
    committed: list[CommittedInfo]
    dropped: list[DroppedInfo]
    held: list[HeldInfo]
    parts: list[PartsInfo]
    resume: ResumeWaitInfo | None
    next_prune: float | None
    prune: list[PruneInfo]
    errors: list[ErrorInfo]
    timeline: list[TimelineEntry]
    history: HistoryInfo | None


class ChildLike(Protocol):
    """What ``child_info`` reads: the fields of ``supervisor.runner.ChildStatus``."""

    @property
    def name(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def restarts(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def since(self) -> float: ...


def child_info(child: ChildLike, now: float | None = None) -> ChildInfo:
    """A child's entry from its runner status (``since`` is the Unix time of its last state
    change, so uptime counts only while it runs)."""
    now = time.time() if now is None else now
    running = child.state == "RUNNING"
    return ChildInfo(
        name=child.name, state=child.state, pid=child.pid,
        uptime=max(0.0, now - child.since) if running else 0.0,
        restarts=child.restarts, last_exit=child.returncode,
    )


def upload_info(current: tuple[str, Progress] | None) -> UploadInfo | None:
    """The upload entry from the streamer's ``current`` (tag, progress), or None when idle."""
    if current is None:
        return None
    tag, progress = current
    return UploadInfo(
        tag=tag, bytes_done=progress.done, bytes_total=progress.total,
        rate=progress.rate, eta=progress.eta,
    )


def committed_info(tag: str, step: int, nbytes: int, committed_at: float) -> CommittedInfo:
    """A committed checkpoint's entry."""
    return CommittedInfo(tag=tag, step=step, bytes=nbytes, committed_at=committed_at)


def snapshot(
    *,
    run: str,
    state: DaemonState,
    started: float,
    backend: str,
    children: Iterable[ChildInfo] = (),
    queued: int = 0,
    tracked: int = 0,
    upload: UploadInfo | None = None,
    committed: Iterable[CommittedInfo] = (),
    dropped: Iterable[DroppedInfo] = (),
    held: Iterable[HeldInfo] = (),
    parts: Iterable[PartsInfo] = (),
    resume: ResumeWaitInfo | None = None,
    next_prune: float | None = None,
    prune: Iterable[PruneInfo] = (),
    errors: Iterable[ErrorInfo] = (),
    timeline: Iterable[TimelineEntry] = (),
    history: HistoryInfo | None = None,
    now: float | None = None,
) -> StatusSnapshot:
    """The whole document; ``started`` is the daemon's start as a Unix time."""
    now = time.time() if now is None else now
    return StatusSnapshot(
        run=run, state=state, pid=os.getpid(), uptime=max(0.0, now - started),
        backend=backend, children=list(children),
        watcher=WatcherInfo(queued=queued, tracked=tracked), upload=upload,
        committed=sorted(committed, key=lambda c: c["step"]),
        dropped=sorted(dropped, key=lambda d: d["step"]),
        held=sorted(held, key=lambda h: h["tag"]),
        parts=sorted(parts, key=lambda p: p["step"]),
        resume=resume, next_prune=next_prune, prune=list(prune), errors=list(errors),
        timeline=list(timeline), history=history,
    )


Listener = Callable[[str, Mapping[str, Any]], None]
"""Told every log event: its name and fields."""


class RecentErrors:
    """The last ``size`` error log events, kept for ``/status``.

    Add ``recent.processor`` to structlog's processors (before the renderer) and every
    ``log.error(...)`` lands here as well as in the journal; ``listeners`` hear every event
    (the metrics count failures from the events that report them).
    """

    def __init__(self, size: int = 20) -> None:
        self._items: deque[ErrorInfo] = deque(maxlen=size)
        self.listeners: list[Listener] = []

    def add(self, event: str, message: str, at: float | None = None, hint: str = "") -> None:
        """Remember one error."""
        item = ErrorInfo(time=time.time() if at is None else at, event=event, message=message)
        if hint:
            item["hint"] = hint
        self._items.append(item)

    def items(self) -> list[ErrorInfo]:
        """Oldest first."""
        return list(self._items)

    def processor(
        self, logger: Any, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        """A structlog processor recording ``error`` and ``critical`` events."""
        for listener in self.listeners:
            listener(str(event_dict.get("event", "")), event_dict)
        if method in ("error", "critical", "exception"):
            fields = " ".join(
                f"{k}={v}" for k, v in event_dict.items()
                if k not in ("event", "timestamp", "level", "exc_info", "hint")
            )
            self.add(str(event_dict.get("event", "")), fields,
                     hint=str(event_dict.get("hint") or ""))
        return event_dict
