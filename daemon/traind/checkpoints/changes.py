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
from collections.abc import Iterator
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
    A trainer's logs beside the checkpoints wake nothing.
    """

    def __init__(self, root: Path, pattern: str, inotify: Inotify | None) -> None:
        self._root = root
        self._pattern = pattern
        self._inotify = inotify
        self._ready = asyncio.Event()
        self._root_lost = False
        if inotify is not None:
            inotify.sync_timeout = 0  # sync_get answers None once nothing is pending
            self._watch_root()
        if self._inotify is not None:
            self._listen()

    @classmethod
    @contextlib.contextmanager
    def open(cls, root: Path, pattern: str, polling: bool) -> Iterator[Changes]:
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
            yield changes
        finally:
            changes._close()

    async def wait(self, stop: asyncio.Event, interval: float) -> None:
        """Return once a change came (after letting its burst gather), ``interval`` seconds
        passed, or ``stop`` is set."""
        if self._root_lost and self._inotify is not None:
            self._watch_root()
        waits = {asyncio.ensure_future(self._ready.wait()), asyncio.ensure_future(stop.wait())}
        try:
            await asyncio.wait(waits, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        if self._ready.is_set() and not stop.is_set():
            await asyncio.sleep(_DEBOUNCE)
            self._drain()

    def _listen(self) -> None:
        assert self._inotify is not None
        loop = asyncio.get_running_loop()
        fd = self._inotify.fd

        def readable() -> None:
            loop.remove_reader(fd)  # level-triggered: quiet until drained
            self._ready.set()

        loop.add_reader(fd, readable)

    def _drain(self) -> None:
        """Read every pending event, watching the directories that appeared."""
        self._ready.clear()
        inotify = self._inotify
        if inotify is None:
            return
        while inotify is self._inotify and (event := inotify.sync_get()) is not None:
            self._handle(event)
        if self._inotify is not None:
            self._listen()

    def _handle(self, event: Event) -> None:
        mask = event.mask
        if Mask.Q_OVERFLOW in mask:
            self._watch_root()  # events were dropped: look at every tree afresh
            return
        watch, path = event.watch, event.path
        if watch is None or path is None:
            return
        if watch.path == self._root and Mask.IGNORED in mask:
            self._root_lost = True  # output_dir itself was removed: watch it when back
            return
        if Mask.ISDIR not in mask:
            return
        top = watch.path == self._root
        if top and not fnmatch.fnmatchcase(path.name, self._pattern):
            return
        if Mask.CREATE in mask or Mask.MOVED_TO in mask:
            self._watch_tree(path)
        elif Mask.MOVED_FROM in mask:
            self._unwatch_tree(path)

    def _watch_root(self) -> None:
        """Watch ``root`` and every matching tree in it (again, after a loss)."""
        self._root_lost = not self._add(self._root, _ROOT_MASK)
        if self._root_lost:
            return
        with contextlib.suppress(OSError):
            for entry in os.scandir(self._root):
                if (fnmatch.fnmatchcase(entry.name, self._pattern)
                        and entry.is_dir(follow_symlinks=False)):
                    self._watch_tree(Path(entry.path))

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
        if self._inotify is None:
            return
        for watch in self._inotify.watches:
            if watch.path == top or top in watch.path.parents:
                with contextlib.suppress(OSError):
                    self._inotify.rm_watch(watch)

    def _add(self, path: Path, mask: Mask) -> bool:
        """Watch ``path``; False when it is gone or unreadable. At the kernel's watch limit
        every watch is dropped and the timed scans carry on alone."""
        if self._inotify is None:
            return False
        try:
            self._inotify.add_watch(path, mask)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                log.warning("checkpoint_watch_limit", path=str(path),
                            hint="raise fs.inotify.max_user_watches; until then a scan "
                                 "every poll_interval finds checkpoints")
                self._close()
            return False
        return True

    def _close(self) -> None:
        inotify, self._inotify = self._inotify, None
        if inotify is not None:
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                asyncio.get_running_loop().remove_reader(inotify.fd)
            inotify.close()

