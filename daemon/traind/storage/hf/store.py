"""The Hugging Face Hub store: objects as files of a model or dataset repo, under
``<path_in_repo>/<run>/``, through ``huggingface_hub`` (blocking, so called in threads).

Every change is one Hub commit. A create-only or replace-if-version put reads the branch's
head commit, looks at the file there, and commits with ``parent_commit`` set to that head:
the Hub refuses the commit (412) when anyone committed in between, and the put reads again.
So both are atomic here (``create`` and ``update`` True): of two writers racing for one tag
one commit lands first, and the other sees it. ``send`` pre-uploads a checkpoint's files (LFS)
and adds them all in one commit; a delete removes its keys in one commit (so pruning a
checkpoint is one commit: ``atomic_delete``). A 429 is waited
out for the ``RateLimit`` reset the Hub names, then the commit is made again.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import random
import socket
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

import structlog
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_url
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.utils._headers import build_hf_headers
from huggingface_hub.utils._http import get_session, hf_raise_for_status

from traind.config import HFStorage
from traind.errors import IntegrityError, StorageError, TransientStorageError
from traind.layout.keys import check_key, check_relpath
from traind.storage.base import (
    OVERWRITE,
    Advance,
    Blob,
    Capabilities,
    LocalFile,
    ObjectMeta,
    PutMode,
    UploadSession,
    counted,
)
from traind.storage.hf.errors import MISSING, reset_in, translate
from traind.storage.memory import version_of
from traind.util.fileio import hash_file
from traind.util.tasks import fan_out

log = structlog.get_logger("traind.hf")
T = TypeVar("T")
CAPABILITIES = Capabilities(
    create=True, update=True,
    claim="Hub commits with parent_commit: one made on a stale head is refused (412)",
    atomic_delete=True)
ATTEMPTS = 12
"""Reads-and-commits a conditional put tries before giving up (each 412 is another writer's
commit landing first)."""
RATE_LIMIT_WAITS = 6
"""How many 429s in a row one call waits out before the error reaches the caller."""
MAX_WAIT = 900.0
CHUNK = 1024 * 1024
PATHS_BATCH = 500


class HFStore:
    """Objects as files of one Hub repo at one branch, under ``<path_in_repo>/<run>/``."""

    def __init__(self, config: HFStorage, run: str) -> None:
        self._config = config
        self._run = run
        self._root = "".join(f"{p}/" for p in (config.path_in_repo, run) if p)
        self._token = config.token.get_secret_value() if config.token else None
        self._api = HfApi(endpoint=config.endpoint, token=self._token)
        self._host = socket.gethostname()
        self._created = False
        self._creating = asyncio.Lock()

    @property
    def describe(self) -> str:
        kind = "" if self._config.repo_type == "model" else f"{self._config.repo_type}s/"
        return f"hf://{kind}{self._config.repo_id}@{self._config.revision}/{self._root}"

    def where(self, key: str) -> str:
        return self.describe + key

    async def capabilities(self) -> Capabilities:
        return CAPABILITIES

    # -- the library's calls, in threads, errors translated ------------------------------

    async def _call(self, op: str, key: str | None, fn: Callable[..., T], *args: Any,
                    **kwargs: Any) -> T:
        """``fn`` in a thread, its errors translated; a 429 is waited out for the Hub's
        ``RateLimit`` reset (logged), a missing repo created once when the config asks."""
        made, waits = False, 0
        while True:
            try:
                return await asyncio.to_thread(fn, *args, **kwargs)
            except StorageError:
                raise
            except Exception as exc:
                error = translate(exc, self.where(key or ""), op, key)
                wait = reset_in(exc) if error.status == 429 else None
                if wait is not None and waits < RATE_LIMIT_WAITS:
                    waits += 1
                    delay = min(MAX_WAIT, wait) + random.uniform(0.0, 1.0)
                    log.warning("hf_rate_limited", repo=self._config.repo_id, op=op, key=key,
                                attempt=waits, retry_in=round(delay, 1))
                    await asyncio.sleep(delay)
                    continue
                if error.code != "RepoNotFound" or not self._config.create_repo or made:
                    raise error from exc
            made = True
            await self._ensure_repo()  # created on first use, then the call again

    def _repo(self) -> dict[str, Any]:
        return {"repo_id": self._config.repo_id, "repo_type": self._config.repo_type}

    async def _head(self) -> str:
        info = await self._call("repo_info", None, self._api.repo_info, **self._repo(),
                                revision=self._config.revision)
        assert info.sha is not None
        return info.sha

    async def _commit(self, ops: list[Any], message: str, key: str | None,
                      parent: str | None = None) -> None:
        """One commit of ``ops`` (on ``parent`` when given: refused with 412 if the branch
        moved since)."""
        await self._call("create_commit", key, self._api.create_commit, **self._repo(),
                         operations=ops, commit_message=message,
                         revision=self._config.revision, parent_commit=parent)

    async def _ensure_repo(self) -> None:
        async with self._creating:
            if self._created:
                return
            await self._call("create_repo", None, self._api.create_repo, **self._repo(),
                             private=self._config.private, exist_ok=True)
            self._created = True
        log.info("hf_repo_created", repo=self._config.repo_id,
                 repo_type=self._config.repo_type, private=self._config.private)

    def _message(self, action: str, key: str) -> str:
        return f"traind {self._run}: {action} {key} (host {self._host})"

    def _download(self, path: str, revision: str, start: int | None = None,
                  end: int | None = None) -> bytes | None:
        url = hf_hub_url(self._config.repo_id, path, repo_type=self._config.repo_type,
                         revision=revision, endpoint=self._config.endpoint)
        headers = build_hf_headers(token=self._token)
        if start is not None and end is not None:
            headers["Range"] = f"bytes={start}-{end - 1}"
        response = get_session().get(url, headers=headers, follow_redirects=True)
        if _no_file(response):
            return None
        if response.status_code == 416:
            return b""
        hf_raise_for_status(response)
        return bytes(response.content)

    def _stream(self, path: str, revision: str, target: Path, advance: Advance) -> str | None:
        """Write the file at ``path`` to ``target`` as it arrives; its sha256, None when
        the Hub has no such file."""
        url = hf_hub_url(self._config.repo_id, path, repo_type=self._config.repo_type,
                         revision=revision, endpoint=self._config.endpoint)
        digest = hashlib.sha256()
        with counted(advance) as tally, get_session().stream(
                "GET", url, headers=build_hf_headers(token=self._token),
                follow_redirects=True) as response:
            if _no_file(response):
                return None
            hf_raise_for_status(response)
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as out:
                for chunk in response.iter_bytes(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    tally(len(chunk))
        return digest.hexdigest()

    async def _paths(self, paths: Sequence[str], revision: str) -> dict[str, RepoFile]:
        found: dict[str, RepoFile] = {}
        for i in range(0, len(paths), PATHS_BATCH):
            infos = await self._call("get_paths_info", None, self._api.get_paths_info,
                                     **self._repo(), paths=list(paths[i:i + PATHS_BATCH]),
                                     revision=revision)
            found |= {f.path: f for f in infos if isinstance(f, RepoFile)}
        return found

    # -- the primitives -----------------------------------------------------------------

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> bool:
        path = self._root + check_key(key)
        if mode.kind == "overwrite":
            await self._commit([CommitOperationAdd(path, bytes(data))],
                               self._message("put", key), key)
            return True
        for _ in range(ATTEMPTS):
            head = await self._head()
            if mode.kind == "create":
                if path in await self._paths([path], head):
                    return False
            else:
                found = await self._call("download", key, self._download, path, head)
                if found is None or version_of(found) != mode.version:
                    return False
            try:
                await self._commit([CommitOperationAdd(path, bytes(data))],
                                   self._message(mode.kind, key), key, parent=head)
                return True
            except StorageError as exc:
                if exc.status != 412:
                    raise
            await asyncio.sleep(random.uniform(0.0, 0.2))  # another commit landed: look again
        raise TransientStorageError(f"{self.where(key)}: the branch kept moving; retrying",
                                    code="412", status=412, key=key, op="put")

    async def get(self, key: str) -> Blob | None:
        found = await self._call("download", key, self._download, self._root + check_key(key),
                                 self._config.revision)
        return None if found is None else Blob(found, version_of(found))

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        found = await self._call("download", key, self._download, self._root + check_key(key),
                                 self._config.revision, start, end)
        if found is None:
            raise StorageError(f"{self.where(key)}: no such file", code=MISSING, key=key,
                               op="download")
        return found[:end - start]

    async def head(self, key: str) -> ObjectMeta | None:
        path = self._root + check_key(key)
        found = (await self._paths([path], self._config.revision)).get(path)
        return None if found is None else ObjectMeta(key, found.size)

    async def _tree(self, folder: str, recursive: bool) -> builtins.list[RepoFile | RepoFolder]:
        def walk() -> builtins.list[RepoFile | RepoFolder]:
            return list(self._api.list_repo_tree(
                **self._repo(), path_in_repo=folder.rstrip("/") or None, recursive=recursive,
                revision=self._config.revision))
        try:
            return await self._call("list_repo_tree", folder, walk)
        except StorageError as exc:
            if exc.missing:
                return []  # no such folder: nothing stored under it
            raise

    async def list(self, prefix: str) -> builtins.list[ObjectMeta]:
        full = self._root + prefix
        folder = full.rsplit("/", 1)[0]
        return [ObjectMeta(e.path[len(self._root):], e.size,
                           sha256=e.lfs.sha256 if e.lfs is not None else None)
                for e in await self._tree(folder, recursive=True)
                if isinstance(e, RepoFile) and e.path.startswith(full)]

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        folder = self._root + prefix
        return sorted(e.path.rsplit("/", 1)[-1] for e in await self._tree(folder, False)
                      if isinstance(e, RepoFolder))

    async def delete(self, keys: Sequence[str]) -> None:
        paths = [self._root + check_key(k) for k in keys]
        for _ in range(ATTEMPTS):
            head = await self._head()
            there = sorted(set(await self._paths(paths, head)))
            if not there:
                return
            try:
                await self._commit([CommitOperationDelete(p) for p in there],
                                   self._message("delete", _summary(keys)), None, parent=head)
                return
            except StorageError as exc:
                if exc.status != 412:
                    raise
            await asyncio.sleep(random.uniform(0.0, 0.2))
        raise TransientStorageError(f"{self.describe}: the branch kept moving; retrying",
                                    code="412", status=412, op="delete")

    async def send(
        self, prefix: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        if not files:
            return
        hashes = dict(zip([f.path for f in files], await fan_out(
            files, self._config.concurrency,
            lambda f: asyncio.to_thread(hash_file, root / check_relpath(f.path))), strict=True))
        ops = [CommitOperationAdd(self._root + prefix + f.path, str(root / f.path))
               for f in files]
        await self._commit(ops, self._message(f"store {len(files)} files of",
                                              prefix.rstrip("/")), prefix)
        for f, op in zip(files, ops, strict=True):
            size, sha = hashes[f.path]
            if size != f.size or op.upload_info.sha256.hex() != sha:
                raise IntegrityError(f"{self.where(prefix + f.path)}: changed while sent")
            session.advance(size)
            await session.file_done(f.path, sha)

    async def fetch(
        self, prefix: str, files: Sequence[LocalFile], dest: Path, advance: Advance
    ) -> dict[str, str]:
        head = await self._head()  # every file from one commit
        infos = await self._paths([self._root + prefix + f.path for f in files], head)

        async def one(f: LocalFile) -> str:
            path = self._root + prefix + f.path
            if path not in infos:
                raise IntegrityError(f"{self.where(prefix + f.path)}: missing from the repo")
            sha = await self._call("download", prefix + f.path, self._stream, path, head,
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
        await self._head()  # the repo is reachable, the token valid (created when asked)
        probe = CommitOperationAdd(f"{self._root}.traind-probe", b"probe")
        await self._call("preupload_lfs_files", None, self._api.preupload_lfs_files,
                         **self._repo(), additions=[probe], revision=self._config.revision)
        # the pre-upload asks for write access, and commits nothing

    async def aclose(self) -> None:
        return None


def _no_file(response: Any) -> bool:
    """Whether the Hub answered that the file (not the repo or revision) is not there."""
    return bool(response.status_code == 404
                and response.headers.get("X-Error-Code") == "EntryNotFound")


def _summary(keys: Sequence[str]) -> str:
    tags = sorted({k.split("/", 1)[0] for k in keys})
    return f"{len(keys)} objects of {', '.join(tags)}"
