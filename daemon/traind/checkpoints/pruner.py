"""Apply the retention policy: delete what ``retention.py`` says may go, remotely and locally."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import structlog

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake import snapshot
from traind.checkpoints.intake.watcher import candidates
from traind.checkpoints.restore.download import identity, newest
from traind.checkpoints.retention.policy import (
    Candidate,
    Stranded,
    Verdict,
    plan_local,
    plan_remote,
    stranded,
)
from traind.checkpoints.state.journal import Journal
from traind.config import RetentionConfig
from traind.protocol import CheckpointStore

log = structlog.get_logger("traind.retention")


@dataclass(frozen=True)
class PrunePlan:
    """Verdicts for the store and for output_dir."""

    remote: list[Verdict]
    local: list[Verdict]


async def plan(
    storage: CheckpointStore,
    journal: Journal,
    policy: RetentionConfig,
    output_dir: Path,
    pattern: str,
    protected: Collection[str] = (),
) -> PrunePlan:
    """Work out what retention would delete now, and why everything else stays.

    A directory in ``output_dir`` counts as committed only when the journal says it was
    stored from there (or restored there) and its files are still the size and mtime they
    were snapshot with: a directory that merely shares a committed tag's name (another
    run's, or one the trainer saved again) is never deleted.
    ``protected`` tags stay on disk (the trainer's resume point). A checkpoint recorded as
    corrupt in the store is kept and not counted: it must not make the newest one that
    verifies look old enough to delete."""
    manifests = await storage.manifests()
    corrupt = await journal.corrupt()
    bad = [m for m in manifests if (m.tag, identity(m)) in corrupt]
    good = [m for m in manifests if m not in bad]
    latest = newest(good)
    best = latest.trainer.best_tag if latest else None
    remote = plan_remote([Candidate(m.tag, m.step) for m in good], policy, best) + [
        Verdict(m.tag, m.step, True, "corrupt in the store: not counted, kept for repair")
        for m in bad
    ]
    present = await asyncio.to_thread(candidates, output_dir, pattern)
    here = output_dir.resolve()
    committed = {
        e.tag for e in await journal.entries("committed", "pruning", "pruned")
        if e.tag in present and e.source.resolve() == here / e.tag
        and not await asyncio.to_thread(
            snapshot.rewritten, output_dir / e.tag, await journal.files(e.tag)
        )
    }
    local = plan_local(
        [Candidate(t, s) for t, s in present.items()], committed, policy.keep_local, protected
    )
    return PrunePlan(remote, local)


async def delete(storage: CheckpointStore, journal: Journal, tag: str) -> None:
    """Delete ``tag`` from the store. A backend deletes the manifest first, then the files;
    the journal's ``pruning`` state lets the next prune finish the job after a daemon was
    killed in between, instead of leaving files without a manifest in the store forever."""
    known = await journal.get(tag) is not None
    if known:
        await journal.set_state(tag, "pruning")
    await storage.delete(tag)
    if known:
        await journal.set_state(tag, "pruned")


async def _finish_deletes(storage: CheckpointStore, journal: Journal) -> None:
    """Complete the deletes that a killed daemon left half-done (see ``delete``)."""
    for entry in await journal.entries("pruning"):
        await delete(storage, journal, entry.tag)
        log.info("checkpoint_pruned", where="remote", tag=entry.tag, step=entry.step,
                 reason="finishing a delete that was interrupted", backend=storage.describe)


async def prune(
    storage: CheckpointStore,
    journal: Journal,
    policy: RetentionConfig,
    output_dir: Path,
    pattern: str,
    protected: Collection[str] = (),
    remote: bool = True,
) -> PrunePlan:
    """Finish interrupted deletes, then delete what the plan lets go; return the plan
    that was applied. Without ``remote`` the store is left to the one host that prunes it
    (node 0 of a multi-node job) and only output_dir is pruned."""
    if remote:
        await _finish_deletes(storage, journal)
    result = await plan(storage, journal, policy, output_dir, pattern, protected)
    for v in result.remote:
        if remote and not v.keep:
            await delete(storage, journal, v.tag)
            log.info("checkpoint_pruned", where="remote", tag=v.tag, step=v.step, reason=v.reason,
                     backend=storage.describe)
    for v in result.local:
        if not v.keep:
            await asyncio.to_thread(shutil.rmtree, output_dir / v.tag, True)
            log.info("checkpoint_pruned", where="local", tag=v.tag, step=v.step, reason=v.reason)
    return result


async def give_up_stranded(streamer: Streamer, nodes: int, part_timeout: float) -> list[Stranded]:
    """On node 0 of a multi-node job: delete from the store each checkpoint whose parts
    never all arrived within ``part_timeout`` (a host died for good), after letting go of this
    host's own snapshot of it (the other hosts find their part gone); each one is an error
    event. Return those given up."""
    store = streamer.storage
    given_up = []
    for lost in stranded(await store.uncommitted(), nodes, time.time(), part_timeout):
        if lost.tag == streamer.in_flight:
            continue  # this host is storing it right now: looked at again next time
        if lost.tag in streamer.unstored:
            await streamer.drop(lost.tag)
        await streamer.storage.delete(lost.tag)
        given_up.append(lost)
        log.error("checkpoint_parts_abandoned", tag=lost.tag, step=lost.step,
                  present=list(lost.present), missing=list(lost.missing),
                  age=round(lost.age, 1), part_timeout=part_timeout,
                  backend=streamer.storage.describe,
                  hint="the hosts missing never stored their part (died for good?): "
                       "never listed, deleted from the store; this host's snapshot is let "
                       "go, its copy in output_dir kept")
    return given_up
