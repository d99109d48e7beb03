"""Every metric the alert rules and the Grafana dashboard in config/ use exists in a running
gateway's /metrics, and the new figures (spend, upstream attempts, cooldowns) are fed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import trio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MASTER_KEY

if TYPE_CHECKING:
    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

CONFIG = Path(__file__).resolve().parents[2] / "config"
_NAME = re.compile(r"\btriogate_[a-z0-9_]+")
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                               "_created"),
             "gauge": ("",), "summary": ("_sum", "_count", "_created")}


def names_used() -> dict[str, set[str]]:
    """triogate_* names in the alert rules' and the dashboard's expressions, by file."""
    rules = yaml.safe_load((CONFIG / "alerts.yml").read_text())
    alert_exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((CONFIG / "grafana-dashboard.json").read_text())
    panel_exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    panel_exprs += [v["query"] for v in dashboard["templating"]["list"]
                    if v["type"] == "query"]
    return {
        "alerts.yml": {n for e in alert_exprs for n in _NAME.findall(e)},
        "grafana-dashboard.json": {n for e in panel_exprs for n in _NAME.findall(e)},
    }


def exposed(text: str) -> tuple[set[str], dict[str, float]]:
    """Every series name /metrics can show (a family's declared names count even before its
    first sample), and the sample values by ``name{labels}``."""
    names: set[str] = set()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
        for sample in family.samples:
            names.add(sample.name)
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = sample.value
    return names, values


async def test_every_metric_in_the_alerts_and_the_dashboard_is_exposed(
    gateway: Gateway,
) -> None:
    used = names_used()
    assert all(used.values())
    with trio.fail_after(30):
        async with httpx.AsyncClient(timeout=20) as http:
            response = await http.post(
                f"{gateway.openai_base}/chat/completions",
                headers={"authorization": f"Bearer {MASTER_KEY}"},
                json={"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]})
            assert response.status_code == 200
            await gateway.services.settler.wait_drained()
            scraped = await http.get(f"{gateway.url}/metrics")
    names, values = exposed(scraped.text)
    for source, wanted in used.items():
        assert wanted <= names, f"{source} uses metrics /metrics lacks: {wanted - names}"
    deployment = response.headers["x-triogate-deployment"]
    assert values[f"triogate_upstream_attempts_total{{deployment={deployment},outcome=ok}}"] == 1
    assert values["triogate_spend_usd_total{model_group=gpt-test}"] > 0
    assert values["triogate_deployments_cooling_down{}"] == 0
    assert values["triogate_redis_waits_per_request_count{phase=before}"] == 1
