"""Claims by listing, for stores without an atomic create-only put (``Capabilities.create``
False: an S3-compatible store that ignores ``If-None-Match``, an SFTP server whose exclusive
create is not).

Every claimant puts its own ``<claimants>/<writer id>.json`` and then lists them; alone, it
has won. Not alone, it withdraws: on a store with read-after-write consistency at most one of
several racing writers goes on, and the others try again. They try again after a random
pause (the one ``retry`` loop, full jitter), so two writers that collided do not collide again
in lockstep; the chance that they still do falls by half with every attempt.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from traind.errors import ContendedError
from traind.layout.manifest import Writer
from traind.storage.base import CREATE, OVERWRITE, ObjectStore
from traind.util.retry import Backoff, retrying

log = structlog.get_logger("traind.protocol")
CLAIMANTS = "traind-claims/"
"""Under a tag: the claimant objects of a whole tag's claim (a node's part: ``-<rank>/``)."""
CONTENDED = Backoff(0.01, 2.0, jitter=1.0)
"""The pause before another listed attempt: from 10 ms, doubling, drawn at random below."""
ATTEMPTS = 12
"""Listed attempts before a claim is given up to the caller's own retry (a few seconds)."""


async def claim_listed(store: ObjectStore, claimants: str, tag: str, writer: Writer) -> None:
    """Put ``writer``'s claimant object under ``claimants`` and list them; return when it is
    alone, else withdraw it and raise ContendedError naming every writer seen."""
    mine = f"{claimants}{writer.id}.json"
    await store.put(mine, writer.to_json())
    others = [m.key for m in await store.list(claimants) if m.key != mine]
    if not others:
        return
    await store.delete([mine])
    names = []
    for key in others:
        if (found := await store.get(key)) is not None:
            names.append(str(Writer.from_json(found.data)))
    raise ContendedError(tag, str(writer), names or ["another writer"], store.where(claimants))


async def decided(attempt: Callable[[], Awaitable[bool]]) -> bool:
    """Run a listed claim ``attempt`` until it is not contended (jittered retries), at most
    ATTEMPTS times; the last ContendedError is raised."""
    return await retrying(attempt, CONTENDED, ATTEMPTS - 1,
                          is_transient=lambda exc: isinstance(exc, ContendedError),
                          on_retry=_contended)


def _contended(exc: BaseException, attempt: int, pause: float) -> None:
    assert isinstance(exc, ContendedError)
    log.info("checkpoint_claim_contended", tag=exc.tag, writers=[exc.ours, *exc.theirs],
             attempt=attempt, retry_in=round(pause, 3))


async def create(store: ObjectStore, key: str, body: bytes, claimants: str, tag: str,
                 writer: Writer) -> bool:
    """Create the claim object ``key`` unless one is there; return whether this call made
    it: the store's atomic create, or the listing protocol where it has none."""
    if (await store.capabilities()).create:
        return await store.put(key, body, CREATE)

    async def attempt() -> bool:
        if await store.get(key) is not None:
            return False
        await claim_listed(store, claimants, tag, writer)
        return await store.put(key, body, OVERWRITE)

    return await decided(attempt)
