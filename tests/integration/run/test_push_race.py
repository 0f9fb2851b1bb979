"""Two ``traind push`` commands racing for one tag on an S3 store that ignores conditional
writes (a proxy in front of SeaweedFS drops ``If-None-Match``/``If-Match``): in every one
of 20 rounds exactly one copy is committed, and the other push exits 1 naming both
writers."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from tests.support.checkpoints import write_checkpoint
from tests.support.daemon import write_config
from tests.support.requires import need_binary, need_module
from tests.support.s3proxy import throttling_proxy
from tests.support.seaweed import running_seaweed

ROUNDS = 20


async def traind(*args: str) -> tuple[int, str, str]:
    """Run the real CLI; return its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "traind", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(120):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_two_pushes_one_copy_every_round(tmp_path: Path) -> None:
    """Hosts a and b push checkpoint-N with different bytes at the same instant, 20 rounds:
    one push commits, the other exits 1 saying whose the tag is (both writers named); the
    store lists each tag once, with the winner's bytes."""
    need_module("aiobotocore")
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
        server.create_bucket("ckpts")
        async with throttling_proxy(server.endpoint, ignore_conditions=True) as proxy:
            storage = server.storage_toml("ckpts", endpoint_url=proxy.endpoint)
            cfgs = {name: write_config(tmp_path / f"{name}.toml", run="exp",
                                       output_dir=tmp_path / name / "out",
                                       state_dir=tmp_path / name / "state", storage=storage)
                    for name in "ab"}
            seconds, winners = [], []
            raced = 0
            for step in range(1, ROUNDS + 1):
                tag = f"checkpoint-{step}"
                for name in "ab":
                    write_checkpoint(tmp_path / name / "src", step, size=64 * 1024)
                    (tmp_path / name / "src" / tag / f"{name}.bin").write_bytes(name.encode())
                started = time.monotonic()
                results = await asyncio.gather(*(
                    traind("push", "-c", str(cfgs[n]), str(tmp_path / n / "src" / tag))
                    for n in "ab"))
                seconds.append(time.monotonic() - started)
                codes = sorted(rc for rc, _, _ in results)
                assert codes == [0, 1], results
                loser = next(err for rc, _, err in results if rc == 1)
                if "already committed" in loser:  # it started after the other's commit
                    assert "by writer" in loser, loser
                else:  # the race itself: both writers named, id@host
                    assert "belongs to writer" in loser, loser
                    assert loser.count("@") >= 2, loser
                    raced += 1
                winners.append("ab"[[rc for rc, _, _ in results].index(0)])
            rc, out, err = await traind("list", "-c", str(cfgs["a"]), "--json")
            assert rc == 0, err
            listed = json.loads(out)
            assert proxy.dropped > 0  # the store really ignored the conditions
    assert sorted(c["tag"] for c in listed) == sorted(f"checkpoint-{n}"
                                                       for n in range(1, ROUNDS + 1))
    print(f"{ROUNDS} rounds ({raced} raced to the claim): winners {''.join(winners)}; whole "
          f"command pairs took median {statistics.median(seconds):.2f} s, max "
          f"{max(seconds):.2f} s")
