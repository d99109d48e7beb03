"""The dashboard's session and CSRF rules over real HTTP (a running gateway, httpx).

A form without its token, or posted from another origin, changes nothing; a forged or
signed-out cookie opens nothing; every page carries the security headers.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import httpx
import pytest
import trio
import yaml

from tests.e2e.conftest import MASTER_KEY
from triogate.store import SpendLogRow

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.conftest import Gateway

pytestmark = pytest.mark.e2e

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def token(html: str) -> str:
    found = _CSRF.search(html)
    assert found, "no CSRF token in the page"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, key: str = MASTER_KEY) -> httpx.Response:
    page = await client.get("/ui/login")
    return await client.post("/ui/login", data={"key": key, "csrf": token(page.text),
                                                "next": "/ui/keys"})


async def key_count(gateway: Gateway) -> int:
    assert gateway.services.store is not None
    return (await gateway.services.store.list_keys(page=1, size=10))[1]


async def test_signed_out_pages_lead_to_the_sign_in_form(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await client.get("/ui/spend")
        assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=%2Fui%2Fspend"
        r = await client.post("/ui/keys/new", data={"key_alias": "x"})
        assert r.status_code == 403
        assert await key_count(gateway) == 0


async def test_sign_in_sets_a_strict_http_only_cookie(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await sign_in(client)
        assert r.status_code == 303 and r.headers["location"] == "/ui/keys"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
        assert "Secure" not in cookie and MASTER_KEY not in cookie
        page = await client.get("/ui/keys")
        assert page.status_code == 200
        for header in ("content-security-policy", "x-frame-options", "x-content-type-options"):
            assert header in page.headers
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert "<script>" not in page.text  # only <script src=...>, no inline script


async def test_over_tls_the_cookie_is_secure(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url,
                                 headers={"x-forwarded-proto": "https"}) as client:
        r = await sign_in(client)
        assert r.headers["set-cookie"].endswith("; Secure")


async def test_a_wrong_key_or_a_stale_sign_in_form_is_refused(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await sign_in(client, "sk-not-the-master")
        assert r.status_code == 401
        assert "triogate_ui=" not in r.headers.get("set-cookie", "")
        await client.get("/ui/login")
        r = await client.post("/ui/login", data={"key": MASTER_KEY, "csrf": "forged"})
        assert r.status_code == 403
        assert "triogate_ui=" not in r.headers.get("set-cookie", "")


async def test_forms_need_the_session_token_and_this_origin(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        await sign_in(client)
        form = await client.get("/ui/keys/new")
        csrf = token(form.text)
        r = await client.post("/ui/keys/new", data={"key_alias": "no-token"})
        assert r.status_code == 403
        r = await client.post("/ui/keys/new", data={"key_alias": "bad", "csrf": csrf + "x"})
        assert r.status_code == 403
        r = await client.post("/ui/keys/new", data={"key_alias": "evil", "csrf": csrf},
                              headers={"origin": "http://evil.example"})
        assert r.status_code == 403
        assert await key_count(gateway) == 0
        r = await client.post("/ui/keys/new", data={"key_alias": "ok", "csrf": csrf},
                              headers={"origin": gateway.url})
        assert r.status_code == 200 and 'id="new-key"' in r.text
        assert await key_count(gateway) == 1
        # Another session's token does not work in this one.
        async with httpx.AsyncClient(base_url=gateway.url) as other:
            await sign_in(other)
            r = await other.post("/ui/keys/new", data={"key_alias": "x", "csrf": csrf})
            assert r.status_code == 403
        assert await key_count(gateway) == 1


async def test_the_api_refusal_is_shown_and_changes_nothing(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        await sign_in(client)
        csrf = token((await client.get("/ui/keys/new")).text)
        r = await client.post("/ui/keys/new", data={"csrf": csrf, "duration": "9999999999d",
                                                     "key_alias": "<b>x</b>"})
        assert r.status_code == 400
        assert "must be at most 36500d" in r.text
        assert 'value="&lt;b&gt;x&lt;/b&gt;"' in r.text  # the form keeps what was typed
        assert await key_count(gateway) == 0


async def test_a_forged_cookie_opens_nothing(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        await sign_in(client)
        value = client.cookies["triogate_ui"]
    body, _, mac = value.partition(".")
    for forged in (body + "." + mac[::-1], body[:-2] + "." + mac, value + "x"):
        async with httpx.AsyncClient(base_url=gateway.url,
                                     cookies={"triogate_ui": forged}) as other:
            r = await other.get("/ui/keys")
            assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
    async with httpx.AsyncClient(base_url=gateway.url, cookies={"triogate_ui": value}) as same:
        assert (await same.get("/ui/keys")).status_code == 200  # the real one still works


async def test_a_signed_out_cookie_stops_working(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        await sign_in(client)
        value = client.cookies["triogate_ui"]
        csrf = token((await client.get("/ui")).text)
        r = await client.post("/ui/logout", data={"csrf": csrf})
        assert r.status_code == 303 and "Max-Age=0" in r.headers["set-cookie"]
    async with httpx.AsyncClient(base_url=gateway.url) as replay:
        replay.cookies.set("triogate_ui", value, path="/ui")
        r = await replay.get("/ui/keys")
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")


async def test_a_virtual_key_sees_only_its_own_page(gateway: Gateway) -> None:
    assert gateway.services.store is not None
    raw, _ = await gateway.services.store.create_key(key_alias="<i>mine</i>")
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await sign_in(client, raw)
        assert r.status_code == 303 and r.headers["location"] == "/ui/mine"
        mine = await client.get("/ui/mine")
        assert mine.status_code == 200 and "&lt;i&gt;mine&lt;/i&gt;" in mine.text
        assert raw not in mine.text
        for link in re.findall(r'href="(/ui[^"#]*)"', mine.text):  # no link to a closed page
            if "logout" not in link:
                r = await client.get(link.replace("&amp;", "&"))
                assert r.status_code in (200, 303), link
        for path in ("/ui/keys", "/ui/spend", "/ui/config", "/ui/spend.csv"):
            assert (await client.get(path)).status_code == 403
        r = await client.get("/ui")
        assert r.status_code == 303 and r.headers["location"] == "/ui/mine"


async def test_a_users_role_decides_what_its_key_may_do(gateway: Gateway) -> None:
    store = gateway.services.store
    assert store is not None
    await store.create_user(user_id="ops", user_role="proxy_admin")
    await store.create_user(user_id="auditor", user_role="proxy_admin_viewer")
    admin_raw, _ = await store.create_key(user_id="ops", key_alias="ops-key")
    viewer_raw, _ = await store.create_key(user_id="auditor", key_alias="audit-key")
    async with httpx.AsyncClient(base_url=gateway.url) as viewer:
        r = await sign_in(viewer, viewer_raw)
        assert r.status_code == 303 and r.headers["location"] == "/ui/keys"
        page = await viewer.get("/ui/keys")
        assert page.status_code == 200 and "ops-key" in page.text
        assert "New key" not in page.text  # no button to a page it may not open
        for path in ("/ui", "/ui/spend", "/ui/config", "/ui/deployments"):
            assert (await viewer.get(path)).status_code == 200, path
        assert (await viewer.get("/ui/teams/new")).status_code == 403
        r = await viewer.post("/ui/teams/new", data={"csrf": token(page.text),
                                                     "team_id": "nope"})
        assert r.status_code == 403
        assert "nope" not in await store.get_teams(["nope"])
    async with httpx.AsyncClient(base_url=gateway.url) as admin:
        await sign_in(admin, admin_raw)
        csrf = token((await admin.get("/ui/teams/new")).text)
        r = await admin.post("/ui/teams/new", data={"csrf": csrf, "team_id": "made-by-ops"})
        assert r.status_code == 303, r.text
        assert "made-by-ops" in await store.get_teams(["made-by-ops"])
        # The role is chosen in the user form, and shown on the user's page.
        new_user = await admin.get("/ui/users/new")
        assert '<select id="f-user_role" name="user_role">' in new_user.text
        r = await admin.post("/ui/users/new", data={"csrf": csrf, "user_id": "aud2",
                                                    "user_role": "proxy_admin_viewer"})
        assert r.status_code == 303, r.text
        assert (await store.get_users(["aud2"]))["aud2"].user_role == "proxy_admin_viewer"
        assert "proxy_admin_viewer" in (await admin.get(r.headers["location"])).text
        await store.update_user("ops", user_role="internal_user")  # demoted: read-only
        assert (await admin.get("/ui/teams/new")).status_code == 403


async def test_the_overview_lists_every_worker(tmp_path: Path) -> None:
    """`serve --workers 2`: each worker reports when it serves the overview; both appear."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "m", "litellm_params": {"model": "mock/m"}}],
        "general_settings": {"master_key": MASTER_KEY},
        "triogate": {"state_dir": str(tmp_path / "state")},
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIOGATE_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "triogate", "serve", "--config", str(config), "--port", "0",
         "--workers", "2"], stderr=subprocess.PIPE, env=env)
    assert process.stderr is not None
    try:
        def ready() -> tuple[int, set[str]]:
            port, pids = 0, set()
            for line in process.stderr:  # type: ignore[union-attr]
                if found := re.search(rb'"port": ?(\d+)', line):
                    port = int(found.group(1))
                if b"gateway ready" in line and (pid := re.search(rb'"pid": ?(\d+)', line)):
                    pids.add(pid.group(1).decode())
                if port and len(pids) == 2:
                    return port, pids
            raise AssertionError("the supervisor exited early")

        with trio.fail_after(60):
            port, pids = await trio.to_thread.run_sync(ready)
            url = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=url) as client:
                await sign_in(client)
                cookie = client.cookies["triogate_ui"]
            shown: set[str] = set()
            # One client, as one browser tab: the overview closes its connection, so the
            # next refresh reconnects and the kernel may hand it to the other worker.
            async with httpx.AsyncClient(base_url=url,
                                         cookies={"triogate_ui": cookie}) as tab:
                while len(shown) < 2:
                    page = await tab.get("/ui")
                    assert page.status_code == 200
                    assert page.headers["connection"] == "close"
                    shown = set(re.findall(r"pid (\d+)", page.text))
                    await trio.sleep(0.05)
            assert shown == pids
            assert "2 processes" in page.text  # the cards add up both workers
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            await trio.to_thread.run_sync(process.wait, 20)
        finally:
            if process.poll() is None:
                process.kill()


