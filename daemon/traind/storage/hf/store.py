"""The Hugging Face Hub store: objects as files of a model or dataset repo, under
``<path_in_repo>/<run>/``, through ``huggingface_hub`` (``HubRepo``: in threads).

Every change is one Hub commit. A create-only or replace-if-version put reads the branch's
head commit, looks at the file there, and commits with ``parent_commit`` set to that head:
the Hub refuses the commit (412) when anyone committed in between, and the put reads again.
So both are atomic here (``create`` and ``update`` True): of two writers racing for one tag
one commit lands first, and the other sees it. ``send`` only pre-uploads a checkpoint's files
(the LFS bytes; ``staged``): ``publish`` asks the LFS batch API that those bytes are there and
adds the files with the manifest in one commit made the same way, so a checkpoint is one
commit. A delete removes its keys in one commit (pruning a checkpoint: ``atomic_delete``).
"""

from __future__ import annotations

import asyncio
import builtins
import socket
from collections.abc import Collection, Sequence
from pathlib import Path

import structlog
from huggingface_hub import CommitOperationAdd, CommitOperationDelete
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.lfs import post_lfs_batch_info
from huggingface_hub.utils._runtime import is_xet_available

from traind.config import HFStorage
from traind.errors import IntegrityError, MissingFilesError, StorageError, TransientStorageError
from traind.layout.keys import check_key, check_relpath
from traind.storage.base import (
    CREATE,
    OVERWRITE,
    Advance,
    Blob,
    Capabilities,
    LocalFile,
    ObjectMeta,
    PutMode,
    UploadSession,
)
from traind.storage.hf.errors import MISSING
from traind.storage.hf.repo import HubRepo
from traind.storage.memory import version_of
from traind.util.tasks import fan_out

log = structlog.get_logger("traind.hf")
CAPABILITIES = Capabilities(
    create=True, update=True, atomic_delete=True, staged=True,
    claim="one Hub commit per checkpoint (files and manifest), made with parent_commit: the "
          "first writer's lands, one made on a stale head is refused (412) and looks again")
ATTEMPTS = 12
"""Reads-and-commits a conditional put tries before giving up (each 412 is another writer's
commit landing first)."""


