"""Which traind writes a checkpoint: a random id made once per state_dir, plus the host.

Two daemons with the same ``run.name`` and store (two hosts, or a copied config) are told
apart by it: a checkpoint's claim and manifest in the store name their writer, and a
writer finding another's there stops instead of overwriting or mixing.
"""

from __future__ import annotations

import re
import secrets
import socket
from collections.abc import Iterable
from pathlib import Path

from traind.errors import TraindError
from traind.layout.manifest import Manifest, Writer
from traind.util.fileio import create_exclusive

WRITER_ID_FILE = "writer-id"
_ID = re.compile(r"[0-9a-f]{32}")


def load_or_create(state_dir: Path) -> Writer:
    """This state_dir's writer: its id read from ``writer-id``, created atomically the
    first time (a racing ``traind push`` ends up with the same id), and this host's name."""
    path = state_dir / WRITER_ID_FILE
    if not path.exists():
        create_exclusive(path, secrets.token_hex(16).encode() + b"\n")
    text = path.read_text().strip()
    if not _ID.fullmatch(text):
        raise TraindError(f"{path}: not a traind writer id ({text[:40]!r}); remove the file "
                          "and a new one is made")
    return Writer(id=text, host=socket.gethostname())


def written_by(manifests: Iterable[Manifest], writer: Writer) -> set[str]:
    """The tags of ``manifests`` that ``writer`` committed; another writer's tag is not ours
    to skip: its claim tells the streamer."""
    return {m.tag for m in manifests if m.writer is not None and m.writer.id == writer.id}
