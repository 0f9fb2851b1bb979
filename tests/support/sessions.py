"""In-memory ``UploadSession`` doubles for backend tests (the journal's, without SQLite)."""

from __future__ import annotations


class RecordingSession:
    """Records every file reported done (at most once each) and every ``advance``, with how
    many files were done by then; keeps resume state like the journal does."""

    def __init__(self) -> None:
        self.done: dict[str, str] = {}
        self.advances: list[tuple[int, int]] = []
        self.states: dict[str, str] = {}

    def advance(self, nbytes: int) -> None:
        self.advances.append((nbytes, len(self.done)))

    async def file_done(self, path: str, sha256: str) -> None:
        assert path not in self.done, f"file_done twice for {path}"
        self.done[path] = sha256
        self.states.pop(path, None)

    async def load_state(self, path: str) -> str | None:
        return self.states.get(path)

    async def save_state(self, path: str, state: str) -> None:
        self.states[path] = state


class NoSession(RecordingSession):
    """A session that must not be reached: nothing may be sent or stored through it."""

    def advance(self, nbytes: int) -> None:
        raise AssertionError("nothing should be uploaded")

    async def file_done(self, path: str, sha256: str) -> None:
        raise AssertionError(f"{path!r} must not be stored")
