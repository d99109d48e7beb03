"""The failing-deployment warnings: one per deployment per interval, with the count."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from triogate.errors import ProviderConnectError, ProviderStatusError
from triogate.routing.failures import MAX_TEXT, FailureLog, describe

if TYPE_CHECKING:
    import pytest


def test_describe_is_one_line_with_the_class_and_a_bounded_text() -> None:
    assert describe(ProviderConnectError("ConnectError: [Errno 111]\n refused")) == (
        "ProviderConnectError: ConnectError: [Errno 111] refused")
    long = describe(ProviderStatusError(500, "x" * 5000))
    assert long.startswith("ProviderStatusError: upstream returned 500: xxx")
    assert len(long) <= len("ProviderStatusError: ") + MAX_TEXT + 1
    assert describe(ValueError()) == "ValueError"


def test_one_warning_per_deployment_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    log = FailureLog(interval_ms=10_000)
    caplog.set_level(logging.WARNING, logger="triogate.routing")
    error = ProviderConnectError("refused")
    for now_ms in (0, 1_000, 2_000, 9_999):
        log.note("gpt", "dep-a", error, now_ms=now_ms)
    log.note("gpt", "dep-b", error, now_ms=5_000)  # another deployment: its own interval
    log.note("gpt", "dep-a", error, now_ms=10_000)
    lines = [(r.getMessage(), getattr(r, "failures_not_logged", None)) for r in caplog.records]
    assert lines == [
        ("deployment dep-a of gpt failed: ProviderConnectError: refused", 0),
        ("deployment dep-b of gpt failed: ProviderConnectError: refused", 0),
        ("deployment dep-a of gpt failed: ProviderConnectError: refused", 3),
    ]
