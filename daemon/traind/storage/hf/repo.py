"""One Hub repo at one branch through ``huggingface_hub``: its calls in threads with their
errors translated, a 429 waited out for the Hub's ``RateLimit`` reset, a missing repo or
branch created once when the config asks; commits made on a known parent; downloads."""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import structlog
from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.utils._headers import build_hf_headers
from huggingface_hub.utils._http import get_session, hf_raise_for_status

from traind.config import HFStorage
from traind.errors import StorageError
from traind.storage.base import Advance, counted
from traind.storage.hf.errors import reset_in, translate

log = structlog.get_logger("traind.hf")
T = TypeVar("T")
RATE_LIMIT_WAITS = 6
"""How many 429s in a row one call waits out before the error reaches the caller."""
MAX_WAIT = 900.0
CHUNK = 1024 * 1024
PATHS_BATCH = 500


class HubRepo:
    """The repo and branch of ``config``; ``where`` names a key in errors."""

    def __init__(self, config: HFStorage, where: Callable[[str], str]) -> None:
        self._config = config
        self._where = where
        self.token = config.token.get_secret_value() if config.token else None
        self.api = HfApi(endpoint=config.endpoint, token=self.token)
        self._created = False
        self._creating = asyncio.Lock()

    async def call(self, op: str, key: str | None, fn: Callable[..., T], *args: Any,
                   **kwargs: Any) -> T:
        """``fn`` in a thread, its errors translated; a 429 is waited out for the Hub's
        ``RateLimit`` reset (logged), a missing repo created once when the config asks."""
        made: set[str] = set()
        waits = 0
        while True:
            try:
                return await asyncio.to_thread(fn, *args, **kwargs)
            except StorageError:
                raise
            except Exception as exc:
                error = translate(exc, self._where(key or ""), op, key)
                wait = reset_in(exc) if error.status == 429 else None
                if wait is not None and waits < RATE_LIMIT_WAITS:
                    waits += 1
                    delay = min(MAX_WAIT, wait) + random.uniform(0.0, 1.0)
                    log.warning("hf_rate_limited", repo=self._config.repo_id, op=op, key=key,
                                attempt=waits, retry_in=round(delay, 1))
                    await asyncio.sleep(delay)
                    continue
                missing = error.code if error.code in ("RepoNotFound", "RevisionNotFound") else ""
                if not missing or not self._config.create_repo or missing in made:
                    raise error from exc
            made.add(missing)  # created on first use, then the call again
            await (self.ensure_repo() if missing == "RepoNotFound" else self._ensure_branch())

    def repo(self) -> dict[str, Any]:
        return {"repo_id": self._config.repo_id, "repo_type": self._config.repo_type}

    async def head(self) -> str:
        info = await self.call("repo_info", None, self.api.repo_info, **self.repo(),
                               revision=self._config.revision)
        assert info.sha is not None
        return info.sha

    async def commit(self, ops: list[Any], message: str, key: str | None,
                     parent: str | None = None) -> None:
        """One commit of ``ops`` (on ``parent`` when given: refused with 412 if the branch
        moved since)."""
        await self.call("create_commit", key, self.api.create_commit, **self.repo(),
                        operations=ops, commit_message=message,
                        revision=self._config.revision, parent_commit=parent)

    async def ensure_repo(self) -> None:
        async with self._creating:
            if self._created:
                return
            await self.call("create_repo", None, self.api.create_repo, **self.repo(),
                            private=self._config.private, exist_ok=True)
            self._created = True
        log.info("hf_repo_created", repo=self._config.repo_id,
                 repo_type=self._config.repo_type, private=self._config.private)

    async def _ensure_branch(self) -> None:
        await self.call("create_branch", None, self.api.create_branch, **self.repo(),
                        branch=self._config.revision, exist_ok=True)
        log.info("hf_branch_created", repo=self._config.repo_id,
                 branch=self._config.revision)

    def download(self, path: str, revision: str, start: int | None = None,
                 end: int | None = None) -> bytes | None:
        url = hf_hub_url(self._config.repo_id, path, repo_type=self._config.repo_type,
                         revision=revision, endpoint=self._config.endpoint)
        headers = build_hf_headers(token=self.token)
        if start is not None and end is not None:
            headers["Range"] = f"bytes={start}-{end - 1}"
        response = get_session().get(url, headers=headers, follow_redirects=True)
        if _no_file(response):
            return None
        if response.status_code == 416:
            return b""
        hf_raise_for_status(response)
        return bytes(response.content)

    def stream(self, path: str, revision: str, target: Path, advance: Advance) -> str | None:
        """Write the file at ``path`` to ``target`` as it arrives; its sha256, None when
        the Hub has no such file."""
        url = hf_hub_url(self._config.repo_id, path, repo_type=self._config.repo_type,
                         revision=revision, endpoint=self._config.endpoint)
        digest = hashlib.sha256()
        with counted(advance) as tally, get_session().stream(
                "GET", url, headers=build_hf_headers(token=self.token),
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

    async def paths(self, paths: Sequence[str], revision: str) -> dict[str, RepoFile]:
        found: dict[str, RepoFile] = {}
        for i in range(0, len(paths), PATHS_BATCH):
            infos = await self.call("get_paths_info", None, self.api.get_paths_info,
                                    **self.repo(), paths=list(paths[i:i + PATHS_BATCH]),
                                    revision=revision)
            found |= {f.path: f for f in infos if isinstance(f, RepoFile)}
        return found

    async def commit_on(self, ops: list[Any], message: str, key: str | None,
                        head: str) -> bool:
        """Commit ``ops`` on ``head``; False (after a short random pause) when another
        commit landed first, for the caller to look again."""
        try:
            await self.commit(ops, message, key, parent=head)
            return True
        except StorageError as exc:
            if exc.status != 412:
                raise
        await asyncio.sleep(random.uniform(0.0, 0.2))
        return False

    async def tree(self, folder: str, recursive: bool) -> builtins.list[RepoFile | RepoFolder]:
        def walk() -> builtins.list[RepoFile | RepoFolder]:
            return list(self.api.list_repo_tree(
                **self.repo(), path_in_repo=folder.rstrip("/") or None, recursive=recursive,
                revision=self._config.revision))
        try:
            return await self.call("list_repo_tree", folder, walk)
        except StorageError as exc:
            if exc.missing:
                return []  # no such folder: nothing stored under it
            raise


def _no_file(response: Any) -> bool:
    """Whether the Hub answered that the file (not the repo or revision) is not there."""
    return bool(response.status_code == 404
                and response.headers.get("X-Error-Code") == "EntryNotFound")
