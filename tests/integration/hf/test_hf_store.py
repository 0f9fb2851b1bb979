"""The Hub store against the Hub stand-in, with the real huggingface_hub: a checkpoint's
files in one commit, pruning in one, commits and API calls past the Hub's budgets waited out
(429 with RateLimit) and logged, a file whose Hub sha256 disagrees refused, and the Hub's
errors for a bad token, a missing repo and a file over the size limit; a dataset repo too."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.conformance.conftest import hf_config
from tests.conformance.test_primitives import _write
from tests.conformance.test_protocol import _upload
from tests.support.fake_hub import READ_TOKEN, FakeHub, running_hub
from tests.support.sessions import RecordingSession as Session

from traind.errors import IntegrityError, MissingFilesError, StorageError
from traind.layout.manifest import Manifest, Writer
from traind.protocol import CheckpointStore
from traind.storage import LocalFile, ObjectStore, open_objects
from traind.storage.base import CREATE, StagingStore


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    """A fresh stand-in per test, its commit budget two per two seconds."""
    with running_hub(FakeHub(commit_budget=2, window=2.0, max_file_size=4096)) as server:
        yield server


def _repo() -> str:
    return f"traind/t-{uuid.uuid4().hex[:12]}"


async def _sent(store: ObjectStore, prefix: str, root: Path, files: list[LocalFile],
                session: Session) -> None:
    """Send ``files`` and publish them (the Hub stages what it is sent)."""
    await store.send(prefix, root, files, session)
    assert isinstance(store, StagingStore)
    assert await store.publish(prefix, files, "test: the files alone")


def _hashes(manifest: Manifest) -> dict[str, str]:
    return {f.path: f.sha256 for f in manifest.files}


async def test_a_checkpoint_is_one_commit(hub: FakeHub, tmp_path: Path) -> None:
    """Claiming, sending and committing a checkpoint makes one Hub commit (the pre-upload,
    then one create_commit of its files and manifest) naming the tag, writer and host; the
    Hub's LFS sha256 is the one traind reports."""
    repo = _repo()
    store = CheckpointStore(open_objects(hf_config(hub, repo), "run"), "run")
    writer = Writer("c" * 32, "host-c")
    async with asyncio.timeout(30):
        await store.probe()
        before = len(hub.commits("model", repo))
        manifest = await _upload(store, tmp_path, {
            "model.safetensors": b"\1" * 3000, "trainer_state.json": b"{}",
            "sub/opt.pt": b"\2" * 100}, writer, "checkpoint-5")
        assert len(hub.commits("model", repo)) == before  # staged: nothing visible yet
        await store.commit(manifest)
    history = hub.commits("model", repo)
    assert len(history) == before + 1
    assert history[0].message.startswith(f"traind run: commit checkpoint-5 of writer {writer}")
    assert "(host " in history[0].message
    assert sorted(p for p in history[0].tree if "checkpoint-5" in p) == sorted(
        f"ckpts/run/checkpoint-5/{n}" for n in (
            "model.safetensors", "sub/opt.pt", "trainer_state.json", "traind-manifest.json"))
    entry = history[0].tree["ckpts/run/checkpoint-5/model.safetensors"]
    assert entry.lfs == _hashes(manifest)["model.safetensors"]


async def test_bytes_the_hub_lost_before_the_commit_are_sent_again(
        hub: FakeHub, tmp_path: Path) -> None:
    """The commit asks the LFS batch API that every pre-uploaded file is on the Hub: one
    whose bytes are gone stops it (MissingFilesError naming it, nothing committed); sent
    again, the checkpoint commits."""
    repo = _repo()
    store = CheckpointStore(open_objects(hf_config(hub, repo), "run"), "run")
    writer = Writer("d" * 32, "host-d")
    async with asyncio.timeout(30):
        manifest = await _upload(store, tmp_path, {
            "a.safetensors": b"\3" * 4000, "b.safetensors": b"\4" * 500}, writer,
            "checkpoint-3")
        with hub.lock:
            del hub.lfs[_hashes(manifest)["b.safetensors"]]
        with pytest.raises(MissingFilesError) as missing:
            await store.commit(manifest)
        assert missing.value.paths == ["b.safetensors"]
        assert await store.committed("checkpoint-3") is None
        await store.upload("checkpoint-3", tmp_path, [LocalFile("b.safetensors", 500)],
                           Session())
        await store.commit(manifest)
        assert await store.committed("checkpoint-3") == manifest


