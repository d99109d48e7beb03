"""Metrics observed through cached children still reach the exposition."""

from __future__ import annotations

from triogate.metrics import Metrics


def _sample(metrics: Metrics, name: str, labels: dict[str, str]) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_cached_child_still_counts() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.observe_request("chat", "g", "d1", 200, 0.02, cost_nanousd=1_500_000_000)
    metrics.observe_request("chat", "g", "d1", 429, 0.01)
    labels = {"route": "chat", "model_group": "g", "deployment": "d1"}
    assert _sample(metrics, "triogate_requests_total", {**labels, "status": "200"}) == 3
    assert _sample(metrics, "triogate_requests_total", {**labels, "status": "429"}) == 1
    assert _sample(metrics, "triogate_request_duration_seconds_count",
                   {"route": "chat", "model_group": "g"}) == 4
    assert _sample(metrics, "triogate_spend_usd_total", {"model_group": "g"}) == 4.5


def test_the_child_is_the_metrics_own() -> None:
    """The cache holds what ``labels()`` returns: both paths count on one child."""
    metrics = Metrics()
    metrics.redis_waits_child("before").observe(1)
    metrics.redis_waits.labels("before").observe(1)
    assert metrics.redis_waits_child("before") is metrics.redis_waits.labels("before")
    assert _sample(metrics, "triogate_redis_waits_per_request_count", {"phase": "before"}) == 2
    metrics.observe_attempts([("d1", True, None, 0.1), ("d1", False, None, 0.1)])
    assert _sample(metrics, "triogate_upstream_attempts_total",
                   {"deployment": "d1", "outcome": "error"}) == 1
    assert b"triogate_upstream_attempts_total" in metrics.render()
