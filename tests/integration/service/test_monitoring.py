"""The Grafana dashboard and Prometheus alert rules in monitoring/: promtool accepts and
tests the rules, and every dashboard query names a metric traind's /metrics exports."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aiohttp
import pytest
from tests.support.monitoring import dashboard_queries, exported, names_in
from tests.support.requires import need_binary

from traind.status import model
from traind.status.metrics import Metrics
from traind.status.server import StatusServer

MONITORING = Path(__file__).parents[3] / "monitoring"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run promtool in monitoring/ within 60 s."""
    return subprocess.run([need_binary("promtool"), *args], cwd=MONITORING,
                          capture_output=True, text=True, timeout=60, check=False)


def test_promtool_checks_the_rules() -> None:
    """``promtool check rules`` accepts alerts.yml."""
    done = promtool("check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_every_alert() -> None:
    """``promtool test rules`` passes, and each alert has a test where it fires."""
    done = promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    rules = (MONITORING / "alerts.yml").read_text()
    tests = (MONITORING / "alerts_test.yml").read_text()
    alerts = [line.split(":", 1)[1].strip() for line in rules.splitlines()
              if line.strip().startswith("- alert:")]
    assert len(alerts) >= 6
    assert [a for a in alerts if f"alertname: {a}" not in tests] == []


async def test_dashboard_queries_name_exported_metrics() -> None:
    """Every metric a dashboard panel queries is on the page the status server serves."""
    metrics = Metrics()
    async with (
        asyncio.timeout(10),
        StatusServer("127.0.0.1:0", lambda: model.snapshot(
            run="r", state="running", started=0, backend="memory"), metrics) as server,
        aiohttp.ClientSession() as session,
        session.get(f"http://{server.address}/metrics") as response,
    ):
        page = await response.text()
    names = exported(page)
    queries = dashboard_queries()
    assert len(queries) >= 10
    unknown = {title: sorted(n for e in exprs for n in names_in(e) if n not in names)
               for title, exprs in queries.items()}
    assert {t: u for t, u in unknown.items() if u} == {}
    assert all(names_in(e) for exprs in queries.values() for e in exprs)


@pytest.mark.parametrize("needed", [
    "traind_seconds_since_last_save", "traind_save_interval_seconds",
    "traind_newest_checkpoint_unsafe_seconds", "traind_disk_free_bytes",
    "traind_disk_floor_bytes", "traind_child_hangs_total", "traind_save_to_safe_seconds_bucket",
])
def test_the_alerts_metrics_are_on_the_dashboard(needed: str) -> None:
    """The metrics added for the alerts are graphed too."""
    assert any(needed in e for exprs in dashboard_queries().values() for e in exprs)
