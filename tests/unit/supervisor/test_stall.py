"""Hang detection from vLLM's /metrics: parsing and the pure stall decision."""

from __future__ import annotations

from traind.supervisor.stall import Load, Stall, is_hung, observe, parse_load

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 23.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:prompt_tokens_total{engine="0",model_name="m"} 999.0
"""


def test_parse_sums_engines_and_ignores_other_series() -> None:
    """Running, waiting and generated tokens are summed over engines; _created is not a count."""
    assert parse_load(METRICS) == Load(running=3.0, waiting=3.0, generated=123.0)


def test_parse_without_the_token_counter_is_none() -> None:
    """A /metrics without vllm:generation_tokens_total (not vLLM) gives no reading."""
    assert parse_load("python_gc_objects_collected_total 1.0\n") is None
    assert parse_load("vllm:num_requests_running 1\nvllm:generation_tokens_total x\n") is None


def test_idle_is_never_hung() -> None:
    """No request running or waiting: no stall, however long nothing is generated."""
    idle = Load(0, 0, 5)
    stall = None
    for now in range(0, 10_000, 100):
        stall = observe(stall, idle, float(now))
        assert not is_hung(stall, float(now), 300)


def test_busy_and_generating_is_not_hung() -> None:
    """Every reading with a moved counter restarts the clock."""
    stall = None
    for step in range(100):
        stall = observe(stall, Load(1, 0, float(step)), step * 200.0)
        assert not is_hung(stall, step * 200.0, 300)


def test_busy_without_tokens_is_hung_after_the_limit() -> None:
    """Busy with a frozen counter is hung exactly at stall_timeout, counted from the last
    token; becoming idle clears it."""
    stall = observe(None, Load(2, 0, 50), 0.0)
    stall = observe(stall, Load(2, 1, 51), 10.0)
    assert stall == Stall(10.0, 51)
    stall = observe(stall, Load(0, 4, 51), 309.0)
    assert not is_hung(stall, 309.0, 300)
    assert is_hung(stall, 310.0, 300)
    assert observe(stall, Load(0, 0, 51), 311.0) is None
