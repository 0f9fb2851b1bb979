"""A multi-node job's resume agreement over SFTP (checkpoints/agreement.py), laid out as on
a local disk: node R's request ``.traind-resume/start-<R>.json`` holding its nonce, and
node 0's ``board.json``, each written whole under a temporary name and renamed.
"""

from __future__ import annotations

import asyncio
import posixpath

import asyncssh

from traind.layout.parts import Part, part_rank
from traind.storage.ssh.sftp import makedirs, read_bytes, remove, write_bytes

REQUEST = "start-"
BOARD = "board.json"


def request_path(base: str, rank: int) -> str:
    """Node ``rank``'s request under the agreement directory ``base``."""
    return posixpath.join(base, f"{REQUEST}{rank}.json")


async def request_start(sftp: asyncssh.SFTPClient, base: str, rank: int, nonce: str) -> None:
    """Replace node ``rank``'s request with ``nonce``, atomically."""
    await makedirs(sftp, {base})
    await write_bytes(sftp, request_path(base, rank), nonce.encode())


async def withdraw_start(sftp: asyncssh.SFTPClient, base: str, rank: int, nonce: str) -> None:
    """Remove node ``rank``'s request while it is still ``nonce``."""
    path = request_path(base, rank)
    if (data := await read_bytes(sftp, path)) is not None and \
            data.decode(errors="replace") == nonce:
        await remove(sftp, path)


async def start_requests(sftp: asyncssh.SFTPClient, base: str) -> dict[int, str]:
    """Every rank's request, rank → nonce: one directory listing, then the requests read."""
    try:
        names = await sftp.listdir(base)
    except asyncssh.SFTPNoSuchFile:
        return {}
    ranks = sorted(int(stem) for n in names if n.startswith(REQUEST) and n.endswith(".json")
                   if (stem := n[len(REQUEST):-len(".json")]).isdigit())
    bodies = await asyncio.gather(*(read_bytes(sftp, request_path(base, r)) for r in ranks))
    return {rank: data.decode(errors="replace") for rank, data in zip(ranks, bodies, strict=True)
            if data is not None}  # None: withdrawn meanwhile


async def write_board(sftp: asyncssh.SFTPClient, base: str, data: bytes) -> None:
    """Replace the board (node 0 alone writes it), atomically."""
    await makedirs(sftp, {base})
    await write_bytes(sftp, posixpath.join(base, BOARD), data)


async def read_board(sftp: asyncssh.SFTPClient, base: str) -> bytes | None:
    """The board, None before node 0 wrote one."""
    return await read_bytes(sftp, posixpath.join(base, BOARD))


async def uncommitted(sftp: asyncssh.SFTPClient, root: str, manifest_name: str,
                      reserved: str) -> dict[str, list[Part]]:
    """Every tag directory under ``root`` with part manifests and no ``manifest_name``,
    with its parts: the run's listing, each tag's, and part bodies only for those tags."""
    try:
        tags = sorted(n for n in await sftp.listdir(root) if n not in {".", "..", reserved})
    except asyncssh.SFTPNoSuchFile:
        return {}
    listings = await asyncio.gather(*(_names(sftp, posixpath.join(root, t)) for t in tags))
    found: dict[str, list[Part]] = {}
    for tag, names in zip(tags, listings, strict=True):
        part_names = sorted(n for n in names if part_rank(n) is not None)
        if not part_names or manifest_name in names:
            continue
        bodies = await asyncio.gather(*(read_bytes(sftp, posixpath.join(root, tag, n))
                                        for n in part_names))
        if parts := [Part.from_json(b) for b in bodies if b is not None]:
            found[tag] = parts
    return found


async def _names(sftp: asyncssh.SFTPClient, path: str) -> set[str]:
    """The names in directory ``path``; none when it is gone or is a file."""
    try:
        return set(await sftp.listdir(path))
    except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPFailure, asyncssh.SFTPNotADirectory):
        return set()
