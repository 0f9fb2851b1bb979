"""A multi-node job's resume agreement on S3 (checkpoints/agreement.py): start requests with
the nonce in the key, so node 0 learns every rank's from one listing, and one small board.

Node R's request is the empty object ``.traind-resume/start-<R>-<nonce>``: a LIST returns
no bodies, so node 0's poll is one listing per 1000 ranks however many hosts ask. A host
deletes its older requests before putting a new one, so a rank has one at a time; should
two be listed (a delete not yet seen), the newest wins. The board is
``.traind-resume/board.json``: one GET per poll for every other host, 404 before node 0
wrote one. A throttled listing or read (503 SlowDown) is retried by ``Ops.call`` and raised
when retries run out, never read as "no requests" or "no board".
"""

from __future__ import annotations

from typing import Any

from traind.layout.keys import check_component
from traind.layout.parts import Part, part_rank
from traind.storage.s3.claim import get, put_new
from traind.storage.s3.client import Ops
from traind.storage.tasks import fan_out

REQUEST = "start-"
BOARD = "board.json"


def request_key(base: str, rank: int, nonce: str) -> str:
    """Node ``rank``'s request ``nonce`` under the agreement prefix ``base``."""
    return f"{base}{REQUEST}{rank}-{check_component(nonce, 'start request nonce')}"


async def _listed(ops: Ops, prefix: str) -> list[dict[str, Any]]:
    """Every object under ``prefix`` as listed (key, size, time): one request per page."""
    return [obj async for page in ops.pages(prefix) for obj in page.get("Contents", [])]


async def request_start(ops: Ops, base: str, rank: int, nonce: str) -> None:
    """Replace node ``rank``'s request with ``nonce``: its older ones deleted first."""
    key = request_key(base, rank, nonce)
    for obj in await _listed(ops, f"{base}{REQUEST}{rank}-"):
        if str(obj["Key"]) != key:
            await ops.call("delete_object", str(obj["Key"]))
    await put_new(ops, key, b"", conditional=False)


async def withdraw_start(ops: Ops, base: str, rank: int, nonce: str) -> None:
    """Delete node ``rank``'s request ``nonce`` (one of another nonce is another key)."""
    await ops.call("delete_object", request_key(base, rank, nonce))


async def start_requests(ops: Ops, base: str) -> dict[int, str]:
    """Every rank's request, rank → nonce, from the names of one listing."""
    newest: dict[int, tuple[Any, str]] = {}
    for obj in await _listed(ops, base + REQUEST):
        rank, sep, nonce = str(obj["Key"])[len(base + REQUEST):].partition("-")
        if not (rank.isdigit() and sep and nonce):
            continue
        seen = (obj.get("LastModified"), nonce)
        if int(rank) not in newest or _later(seen, newest[int(rank)]):
            newest[int(rank)] = seen
    return {rank: nonce for rank, (_, nonce) in newest.items()}


def _later(a: tuple[Any, str], b: tuple[Any, str]) -> bool:
    """Whether request ``a`` was stored after ``b`` (their listed times; None is oldest)."""
    if a[0] is None or b[0] is None:
        return b[0] is None and a[0] is not None
    return bool(a[0] > b[0])


async def write_board(ops: Ops, base: str, data: bytes) -> None:
    """Replace the board (node 0 alone writes it)."""
    await put_new(ops, base + BOARD, data, conditional=False)


async def read_board(ops: Ops, base: str) -> bytes | None:
    """The board, None before node 0 wrote one: one GET."""
    return await get(ops, base + BOARD)


async def uncommitted(ops: Ops, run_prefix: str, manifest_name: str, reserved: str,
                      limit: int) -> dict[str, list[Part]]:
    """Every tag under ``run_prefix`` with part manifests and no ``manifest_name``, with
    its parts: one listing of the run, and part bodies read (``limit`` at once) only for
    those tags."""
    keys: dict[str, set[str]] = {}
    for obj in await _listed(ops, run_prefix):
        tag, _, name = str(obj["Key"])[len(run_prefix):].partition("/")
        if tag != reserved and name and "/" not in name:
            keys.setdefault(tag, set()).add(name)
    wanted = [(tag, name) for tag, names in sorted(keys.items()) if manifest_name not in names
              for name in sorted(names) if part_rank(name) is not None]
    bodies = await fan_out(wanted, limit,
                           lambda tag_name: get(ops, f"{run_prefix}{tag_name[0]}/{tag_name[1]}"))
    found: dict[str, list[Part]] = {}
    for (tag, _), data in zip(wanted, bodies, strict=True):
        if data is not None:  # None: deleted meanwhile
            found.setdefault(tag, []).append(Part.from_json(data))
    return found
