"""What wakes the watcher: inotify on output_dir and on every checkpoint tree in it.

The kernel wakes the event loop only when something that may be a checkpoint changes, so a
quiet output_dir costs nothing between the watcher's timed scans. Without inotify
(``force_polling`` for NFS, a platform without it, or the kernel's watch limit reached)
only the timed scans remain.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fnmatch
import os
from collections.abc import AsyncIterator
from pathlib import Path

import structlog

log = structlog.get_logger("traind.watcher")

try:
    from asyncinotify import Event, Inotify, Mask

    _ROOT_MASK = Mask.CREATE | Mask.DELETE | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.ONLYDIR
    _TREE_MASK = (Mask.CREATE | Mask.CLOSE_WRITE | Mask.DELETE | Mask.MOVED_FROM
                  | Mask.MOVED_TO | Mask.ONLYDIR | Mask.DONT_FOLLOW)
except (ImportError, OSError, RuntimeError):  # no inotify on this platform
    Inotify = None  # type: ignore[assignment,misc]

_DEBOUNCE = 0.01
"""Seconds to let a burst of changes gather before the watcher looks (one scan, not one
per file written)."""
_BATCH = 256
"""Events read from the kernel in one go."""


class Changes:
    """Waits for a change under ``root`` that may concern a checkpoint, or a timeout.

    Watched: ``root`` itself (directories matching ``pattern`` appearing, going, renamed)
    and every directory of each matching tree (files finished, created, removed, renamed).
    A trainer's logs beside the checkpoints wake nothing. Directories are walked and
    watched in a worker thread (an output_dir may be on a slow filesystem), while the
    event loop does not read the descriptor.
    """

    def __init__(self, root: Path, pattern: str, inotify: Inotify | None) -> None:
        self._root = root
        self._pattern = pattern
        self._inotify = inotify
        self._ready = asyncio.Event()
        self._root_lost = inotify is not None
        """Whether ``root`` is to be watched (again): at first, after it was removed, and
        after the kernel's queue overflowed."""
        self._limit: Path | None = None
        """The directory the kernel refused a watch on for its watch limit."""
        if inotify is not None:
            inotify.sync_timeout = 0  # sync_get answers None once nothing is pending

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, root: Path, pattern: str, polling: bool) -> AsyncIterator[Changes]:
        """Changes under ``root``, closed on leaving; with ``polling``, only the timeouts."""
        inotify = None
        if not polling and Inotify is not None:
            try:
                inotify = Inotify(cache_size=_BATCH)
            except OSError as exc:
                log.warning("checkpoint_watch_unavailable", error=str(exc),
                            hint="falling back to a scan every poll_interval")
        changes = cls(root, pattern, inotify)
        try:
            await changes._watch([])
            yield changes
        finally:
            changes._close()

    async def wait(self, stop: asyncio.Event, interval: float) -> None:
        """Return once a change came (after letting its burst gather), ``interval`` seconds
        passed, or ``stop`` is set."""
        if self._root_lost:
            await self._watch([])
        waits = {asyncio.ensure_future(self._ready.wait()), asyncio.ensure_future(stop.wait())}
        try:
            await asyncio.wait(waits, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        if self._ready.is_set() and not stop.is_set():
            await asyncio.sleep(_DEBOUNCE)
            await self._drain()

    def _listen(self) -> None:
        assert self._inotify is not None
        loop = asyncio.get_running_loop()
        fd = self._inotify.fd

        def readable() -> None:
            loop.remove_reader(fd)  # level-triggered: quiet until drained
            self._ready.set()

        loop.add_reader(fd, readable)

    async def _drain(self) -> None:
        """Read every pending event (without blocking), then watch the directories that
        appeared."""
        self._ready.clear()
        fresh: list[Path] = []
        if self._inotify is not None:
            while (event := self._inotify.sync_get()) is not None:
                if (new := self._handle(event)) is not None:
                    fresh.append(new)
        await self._watch(fresh)

    def _handle(self, event: Event) -> Path | None:
        """Act on one event; the directory to watch that it made, if any."""
        mask = event.mask
        if Mask.Q_OVERFLOW in mask:
            self._root_lost = True  # events were dropped: look at every tree afresh
            return None
        watch, path = event.watch, event.path
        if watch is None or path is None:
            return None
        top = watch.path == self._root
        if top and Mask.IGNORED in mask:
            self._root_lost = True  # output_dir itself was removed: watch it when back
            return None
        if Mask.ISDIR not in mask or (
                top and not fnmatch.fnmatchcase(path.name, self._pattern)):
            return None
        if Mask.CREATE in mask or Mask.MOVED_TO in mask:
            return path
        if Mask.MOVED_FROM in mask:
            self._unwatch_tree(path)
        return None

    async def _watch(self, trees: list[Path]) -> None:
        """Watch ``trees`` (and ``root`` with every matching tree, when it is to be), in a
        thread; then listen again, or give up on inotify at the kernel's watch limit."""
        if self._inotify is None:
            return
        again, self._root_lost = self._root_lost, False
        if again or trees:
            self._root_lost = not await asyncio.to_thread(self._watch_now, again, trees)
        if self._limit is not None:
            log.warning("checkpoint_watch_limit", path=str(self._limit),
                        hint="raise fs.inotify.max_user_watches; until then a scan "
                             "every poll_interval finds checkpoints")
            self._close()
        else:
            self._listen()

    def _watch_now(self, root: bool, trees: list[Path]) -> bool:
        """Watch ``root`` and its matching trees (``root``) and ``trees``; False when
        ``root`` could not be watched (it is gone)."""
        if root:
            if not self._add(self._root, _ROOT_MASK):
                return False
            with contextlib.suppress(OSError):
                trees = trees + [Path(entry.path) for entry in os.scandir(self._root)
                                 if fnmatch.fnmatchcase(entry.name, self._pattern)
                                 and entry.is_dir(follow_symlinks=False)]
        for tree in trees:
            self._watch_tree(tree)
        return True

    def _watch_tree(self, top: Path) -> None:
        """Watch ``top`` and every directory below it, including those made before the
        watch was in place."""
        pending = [top]
        while pending:
            path = pending.pop()
            if not self._add(path, _TREE_MASK):
                continue
            with contextlib.suppress(OSError):
                pending.extend(Path(entry.path) for entry in os.scandir(path)
                               if entry.is_dir(follow_symlinks=False))

    def _unwatch_tree(self, top: Path) -> None:
        """Stop watching a tree renamed away (its watches would name the old path)."""
        assert self._inotify is not None
        for watch in self._inotify.watches:
            if watch.path == top or top in watch.path.parents:
                with contextlib.suppress(OSError):
                    self._inotify.rm_watch(watch)

    def _add(self, path: Path, mask: Mask) -> bool:
        """Watch ``path``; False when it is gone or unreadable, or the kernel's watch limit
        is reached (noted in ``_limit``: no further watch is tried)."""
        if self._inotify is None or self._limit is not None:
            return False
        try:
            self._inotify.add_watch(path, mask)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                self._limit = path
            return False
        return True

    def _close(self) -> None:
        inotify, self._inotify = self._inotify, None
        if inotify is not None:
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                asyncio.get_running_loop().remove_reader(inotify.fd)
            inotify.close()
