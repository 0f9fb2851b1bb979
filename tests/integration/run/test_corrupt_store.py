"""A corrupt checkpoint in the store, through the real CLI against a local store and a real
SeaweedFS: a fresh host falls back to the newest that verifies and starts the trainer from
it, ``pull latest`` falls back and says so, ``pull TAG`` refuses, ``verify`` names each bad
file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support.checkpoints import write_checkpoint
from tests.support.daemon import DaemonProcess, is_event, write_config
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import SeaweedS3, running_seaweed
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal

pytestmark = pytest.mark.timeout(240)
RUN = "exp"


@dataclass
class Store:
    """A store holding run ``exp``: its ``[storage]`` TOML, and raw access to its objects."""

    toml: str
    root: Path | None = None  # local
    server: SeaweedS3 | None = None  # s3
    bucket: str = ""

    def _key(self, tag: str, path: str) -> str:
        return f"ckpts/{RUN}/{tag}/{path}"

    def read(self, tag: str, path: str) -> bytes:
        if self.root is not None:
            return (self.root / RUN / tag / path).read_bytes()
        assert self.server is not None
        resp = self.server.client().get_object(Bucket=self.bucket, Key=self._key(tag, path))
        return bytes(resp["Body"].read())

    def write(self, tag: str, path: str, data: bytes) -> None:
        if self.root is not None:
            (self.root / RUN / tag / path).write_bytes(data)
            return
        assert self.server is not None
        self.server.client().put_object(Bucket=self.bucket, Key=self._key(tag, path), Body=data)

    def remove(self, tag: str, path: str) -> None:
        if self.root is not None:
            (self.root / RUN / tag / path).unlink()
            return
        assert self.server is not None
        self.server.client().delete_object(Bucket=self.bucket, Key=self._key(tag, path))

    def flip_byte(self, tag: str, path: str, offset: int = 1000) -> None:
        """Change one byte of a stored object in place, as bit rot or a bad disk would."""
        data = bytearray(self.read(tag, path))
        data[offset] ^= 0xFF
        self.write(tag, path, bytes(data))


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS for this module's S3 cases."""
    need_module("aiobotocore")
    with running_seaweed(need_binary("weed"), tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh, empty store of the parameter's kind (S3: a new bucket)."""
    if request.param == "local":
        root = tmp_path / "store"
        return Store(f'type = "local"\npath = "{root}"', root=root)
    server: SeaweedS3 = request.getfixturevalue("seaweed")
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    server.create_bucket(bucket)
    return Store(server.storage_toml(bucket, prefix="ckpts"), server=server, bucket=bucket)


def traind(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "traind", *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def host(tmp_path: Path, name: str, store: Store, extra: str = "") -> Path:
    """The config of a host with its own, empty output_dir and state_dir."""
    (tmp_path / name / "out").mkdir(parents=True)
    return write_config(
        tmp_path / name / "traind.toml", run=RUN, output_dir=tmp_path / name / "out",
        state_dir=tmp_path / name / "state", storage=store.toml, extra=extra,
    )


def host_run(tmp_path: Path, name: str) -> RunIdentity:
    """The run the daemon of ``host(tmp_path, name, ...)`` keeps its journal for."""
    return RunIdentity(RUN, Path(os.path.realpath(tmp_path / name / "out")), "store")


def committed_1_to_4(tmp_path: Path, store: Store) -> None:
    """Commit checkpoint-1..4 from a first host with ``traind push``."""
    cfg = host(tmp_path, "writer", store)
    for step in range(1, 5):
        write_checkpoint(tmp_path / "writer/out", step)
        pushed = traind("push", "-c", str(cfg), str(tmp_path / f"writer/out/checkpoint-{step}"))
        assert pushed.returncode == 0, pushed.stderr


TRAINER = """
import json, os, pathlib, sys, time
out, record = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with record.open("a") as f:
    f.write(os.environ.get("TRAIND_RESUME_FROM", "-") + "\\n")
if len(sys.argv) > 3:  # save checkpoint-4 again, as a trainer resumed from 3 does
    d = out / "checkpoint-4"
    d.mkdir()
    (d / "shard-0.bin").write_bytes(os.urandom(65536))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
print("training", flush=True)
time.sleep(600)
"""


def trainer_toml(tmp_path: Path, name: str, *, save: bool = False) -> str:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    argv = [sys.executable, str(script), str(tmp_path / name / "out"),
            str(tmp_path / name / "resumed.txt")] + (["save"] if save else [])
    return f"[trainer]\ncommand = {json.dumps(argv)}\n"


async def test_fresh_host_falls_back_past_a_corrupt_newest(
    tmp_path: Path, store: Store
) -> None:
    """A fresh host restores checkpoint-3 when checkpoint-4 is corrupt in the store, logs 4
    as an error and starts the trainer from 3; started again without output_dir it skips 4
    without downloading it, and 4 saved again by the trainer is stored over the corrupt one."""
    committed_1_to_4(tmp_path, store)
    store.flip_byte("checkpoint-4", "shard-1.bin")
    cfg = host(tmp_path, "fresh", store, trainer_toml(tmp_path, "fresh"))
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for(is_event("child_output", child="trainer", line="training"), timeout=90)
        corrupt = daemon.wait_for("checkpoint_corrupt", timeout=5)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert corrupt["level"] == "error"
    assert corrupt["tag"] == "checkpoint-4"
    assert "shard-1.bin" in corrupt["error"]
    restored = [e["tag"] for e in daemon.named("checkpoint_restored")]
    assert restored == ["checkpoint-3"]
    out = tmp_path / "fresh/out"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-3"]
    assert (tmp_path / "fresh/resumed.txt").read_text().split() == [str(out / "checkpoint-3")]

    # The same host, output_dir lost (an ephemeral disk), state_dir kept.
    shutil.rmtree(out)
    out.mkdir()
    cfg.write_text(cfg.read_text().replace(
        trainer_toml(tmp_path, "fresh"), trainer_toml(tmp_path, "fresh", save=True)))
    again = DaemonProcess(cfg)
    try:
        again.wait_for(is_event("checkpoint_committed", tag="checkpoint-4"), timeout=90)
        assert again.stop() == 0
    finally:
        again.kill()
    assert [e["tag"] for e in again.named("restore_starting")] == ["checkpoint-3"]
    assert [e["tag"] for e in again.named("restore_skipped_corrupt")] == ["checkpoint-4"]
    assert not again.named("checkpoint_corrupt")
    resumed = (tmp_path / "fresh/resumed.txt").read_text().split()
    assert resumed == [str(out / "checkpoint-3")] * 2
    assert store.read("checkpoint-4", "shard-0.bin") == (out / "checkpoint-4/shard-0.bin"
                                                         ).read_bytes()
    checked = traind("verify", "-c", str(cfg), "checkpoint-4")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    journal = Journal.in_state_dir(tmp_path / "fresh/state", host_run(tmp_path, "fresh"))
    try:
        assert await journal.corrupt() == {}  # committed again: the record is gone
    finally:
        journal.close()


def test_pull_latest_falls_back_and_pull_tag_refuses(tmp_path: Path, store: Store) -> None:
    """``pull latest`` restores the newest checkpoint that verifies and says it passed over
    the corrupt one; ``pull`` of the corrupt tag exits non-zero and leaves nothing behind."""
    committed_1_to_4(tmp_path, store)
    store.flip_byte("checkpoint-4", "shard-0.bin")
    cfg = host(tmp_path, "laptop", store)
    dest = tmp_path / "pulled"
    latest = traind("pull", "-c", str(cfg), "latest", str(dest))
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout.strip() == str(dest / "checkpoint-3")
    assert "checkpoint-4 (latest) is corrupt in the store; pulled checkpoint-3" in latest.stderr
    assert (dest / "checkpoint-3/shard-0.bin").read_bytes() == (
        tmp_path / "writer/out/checkpoint-3/shard-0.bin").read_bytes()
    named = traind("pull", "-c", str(cfg), "checkpoint-4", str(dest))
    assert named.returncode == 1
    assert "checkpoint checkpoint-4 failed verification: shard-0.bin: sha256" in named.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["checkpoint-3"]


def test_verify_reports_every_bad_file(tmp_path: Path, store: Store) -> None:
    """``verify`` exits 0 on a clean store; with a flipped byte and a missing object it names
    exactly those files (``--all`` and by tag) and exits 1."""
    committed_1_to_4(tmp_path, store)
    cfg = host(tmp_path, "checker", store)
    (tmp_path / "checker/state").mkdir()  # the scratch files go there
    clean = traind("verify", "-c", str(cfg))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert [line.split(":")[0] for line in clean.stdout.splitlines()[:4]] == [
        f"checkpoint-{n}" for n in range(1, 5)]
    assert "4 OK, 0 with problems" in clean.stdout

    store.flip_byte("checkpoint-4", "shard-1.bin")
    store.remove("checkpoint-2", "trainer_state.json")
    every = traind("verify", "-c", str(cfg), "--all")
    assert every.returncode == 1
    problems = [line.strip() for line in every.stdout.splitlines() if line.startswith("  ")]
    assert len(problems) == 2, every.stdout
    assert problems[0].startswith("trainer_state.json: ")
    assert "missing" in problems[0]
    assert problems[1].startswith("shard-1.bin: sha256 ")
    assert "checkpoint-1: OK" in every.stdout
    assert "checkpoint-3: OK" in every.stdout
    assert "2 OK, 2 with problems" in every.stdout

    one = traind("verify", "-c", str(cfg), "checkpoint-4")
    assert one.returncode == 1
    assert "checkpoint-4: 1 of 3 files do not match" in one.stdout
    good = traind("verify", "-c", str(cfg), "checkpoint-3")
    assert good.returncode == 0, good.stdout
    assert list((tmp_path / "checker/state").iterdir()) == []  # scratch files removed


async def test_verify_records_and_forgets_corrupt_checkpoints(tmp_path: Path,
                                                             store: Store) -> None:
    """``verify`` on a host with a journal records a corrupt checkpoint there (restores pass
    over it without downloading it) and forgets it once it verifies again, repaired."""
    committed_1_to_4(tmp_path, store)
    cfg = host(tmp_path, "checker", store)
    Journal.in_state_dir(tmp_path / "checker/state", host_run(tmp_path, "checker")).close()
    good = store.read("checkpoint-4", "shard-0.bin")
    store.flip_byte("checkpoint-4", "shard-0.bin")
    assert traind("verify", "-c", str(cfg)).returncode == 1
    journal = Journal.in_state_dir(tmp_path / "checker/state", host_run(tmp_path, "checker"))
    try:
        recorded = await journal.corrupt()
        assert [tag for tag, _ in recorded] == ["checkpoint-4"]
        assert next(iter(recorded.values())).startswith("shard-0.bin: sha256 ")
        store.write("checkpoint-4", "shard-0.bin", good)
        assert traind("verify", "-c", str(cfg), "latest").returncode == 0
        assert await journal.corrupt() == {}
    finally:
        journal.close()


def test_a_torn_resume_point_corrupt_in_the_store_is_saved_again(
    tmp_path: Path, store: Store
) -> None:
    """checkpoint-4 torn on disk and corrupt in the store: the trainer resumes from 3, and
    the checkpoint-4 it then saves again is stored over the corrupt one."""
    cfg = host(tmp_path, "h", store, trainer_toml(tmp_path, "h", save=True))
    out = tmp_path / "h/out"
    for step in (3, 4):
        write_checkpoint(out, step)
        pushed = traind("push", "-c", str(cfg), str(out / f"checkpoint-{step}"))
        assert pushed.returncode == 0, pushed.stderr
    (out / "checkpoint-4/shard-0.bin").write_bytes(b"torn")  # killed while saving it again
    store.flip_byte("checkpoint-4", "shard-1.bin")
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for(is_event("checkpoint_committed", tag="checkpoint-4"), timeout=90)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert [e["tag"] for e in daemon.named("checkpoint_corrupt")] == ["checkpoint-4"]
    assert (tmp_path / "h/resumed.txt").read_text().split() == [str(out / "checkpoint-3")]
    assert store.read("checkpoint-4", "shard-0.bin") == (out / "checkpoint-4/shard-0.bin"
                                                         ).read_bytes()
    checked = traind("verify", "-c", str(cfg))
    assert checked.returncode == 0, checked.stdout + checked.stderr
