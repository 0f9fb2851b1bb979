"""Parts of a multi-node checkpoint over SFTP: one claim per node rank, files never written
over another host's, part manifests beside the files, and their ranks from one listing.

As on a local disk: a part claim ``<tag>/traind-writer-<rank>.json`` is an exclusive
create, and a part's file is uploaded under a name of its own, then hard-linked into place
(``hardlink@openssh.com``), which fails when another host stored that path first; then the
stored file is hashed and kept when its bytes are this host's.
"""

from __future__ import annotations

import hashlib
import posixpath
import secrets
from typing import cast

import asyncssh

from traind.layout.keys import CLAIM_NAME
from traind.layout.manifest import Writer
from traind.layout.parts import (
    PART_CLAIM_PREFIX,
    Part,
    part_claim_name,
    part_name,
    part_rank,
)
from traind.storage.fileio import PART_SUFFIX
from traind.storage.ssh.sftp import create_new, makedirs, read_bytes, remove, rename

CHUNK = 1024 * 1024
"""Bytes read at a time when a stored file is hashed to compare it with this host's."""


async def claim_part(sftp: asyncssh.SFTPClient, base: str, rank: int, writer: Writer
                     ) -> tuple[bytes | None, bytes | None]:
    """Create node ``rank``'s part claim under ``base`` for ``writer`` unless one is there;
    return (the claim found there instead, or None when this call made it; the whole tag's
    single-writer claim, read after ours exists). A claim made here is removed again when
    a single writer holds the tag."""
    path = posixpath.join(base, part_claim_name(rank))
    await makedirs(sftp, {base})
    found = None if await create_new(sftp, path, writer.to_json()) else (
        await read_bytes(sftp, path) or b"")
    whole = await read_bytes(sftp, posixpath.join(base, CLAIM_NAME))
    if whole is not None and found is None:
        await remove(sftp, path)
    return found, whole


async def any_part_claim(sftp: asyncssh.SFTPClient, base: str) -> bytes | None:
    """A part claim stored under ``base`` (a multi-node job's tag), if any."""
    try:
        names = await sftp.listdir(base)
    except asyncssh.SFTPNoSuchFile:
        return None
    for name in sorted(names):
        if name.startswith(PART_CLAIM_PREFIX) and name.endswith(".json"):
            return await read_bytes(sftp, posixpath.join(base, name))
    return None


def staged_name(remote: str) -> str:
    """A name of this host's own beside ``remote``, to upload a part's file under."""
    return f"{remote}.{secrets.token_hex(6)}{PART_SUFFIX}"


async def link_once(sftp: asyncssh.SFTPClient, staged: str, remote: str) -> str | None:
    """Put ``staged`` in place as ``remote`` unless a file is there; return None when it
    went in, else the sha256 of the file stored there. ``staged`` is removed either way."""
    try:
        try:
            await sftp.link(staged, remote)
            return None
        except asyncssh.SFTPOpUnsupported:  # no hard links: look, then rename
            if not await sftp.exists(remote):
                await rename(sftp, staged, remote)
                return None
        except (asyncssh.SFTPFailure, asyncssh.SFTPFileAlreadyExists):
            if not await sftp.exists(remote):  # SFTP v3 reports "exists" as a plain failure
                raise
        return await sha256_of(sftp, remote)
    finally:
        await remove(sftp, staged)


async def sha256_of(sftp: asyncssh.SFTPClient, remote: str) -> str:
    """The sha256 of a remote file, read in chunks."""
    digest = hashlib.sha256()
    async with await sftp.open(remote, "rb", block_size=-1, max_requests=128) as f:
        offset = 0
        while chunk := cast(bytes, await f.read(CHUNK, offset)):  # opened "rb": bytes
            digest.update(chunk)
            offset += len(chunk)
    return digest.hexdigest()


async def part_ranks(sftp: asyncssh.SFTPClient, base: str) -> set[int]:
    """The node ranks with a part manifest under ``base``: one directory listing."""
    try:
        names = await sftp.listdir(base)
    except asyncssh.SFTPNoSuchFile:
        return set()
    return {rank for name in names if (rank := part_rank(name)) is not None}


async def parts(sftp: asyncssh.SFTPClient, base: str) -> list[Part]:
    """Every part manifest under ``base``."""
    found = []
    for rank in sorted(await part_ranks(sftp, base)):
        if (data := await read_bytes(sftp, posixpath.join(base, part_name(rank)))) is not None:
            found.append(Part.from_json(data))
    return found