async def test_pruning_a_checkpoint_is_one_commit(hub: FakeHub, tmp_path: Path) -> None:
    """Deleting a committed checkpoint (manifest, files, claim) is one Hub commit, and its
    folder is gone from the branch."""
    repo = _repo()
    store = CheckpointStore(open_objects(hf_config(hub, repo), "run"), "run")
    writer = Writer("b" * 32, "host-b")
    async with asyncio.timeout(30):
        await store.commit(await _upload(store, tmp_path, {"a.bin": b"\1" * 2000,
                                                           "b.json": b"{}"}, writer,
                                         "checkpoint-2"))
        before = len(hub.commits("model", repo))
        await store.delete("checkpoint-2")
        left = await store.manifests()
    assert len(hub.commits("model", repo)) == before + 1
    assert left == []
    assert not [p for p in hub.head("model", repo).tree if "checkpoint-2" in p]


async def test_commits_past_the_budget_wait_for_the_reset(hub: FakeHub) -> None:
    """Past the Hub's commit budget the store waits the RateLimit reset out, logs
    ``hf_rate_limited``, and every put lands."""
    store = open_objects(hf_config(hub, _repo()), "run")
    with capture_logs() as logs:
        async with asyncio.timeout(60):
            for n in range(4):
                await store.put(f"t/obj-{n}", b"x")
            found = sorted(m.key for m in await store.list("t/"))
    assert found == [f"t/obj-{n}" for n in range(4)]
    assert "429" in hub.refused
    assert any(e["event"] == "hf_rate_limited" and e["retry_in"] > 0 for e in logs)


async def test_the_hubs_errors_are_storage_errors(hub: FakeHub, tmp_path: Path) -> None:
    """A bad token, a read-only one (the probe's pre-upload needs write access), a missing
    repo (not created unasked) and a file over the Hub's limit each fail with a StorageError
    saying so, the token never in the message."""
    bad = open_objects(hf_config(hub, _repo(), token="hf_wrong"), "run")
    repo = _repo()
    hub.create("model", repo)
    reader = open_objects(hf_config(hub, repo, token=READ_TOKEN), "run")
    missing = open_objects(hf_config(hub, _repo(), create_repo=False), "run")
    store = open_objects(hf_config(hub, _repo()), "run")
    async with asyncio.timeout(30):
        with pytest.raises(StorageError) as unauthorized:
            await bad.probe()
        with pytest.raises(StorageError) as absent:
            await missing.probe()
        with pytest.raises(StorageError) as read_only:
            await reader.probe()
        await store.probe()
        with pytest.raises(StorageError) as too_big:
            await store.send("checkpoint-1/", tmp_path,
                             _write(tmp_path, {"huge.bin": b"\0" * 5000}), Session())
    assert unauthorized.value.status == 401
    assert "token" in str(unauthorized.value)
    assert "hf_wrong" not in str(unauthorized.value)
    assert absent.value.code == "RepoNotFound"
    assert read_only.value.status == 403
    assert "maximum size" in str(too_big.value)


async def test_a_password_in_the_endpoint_is_not_in_the_hubs_errors(hub: FakeHub) -> None:
    """huggingface_hub's errors name the request's URL: a password in a self-hosted
    endpoint's URL is masked in the StorageError made of them (here the Hub's 401: httpx
    sends the URL's user and password instead of the token)."""
    endpoint = hub.endpoint.replace("http://", "http://proxy:pa55-hub@")
    missing = open_objects(hf_config(hub, _repo(), create_repo=False, endpoint=endpoint), "run")
    async with asyncio.timeout(30):
        with pytest.raises(StorageError) as absent:
            await missing.probe()
    assert "http://proxy:***@127.0.0.1:" in str(absent.value)
    assert "pa55-hub" not in str(absent.value)


