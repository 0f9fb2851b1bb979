"""A claim is a lease over SFTP to a real sshd: a dead writer's stale claim is taken over
with everything it left, and of two takers one wins."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs
from tests.integration.ssh.conftest import MakeBackend
from tests.support.sshd import SSHServer
from tests.support.writers import (
    check_own_bytes,
    close,
    commit_when_stale,
    dead_writer,
    race_for_stale_claim,
    side,
)

TAG = "checkpoint-1"


async def test_a_dead_writers_claim_is_taken_over_with_all_it_left(
    sshd: SSHServer, make_backend: MakeBackend, remote: Path, tmp_path: Path,
) -> None:
    """A writer that died mid-upload over SFTP: once its claim is stale the next writer
    takes it over, removes what it left (a subdirectory too) and commits its own bytes."""
    dead = await dead_writer(tmp_path, make_backend(sshd))
    tag_dir = remote / "store" / "run1" / TAG
    (tag_dir / "sub").mkdir()
    (tag_dir / "sub" / "half.bin").write_bytes(b"half")
    fresh = await side(tmp_path, "b", make_backend(sshd), steps=1, claim_ttl=1.0)
    try:
        with capture_logs() as logs:
            await commit_when_stale(fresh, TAG)
        await check_own_bytes(fresh, make_backend(sshd), TAG, tmp_path)
    finally:
        close([dead, fresh])
    assert [e["holder"] for e in logs if e["event"] == "checkpoint_claim_taken_over"] == [
        str(dead.writer)]
    left = {p.name for p in tag_dir.iterdir()}
    assert left - {n for n in left if n.startswith("traind-takeover-")} == {
        *fresh.written[TAG], "traind-manifest.json", "traind-writer.json"}


async def test_two_takers_of_a_stale_claim_one_wins(
    sshd: SSHServer, make_backend: MakeBackend, tmp_path: Path,
) -> None:
    """Two writers (own connections) meeting one stale claim at once: the exclusive create
    of the takeover marker lets one through; the other meets its commit."""
    await race_for_stale_claim(tmp_path, lambda: make_backend(sshd), TAG)
