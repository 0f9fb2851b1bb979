"""A multi-node job's resume agreement in the store (``checkpoints.multinode.agreement``
decides): each host's start request, and node 0's board, under ``.traind-resume/``.

Node R's request is the empty object ``.traind-resume/start-<R>-<nonce>``, so node 0 learns
every rank's from the names of one listing, however many hosts ask. A host deletes its
older requests before putting a new one, so a rank has one at a time; should two be listed
(a delete not yet seen), the newest wins. The board is ``.traind-resume/board.json``.
"""

from __future__ import annotations

from traind.layout.fields import decimal
from traind.layout.keys import AGREEMENT_DIR, check_component
from traind.storage.base import ObjectMeta, ObjectStore
from traind.util.fileio import PART_SUFFIX

REQUEST = f"{AGREEMENT_DIR}/start-"
BOARD = f"{AGREEMENT_DIR}/board.json"


def request_key(rank: int, nonce: str) -> str:
    """Node ``rank``'s request ``nonce``."""
    return f"{REQUEST}{rank}-{check_component(nonce, 'start request nonce')}"


async def request_start(store: ObjectStore, rank: int, nonce: str) -> None:
    """Replace node ``rank``'s request with ``nonce``: its older ones deleted first."""
    key = request_key(rank, nonce)
    await store.delete([m.key for m in await store.list(f"{REQUEST}{rank}-") if m.key != key])
    await store.put(key, b"")


async def withdraw_start(store: ObjectStore, rank: int, nonce: str) -> None:
    """Remove node ``rank``'s request ``nonce`` (one of another nonce is another key)."""
    await store.delete([request_key(rank, nonce)])


async def start_requests(store: ObjectStore) -> dict[int, str]:
    """Every rank's request, rank → nonce, from the names of one listing."""
    newest: dict[int, ObjectMeta] = {}
    for meta in await store.list(REQUEST):
        rank, sep, nonce = meta.key[len(REQUEST):].partition("-")
        if nonce.endswith(PART_SUFFIX):
            continue  # a request being written (local, SSH): not stored yet
        if (r := decimal(rank)) is not None and sep and nonce and (
                r not in newest or _later(meta, newest[r])):
            newest[r] = meta
    return {rank: meta.key[len(REQUEST):].partition("-")[2] for rank, meta in newest.items()}


def _later(a: ObjectMeta, b: ObjectMeta) -> bool:
    """Whether request ``a`` was stored after ``b`` (their listed times; None is oldest)."""
    if a.modified is None or b.modified is None:
        return b.modified is None and a.modified is not None
    return a.modified > b.modified


async def write_board(store: ObjectStore, data: bytes) -> None:
    """Replace the board (node 0 alone writes it)."""
    await store.put(BOARD, data)


async def read_board(store: ObjectStore) -> bytes | None:
    """The board, None before node 0 wrote one: one small read."""
    found = await store.get(BOARD)
    return None if found is None else found.data
