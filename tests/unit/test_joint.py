"""One host's side of a multi-node resume, on a real local store: the agreement with the
other hosts, and the agreed checkpoint made whole in output_dir."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path
from typing import cast

import pytest
from tests.support.waits import until
from traind.checkpoints.multinode.assemble import make_whole
from traind.checkpoints.multinode.resume import JointResume
from traind.checkpoints.state.journal import Journal

from traind.config import LocalStorage
from traind.errors import IntegrityError
from traind.layout.keys import AGREEMENT_DIR
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.protocol import CheckpointStore, open_storage
from traind.util.nodes import NodeRank
from traind.util.retry import Backoff

TAG = "checkpoint-2"
BYTES = {".metadata": b"meta", "__0_0.distcp": b"rank zero", "__1_0.distcp": b"rank one"}
WRITER = Writer("0" * 32, "node0")


def entry(path: str, data: bytes) -> FileEntry:
    return FileEntry(path, len(data), hashlib.sha256(data).hexdigest())


def committed(root: Path, tag: str, files: dict[str, bytes]) -> Manifest:
    """Commit ``tag`` with ``files`` in the local store at ``root`` (its manifest last)."""
    for path, data in files.items():
        (root / "exp" / tag).mkdir(parents=True, exist_ok=True)
        (root / "exp" / tag / path).write_bytes(data)
    manifest = Manifest(run="exp", tag=tag, step=int(tag.rsplit("-", 1)[1]),
                        files=tuple(entry(p, d) for p, d in sorted(files.items())),
                        writer=WRITER)
    (root / "exp" / tag / "traind-manifest.json").write_bytes(manifest.to_json())
    return manifest


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return open_storage(LocalStorage(path=tmp_path / "store"), "exp")


async def _no_scan() -> None:
    """No watcher: nothing for a stopped trainer to have left."""


def host(rank: int, nodes: int = 2) -> JointResume:
    return JointResume(NodeRank(rank, nodes, "run.node_rank"), lambda: True, _no_scan,
                       poll=Backoff(0.01, 0.05))


async def test_make_whole_fetches_what_is_lacking_into_new_inodes(
    tmp_path: Path, store: CheckpointStore
) -> None:
    """Node 1 holds its own file, and a .metadata of other bytes hard-linked into staging:
    the missing file and the differing one are fetched; the differing one takes a new
    inode (the staging snapshot keeps its bytes), the matching one is not touched."""
    manifest = committed(tmp_path / "store", TAG, BYTES)
    own = tmp_path / "out" / TAG
    own.mkdir(parents=True)
    (own / "__1_0.distcp").write_bytes(BYTES["__1_0.distcp"])
    (own / ".metadata").write_bytes(b"an older save")
    staging = tmp_path / "staging"
    staging.mkdir()
    os.link(own / ".metadata", staging / ".metadata")
    kept = (own / "__1_0.distcp").stat().st_ino
    path, fetched = await make_whole(store, manifest, tmp_path / "out")
    assert (path, fetched) == (own, 2)
    assert {p.name: p.read_bytes() for p in own.iterdir()} == BYTES
    assert (own / "__1_0.distcp").stat().st_ino == kept
    assert (staging / ".metadata").read_bytes() == b"an older save"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [TAG]  # no temp left
    assert await make_whole(store, manifest, tmp_path / "out") == (own, 0)


async def test_make_whole_restores_a_directory_that_is_not_there(
    tmp_path: Path, store: CheckpointStore
) -> None:
    """A wiped host gets the whole union, every file."""
    manifest = committed(tmp_path / "store", TAG, BYTES)
    path, fetched = await make_whole(store, manifest, tmp_path / "out")
    assert fetched == 3
    assert {p.name: p.read_bytes() for p in path.iterdir()} == BYTES


async def test_make_whole_never_uses_bytes_that_do_not_match(
    tmp_path: Path, store: CheckpointStore
) -> None:
    """A stored file whose bytes are not the manifest's fails the start (IntegrityError):
    nothing of it lands in output_dir, the host's own files stay as they were."""
    manifest = committed(tmp_path / "store", TAG, BYTES)
    (tmp_path / "store" / "exp" / TAG / "__0_0.distcp").write_bytes(b"rank 0!!!")
    own = tmp_path / "out" / TAG
    own.mkdir(parents=True)
    (own / "__1_0.distcp").write_bytes(BYTES["__1_0.distcp"])
    with pytest.raises(IntegrityError, match=r"__0_0\.distcp"):
        await make_whole(store, manifest, tmp_path / "out")
    assert sorted(p.name for p in own.iterdir()) == ["__1_0.distcp"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [TAG]


async def test_hosts_asking_at_different_moments_get_one_decision(
    tmp_path: Path, store: CheckpointStore
) -> None:
    """Node 1 asks while checkpoint-3 is the newest committed; checkpoint-4 is committed
    before node 0 asks: both start from checkpoint-4, by one decision."""
    committed(tmp_path / "store", "checkpoint-3", BYTES)
    one = asyncio.create_task(host(1).agree(store))
    requests = tmp_path / "store" / "exp" / AGREEMENT_DIR
    await until(lambda: any(requests.glob("start-1-*")))
    committed(tmp_path / "store", "checkpoint-4", BYTES)
    async with asyncio.timeout(10):
        zero, first = await asyncio.gather(host(0).agree(store), one)
    assert zero == first
    assert (zero.round, zero.tag, zero.step) == (1, "checkpoint-4", 4)
    assert sorted(m.tag for m in await store.manifests()) == ["checkpoint-3", "checkpoint-4"]


async def test_a_host_asking_again_waits_for_every_other_host(
    tmp_path: Path, store: CheckpointStore
) -> None:
    """After a decision, node 0 asking again is not answered by it: it waits, naming node 1
    as missing, until node 1 asks too; then both get round 2."""
    zero, one = host(0), host(1)
    async with asyncio.timeout(10):
        await asyncio.gather(zero.agree(store), one.agree(store))
    again = asyncio.create_task(zero.agree(store))
    await until(lambda: zero.waiting is not None and zero.waiting.missing == (1,))
    assert not again.done()
    async with asyncio.timeout(10):
        first, second = await asyncio.gather(again, one.agree(store))
    assert first == second
    assert (first.round, first.tag) == (2, None)
    assert zero.waiting is None


async def test_a_cancelled_wait_withdraws_its_request(
    tmp_path: Path, store: CheckpointStore
) -> None:
    """A host stopped while it waits removes its start request, so node 0 never counts a
    host that is gone."""
    one = host(1)
    waiting = asyncio.create_task(one.agree(store))
    requests = tmp_path / "store" / "exp" / AGREEMENT_DIR
    await until(lambda: any(requests.glob("start-1-*")))  # stored, or being written
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not any(requests.glob("start-1-*"))
    assert await store.start_requests() == {}


async def test_a_host_killed_while_waiting_takes_the_decision_made_for_it(
    tmp_path: Path, store: CheckpointStore
) -> None:
    """Node 1's daemon stops while it waits, just after node 0 decided for both: its next
    daemon asks with the same nonce (kept in state_dir) and starts on that decision at once
    instead of waiting for node 0, whose trainer already started; once a start used the
    answer, the next request is fresh."""
    ticket = tmp_path / "state1" / "resume-request.json"
    ticket.parent.mkdir()
    slow = JointResume(NodeRank(1, 2, "run.node_rank"), lambda: True, _no_scan, ticket,
                       poll=Backoff(30.0, 30.0))
    waiting = asyncio.create_task(slow.agree(store))
    await until(lambda: slow.waiting is not None)  # asked, and read the board once
    async with asyncio.timeout(10):
        decided = await host(0).agree(store)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    again = JointResume(NodeRank(1, 2, "run.node_rank"), lambda: True, _no_scan, ticket,
                        poll=Backoff(30.0, 30.0))
    async with asyncio.timeout(10):
        nothing = cast(Journal, None)  # not read: there is no checkpoint to resume from
        assert await again.resume_point(store, nothing, tmp_path / "out", print) is None
    assert decided.round == 1
    assert json.loads(ticket.read_text()) == {"nonce": decided.nonces[1], "answered": True}
    late = asyncio.create_task(again.agree(store))
    await until(lambda: json.loads(ticket.read_text())["nonce"] != decided.nonces[1])
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late


async def test_a_ticket_nonce_unfit_for_a_key_is_not_reused(
    tmp_path: Path, store: CheckpointStore
) -> None:
    """An unanswered ticket whose nonce is not letters and digits (an edited file) is not
    asked with again (S3 puts the nonce in a key): the request gets a fresh nonce."""
    ticket = tmp_path / "state1" / "resume-request.json"
    ticket.parent.mkdir()
    ticket.write_text(json.dumps({"nonce": "../x y", "answered": False}))
    waiting = asyncio.create_task(JointResume(NodeRank(1, 2, "run.node_rank"), lambda: True,
                                              0.0, ticket, poll=Backoff(30.0, 30.0)).agree(store))
    try:
        await until(lambda: json.loads(ticket.read_text())["nonce"] != "../x y")
        async with asyncio.timeout(10):  # the ticket is written before the request is
            while not (asked := await store.start_requests()):  # noqa: ASYNC110 - the store
                await asyncio.sleep(0.01)
        assert list(asked) == [1]
        assert asked[1] == json.loads(ticket.read_text())["nonce"]
        assert asked[1].isalnum()
    finally:
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
