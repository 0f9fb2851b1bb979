"""container/Dockerfile, built by a real dockerd through its /build API on a base imported
from this machine (tests/support/rootfs.py) and run: traind as the entrypoint commits to a
bind-mounted local store, and ``docker stop`` ends it with the newest checkpoint committed."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from pathlib import Path

import aiodocker
import pytest
from tests.support.checkpoints import stored
from tests.support.dockerd import Dockerd

pytestmark = pytest.mark.timeout(300)
CHECKOUT = Path(__file__).resolve().parents[3]
RECIPE = "traind-recipe:test"
TRAINER = """\
import json, os, sys, time
out, step = sys.argv[1], 0
while True:
    step += 1
    d = os.path.join(out, f"checkpoint-{step}")
    os.makedirs(d)
    with open(os.path.join(d, "weights.bin"), "wb") as f:
        f.write(os.urandom(4096))
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step}, f)
    print(f"step={step}", flush=True)
    time.sleep(1)
"""
"""A stdlib trainer: a checkpoint a second, until it is stopped."""


def build_context() -> bytes:
    """The build context `docker build .` in the checkout sends: the recipe, traind's source."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("container/Dockerfile", "pyproject.toml", "README.md", "daemon"):
            tar.add(CHECKOUT / name, arcname=name,
                    filter=lambda info: None if "__pycache__" in info.name else info)
    return buffer.getvalue()


async def build(docker: aiodocker.Docker, base: str) -> None:
    """``POST /build`` of the recipe FROM ``base``, no network (pip offline)."""
    args = {"BASE": base, "PIP_ARGS": "--no-deps --no-build-isolation --no-index"}
    async with docker._query(  # aiodocker's build has no networkmode
        "build", "POST", data=build_context(), headers={"Content-Type": "application/x-tar"},
        params={"dockerfile": "container/Dockerfile", "t": RECIPE, "networkmode": "none",
                "buildargs": json.dumps(args), "rm": "1", "forcerm": "1"},
    ) as response:
        said = await response.text()
    assert '"error"' not in said, said[-2000:]


async def test_recipe_builds_runs_and_commits_on_docker_stop(
    tmp_path: Path, dockerd: Dockerd, base_image: str
) -> None:
    """The recipe builds FROM a base given as a build argument; its entrypoint is traind,
    which commits checkpoints to the bind-mounted store; ``docker stop -t 10`` (SIGTERM) ends
    it with exit status 0 and the trainer's newest checkpoint committed."""
    (tmp_path / "trainer.py").write_text(TRAINER)
    (tmp_path / "traind.toml").write_text(f"""
[run]
name = "recipe"
output_dir = "/work/out"
state_dir = "/var/lib/traind"
stop_timeout = "8s"

[checkpoints]
settle = "200ms"
poll_interval = "200ms"

[storage]
type = "local"
path = "{tmp_path / "store"}"

[status]
enabled = false

[trainer]
command = ["python3", "{tmp_path / "trainer.py"}", "/work/out"]
""")
    async with aiodocker.Docker(url=dockerd.host) as docker:
        await asyncio.wait_for(build(docker, base_image), 240)
        container = await docker.containers.create({
            "Image": RECIPE, "Labels": {"traind-test": "recipe"},
            "Env": [f"TRAIND_CONFIG={tmp_path / 'traind.toml'}"],
            "HostConfig": {"NetworkMode": "none", "Binds": [f"{tmp_path}:{tmp_path}"]},
        })
        try:
            await container.start()
            while len(stored(tmp_path / "store", "recipe")) < 2:
                assert (await container.show())["State"]["Running"], await container.log(
                    stdout=True, stderr=True)
                await asyncio.sleep(0.2)
            await asyncio.wait_for(container.stop(t=10), 30)
            state = (await container.show())["State"]
            logs = "".join(await container.log(stdout=True, stderr=True))
            assert state["ExitCode"] == 0, logs[-3000:]
            written = await written_steps(container)
            committed = stored(tmp_path / "store", "recipe")
            assert f"checkpoint-{max(written)}" in committed, (written, sorted(committed))
            assert '"event": "checkpoint_committed"' in logs  # JSON logs on stdout
        finally:
            await container.delete(force=True)


async def written_steps(container: aiodocker.containers.DockerContainer) -> list[int]:
    """The steps of the checkpoints the trainer wrote to the container's own disk."""
    archive = await container.get_archive("/work/out")
    names = {Path(m.name).parts[1] for m in archive.getmembers() if len(Path(m.name).parts) > 1}
    return [int(n.removeprefix("checkpoint-")) for n in names if n.startswith("checkpoint-")]