async def test_api_calls_past_the_window_wait_for_the_reset() -> None:
    """Past the Hub's API calls per window (429 with RateLimit) reads and writes wait the
    reset out and still succeed."""
    with running_hub(FakeHub(api_budget=6, api_window=2.0)) as hub:
        store = open_objects(hf_config(hub, _repo()), "run")
        with capture_logs() as logs:
            async with asyncio.timeout(60):
                for n in range(3):
                    await store.put(f"t/obj-{n}", b"x", CREATE)
                found = sorted(m.key for m in await store.list("t/"))
                blob = await store.get("t/obj-2")
    assert found == ["t/obj-0", "t/obj-1", "t/obj-2"]
    assert blob is not None
    assert "429-api" in hub.refused
    assert any(e["event"] == "hf_rate_limited" for e in logs)


async def test_a_file_whose_hub_sha256_disagrees_is_not_restored(
        hub: FakeHub, tmp_path: Path) -> None:
    """When the Hub's recorded LFS sha256 is not that of the bytes it serves, the fetch
    fails with an IntegrityError naming both, never handing the file over."""
    repo = _repo()
    store = open_objects(hf_config(hub, repo), "run")
    files = _write(tmp_path / "src", {"w.safetensors": b"\3" * 1000})
    async with asyncio.timeout(30):
        await _sent(store, "checkpoint-4/", tmp_path / "src", files, Session())
        hub.head("model", repo).tree["ckpts/run/checkpoint-4/w.safetensors"].lfs = "0" * 64
        with pytest.raises(IntegrityError, match="recorded"):
            await store.fetch("checkpoint-4/", files, tmp_path / "back", lambda n: None)


async def test_a_dataset_repo_holds_checkpoints_too(hub: FakeHub, tmp_path: Path) -> None:
    """With repo_type = "dataset" the same store works through the Hub's dataset routes
    (``/datasets/`` for LFS and downloads): sent, listed, fetched whole."""
    repo = _repo()
    store = open_objects(hf_config(hub, repo, repo_type="dataset"), "run")
    files = _write(tmp_path / "src", {"w.safetensors": b"\4" * 3000, "s.json": b"{}"})
    session = Session()
    async with asyncio.timeout(30):
        await _sent(store, "checkpoint-6/", tmp_path / "src", files, session)
        listed = {m.key: m.size for m in await store.list("checkpoint-6/")}
        back = await store.fetch("checkpoint-6/", files, tmp_path / "back", lambda n: None)
    assert ("dataset", repo) in hub.repos
    assert listed == {"checkpoint-6/w.safetensors": 3000, "checkpoint-6/s.json": 2}
    assert back == session.done
    assert store.describe.startswith(f"hf://datasets/{repo}@main/")


async def test_checkpoints_on_a_branch_of_their_own(hub: FakeHub, tmp_path: Path) -> None:
    """With ``revision`` a branch that does not exist yet (and create_repo), the branch is
    made from main on first use; a checkpoint is committed there and read back from it,
    and main is left as it was."""
    repo = _repo()
    config = hf_config(hub, repo, revision="traind-ckpts")
    store = CheckpointStore(open_objects(config, "run"), "run")
    writer = Writer("e" * 32, "host-e")
    with capture_logs() as logs:
        async with asyncio.timeout(30):
            await store.probe()
            manifest = await _upload(store, tmp_path, {"m.safetensors": b"\5" * 2500}, writer,
                                     "checkpoint-8")
            await store.commit(manifest)
            listed = await store.manifests()
            back = await store.download(manifest, tmp_path / "back", lambda n: None)
            on_main = await CheckpointStore(open_objects(hf_config(hub, repo), "run"),
                                            "run").manifests()
    assert [e["branch"] for e in logs if e["event"] == "hf_branch_created"] == ["traind-ckpts"]
    assert listed == [manifest]
    assert back == _hashes(manifest)
    assert on_main == []
    assert not [p for p in hub.head("model", repo).tree if "checkpoint-8" in p]
    assert "ckpts/run/checkpoint-8/traind-manifest.json" in hub.head(
        "model", repo, "traind-ckpts").tree
