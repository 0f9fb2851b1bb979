"""How many times each checkpoint's commit failed, and when it is tried again: capped
backoff with jitter, so two writers that failed together do not try again together."""

from __future__ import annotations

import structlog

from traind.errors import MissingFilesError
from traind.util.retry import Backoff

log = structlog.get_logger("traind.streamer")

RETRY_JITTER = 0.5
"""A failed upload is tried again after a pause drawn from the upper half of its backoff:
two writers that failed together (a contended claim) do not try again together."""


class Attempts:
    """Failed attempts per tag, until the tag is forgotten (committed or let go)."""

    def __init__(self, initial: float, cap: float) -> None:
        self.backoff = Backoff(initial, cap, jitter=RETRY_JITTER)
        self._failures: dict[str, int] = {}

    def __contains__(self, tag: str) -> bool:
        return tag in self._failures

    def failed(self, tag: str) -> int:
        """Count one more failed attempt of ``tag``; return how many there were."""
        n = self._failures[tag] = self._failures.get(tag, 0) + 1
        return n

    def forget(self, tag: str) -> None:
        """Start counting ``tag`` anew."""
        self._failures.pop(tag, None)

    def retry_later(self, tag: str, exc: BaseException) -> float:
        """Seconds until ``tag``, whose upload failed, is tried again (with backoff)."""
        n = self.failed(tag)
        delay = self.backoff.delay(n - 1)
        log.error("checkpoint_upload_failed", tag=tag, attempt=n, retry_in=delay, error=str(exc),
                  hint="retried with backoff; the snapshot waits in state_dir/staging until "
                       "the store takes it")
        return delay

    def files_missing(self, tag: str, exc: MissingFilesError) -> float:
        """Seconds until the files of ``tag`` the store lacks are sent again: at once the
        first time (a daemon restarted mid-upload on a store that had only staged them, the
        Hub), with backoff if they go missing again."""
        if tag in self._failures:
            return self.retry_later(tag, exc)
        self._failures[tag] = 1
        log.warning("checkpoint_files_missing", tag=tag, files=len(exc.paths),
                    paths=exc.paths[:5], hint="sent again now; the manifest waits for them")
        return 0.0
