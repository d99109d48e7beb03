"""Form text → admin API JSON, histogram arithmetic, and the redacted configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import orjson
import pytest
import yaml

from triogate.config import parse_config
from triogate.ui import forms, stats
from triogate.ui.limits import window_sum
from triogate.ui.pages_system import REDACTED, is_secret_name, redacted
from triogate.ui.stats import Overview, Sampler, combine, diff, per_bucket, quantile, worker_row


def test_creating_leaves_out_empty_fields_and_converts_the_rest() -> None:
    form = {"key_alias": " svc ", "max_budget": "$5.50", "budget_duration": "1d",
            "rpm_limit": "1,000", "tpm_limit": "", "models": "a, b,, ", "tags": "",
            "metadata": '{"owner": "me"}', "csrf": "x", "duration": "30d"}
    body = forms.body_of("keys", form, creating=True)
    assert body == {"key_alias": "svc", "max_budget": "5.50", "budget_duration": "1d",
                    "rpm_limit": 1000, "models": ["a", "b"], "metadata": {"owner": "me"},
                    "duration": "30d"}


def test_updating_sends_null_for_an_emptied_limit() -> None:
    body = forms.body_of("teams", {"team_alias": "T", "rpm_limit": "", "models": ""},
                         creating=False)
    assert body == {"team_alias": "T", "rpm_limit": None, "models": None}
    assert "duration" not in forms.editable("keys", creating=False)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("rpm_limit", "ten", "not a whole number"),
    ("metadata", "{oops", "not valid JSON"),
    ("metadata", "[1, 2]", "must be a JSON object"),
])
def test_text_that_cannot_be_json_is_named(name: str, text: str, message: str) -> None:
    with pytest.raises(forms.FormError, match=message):
        forms.body_of("keys", {name: text}, creating=True)


def test_each_kind_shows_only_the_fields_its_api_accepts() -> None:
    assert "key_alias" in forms.editable("keys", creating=True)
    assert "key_alias" not in forms.editable("teams", creating=True)
    assert forms.editable("tags", creating=True) == [
        "description", "max_budget", "budget_duration", "rpm_limit", "tpm_limit"]
    for kind in forms.FIELDS:
        assert set(forms.editable(kind, creating=True)) <= set(forms.FIELDS[kind])


def test_stored_values_show_as_form_text() -> None:
    html = forms.render_fields("keys", {"models": ["a", "b"], "max_budget": 5.0,
                                        "metadata": {"k": "<v>"}}, creating=False)
    assert 'value="a, b"' in html and 'value="5"' in html
    assert "&lt;v&gt;" in html and "<v>" not in html


def _cumulative(counts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, running = [], 0.0
    for bound, n in counts:
        running += n
        out.append((bound, running))
    return out


def test_quantiles_interpolate_inside_a_bucket() -> None:
    buckets = _cumulative([(0.1, 50), (0.5, 40), (1.0, 10), (float("inf"), 0)])
    assert quantile(buckets, 0.5) == pytest.approx(0.1)
    assert quantile(buckets, 0.9) == pytest.approx(0.5)
    assert quantile(buckets, 0.99) == pytest.approx(0.95)
    assert quantile([], 0.5) is None
    assert quantile([(1.0, 0.0), (float("inf"), 0.0)], 0.5) is None


def test_wait_buckets_read_as_counts_per_number_of_waits() -> None:
    buckets = _cumulative([(0, 0), (1, 7), (2, 2), (3, 0), (4, 0), (5, 0), (6, 0), (8, 1),
                           (10, 0), (15, 0), (20, 0), (float("inf"), 3)])
    named = dict(per_bucket(buckets))
    assert named["1"] == 7 and named["2"] == 2 and named["7-8"] == 1
    assert named["> 20"] == 3 and named["0"] == 0


def test_the_sampler_reports_the_last_minute() -> None:
    sampler = Sampler()
    key: Any = ("triogate_requests_total", ())
    assert sampler.window(100.0, {key: 10.0}) == (0.0, {key: 10.0})  # since start
    span, recent = sampler.window(130.0, {key: 40.0})
    assert span == 30.0 and recent == {key: 30.0}
    span, recent = sampler.window(175.0, {key: 50.0})  # the first snapshot is too old
    assert span == 45.0 and recent == {key: 10.0}
    assert diff({key: 5.0}, {}) == {key: 5.0}


def _process(pid: int, fast: float, slow: float, *, errors: float = 0.0) -> dict[str, Any]:
    """A process's published row (through JSON, as Redis holds it)."""
    duration = _cumulative([(0.01, fast), (0.1, 0.0), (1.0, slow), (float("inf"), 0.0)])
    o = Overview(pid=pid, window_s=60.0, requests=fast + slow, errors=errors,
                 duration=duration, ttft=[], requests_per_s=(fast + slow) / 60,
                 error_rate=errors / (fast + slow), p50_s=None, p99_s=None, ttft_p50_s=None,
                 waits_before=[("1", fast + slow), ("2", 0.0)], waits_after=[("1", 1.0)],
                 degraded={}, settler_queue=0, journal_pending=0, spend_log_queue=0,
                 redis_ok=True)
    row: dict[str, Any] = orjson.loads(orjson.dumps(worker_row(o, 1)))
    return row


