"""What /proc says of a process or one of its threads."""

from __future__ import annotations

from pathlib import Path


def nice_of(pid: int, tid: int | None = None) -> int:
    """The nice value of process ``pid`` (its main thread), or of its thread ``tid``."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat")
    return int(stat.read_text().rsplit(")", 1)[1].split()[16])


def threads_of(pid: int) -> list[int]:
    """The thread ids of process ``pid``."""
    return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]


def autogroups() -> bool:
    """Whether this kernel puts each new session in an autogroup of its own."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def autogroup_nice(pid: int) -> int | None:
    """The nice value of ``pid``'s autogroup, or None where it has none: a kernel without
    autogroups, or a process whose session began before any setsid (init's, as under some CI
    runners), which reads as an empty file."""
    try:
        said = Path(f"/proc/{pid}/autogroup").read_text().split()  # "/autogroup-9 nice 10"
    except OSError:
        return None
    return int(said[-1]) if said else None
