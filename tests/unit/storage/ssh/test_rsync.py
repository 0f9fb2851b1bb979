"""Reading rsync's ``--info=progress2`` output: byte totals from complete lines only."""

from __future__ import annotations

from traind.storage.ssh.rsync import progress_totals

OUTPUT = (
    b"\r         32,768   0%    0.00kB/s    0:00:00  "
    b"\r     42,827,776  40%   40.81MB/s    0:00:01  "
    b"\r    104,857,600 100%   40.31MB/s    0:00:02 (xfr#1, to-chk=0/1)\n"
    b"    104,857,6"
)


def test_progress_totals_from_complete_lines() -> None:
    """Each complete line gives its running total; a partial line waits for more output."""
    totals, rest = progress_totals(OUTPUT)
    assert totals == [32_768, 42_827_776, 104_857_600]
    assert rest == b"    104,857,6"
    assert progress_totals(rest + b"00 100%   1.00MB/s    0:00:02\r") == ([104_857_600], b"")


def test_other_output_is_ignored() -> None:
    """Lines that are no progress report (warnings, blank lines) count nothing."""
    assert progress_totals(b"\nsending incremental file list\n\r  \r") == ([], b"")
