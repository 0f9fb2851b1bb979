"""The SSH backend: checkpoints on any host you can ssh into, over SFTP (or rsync).

Layout and contract are the local backend's: ``<remote_path>/<run>/<tag>/<path>``, each file
written as ``<name>.traind-part`` and renamed once whole and fsynced, the manifest
``traind-manifest.json`` written last by ``commit``. Every remote operation is an SFTP call
(no shell), and tags and paths are validated again here before they become remote paths.
The connection lives in ``link`` (host keys, reconnects); file data moves by
``transfer``: over asyncssh (``sftp``), over the system ssh client speaking SFTP
(``openssh/``), or with rsync (``rsync``). Metadata always goes over asyncssh,
the claim (``traind-writer.json``) and the manifest as exclusive creates.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
from collections.abc import Collection, Sequence
from pathlib import Path

import asyncssh
import structlog

from traind.config import SSHStorage
from traind.errors import ConflictError, IntegrityError, StorageError, TransientStorageError
from traind.layout.keys import (
    AGREEMENT_DIR,
    CLAIM_NAME,
    MANIFEST_NAME,
    check_component,
    check_relpath,
    check_tag,
)
from traind.layout.manifest import FileEntry, Manifest, Writer, listed
from traind.layout.parts import Part, PartsDisagreeError, part_claim_name, part_name
from traind.storage.base import Advance, LocalFile, UploadSession
from traind.storage.claim import (
    Lease,
    check_claim,
    check_committed,
    check_held,
    check_lease,
    is_claim_file,
)
from traind.storage.ssh import agreement as ssh_agreement
from traind.storage.ssh import parts as ssh_parts
from traind.storage.ssh import rsync as ssh_rsync
from traind.storage.ssh.errors import translate
from traind.storage.ssh.link import SSHLink
from traind.storage.ssh.openssh.transfer import OpenSSHTransfer
from traind.storage.ssh.sftp import (
    create_new,
    get_file,
    makedirs,
    parents,
    put_file,
    read_bytes,
    remove,
    write_bytes,
)
from traind.storage.tasks import fan_out

log = structlog.get_logger("traind.ssh")


class SSHBackend:
    """Checkpoints under ``<remote_path>/<run>/<tag>/`` on an SSH host."""

    def __init__(self, config: SSHStorage, run: str) -> None:
        self._config = config
        self._root = posixpath.join(config.remote_path, check_component(run, "run name"))
        self._link = SSHLink(config)
        self._rsync = ssh_rsync.RsyncTransfer(config, self._link)
        self._openssh = OpenSSHTransfer(self._link) if config.transfer == "openssh" else None

    @property
    def describe(self) -> str:
        """``ssh://user@host:port/<remote_path>/<run>`` (``/~/`` when relative to home)."""
        target = self._link.target
        root = self._root if self._root.startswith("/") else f"~/{self._root}"
        return f"ssh://{target.user}@{target.host}:{target.port}/{root.lstrip('/')}"

    def _tag_dir(self, tag: str) -> str:
        return posixpath.join(self._root, check_tag(tag))

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        """Store ``files`` under ``tag``: SFTP (``concurrency`` files at once) or one rsync run;
        ``session.file_done`` as each file is durably in place."""
        base = self._tag_dir(tag)
        remote = {f.path: posixpath.join(base, check_relpath(f.path)) for f in files}
        dirs = parents([*remote.values(), posixpath.join(base, MANIFEST_NAME)])
        await self._link.call(f"create {base}", lambda sftp: makedirs(sftp, dirs))
        if self._config.transfer == "rsync":
            await self._rsync.upload(base, root, files, session)
        else:

            async def one(f: LocalFile) -> None:
                _, sha = await self._put(root / f.path, remote[f.path], f.size, session.advance)
                await session.file_done(f.path, sha)

            await fan_out(files, self._config.concurrency, one)

    async def _put(
        self, local: Path, remote: str, size: int, advance: Advance
    ) -> tuple[int, str]:
        if self._openssh:
            return await self._openssh.put(local, remote, size, advance)
        return await self._link.call(
            f"upload {remote}", lambda sftp: put_file(sftp, local, remote, advance))

    async def _get(
        self, remote: str, local: Path, size: int, advance: Advance
    ) -> tuple[int, str]:
        if self._openssh:
            return await self._openssh.get(remote, local, size, advance)
        return await self._link.call(
            f"download {remote}", lambda sftp: get_file(sftp, remote, local, advance))

    def _where(self, path: str) -> str:
        return f"{self._link.target.host}:{path}"

    async def claim(self, tag: str, writer: Writer) -> None:
        """Create ``traind-writer.json`` exclusively, or find it is ``writer``'s already."""
        base = self._tag_dir(tag)
        path = posixpath.join(base, CLAIM_NAME)

        async def op(sftp: asyncssh.SFTPClient) -> tuple[bytes | None, bytes | None]:
            await makedirs(sftp, {base})
            claimed = None if await create_new(sftp, path, Lease.new(writer).to_json()) else (
                await read_bytes(sftp, path) or b"")
            return claimed, await read_bytes(sftp, posixpath.join(base, MANIFEST_NAME))

        claimed, data = await self._link.call(f"claim {base}", op)
        if claimed == b"":  # taken over or pruned meanwhile: the next attempt finds it free
            raise TransientStorageError(f"{tag}: the claim {self._where(path)} vanished")
        if claimed is not None:
            check_lease(tag, writer, Lease.from_json(claimed),
                        Manifest.from_json(data) if data else None, self._where(path))
            return
        try:  # committed by a traind from before claims: a manifest without a claim
            check_committed(tag, writer, Manifest.from_json(data) if data else None,
                            self._where(base))
            holder = await self._link.call(f"claim {base}",
                                           lambda sftp: ssh_parts.any_part_claim(sftp, base))
            if holder is not None:  # a multi-node job's tag
                raise ConflictError(tag, str(writer), str(Writer.from_json(holder)),
                                    self._where(base))
        except StorageError:
            await self._link.call(f"unclaim {base}", lambda sftp: remove(sftp, path))
            raise

    async def _lease(self, tag: str) -> Lease | None:
        path = posixpath.join(self._tag_dir(tag), CLAIM_NAME)
        data = await self._link.call(f"read {path}", lambda sftp: read_bytes(sftp, path))
        return Lease.from_json(data) if data is not None else None

    async def renew(self, tag: str, writer: Writer) -> None:
        """Rewrite this writer's claim renewed now; ConflictError once it is not its own."""
        await self._renew(tag, writer, None)

    async def release(self, tag: str, writer: Writer) -> None:
        """Mark this writer's claim stale at once; another's is left alone."""
        found = await self._lease(tag)
        if found is not None and found.writer.id == writer.id:
            await self._renew(tag, writer, 0.0)

    async def _renew(self, tag: str, writer: Writer, at: float | None) -> None:
        path = posixpath.join(self._tag_dir(tag), CLAIM_NAME)
        found = check_held(tag, writer, await self._lease(tag), self._where(path))
        body = found.renewed(at).to_json()
        await self._link.call(f"renew {path}", lambda sftp: write_bytes(sftp, path, body))

    async def take_over(self, tag: str, stale: Lease, writer: Writer) -> bool:
        """Create the takeover marker exclusively, then remove the stale writer's files and
        its claim; False when another writer got the marker or the claim was renewed."""
        base = self._tag_dir(tag)
        claim, marker = posixpath.join(base, CLAIM_NAME), posixpath.join(base, stale.marker)

        async def op(sftp: asyncssh.SFTPClient) -> bool:
            if not await create_new(sftp, marker, writer.to_json()):
                return False
            found = await read_bytes(sftp, claim)
            if found is None or Lease.from_json(found) != stale:  # renewed: its writer lives
                await remove(sftp, marker)
                return False
            for entry in await sftp.readdir(base):
                name = str(entry.filename)
                if name in {".", ".."} or is_claim_file(name):
                    continue
                if entry.attrs.type == asyncssh.FILEXFER_TYPE_DIRECTORY:
                    await sftp.rmtree(posixpath.join(base, name))
                else:
                    await remove(sftp, posixpath.join(base, name))
            await remove(sftp, claim)
            return True

        return await self._link.call(f"take over {base}", op)

    async def claim_part(self, tag: str, rank: int, writer: Writer) -> None:
        """Create node ``rank``'s part claim exclusively, or find it ``writer``'s already."""
        base = self._tag_dir(tag)
        path = posixpath.join(base, part_claim_name(rank))
        found, whole = await self._link.call(
            f"claim {path}", lambda sftp: ssh_parts.claim_part(sftp, base, rank, writer))
        if found == b"":  # pruned meanwhile: the next attempt finds it free
            raise TransientStorageError(f"{tag}: the part claim {self._where(path)} vanished")
        if found is not None:
            check_claim(tag, writer, Writer.from_json(found), self._where(path))
        if whole is not None:
            raise ConflictError(tag, str(writer), str(Writer.from_json(whole)),
                                self._where(posixpath.join(base, CLAIM_NAME)))

    async def part_claim(self, tag: str, rank: int) -> Writer | None:
        """Who holds node ``rank``'s part of ``tag``, or None."""
        path = posixpath.join(self._tag_dir(tag), part_claim_name(rank))
        data = await self._link.call(f"read {path}", lambda sftp: read_bytes(sftp, path))
        return Writer.from_json(data) if data is not None else None

    async def upload_part(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        """Send each file under a name of its own and link it into place (SFTP or the
        openssh mode; rsync's runs cannot refuse a stored file), keeping a file another
        host stored with the same bytes; PartsDisagreeError when its bytes differ."""
        base = self._tag_dir(tag)
        remote = {f.path: posixpath.join(base, check_relpath(f.path)) for f in files}
        dirs = parents([*remote.values(), posixpath.join(base, MANIFEST_NAME)])
        await self._link.call(f"create {base}", lambda sftp: makedirs(sftp, dirs))
        async def one(f: LocalFile) -> None:
            target, staged = remote[f.path], ssh_parts.staged_name(remote[f.path])
            _, sha = await self._put(root / f.path, staged, f.size, session.advance)
            there = await self._link.call(
                f"store {target}", lambda sftp: ssh_parts.link_once(sftp, staged, target))
            if there is not None and there != sha:
                raise PartsDisagreeError(
                    f"{tag}: {f.path} in the store ({self._where(target)}) differs from this "
                    f"host's (sha256 {there[:12]}… != {sha[:12]}…); another node saved other "
                    "bytes under the same path")
            await session.file_done(f.path, sha)

        await fan_out(files, self._config.concurrency, one)

    async def commit_part(self, part: Part) -> None:
        """Write ``part``'s manifest beside its files."""
        path = posixpath.join(self._tag_dir(part.tag), part_name(part.node_rank))
        data = part.to_json()
        await self._link.call(f"store {path}", lambda sftp: write_bytes(sftp, path, data))

    async def part_ranks(self, tag: str) -> set[int]:
        """The node ranks whose part manifest of ``tag`` is stored: one directory listing."""
        base = self._tag_dir(tag)
        return await self._link.call(f"list {base}",
                                     lambda sftp: ssh_parts.part_ranks(sftp, base))

    async def parts(self, tag: str) -> list[Part]:
        """Every part manifest stored for ``tag``."""
        base = self._tag_dir(tag)
        return await self._link.call(f"list {base}", lambda sftp: ssh_parts.parts(sftp, base))

    async def committed(self, tag: str) -> Manifest | None:
        """The manifest of ``tag`` when it is committed (one small read)."""
        path = posixpath.join(self._tag_dir(tag), MANIFEST_NAME)
        data = await self._link.call(f"read {path}", lambda sftp: read_bytes(sftp, path))
        return Manifest.from_json(data) if data is not None else None

    async def uncommitted(self) -> dict[str, list[Part]]:
        """Every tag with part manifests and no manifest, with its parts (node 0's look for
        checkpoints whose parts never all arrive)."""
        return await self._link.call(f"list {self._root}", lambda sftp: ssh_agreement.uncommitted(
            sftp, self._root, MANIFEST_NAME, AGREEMENT_DIR))

    @property
    def _agreement(self) -> str:
        return posixpath.join(self._root, AGREEMENT_DIR)

    async def request_start(self, rank: int, nonce: str) -> None:
        """Store node ``rank``'s start request ``nonce``, replacing its last one."""
        base = self._agreement
        await self._link.call(f"request in {base}", lambda sftp: ssh_agreement.request_start(
            sftp, base, rank, nonce))

    async def withdraw_start(self, rank: int, nonce: str) -> None:
        """Remove node ``rank``'s start request while it is still ``nonce``."""
        base = self._agreement
        await self._link.call(f"withdraw in {base}", lambda sftp: ssh_agreement.withdraw_start(
            sftp, base, rank, nonce))

    async def start_requests(self) -> dict[int, str]:
        """Every node's start request, rank → nonce."""
        base = self._agreement
        return await self._link.call(f"list {base}",
                                     lambda sftp: ssh_agreement.start_requests(sftp, base))

    async def write_board(self, data: bytes) -> None:
        """Replace the resume board, atomically."""
        base = self._agreement
        await self._link.call(f"write {base}",
                              lambda sftp: ssh_agreement.write_board(sftp, base, data))

    async def read_board(self) -> bytes | None:
        """The resume board, None before node 0 wrote one."""
        base = self._agreement
        return await self._link.call(f"read {base}",
                                     lambda sftp: ssh_agreement.read_board(sftp, base))

    async def commit(self, manifest: Manifest) -> None:
        """Create the manifest exclusively (written whole, then linked): now the checkpoint
        exists. One there already is replaced only when it is this writer's (a retry)."""
        base = self._tag_dir(manifest.tag)
        path = posixpath.join(base, MANIFEST_NAME)
        data = manifest.to_json()

        async def op(sftp: asyncssh.SFTPClient) -> bytes | None:
            await makedirs(sftp, {base})
            return None if await create_new(sftp, path, data) else await read_bytes(sftp, path)

        found = await self._link.call(f"commit {base}", op)
        if found is None:
            return
        check_committed(manifest.tag, manifest.writer, Manifest.from_json(found),
                        self._where(path))
        await self._link.call(f"commit {base}", lambda sftp: write_bytes(sftp, path, data))

    async def manifests(self) -> list[Manifest]:
        """Every committed checkpoint of the run (directories without a manifest are not)."""
        async def op(sftp: asyncssh.SFTPClient) -> list[tuple[str, bytes | None]]:
            try:
                names = await sftp.listdir(self._root)
            except asyncssh.SFTPNoSuchFile:
                return []
            paths = [posixpath.join(self._root, n, MANIFEST_NAME)
                     for n in sorted(names) if n not in {".", "..", AGREEMENT_DIR}]
            return list(zip(paths, await asyncio.gather(*(read_bytes(sftp, p) for p in paths)),
                            strict=True))

        found = await self._link.call(f"list {self._root}", op)
        host = self._link.target.host
        manifests = (listed(data, f"{host}:{path}") for path, data in found if data is not None)
        return [m for m in manifests if m is not None]

    async def download(self, manifest: Manifest, dest: Path, advance: Advance) -> dict[str, str]:
        """Fetch every file of ``manifest`` under ``dest``; return path -> sha256 as written."""
        base = self._tag_dir(manifest.tag)
        remote = {e.path: posixpath.join(base, check_relpath(e.path)) for e in manifest.files}

        async def one(entry: FileEntry) -> tuple[str, str]:
            try:
                _, sha = await self._get(remote[entry.path], dest / entry.path, entry.size,
                                         advance)
            except StorageError as exc:
                if isinstance(exc, TransientStorageError) or await self._exists(
                    remote[entry.path]
                ):
                    raise
                raise IntegrityError(
                    f"{self._link.target.host}:{remote[entry.path]}: missing from the store"
                ) from exc
            return entry.path, sha

        return dict(await fan_out(manifest.files, self._config.concurrency, one))

    async def _exists(self, remote: str) -> bool:
        """Whether ``remote`` is there: a download that failed for lack of it is a file not
        matching its manifest, not a store that failed."""
        return await self._link.call(f"stat {remote}", lambda sftp: sftp.exists(remote))

    async def delete(self, tag: str) -> None:
        """Remove the manifest first, then the checkpoint's directory; missing is fine."""
        base = self._tag_dir(tag)

        async def op(sftp: asyncssh.SFTPClient) -> None:
            await remove(sftp, posixpath.join(base, MANIFEST_NAME))
            with contextlib.suppress(asyncssh.SFTPNoSuchFile):
                for entry in await sftp.readdir(base):  # the claim goes last
                    if entry.filename in {".", "..", CLAIM_NAME}:
                        continue
                    path = posixpath.join(base, str(entry.filename))
                    if entry.attrs.type == asyncssh.FILEXFER_TYPE_DIRECTORY:
                        await sftp.rmtree(path)
                    else:
                        await remove(sftp, path)
                await sftp.rmtree(base)

        await self._link.call(f"delete {base}", op)

    async def probe(self) -> str:
        """Connect, create remote_path, write and remove a file there; say what fails."""
        link = self._link
        conn = await link.connect()  # its errors already say what failed (DNS, auth, ...)
        step = "start the SFTP subsystem on"
        try:
            sftp = await conn.start_sftp_client()
            step = "create remote_path"
            await makedirs(sftp, {self._root})
            probe = posixpath.join(self._root, f".traind-probe-{secrets.token_hex(4)}")
            step = "write a file in"
            await write_bytes(sftp, probe, b"ok")
            step = "remove a file from"
            await sftp.remove(probe)
            if self._config.transfer == "rsync":
                await ssh_rsync.probe(link, conn)
            if self._openssh:
                await self._openssh.probe()
            step = "create a file exclusively in"
            exclusive = await create_new(sftp, probe, b"1") and not await create_new(
                sftp, probe, b"2")
            await sftp.remove(probe)
        except (asyncssh.Error, OSError) as exc:
            raise translate(exc, link.target, f"{step} {self._root}") from exc
        finally:
            conn.abort()
        if not exclusive:
            log.warning("ssh_exclusive_create_ignored", root=self._root)
            return ("none: this SFTP server lets an exclusive create replace a file, so two "
                    "writers of one run.name could mix a checkpoint")
        return "exclusive create over SFTP (hard link, else O_EXCL): a tag is one writer's"

    async def cleanup(self, resume_states: Collection[str]) -> int:
        """Nothing to do: a partial file is rewritten by the next upload of its checkpoint."""
        return 0

    async def aclose(self) -> None:
        """Close the connections (and stop the ssh processes of the openssh mode)."""
        if self._openssh:
            await self._openssh.aclose()
        await self._link.aclose()
