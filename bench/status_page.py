"""Benchmark: the status page's weight, and the daemon's CPU while five browsers watch it.

Starts ``traind run`` (local store, an output_dir holding ``--checkpoints`` small finished
checkpoints, so the page has a timeline, a store list and a chart to draw) and, after the
checkpoints are committed, measures the daemon's user+system CPU from ``/proc`` over the same
span in three conditions, one after another on the same daemon:

- nobody watching (the baseline);
- five ``traind status --watch``-like clients polling ``/status`` every 2 s (what a
  terminal user costs, for comparison);
- five pages of headless Chromium (one profile each) showing ``/``, which polls every 2 s.

The page's weight is what Chromium reports transferred (encoded body + headers) for the first
load of ``/`` and every file it pulls, and for one live update (``/?part=main``).

    python bench/status_page.py --seconds 30 --checkpoints 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.browser import CHROMIUM_ARGS, chromium_path
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
WATCHERS = 5
POLL = 2.0  # seconds, as the page's script polls


def cpu(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has spent so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start(work: Path, checkpoints: int) -> tuple[subprocess.Popen[bytes], str]:
    """``traind run`` on an output_dir of finished checkpoints; the process and its URL."""
    out = work / "out"
    for step in range(1, checkpoints + 1):
        ckpt = out / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "model.safetensors").write_bytes(os.urandom(64 * 1024))
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    port = free_port()
    config = work / "traind.toml"
    config.write_text(
        f'[run]\nname = "bench"\noutput_dir = "{out}"\nstate_dir = "{work / "state"}"\n'
        f'[checkpoints]\nsettle = "200ms"\n'
        f'[storage]\ntype = "local"\npath = "{work / "store"}"\n'
        f'[retention]\nkeep_last = {max(1, checkpoints - 3)}\nkeep_local = {checkpoints}\n'
        f'[status]\nlisten = "127.0.0.1:{port}"\n'
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "daemon"))
    proc = subprocess.Popen([sys.executable, "-m", "traind", "run", "-c", str(config)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def wait_committed(url: str, count: int, timeout: float = 120.0) -> None:
    """Until ``/status`` lists ``count`` checkpoints committed in the store (or the ones
    retention kept after committing them all)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/status", timeout=5) as response:
                status = json.load(response)
            done = [e for e in status["timeline"] if e["stage"] == "committed"]
            if len(done) >= count:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"checkpoints not committed within {timeout:g}s")


def measure(pid: int, seconds: float, sleep: Callable[[float], None] = time.sleep) -> float:
    """Percent of one core ``pid`` used over the next ``seconds`` (spent in ``sleep``)."""
    before = cpu(pid)
    sleep(seconds)
    return 100 * (cpu(pid) - before) / seconds


def json_pollers(url: str, stop: threading.Event) -> list[threading.Thread]:
    """Five threads fetching ``/status`` every ``POLL`` seconds until ``stop``."""
    def poll() -> None:
        while not stop.is_set():
            with urllib.request.urlopen(f"{url}/status", timeout=5) as response:
                response.read()
            stop.wait(POLL)

    threads = [threading.Thread(target=poll, daemon=True) for _ in range(WATCHERS)]
    for t in threads:
        t.start()
    return threads


def weight(page: Any, url: str) -> dict[str, int]:
    """Bytes transferred for the first load of ``url`` and each file it pulls."""
    finished: list[Any] = []

    def done(request: Any) -> None:
        finished.append(request)

    page.on("requestfinished", done)
    page.goto(url, wait_until="load")
    page.wait_for_timeout(200)
    sizes: dict[str, int] = {}
    for request in finished:
        s = request.sizes()
        name = request.url.removeprefix(url.rstrip("/")) or "/"
        sizes[name] = s["responseBodySize"] + s["responseHeadersSize"]
    page.remove_listener("requestfinished", done)
    return sizes


def update_weight(page: Any, url: str) -> int:
    """Bytes transferred by one live update (the page's own poll)."""
    with page.expect_request_finished(lambda r: "part=main" in r.url, timeout=10_000) as info:
        pass
    s = info.value.sizes()
    return int(s["responseBodySize"] + s["responseHeadersSize"])


def with_browsers(url: str, body: Callable[[list[Any]], None]) -> None:
    """Run ``body`` with five Chromium pages showing ``url``, each in its own context."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS,
                                    headless=True, timeout=30_000)
        try:
            pages = [browser.new_context().new_page() for _ in range(WATCHERS)]
            body(pages)
        finally:
            browser.close()


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="each measured span")
    parser.add_argument("--checkpoints", type=int, default=20, help="in output_dir")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="traind-bench-page-"))
    daemon, url = start(work, args.checkpoints)
    try:
        wait_committed(url, args.checkpoints)
        time.sleep(2)  # the retention pass after the last commit
        idle = measure(daemon.pid, args.seconds)

        stop = threading.Event()
        pollers = json_pollers(url, stop)
        polled = measure(daemon.pid, args.seconds)
        stop.set()
        for t in pollers:
            t.join(timeout=10)

        found: dict[str, Any] = {}

        def watch(pages: list[Any]) -> None:
            found["sizes"] = weight(pages[0], url + "/")
            for page in pages[1:]:
                page.goto(url + "/", wait_until="load")
            found["update"] = update_weight(pages[0], url)
            polls: list[str] = []

            def polled(request: Any) -> None:
                if "part=main" in request.url:
                    polls.append(request.url)

            for page in pages:
                page.on("request", polled)
            # Playwright's sync API hears the pages' requests only while it waits itself.
            found["cpu"] = measure(daemon.pid, args.seconds,
                                   lambda s: pages[0].wait_for_timeout(s * 1000))
            found["polls"] = len(polls)

        with_browsers(url, watch)
        if daemon.poll() is not None:
            raise RuntimeError(f"traind exited with {daemon.returncode}")
        sizes = found["sizes"]
        print(f"\n### status page weight ({args.checkpoints} checkpoints committed)\n")
        print("| file | bytes transferred |")
        print("|---|---:|")
        for name, n in sizes.items():
            print(f"| {name} | {n} |")
        print(f"| **first load, total** | **{sum(sizes.values())}** |")
        print(f"| one live update (/?part=main) | {found['update']} |")
        print(f"\n### daemon CPU, {WATCHERS} watchers polling every {POLL:g} s, "
              f"{args.seconds:.0f} s each\n")
        print("| watching | % of a core | over idle |")
        print("|---|---:|---:|")
        print(f"| nobody | {idle:.2f} | |")
        print(f"| {WATCHERS} clients polling /status (JSON) | {polled:.2f} | "
              f"{polled - idle:+.2f} |")
        print(f"| {WATCHERS} Chromium pages showing / | {found['cpu']:.2f} | "
              f"{found['cpu'] - idle:+.2f} |")
        print(f"\nThe pages fetched {found['polls']} live updates in the "
              f"{args.seconds:.0f} s ({WATCHERS * args.seconds / POLL:.0f} expected).")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