def test_the_cards_add_up_every_process() -> None:
    # One process served 90 fast requests, the other 10 slow ones (5 of them errors):
    # the gateway's p50 is fast, its p99 slow, its error rate 5 in 100.
    every = combine([_process(1, 90, 0), _process(2, 0, 10, errors=5)])
    assert every.processes == 2 and every.requests == 100
    assert every.requests_per_s == pytest.approx(100 / 60)
    assert every.error_rate == pytest.approx(0.05)
    assert every.p50_s is not None and every.p50_s <= 0.01
    assert every.p99_s is not None and 0.1 < every.p99_s <= 1.0
    assert every.ttft_p50_s is None  # no stream anywhere
    assert every.waits_before == [("1", 100.0), ("2", 0.0)]
    assert every.waits_after == [("1", 2.0)]
    alone = combine([_process(1, 90, 0)])
    assert alone.processes == 1 and alone.p99_s is not None and alone.p99_s <= 0.01
    assert combine([]).requests_per_s is None


def test_the_configuration_page_redacts_every_secret() -> None:
    config = parse_config({
        "model_list": [{"model_name": "m", "litellm_params": {
            "model": "openai/m", "api_base": "https://user:pw-in-url@api.example/v1",
            "api_key": "sk-upstream-SECRET", "input_cost_per_token": "0.000001"}}],
        "general_settings": {"master_key": "sk-master-SECRET",
                             "database_url": "postgresql://gw:db-SECRET@db/triogate"},
        "triogate": {"redis": {"url": "redis://:redis-SECRET@cache:6379/0"}},
    })
    text = yaml.safe_dump(redacted(config))
    for secret in ("sk-upstream-SECRET", "sk-master-SECRET", "db-SECRET", "redis-SECRET",
                   "pw-in-url"):
        assert secret not in text
    assert REDACTED in text
    assert "0.000001" in text  # a price per token is not a secret
    assert "api.example" in text and "cache:6379" in text


@pytest.mark.parametrize(("name", "secret"), [
    ("api_key", True), ("master_key", True), ("password", True), ("client_secret", True),
    ("auth", True), ("input_usd_per_token", False), ("key_hash", False),
    ("max_tokens", False), ("keys", False), ("model", False),
])
def test_secret_field_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_rate_windows_sum_the_last_sixty_one_second_buckets() -> None:
    now_ms = 1_000_000_500
    second = now_ms // 1000
    reply = [str(second).encode(), b"3", str(second - 59).encode(), b"2",
             str(second - 60).encode(), b"100", b"junk", b"1", str(second + 1).encode(), b"4"]
    assert window_sum(reply, now_ms) == 9  # the bucket 60 s old has left; a future one counts
    assert window_sum([], now_ms) == 0
    assert window_sum(None, now_ms) is None


def test_a_row_of_an_exited_process_of_this_host_is_dropped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert stats._gone({"host": stats.HOST, "pid": child.pid})
    assert not stats._gone({"host": stats.HOST, "pid": os.getpid()})
    assert not stats._gone({"host": "another-machine", "pid": child.pid})
    assert not stats._gone({"host": stats.HOST, "pid": None})


def test_a_users_role_is_a_choice_of_the_apis_roles() -> None:
    from triogate.api.admin.fields import USER_ROLES
    assert {r for r, _ in forms.ROLE_CHOICES} == set(USER_ROLES)
    markup = forms.render_fields("users", {"user_role": "proxy_admin_viewer"}, creating=False)
    assert '<select id="f-user_role" name="user_role">' in markup
    assert '<option value="proxy_admin_viewer" selected>' in markup
    assert forms.body_of("users", {"user_role": "proxy_admin"}, creating=True) == {
        "user_role": "proxy_admin"}
    assert "user_role" not in forms.render_fields("keys", creating=True)