@pytest.mark.parametrize(("kind", "id_field", "ident", "fields", "shown"), [
    ("teams", "team_id", "team-a", {"team_alias": "Team <A>", "max_budget": "10",
                                    "rpm_limit": "5"}, "Team &lt;A&gt;"),
    ("users", "user_id", "ann", {"user_email": "ann@example.com", "tpm_limit": "100"},
     "ann@example.com"),
    ("customers", "user_id", "cust-1", {"alias": "Acme", "max_parallel_requests": "2"}, "Acme"),
    ("tags", "name", "batch-jobs", {"description": "nightly", "max_budget": "1.5"}, "nightly"),
])
async def test_each_entity_is_created_listed_changed_and_deleted(
    gateway: Gateway, kind: str, id_field: str, ident: str, fields: dict[str, str],
    shown: str,
) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        await sign_in(client)
        csrf = token((await client.get(f"/ui/{kind}/new")).text)
        r = await client.post(f"/ui/{kind}/new", data={"csrf": csrf, id_field: ident, **fields})
        assert r.status_code == 303, r.text
        view = await client.get(r.headers["location"])
        assert view.status_code == 200 and shown in view.text
        assert "Created" in view.text and "Spend over time" in view.text
        listing = await client.get(f"/ui/{kind}", params={"q": ident[:3].upper()})
        assert ident in listing.text and "1 " in listing.text
        assert "No " in (await client.get(f"/ui/{kind}", params={"q": "zzz"})).text
        # Update: an emptied limit is cleared.
        limit_field = next(f for f in ("rpm_limit", "tpm_limit", "max_parallel_requests",
                                       "max_budget") if f in fields)
        r = await client.post(f"/ui/{kind}/update",
                              data={"csrf": csrf, "id": ident, **fields, limit_field: ""})
        assert r.status_code == 303
        info = await gateway_info(gateway, kind, ident)
        assert info.get(limit_field) is None
        if kind in ("teams", "customers"):
            r = await client.post(f"/ui/{kind}/block", data={"csrf": csrf, "id": ident})
            assert r.status_code == 303
            assert (await gateway_info(gateway, kind, ident))["blocked"] is True
            page = await client.get(r.headers["location"])
            assert "Blocked." in page.text and "Unblock" in page.text
        r = await client.post(f"/ui/{kind}/delete", data={"csrf": csrf, "id": ident})
        assert r.status_code == 303 and r.headers["location"] == f"/ui/{kind}"
        assert "Deleted" in (await client.get(f"/ui/{kind}")).text
        gone = await client.get(f"/ui/{kind}/view", params={"id": ident})
        assert gone.status_code == 404 and "not found" in gone.text


