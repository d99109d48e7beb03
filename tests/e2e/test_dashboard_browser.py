"""The dashboard in a real headless browser (Debian's chromium, driven by Playwright).

One flow, as an operator would go: sign in with the master key, create a key with a budget,
use it through the openai SDK, find the request in the spend chart and the log table,
block the key and see the API refuse it, sign out. On the way: a key alias that is a
script renders as text, the new key is shown once, every input has a label, the keyboard
reaches the main actions, the configuration page shows no secret. Screenshots of each
page go to ``build/screenshots/`` (ignored by git), or to the folder named by
``TRIOGATE_SCREENSHOTS_DIR``: ``TRIOGATE_SCREENSHOTS_DIR=docs/screenshots`` refreshes the
ones docs/dashboard.md shows, so an ordinary run leaves the work tree clean.

Skipped, with the reason, when chromium or Playwright is not installed
(``.ci/install-browser.sh`` installs both).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import pytest
import trio

from tests.e2e.conftest import (
    BOTH_SERVERS,
    MASTER_KEY,
    UPSTREAM_KEY,
    gateway_config,
    running_gateway,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.e2e.conftest import Gateway
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.e2e, BOTH_SERVERS]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / os.environ.get("TRIOGATE_SCREENSHOTS_DIR", "build/screenshots")
XSS = "<script>alert(1)</script>"

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

if sync_playwright is None or not Path(CHROMIUM).exists():
    if os.environ.get("TRIOGATE_REQUIRE_BROWSER"):  # .ci/run installs both: never skip there
        raise RuntimeError("TRIOGATE_REQUIRE_BROWSER is set but chromium or playwright is "
                           "missing (run .ci/install-browser.sh)")
    pytest.skip("needs Debian's chromium and the playwright package "
                "(run .ci/install-browser.sh)", allow_module_level=True)


def poll(check: Any, *, deadline_s: float = 20.0, what: str) -> Any:
    """Call ``check`` until it returns something truthy (or fail after the deadline)."""
    end = time.monotonic() + deadline_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def unlabelled_inputs(page: Any) -> list[str]:
    """Visible inputs and selects that no <label for> nor aria-label names."""
    return page.evaluate("""() => Array.from(document.querySelectorAll(
        'input:not([type=hidden]), select, textarea')).filter(e =>
        !(e.id && document.querySelector('label[for="' + e.id + '"]')) &&
        !e.getAttribute('aria-label')).map(e => e.name || e.outerHTML)""")


def tab_reaches(page: Any, text: str, *, presses: int = 60) -> bool:
    """Whether pressing Tab from the top of the page focuses an element showing ``text``."""
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    for _ in range(presses):
        page.keyboard.press("Tab")
        focused = page.evaluate("() => (document.activeElement.textContent || "
                                "document.activeElement.value || '').trim()")
        if focused == text:
            return True
    return False


def fits(page: Any) -> list[str]:
    """What does not fit the 1280 px window: the page itself, or a table that scrolls."""
    return page.evaluate("""() => {
        const out = [];
        const root = document.documentElement;
        if (root.scrollWidth > window.innerWidth) out.push('page ' + root.scrollWidth + ' px');
        document.querySelectorAll('.table-wrap').forEach(w => {
            if (w.scrollWidth > w.clientWidth + 1)
                out.push('table "' + (w.querySelector('th') || {}).textContent + '..." '
                         + w.scrollWidth + ' px in ' + w.clientWidth);
        });
        return out; }""")


def shot(page: Any, name: str) -> None:
    assert fits(page) == [], f"{name}: {fits(page)}"  # no clipped column, no sideways page
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def browse(base: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"dialogs": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            # Only the dashboard's own confirmations may open a dialog; alert(1) must not.
            def answer(dialog: Any) -> None:
                seen["dialogs"].append(dialog.message)
                if seen.get("dismiss"):
                    dialog.dismiss()
                else:
                    dialog.accept()
            page.on("dialog", answer)
            flow(page, base, seen)
        finally:
            browser.close()
    return seen


def flow(page: Any, base: str, seen: dict[str, Any]) -> None:
    # Signed out, every page leads to the sign-in form.
    page.goto(f"{base}/ui/keys")
    assert page.url.startswith(f"{base}/ui/login")
    assert unlabelled_inputs(page) == []
    assert tab_reaches(page, "Sign in")
    shot(page, "sign-in")
    page.fill("#f-key", "sk-wrong")
    page.click("button:has-text('Sign in')")
    assert "cannot sign in" in page.inner_text("main")
    page.fill("#f-key", MASTER_KEY)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"{base}/ui/keys")
    cookie = next(c for c in page.context.cookies() if c["name"] == "triogate_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert MASTER_KEY not in cookie["value"]
    page.goto(f"{base}/ui")  # the overview's first snapshot: later visits show rates

    # A team, then a key of that team with a budget; the raw key is shown once.
    page.goto(f"{base}/ui/teams/new")
    assert unlabelled_inputs(page) == []
    page.fill("#f-team_id", "payments")
    page.fill("#f-team_alias", "Payments")
    page.fill("#f-max_budget", "100")
    page.fill("#f-budget_duration", "30d")
    page.click("button:has-text('Create team')")
    page.wait_for_url(re.compile(r".*/ui/teams/view\?id=payments"))
    page.goto(f"{base}/ui/keys/new")
    assert unlabelled_inputs(page) == []
    assert tab_reaches(page, "Create key")
    page.fill("#f-key_alias", "checkout-service")
    page.fill("#f-team_id", "payments")
    page.fill("#f-max_budget", "5")
    page.fill("#f-budget_duration", "1d")
    page.fill("#f-rpm_limit", "60")
    page.fill("#f-models", "gpt-test")
    page.fill("#f-tags", "team-checkout")
    shot(page, "key-new")
    page.click("button:has-text('Create key')")
    raw_key = page.inner_text("#new-key").strip()
    assert raw_key.startswith("sk-")
    page.click("button:has-text('Copy')")
    page.wait_for_selector("button:has-text('Copied')")
    shot(page, "key-created")

    # A key to delete later.
    page.goto(f"{base}/ui/keys/new")
    page.fill("#f-key_alias", "ui-spare")
    page.click("button:has-text('Create key')")
    assert page.inner_text("#new-key").startswith("sk-")

    # A second key whose alias is a script: text everywhere, never run.
    page.goto(f"{base}/ui/keys/new")
    page.fill("#f-key_alias", XSS)
    page.click("button:has-text('Create key')")
    viewer_key = page.inner_text("#new-key").strip()
    page.goto(f"{base}/ui/keys")
    assert XSS in page.inner_text("main")
    assert page.locator("main script").count() == 0
    assert raw_key not in page.content()  # shown once, never again
    shot(page, "keys")

    # Use the key through the official SDK.
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=raw_key, max_retries=0)
    for _ in range(2):
        reply = client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hello"}],
            extra_body={"metadata": {"tags": ["checkout"]}})
        assert reply.choices[0].message.content
    stream = client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "stream it"}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    seen["used"] = True

    # The requests appear in the spend log table and chart (the writer flushes each second).
    def logged() -> bool:
        page.goto(f"{base}/ui/spend")
        return page.locator("table tbody tr:has-text('checkout-service')").count() >= 3
    poll(logged, what="the spend log rows")
    chart = page.locator("svg[aria-label='Spend per day by key']")
    assert "checkout-service" in chart.locator("xpath=..").inner_text()
    assert chart.locator("rect title").count() >= 1
    tags = page.locator("svg[aria-label='Spend per day by tag']").locator("xpath=..")
    assert "checkout" in tags.inner_text()
    assert unlabelled_inputs(page) == []
    shot(page, "spend")
    page.select_option("#f-status", "error")
    page.click("button:has-text('Apply')")
    assert "No requests match these filters." in page.inner_text("main")
    with page.expect_download() as download:
        page.goto(f"{base}/ui/spend")
        page.click("a:has-text('Export CSV')")
    csv_text = Path(download.value.path()).read_text()
    assert csv_text.count("checkout-service") >= 3

    # The key's page: its spend and its limits' use; then block it.
    page.goto(f"{base}/ui/keys")
    page.click("a:has-text('checkout-service')")
    assert "Spend per day by model" in page.content()
    assert re.search(r"3 of 60", page.inner_text("main"))
    assert tab_reaches(page, "Block", presses=120)
    shot(page, "key-detail")
    page.click("button:has-text('Block')")
    assert "Blocked." in page.inner_text("main")

    def refused() -> bool:
        try:
            client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "again"}])
        except (openai.AuthenticationError, openai.PermissionDeniedError):
            return True
        return False
    poll(refused, what="the API to refuse the blocked key")

    page.goto(f"{base}/ui/teams/view?id=payments")
    assert "checkout-service" in page.inner_text("main")  # its keys
    shot(page, "team-detail")

    # The other pages render, and the configuration holds no secret.
    page.goto(f"{base}/ui")
    assert "Redis waits per request" in page.inner_text("main")
    assert "last" in page.inner_text(".cards")  # a window of the last seconds
    assert page.locator("svg[aria-label='Redis waits before the model call'] rect").count() > 0
    shot(page, "overview")
    page.goto(f"{base}/ui/deployments")
    assert "gpt-a" in page.inner_text("main")
    shot(page, "deployments")
    page.goto(f"{base}/ui/config")
    text = page.content()
    assert MASTER_KEY not in text and UPSTREAM_KEY not in text and "redacted" in text
    shot(page, "config")

    # The other lists and forms: labelled, and within the window.
    for path in ("/ui/teams", "/ui/users", "/ui/customers", "/ui/tags", "/ui/users/new",
                 "/ui/customers/new", "/ui/tags/new"):
        page.goto(f"{base}{path}")
        assert unlabelled_inputs(page) == [], path
        assert fits(page) == [], path

    # Deleting asks first: dismissed, the key stays; confirmed, it is gone.
    page.goto(f"{base}/ui/keys")
    page.click("a:has-text('ui-spare')")
    seen["dismiss"] = True
    page.click("button:has-text('Delete key')")
    assert seen["dialogs"][-1].startswith("Delete this key?")
    assert "ui-spare" in page.inner_text("h1")
    seen["dismiss"] = False
    page.click("button:has-text('Delete key')")
    page.wait_for_url(f"{base}/ui/keys")
    assert "Deleted" in page.inner_text("main") and "ui-spare" not in page.inner_text("main")

    # Sign out: the session is gone.
    page.click("button:has-text('Sign out')")
    page.wait_for_url(re.compile(r".*/ui/login.*"))
    assert "signed out" in page.inner_text("main")
    page.goto(f"{base}/ui/spend")
    assert page.url.startswith(f"{base}/ui/login")

    # A virtual key signs in read-only to its own page (and not to the blocked one).
    page.fill("#f-key", raw_key)
    page.click("button:has-text('Sign in')")
    assert "cannot sign in" in page.inner_text("main")
    page.fill("#f-key", viewer_key)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"{base}/ui/mine")
    assert XSS in page.inner_text("h1")
    assert page.locator("a:has-text('Keys')").count() == 0
    page.goto(f"{base}/ui/keys")
    assert "does not allow" in page.inner_text("main")


@pytest.fixture
async def gateway(tmp_path: Path, redis: object, redis_url: str,
                  upstream: FakeUpstream, server: str) -> AsyncIterator[Gateway]:
    """The default gateway, bounded by the browser flow's own 240 s rather than the
    default fixture's 60 s, which a loaded host's browser flow outlasted (the gateway was
    cancelled under it: connection refused)."""
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url)
    with trio.fail_after(300):
        async with running_gateway(config, server=server) as gw:
            yield gw


async def test_dashboard_flow_in_a_real_browser(gateway: Gateway) -> None:
    with trio.fail_after(240):
        seen = await trio.to_thread.run_sync(browse, gateway.url)
    assert seen.get("used")
    assert all("alert" not in m and m != "1" for m in seen["dialogs"])
