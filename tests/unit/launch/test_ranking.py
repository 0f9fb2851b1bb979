"""Offer filtering and ranking for ``traind launch``: pure, the same for every backend."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from traind.launch.base import Constraints, Offer
from traind.launch.ranking import explain, gpu_matches, normalise_gpu, rank, rejection


def offer(id: str, **kw: Any) -> Offer:
    values: dict[str, Any] = {
        "backend": "test", "id": id, "gpu_name": "RTX 4090", "num_gpus": 1,
        "price_per_hour": 0.5, "gpu_ram_gb": 24.0, "disk_gb": 100.0, "download_mbps": 500.0,
        "reliability": 0.99, "max_duration_hours": 24.0 * 30,
    }
    return Offer(**(values | kw))


@pytest.mark.parametrize(
    ("offered", "wanted", "match"),
    [
        ("RTX 4090", "RTX_4090", True),
        ("RTX 4090", "rtx-4090", True),
        ("RTX 4090", "RTX4090", True),
        ("H100 SXM", "H100", True),
        ("H100 NVL", "H100", True),
        ("RTX 4090", "RTX 409", False),
        ("RTX 4090", "RTX 3090", False),
        ("A100 SXM4", "A100_SXM4", True),
        ("A100", "A100 SXM4", False),
        ("", "RTX 4090", False),
        ("RTX 4090", "", False),
    ],
)
def test_gpu_names_match_in_any_spelling(offered: str, wanted: str, match: bool) -> None:
    """GPU names match ignoring case, spaces, _ and -; a family matches its variants only."""
    assert gpu_matches(offered, wanted) is match


def test_normalise_gpu() -> None:
    """Normalised names drop case and separators."""
    assert normalise_gpu(" RTX_40-90 ") == "rtx4090"


@pytest.mark.parametrize(
    ("field", "value", "constraint", "reason"),
    [
        ("gpu_name", "RTX 3090", {"gpu": ("RTX 4090",)}, "gpu model"),
        ("num_gpus", 1, {"num_gpus": 2}, "gpu count"),
        ("gpu_ram_gb", 16.0, {"min_gpu_ram_gb": 24.0}, "gpu memory"),
        ("disk_gb", 40.0, {"min_disk_gb": 50.0}, "disk"),
        ("download_mbps", 90.0, {"min_download_mbps": 100.0}, "download bandwidth"),
        ("reliability", 0.9, {"min_reliability": 0.95}, "reliability"),
        ("max_duration_hours", 2.0, {"duration_hours": 3.0}, "rental duration"),
        ("price_per_hour", 1.01, {"max_price_per_hour": 1.0}, "price cap"),
    ],
)
def test_each_constraint_rejects_with_its_reason(
    field: str, value: object, constraint: dict[str, Any], reason: str
) -> None:
    """Each constraint rejects an offer just past its bound, naming itself; at the bound the
    offer passes."""
    c = Constraints(**constraint)
    assert rejection(offer("x", **{field: value}), c) == reason
    assert rank([offer("x", **{field: value})], c) == []
    at_bound = {
        "gpu_name": "RTX 4090", "num_gpus": 2, "gpu_ram_gb": 24.0, "disk_gb": 50.0,
        "download_mbps": 100.0, "reliability": 0.95, "max_duration_hours": 3.0,
        "price_per_hour": 1.0,
    }[field]
    assert rejection(offer("x", **{field: at_bound}), c) is None


def test_unknown_duration_and_no_cap_accept() -> None:
    """An offer without a maximum duration passes a duration need; no cap means any price."""
    c = Constraints(duration_hours=100.0)
    assert rejection(offer("x", max_duration_hours=None, price_per_hour=99.0), c) is None


def test_empty_constraints_accept_any_gpu_but_need_one() -> None:
    """No GPU model listed accepts any model; the default still needs one GPU."""
    c = Constraints()
    assert rejection(offer("x", gpu_name="Tesla T4"), c) is None
    assert rejection(offer("x", num_gpus=0), c) == "gpu count"
    assert rejection(offer("x", num_gpus=0), Constraints(num_gpus=0)) is None


def test_several_gpu_models_any_matches() -> None:
    """A list of GPU models accepts any of them."""
    c = Constraints(gpu=("H100", "A100 SXM4"))
    names = ["H100 SXM", "A100 SXM4", "A100 PCIE", "RTX 4090"]
    assert {o.gpu_name for o in rank([offer(n, gpu_name=n) for n in names], c)} == set(names[:2])


def test_rank_cheapest_first_then_reliability_then_bandwidth_then_id() -> None:
    """Cheapest first; ties go to the more reliable, then the faster, then the lower id —
    whatever order the offers came in."""
    offers = [
        offer("e", price_per_hour=0.9),
        offer("d", price_per_hour=0.4, reliability=0.99, download_mbps=100.0),
        offer("c", price_per_hour=0.4, reliability=0.99, download_mbps=900.0),
        offer("b", price_per_hour=0.4, reliability=0.999),
        offer("a", price_per_hour=0.4, reliability=0.99, download_mbps=100.0),
        offer("f", price_per_hour=0.1, reliability=0.5),
    ]
    c = Constraints(min_reliability=0.9)
    expected = ["b", "c", "a", "d", "e"]
    for perm in itertools.permutations(offers):
        assert [o.id for o in rank(perm, c)] == expected


def test_rank_never_returns_a_rejected_offer() -> None:
    """Over a grid of offers and constraints, rank returns exactly the acceptable offers,
    sorted by price."""
    grid = [
        offer(f"{p}-{r}-{d}", price_per_hour=p, reliability=r, disk_gb=d)
        for p in (0.2, 0.5, 1.5) for r in (0.8, 0.97, 1.0) for d in (10.0, 100.0)
    ]
    for cap, rel, disk in itertools.product((None, 0.5, 1.0), (0.0, 0.95), (0.0, 50.0)):
        c = Constraints(max_price_per_hour=cap, min_reliability=rel, min_disk_gb=disk)
        ranked = rank(grid, c)
        assert {o.id for o in ranked} == {o.id for o in grid if rejection(o, c) is None}
        prices = [o.price_per_hour for o in ranked]
        assert prices == sorted(prices)


def test_raw_record_is_kept_but_not_compared() -> None:
    """The backend's raw record rides along and does not affect equality."""
    a = offer("x", raw={"dph_total": 0.5, "machine_id": 7})
    assert rank([a], Constraints())[0].raw["machine_id"] == 7
    assert a == offer("x", raw={})


def test_explain_counts_reasons() -> None:
    """explain() summarises why offers were turned down, most common first."""
    c = Constraints(max_price_per_hour=1.0, min_disk_gb=50.0)
    offers = [offer("a", price_per_hour=2.0), offer("b", price_per_hour=3.0),
              offer("c", disk_gb=10.0), offer("d")]
    assert explain(offers, c) == "2 price cap, 1 disk"
    assert explain([], c) == "none offered"
