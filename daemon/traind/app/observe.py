"""What the daemon tells the outside world: sd_notify, metrics, and the /status document.

``Observer`` gathers the facts (state, children, uploads, commits, errors) from the daemon's
parts and keeps systemd's one-line STATUS and the Prometheus metrics current.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.multinode.resume import JointResume
from traind.checkpoints.restore.download import newest
from traind.checkpoints.retention import policy as retention
from traind.checkpoints.state.space import Pinned
from traind.config import RetentionConfig, StatusConfig
from traind.layout.manifest import Manifest
from traind.status import locate, model
from traind.status.metrics import Metrics
from traind.status.render import one_line
from traind.status.server import StatusServer
from traind.status.timeline import Timeline
from traind.supervisor.process import State
from traind.supervisor.runner import ChildStatus
from traind.supervisor.supervisor import Supervisor
from traind.util.proc.systemd import Notifier

log = structlog.get_logger("traind.app")


class Observer:
    """Builds ``/status`` snapshots and pushes state changes to systemd and metrics."""

    def __init__(
        self,
        run: str,
        streamer: Streamer,
        backend: Callable[[], str],
        tracked: Callable[[], int],
        recent: model.RecentErrors | None = None,
        notifier: Notifier | None = None,
        retention: Callable[[], RetentionConfig | None] = lambda: None,
        prunes_remote: bool = True,
    ) -> None:
        self.run = run
        self.state: model.DaemonState = "starting"
        self.started = time.time()
        self.metrics = Metrics(child_states=[s.value for s in State])
        self.notifier = notifier or Notifier()
        self.recent = recent or model.RecentErrors()
        self.supervisor: Supervisor | None = None
        self.joint: JointResume | None = None
        self.next_prune: float | None = None
        self.retention = retention
        """The retention policy in force, for the page's "what the next prune removes"."""
        self.prunes_remote = prunes_remote
        """Whether this host prunes the store (node 0 of a job)."""
        self.timeline = Timeline()
        self._best: str | None = None
        self._streamer = streamer
        self._backend = backend
        self._tracked = tracked
        self._committed: dict[str, model.CommittedInfo] = {}
        self._dropped: dict[str, model.DroppedInfo] = {}
        self._restarts: dict[str, int] = {}
        self._server: StatusServer | None = None
        self.metrics.set_queue_depth(lambda: streamer.queued)
        self.metrics.set_parts_missing(
            lambda: sum(len(p.missing) for p in streamer.waiting_parts.values()))
        self.metrics.set_saves(self.timeline.seconds_since_last_save,
                               self.timeline.save_interval, self.timeline.newest_unsafe_seconds)
        streamer.on_sent = self._sent
        self.recent.listeners.append(self._logged)

    async def serve(self, status: StatusConfig | None, state_dir: Path) -> None:
        """(Re)start the status server for ``status``, or stop it when None or disabled;
        its address is published in ``state_dir`` for ``traind status``."""
        if self._server is not None:
            await self._server.stop()
            self._server = None
            locate.withdraw(state_dir)
        if status is not None and status.enabled:
            server = StatusServer(status.listen, self.snapshot, self.metrics)
            await server.start()
            self._server = server
            try:  # how `traind status` finds this daemon when the config file is broken
                locate.publish(state_dir, str(server.address))
            except OSError as exc:
                log.warning("status_address_unpublished", state_dir=str(state_dir),
                            error=str(exc))

    def snapshot(self) -> model.StatusSnapshot:
        """The whole ``/status`` document, now."""
        children = self.supervisor.status() if self.supervisor else []
        return model.snapshot(
            run=self.run,
            state=self.state,
            started=self.started,
            backend=self._backend(),
            children=[model.child_info(c) for c in children],
            queued=self._streamer.queued,
            tracked=self._tracked(),
            upload=model.upload_info(self._streamer.current),
            committed=self._committed.values(),
            dropped=self._dropped.values(),
            held=[model.HeldInfo(tag=tag, holder=str(lease.writer), renewed_at=lease.renewed_at,
                                 stale_at=lease.renewed_at + self._streamer.claim_ttl)
                  for tag, lease in self._streamer.held.items()],
            parts=[model.PartsInfo(tag=tag, step=p.step, node_rank=p.node_rank,
                                   present=list(p.present), missing=list(p.missing))
                   for tag, p in self._streamer.waiting_parts.items()],
            resume=_resume_wait(self.joint),
            next_prune=self.next_prune,
            prune=self._to_prune(),
            errors=self.recent.items(),
            timeline=self.timeline.entries(),
            history=self.timeline.history(),
        )

    def _to_prune(self) -> list[model.PruneInfo]:
        """What the next retention pass would delete from the store, as things stand."""
        policy = self.retention()
        if policy is None or not self.prunes_remote:
            return []
        committed = [retention.Candidate(c["tag"], c["step"]) for c in self._committed.values()]
        return [model.PruneInfo(tag=v.tag, step=v.step, reason=v.reason)
                for v in retention.plan_remote(committed, policy, self._best) if not v.keep]

    def announce(self) -> None:
        """Send systemd the one-line summary of the current state."""
        self.notifier.status(one_line(self.snapshot()))

    def set_state(self, state: model.DaemonState) -> None:
        """The daemon moved to ``state``."""
        self.state = state
        self.announce()

    def known(self, manifests: list[Manifest]) -> None:
        """Replace the list of committed checkpoints with what the store holds."""
        self._committed = {m.tag: _info(m) for m in manifests}
        if (latest := newest(manifests)) is not None:
            self.metrics.last_commit(latest.step, latest.created_at)
            self._best = latest.trainer.best_tag

    def committed(self, manifest: Manifest) -> None:
        """A checkpoint was just committed by this daemon."""
        self._committed[manifest.tag] = _info(manifest)
        self._best = manifest.trainer.best_tag or self._best
        if (safe := self.timeline.committed(manifest.tag)) is not None:
            self.metrics.safe_after(safe)
        current = self._streamer.current
        seconds = time.monotonic() - current[1].started if current else 0.0
        self.metrics.committed(manifest.step, manifest.total_bytes, seconds)
        self.announce()

    def pruned(self, tags: list[str]) -> None:
        """Retention removed these checkpoints from the store."""
        for tag in tags:
            self._committed.pop(tag, None)

    def dropped(self, pinned: Pinned) -> None:
        """A snapshot was let go unstored to free space (its error event is logged)."""
        self._dropped[pinned.tag] = model.DroppedInfo(
            tag=pinned.tag, step=pinned.step, bytes=pinned.bytes, dropped_at=time.time()
        )
        self.metrics.dropped()
        self.timeline.dropped(pinned.tag)
        self.announce()

    def child_changed(self, child: ChildStatus) -> None:
        """A supervised child changed state."""
        if child.name not in self._restarts:
            self.metrics.add_child(child.name)  # its restart counter exported from 0
        if child.restarts > self._restarts.get(child.name, 0):
            self.metrics.restarted(child.name)
        self._restarts[child.name] = child.restarts
        self.metrics.child_in(child.name, child.state, up=child.state == State.RUNNING)
        self.announce()

    def _sent(self, nbytes: int) -> None:
        """Bytes reached the store (a retried transfer takes back what it resends: the
        counter keeps it, those bytes were sent)."""
        if nbytes > 0:
            self.metrics.uploaded(nbytes)
            self.timeline.sent(nbytes)

    def _logged(self, event: str, fields: Mapping[str, Any]) -> None:
        """Count the failures the daemon logs, so ``/metrics`` and the journal agree, and
        follow each checkpoint's life for the timeline."""
        if event == "child_exited" and isinstance(code := fields.get("returncode"), int):
            self.metrics.child_exited(str(fields.get("child", "")), code)
        elif event == "checkpoint_upload_failed":
            self.metrics.upload_failed()
        elif event in _RETRY_EVENTS:
            self.metrics.storage_retried(_RETRY_EVENTS[event])
        elif event in ("vllm_hung", "trainer_hung"):
            self.metrics.hung(str(fields.get("child", "")))
        elif event == "checkpoint_staged" and isinstance(tag := fields.get("tag"), str):
            with contextlib.suppress(KeyError, TypeError, ValueError):  # logging never fails
                self.timeline.staged(tag, int(fields["step"]), int(fields["bytes"]),
                                     float(fields["since_last_write"]))
        elif event == "checkpoint_complete" and isinstance(tag := fields.get("tag"), str):
            self.timeline.queued(tag)


_RETRY_EVENTS = {"s3_retry": "s3", "ssh_retry": "ssh"}
"""The events a backend logs when it retries an operation, and its name."""


def _resume_wait(joint: JointResume | None) -> model.ResumeWaitInfo | None:
    if joint is None or (waiting := joint.waiting) is None:
        return None
    missing = None if waiting.missing is None else list(waiting.missing)
    return model.ResumeWaitInfo(node_rank=waiting.node_rank, since=waiting.since,
                                missing=missing)


def _info(m: Manifest) -> model.CommittedInfo:
    return model.committed_info(m.tag, m.step, m.total_bytes, m.created_at)