async def gateway_info(gateway: Gateway, kind: str, ident: str) -> dict[str, object]:
    """The row as the admin API reports it (over HTTP, with the master key)."""
    path, param = {"teams": ("/team/info", "team_id"), "users": ("/user/info", "user_id"),
                   "customers": ("/customer/info", "end_user_id"),
                   "tags": ("/tag/info", "name")}[kind]
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        r = await http.get(path, params={param: ident},
                           headers={"authorization": f"Bearer {MASTER_KEY}"})
    assert r.status_code == 200, r.text
    body = r.json()
    return body.get("team_info") or body.get("user_info") or body  # type: ignore[no-any-return]


async def test_a_key_page_shows_its_enforced_windows(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        await sign_in(client)
        csrf = token((await client.get("/ui/keys/new")).text)
        r = await client.post("/ui/keys/new", data={
            "csrf": csrf, "key_alias": "limited", "rpm_limit": "10", "tpm_limit": "100000",
            "max_parallel_requests": "4"})
        raw = re.search(r'id="new-key">([^<]+)<', r.text)
        assert raw is not None
        for _ in range(2):
            chat = await client.post("/v1/chat/completions", json={
                "model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {raw.group(1)}"})
            assert chat.status_code == 200
        keys = await client.get("/ui/keys", params={"q": "limited"})
        view = re.search(r'href="(/ui/keys/view\?id=[0-9a-f]+)"', keys.text)
        assert view is not None
        page = (await client.get(view.group(1))).text
        assert "2 of 10" in page and "the enforced window" in page
        assert "0 of 4" in page and "in flight now" in page


async def test_sign_in_attempts_are_limited(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        statuses = [(await sign_in(client, f"sk-guess-{i}")).status_code for i in range(11)]
        assert statuses == [401] * 10 + [429]
        # Even the right key waits out the minute.
        assert (await sign_in(client)).status_code == 429


async def test_the_spend_log_filters_by_a_keys_alias_or_hash(gateway: Gateway) -> None:
    store = gateway.services.store
    assert store is not None
    _, a = await store.create_key(key_alias="alpha")
    _, b = await store.create_key(key_alias="beta")
    now = gateway.services.clock_ms()
    await store.insert_spend_logs([
        SpendLogRow(request_id=f"req-{i}", api="chat", key_hash=h, key_alias=alias,
                    model_group="m", cost_nanousd=1000, start_time_ms=now - i,
                    end_time_ms=now - i + 1)
        for i, (h, alias) in enumerate([(a.token_hash, "old-alpha"), (a.token_hash, "alpha"),
                                        (b.token_hash, "beta"), (None, "gone")])])

    async def shown(**query: str) -> set[str]:
        page = await client.get("/ui/spend", params=query)
        assert page.status_code == 200
        return set(re.findall(r"<code>(req-\d)</code>", page.text))
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        await sign_in(client)
        assert await shown() == {"req-0", "req-1", "req-2", "req-3"}
        # Its alias now names the key: every request of it, under any alias it had.
        assert await shown(key="alpha") == {"req-0", "req-1"}
        assert await shown(key_hash=a.token_hash) == {"req-0", "req-1"}  # a key page's link
        assert await shown(key=b.token_hash) == {"req-2"}
        assert await shown(key="gone") == {"req-3"}  # an alias no key has: as logged
        assert await shown(key="nobody") == set()
        csv_text = (await client.get("/ui/spend.csv", params={"key": "alpha"})).text
        assert csv_text.count("req-") == 2 and "req-2" not in csv_text
        page = (await client.get("/ui/spend")).text
        legend = page.split('aria-label="Spend per day by key"', 1)[1].split("</figure>")[0]
        assert "master key" in legend  # the legend names the requests without a key
        assert "alpha" in legend and "beta" in legend


async def test_the_spend_page_names_teams_by_alias_and_refused_keys_as_refused(
    gateway: Gateway,
) -> None:
    store = gateway.services.store
    assert store is not None
    team = await store.create_team(team_alias="ml-team")
    now = gateway.services.clock_ms()
    await store.insert_spend_logs([
        SpendLogRow(request_id="req-team", api="chat", team_id=team.team_id, model_group="m",
                    cost_nanousd=2_200, start_time_ms=now, end_time_ms=now + 1),
        SpendLogRow(request_id="req-refused", api="chat", model_group="m", status="rejected",
                    http_status=401, start_time_ms=now, end_time_ms=now + 1),
        SpendLogRow(request_id="req-master", api="chat", model_group="m", cost_nanousd=0,
                    start_time_ms=now, end_time_ms=now + 1)])
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        await sign_in(client)
        page = (await client.get("/ui/spend")).text
    legend = page.split('aria-label="Spend per day by team"', 1)[1].split("</figure>")[0]
    assert "ml-team" in legend and team.team_id not in legend
    rows = {m[1]: m[0] for m in re.findall(r"<tr>(.*?)<code>(req-[a-z]+)</code>", page, re.S)}
    assert "(refused key)" in rows["req-refused"] and "master" not in rows["req-refused"]
    assert "master" in rows["req-master"] and "$0<" in rows["req-master"]
    assert "$0.0000022" in rows["req-team"]  # every significant digit, never $0.000002


async def test_lists_page_through_more_rows_than_one_api_page(gateway: Gateway) -> None:
    # 1,030 keys: more than the admin API's largest page (1,000), so the list reads two.
    store = gateway.services.store
    assert store is not None
    for i in range(1030):
        await store.create_key(key_alias=f"bulk-{i:04d}")
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        await sign_in(client)
        first = (await client.get("/ui/keys")).text
        assert "1,030 keys" in first and "Page 1 of 42" in first
        # 25 a page, oldest first; keys made in the same millisecond are ordered by id, so
        # the page's edge is not exactly bulk-0024 (a flake when it was asserted).
        shown = {int(n) for n in re.findall(r"bulk-(\d{4})", first)}
        assert len(shown) == 25 and 0 in shown and max(shown) < 60
        last = (await client.get("/ui/keys", params={"page": "42"})).text
        assert "bulk-1029" in last and "Page 42 of 42" in last and "Next" not in last
        found = (await client.get("/ui/keys", params={"q": "BULK-1029"})).text
        assert "1 key matching" in found and "bulk-1029" in found


async def test_a_team_admin_manages_its_teams_keys_and_nothing_else(gateway: Gateway) -> None:
    admin_api = {"authorization": f"Bearer {MASTER_KEY}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=admin_api) as api:
        assert (await api.post("/user/new", json={"user_id": "tina"})).status_code == 200
        for team, members in (("pay", [{"user_id": "tina", "role": "admin"}]), ("other", [])):
            r = await api.post("/team/new", json={"team_id": team, "members_with_roles": members})
            assert r.status_code == 200, r.text
        tina = (await api.post("/key/generate", json={"user_id": "tina",
                                                      "key_alias": "tina-key"})).json()["key"]
        mine = (await api.post("/key/generate", json={"team_id": "pay",
                                                      "key_alias": "pay-1"})).json()
        theirs = (await api.post("/key/generate", json={"team_id": "other",
                                                        "key_alias": "other-1"})).json()
    store = gateway.services.store
    assert store is not None
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await sign_in(client, tina)
        assert r.status_code == 303 and r.headers["location"] == "/ui/teams"
        teams = (await client.get("/ui/teams")).text
        assert "pay" in teams and "other" not in teams and "New team" not in teams
        keys = (await client.get("/ui/keys")).text
        assert "pay-1" in keys and "other-1" not in keys and "New key" in keys
        team_page = (await client.get("/ui/teams/view", params={"id": "pay"})).text
        assert "New key for this team" in team_page and "Save changes" not in team_page
        assert "<td>tina</td>" in team_page and "<td>admin</td>" in team_page  # members, roles
        for path in ("/ui/spend", "/ui/config", "/ui/users", "/ui/teams/new"):
            assert (await client.get(path)).status_code == 403, path
        other = await client.get("/ui/keys/view", params={"id": theirs["token"]})
        assert other.status_code == 404 and "other-1" not in other.text  # as the API: unseen
        page = await client.get("/ui/keys/view", params={"id": mine["token"]})
        assert page.status_code == 200 and "Save changes" in page.text
        csrf = token(page.text)
        # Its team's key: blocked. Another team's: refused by the admin API, unchanged.
        r = await client.post("/ui/keys/block", data={"csrf": csrf, "id": mine["token"]})
        assert r.status_code == 303
        r = await client.post("/ui/keys/block", data={"csrf": csrf, "id": theirs["token"]})
        assert r.status_code == 303
        found = await store.get_keys([mine["token"], theirs["token"]])
        assert found[mine["token"]].blocked and not found[theirs["token"]].blocked
        # A key for its team: created; for another team: refused, nothing created.
        r = await client.post("/ui/keys/new", data={"csrf": csrf, "team_id": "pay",
                                                    "key_alias": "pay-2"})
        assert r.status_code == 200 and 'id="new-key"' in r.text
        r = await client.post("/ui/keys/new", data={"csrf": csrf, "team_id": "other",
                                                    "key_alias": "other-2"})
        assert r.status_code == 403 and 'id="new-key"' not in r.text
        assert (await store.list_keys(key_alias="other-2"))[1] == 0
        assert (await store.list_keys(key_alias="pay-2"))[1] == 1
        assert (await client.post("/ui/teams/delete", data={
            "csrf": csrf, "id": "other"})).status_code == 403
        assert "other" in await store.get_teams(["other"])


async def test_a_create_form_sent_twice_creates_once(gateway: Gateway) -> None:
    # Reloading the page that shows a new key posts its form again.
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        await sign_in(client)
        form = (await client.get("/ui/keys/new")).text
        once = re.search(r'name="once" value="([^"]+)"', form)
        assert once
        data = {"csrf": token(form), "once": once.group(1), "max_budget": "1"}
        first = await client.post("/ui/keys/new", data=data)
        assert first.status_code == 200 and 'id="new-key"' in first.text
        again = await client.post("/ui/keys/new", data=data)
        assert again.status_code == 303 and again.headers["location"] == "/ui/keys"
        assert "already sent" in (await client.get("/ui/keys")).text
        assert await key_count(gateway) == 1
        # A refused form is shown again with a new token, so it can be corrected and sent.
        bad = await client.post("/ui/keys/new", data={**data, "once": "t2", "rpm_limit": "x"})
        assert bad.status_code == 400
        retry = re.search(r'name="once" value="([^"]+)"', bad.text)
        assert retry and retry.group(1) != "t2"
        ok = await client.post("/ui/keys/new", data={**data, "once": retry.group(1)})
        assert ok.status_code == 200 and await key_count(gateway) == 2