class HFStore:
    """Objects as files of one Hub repo at one branch, under ``<path_in_repo>/<run>/``."""

    def __init__(self, config: HFStorage, run: str) -> None:
        self._config = config
        self._run = run
        self._root = "".join(f"{p}/" for p in (config.path_in_repo, run) if p)
        self._hub = HubRepo(config, self.where)
        self._host = socket.gethostname()
        self._staged: dict[str, CommitOperationAdd] = {}
        """Files pre-uploaded by ``send`` and not committed yet, by path in the repo."""

    @property
    def describe(self) -> str:
        kind = "" if self._config.repo_type == "model" else f"{self._config.repo_type}s/"
        return f"hf://{kind}{self._config.repo_id}@{self._config.revision}/{self._root}"

    def where(self, key: str) -> str:
        return self.describe + key

    async def capabilities(self) -> Capabilities:
        return CAPABILITIES

    # -- the primitives -----------------------------------------------------------------

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> bool:
        path = self._root + check_key(key)
        if mode.kind == "overwrite":
            await self._hub.commit([CommitOperationAdd(path, bytes(data))],
                                   self._message("put", key), key)
            return True
        for _ in range(ATTEMPTS):
            head = await self._hub.head()
            if not await self._allows(key, mode, head):
                return False
            if await self._hub.commit_on([CommitOperationAdd(path, bytes(data))],
                                         self._message(mode.kind, key), key, head):
                return True
        raise self._moving(key, "put")

    async def _allows(self, key: str, mode: PutMode, head: str) -> bool:
        """Whether ``mode`` lets a put of ``key`` through at commit ``head``."""
        path = self._root + key
        if mode.kind == "create":
            return path not in await self._hub.paths([path], head)
        if mode.kind == "update":
            found = await self._hub.call("download", key, self._hub.download, path, head)
            return found is not None and version_of(found) == mode.version
        return True

    def _message(self, action: str, key: str) -> str:
        return f"traind {self._run}: {action} {key} (host {self._host})"

    def _moving(self, key: str | None, op: str) -> TransientStorageError:
        return TransientStorageError(f"{self.where(key or '')}: the branch kept moving; "
                                     "retrying", code="412", status=412, key=key, op=op)

    async def get(self, key: str) -> Blob | None:
        found = await self._hub.call("download", key, self._hub.download,
                                     self._root + check_key(key), self._config.revision)
        return None if found is None else Blob(found, version_of(found))

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        found = await self._hub.call("download", key, self._hub.download,
                                     self._root + check_key(key), self._config.revision,
                                     start, end)
        if found is None:
            raise StorageError(f"{self.where(key)}: no such file", code=MISSING, key=key,
                               op="download")
        return found[:end - start]

    async def head(self, key: str) -> ObjectMeta | None:
        path = self._root + check_key(key)
        found = (await self._hub.paths([path], self._config.revision)).get(path)
        return None if found is None else ObjectMeta(key, found.size)

    async def list(self, prefix: str) -> builtins.list[ObjectMeta]:
        full = self._root + prefix
        folder = full.rsplit("/", 1)[0]
        return [ObjectMeta(e.path[len(self._root):], e.size,
                           sha256=e.lfs.sha256 if e.lfs is not None else None)
                for e in await self._hub.tree(folder, recursive=True)
                if isinstance(e, RepoFile) and e.path.startswith(full)]

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        folder = self._root + prefix
        return sorted(e.path.rsplit("/", 1)[-1] for e in await self._hub.tree(folder, False)
                      if isinstance(e, RepoFolder))

    async def delete(self, keys: Sequence[str]) -> None:
        paths = [self._root + check_key(k) for k in keys]
        for _ in range(ATTEMPTS):
            head = await self._hub.head()
            there = sorted(set(await self._hub.paths(paths, head)))
            if not there or await self._hub.commit_on(
                    [CommitOperationDelete(p) for p in there],
                    self._message("delete", _summary(keys)), None, head):
                return
        raise self._moving(None, "delete")

    async def send(
        self, prefix: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        if not files:
            return
        ops = await fan_out(files, self._config.concurrency, lambda f: asyncio.to_thread(
            CommitOperationAdd, self._root + prefix + check_relpath(f.path), str(root / f.path)))
        await self._hub.call("preupload_lfs_files", prefix, self._hub.api.preupload_lfs_files,
                             **self._hub.repo(), additions=ops, revision=self._config.revision)
        # The LFS and Xet uploads hashed what they sent; the library reads the rest (files
        # small enough to travel in the commit) lazily, on first use: in threads, here.
        await fan_out([op for op in ops if not op.upload_info.is_hashed],
                      self._config.concurrency,
                      lambda op: asyncio.to_thread(lambda: op.upload_info.sha256))
        for f, op in zip(files, ops, strict=True):
            if op.upload_info.size != f.size:
                raise IntegrityError(f"{self.where(prefix + f.path)}: changed while sent "
                                     f"({op.upload_info.size} bytes, not {f.size})")
            self._staged[op.path_in_repo] = op
            session.advance(f.size)
            await session.file_done(f.path, op.upload_info.sha256.hex())

    async def publish(self, prefix: str, files: Sequence[LocalFile], note: str, *,
                      key: str | None = None, data: bytes = b"", mode: PutMode = CREATE,
                      unless: str | None = None) -> bool:
        paths = [self._root + prefix + check_relpath(f.path) for f in files]
        ops = [op for f, p in zip(files, paths, strict=True)
               if (op := self._staged.get(p)) is not None and op.upload_info.size == f.size]
        staged = {op.path_in_repo for op in ops}
        await self._verify_uploaded(prefix, ops)  # once: a retried commit sends no bytes
        extra = [] if key is None else [CommitOperationAdd(self._root + key, bytes(data))]
        message = f"traind {self._run}: {note} (host {self._host})"
        for _ in range(ATTEMPTS):
            head = await self._hub.head()
            if key is not None and not await self._allows(check_key(key), mode, head):
                return False
            if unless is not None and await self.list(unless):
                return False  # listed after the head was read: a later commit fails (412)
            stored = await self._hub.paths(paths, head)
            if missing := [f.path for f, p in zip(files, paths, strict=True) if p not in staged
                           and (p not in stored or stored[p].size != f.size)]:
                raise MissingFilesError(prefix.rstrip("/"), missing, self.where(prefix))
            if await self._hub.commit_on([*ops, *extra], message, key, head):
                for op in ops:
                    self._staged.pop(op.path_in_repo, None)
                return True
        raise self._moving(key, "publish")

    async def _verify_uploaded(self, prefix: str, ops: Sequence[CommitOperationAdd]) -> None:
        """Ask the LFS batch API that the bytes of every pre-uploaded LFS file are on the
        Hub with their size (it answers with an upload action for any that are not):
        MissingFilesError names those, which are then sent again. Bytes the library sent
        through Xet are not asked after here (that is not the LFS protocol): the commit is
        the check then, the Hub refusing one that names bytes it does not hold."""
        lfs = [op for op in ops if op._upload_mode == "lfs"]  # set by the pre-upload
        if not lfs or is_xet_available():  # the library's own choice of transport
            return
        answer = await self._hub.call(
            "lfs_batch", prefix, post_lfs_batch_info, upload_infos=[op.upload_info for op in lfs],
            token=self._hub.token, repo_type=self._config.repo_type, repo_id=self._config.repo_id,
            revision=self._config.revision, endpoint=self._config.endpoint)
        absent = {o["oid"] for o in [*answer[0], *answer[1]] if "actions" in o or "error" in o}
        if missing := [op for op in lfs if op.upload_info.sha256.hex() in absent]:
            for op in missing:
                self._staged.pop(op.path_in_repo, None)
            raise MissingFilesError(prefix.rstrip("/"), [
                op.path_in_repo[len(self._root + prefix):] for op in missing],
                self.where(prefix))

    async def fetch(
        self, prefix: str, files: Sequence[LocalFile], dest: Path, advance: Advance
    ) -> dict[str, str]:
        head = await self._hub.head()  # every file from one commit
        infos = await self._hub.paths([self._root + prefix + f.path for f in files], head)

        async def one(f: LocalFile) -> str:
            path = self._root + prefix + f.path
            if path not in infos:
                raise IntegrityError(f"{self.where(prefix + f.path)}: missing from the repo")
            sha = await self._hub.call("download", prefix + f.path, self._hub.stream, path, head,
                                       dest / check_relpath(f.path), advance)
            recorded = infos[path].lfs
            if sha is None:
                raise IntegrityError(f"{self.where(prefix + f.path)}: missing from the repo")
            if recorded is not None and recorded.sha256 != sha:
                raise IntegrityError(f"{self.where(prefix + f.path)}: sha256 {sha[:12]}… is "
                                     f"not the Hub's recorded {recorded.sha256[:12]}…")
            return sha

        found = await fan_out(files, self._config.concurrency, one)
        return {f.path: sha for f, sha in zip(files, found, strict=True)}

    async def abort_uploads(self, prefix: str, keep: Collection[str] = ()) -> int:
        return 0  # LFS bytes not committed are the Hub's to collect

    async def probe(self) -> None:
        await self._hub.head()  # the repo is reachable, the token valid (created when asked)
        probe = CommitOperationAdd(f"{self._root}.traind-probe", b"probe")
        await self._hub.call("preupload_lfs_files", None, self._hub.api.preupload_lfs_files,
                             **self._hub.repo(), additions=[probe], revision=self._config.revision)
        # the pre-upload asks for write access, and commits nothing

    async def aclose(self) -> None:
        return None


def _summary(keys: Sequence[str]) -> str:
    tags = sorted({k.split("/", 1)[0] for k in keys})
    return f"{len(keys)} objects of {', '.join(tags)}"
