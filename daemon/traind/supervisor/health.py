"""HTTP health checks: readiness (``successes`` 200s in a row before a deadline) and liveness
(``failures`` bad polls in a row), plus the old ``trl vllm-serve`` weight-sync reset endpoint.

The URL is used exactly as configured (``/health`` for vLLM) and redirects are never followed:
a 3xx while starting is a wrong URL, reported at once with the redirect target.
"""

from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass
from enum import StrEnum

import aiohttp
import structlog
from yarl import URL

from traind.config import HealthConfig
from traind.errors import SupervisorError
from traind.util import redact

log = structlog.get_logger("traind.supervisor")


class Probe(StrEnum):
    """How one poll went."""

    OK = "ok"
    REFUSED = "refused"
    BAD_STATUS = "bad_status"
    REDIRECT = "redirect"
    TIMEOUT = "timeout"
    ERROR = "error"


@dataclass(frozen=True)
class Result:
    """One poll: its kind, the HTTP status if any, and a short detail for logs."""

    probe: Probe
    status: int | None = None
    detail: str = ""


def base_url(health_url: str) -> URL:
    """The server's root (scheme, host, port) from its health URL."""
    return URL(health_url).origin()


async def probe(session: aiohttp.ClientSession, url: str, limit: float) -> Result:
    """Poll ``url`` once, waiting at most ``limit`` seconds; never raises for network trouble."""
    try:
        async with session.get(
            url,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=limit),
        ) as resp:
            if resp.status == 200:
                return Result(Probe.OK, 200)
            where = resp.headers.get("Location", "")
            kind = Probe.REDIRECT if 300 <= resp.status < 400 else Probe.BAD_STATUS
            return Result(kind, resp.status, f"location={redact.url(where)}" if where else "")
    except TimeoutError:
        return Result(Probe.TIMEOUT, detail=f"no answer within {limit}s")
    except aiohttp.ClientConnectorError as exc:
        refused = exc.os_error.errno == errno.ECONNREFUSED
        return Result(Probe.REFUSED if refused else Probe.ERROR, detail=redact.text(str(exc)))
    except aiohttp.ClientError as exc:
        return Result(Probe.ERROR, detail=redact.text(f"{type(exc).__name__}: {exc}"))


def _session() -> aiohttp.ClientSession:
    # A fresh connection per poll: a server that stopped accepting is noticed at once.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


class HealthRedirectError(SupervisorError):
    """The health URL answers with a redirect: it names the wrong path."""


class HealthCheck:
    """Readiness and liveness of one child's HTTP health endpoint."""

    def __init__(self, config: HealthConfig, child: str) -> None:
        self.config = config
        self._shown = redact.url(config.url)  # the URL as messages show it
        self._log = log.bind(child=child, url=self._shown)

    async def wait_ready(self) -> None:
        """Return after ``successes`` 200s in a row; anything else while loading (refused,
        503, timeouts) means still starting. Raise SupervisorError at ``ready_timeout``, and
        HealthRedirectError at the first 3xx (no wait: the URL is wrong)."""
        c = self.config
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + c.ready_timeout
        streak = 0
        last = Result(Probe.REFUSED)
        async with _session() as session:
            while (left := deadline - loop.time()) > 0:
                last = await probe(session, c.url, min(c.timeout, left))
                if last.probe is Probe.REDIRECT:
                    raise self._redirected(last)
                streak = streak + 1 if last.probe is Probe.OK else 0
                if streak >= c.successes:
                    self._log.info("health_ready", seconds=round(loop.time() - started, 3))
                    return
                await asyncio.sleep(min(c.interval, max(0.0, deadline - loop.time())))
        self._log.warning("health_not_ready", seconds=c.ready_timeout, last=last.probe.value,
                          status=last.status, detail=last.detail)
        raise SupervisorError(f"{self._shown} not ready within {c.ready_timeout}s ({last.probe})")

    def _redirected(self, result: Result) -> HealthRedirectError:
        target = result.detail.removeprefix("location=") or "an unnamed location"
        self._log.error("health_redirect", status=result.status, location=target)
        return HealthRedirectError(
            f"health url {self._shown} answers {result.status} redirecting to {target}; "
            "set the health url to the path the server serves (vLLM: /health)"
        )

    async def watch(self) -> Result:
        """Poll every ``interval``; return the last result once ``failures`` polls in a row
        were not 200 (503 is vLLM's dead engine; a refused connection is a dead server)."""
        c = self.config
        bad = 0
        async with _session() as session:
            while True:
                await asyncio.sleep(c.interval)
                result = await probe(session, c.url, c.timeout)
                if result.probe is Probe.OK:
                    bad = 0
                    continue
                bad += 1
                self._log.info("health_failed", result=result.probe.value, status=result.status,
                               detail=result.detail, in_a_row=bad)
                if bad >= c.failures:
                    self._log.warning("health_unhealthy", result=result.probe.value,
                                      status=result.status, polls=bad)
                    return result


async def fetch_text(url: URL, limit: float) -> tuple[int, str] | None:
    """GET ``url`` once (no redirects): its status and body, or None on network trouble."""
    try:
        async with (
            _session() as session,
            session.get(url, allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=limit)) as resp,
        ):
            return resp.status, await resp.text()
    except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
        return None


async def server_kind(health_url: str, limit: float) -> str:
    """Which server answers: "vllm" (vLLM's own server, which current ``trl vllm-serve`` execs:
    it serves ``/v1/models``), "trl" (the older ``trl vllm-serve`` FastAPI server, with
    ``/get_world_size/``), or "unknown"."""
    root = base_url(health_url)
    models = await fetch_text(root / "v1" / "models", limit)
    if models is not None and models[0] == 200:
        return "vllm"
    world = await fetch_text(root / "get_world_size/", limit)
    return "trl" if world is not None and world[0] == 200 else "unknown"


async def close_communicator(health_url: str, limit: float) -> bool:
    """POST ``/close_communicator/`` on the older ``trl vllm-serve`` server so a restarted
    trainer can open a new weight-sync group; True when the server answered 200."""
    url = base_url(health_url) / "close_communicator/"
    try:
        async with (
            _session() as session,
            session.post(url, allow_redirects=False,
                         timeout=aiohttp.ClientTimeout(total=limit)) as resp,
        ):
            ok = resp.status == 200
            log.info("vllm_close_communicator", url=str(url), status=resp.status)
            return ok
    except (TimeoutError, aiohttp.ClientError) as exc:
        log.warning("vllm_close_communicator_failed", url=str(url), error=str(exc))
        return False
