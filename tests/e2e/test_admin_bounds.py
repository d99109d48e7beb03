"""Admin input is bounded and atomic, over real HTTP.

Out-of-range values are 400s naming the field and write nothing, so ``/key/info`` and
``/key/list`` keep answering; custom keys have a minimum length and alphabet and are
never the master key; key aliases are unique; a key without a budget still shows what
it spent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import MASTER_KEY
from tests.e2e.test_admin_api import Admin, chat, poll

if TYPE_CHECKING:

    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/key/generate", {"duration": "9999999999d"}, "duration"),
    ("/key/generate", {"expires": 10**18}, "expires"),
    ("/key/generate", {"expires": "10000-01-01"}, "expires"),
    ("/key/generate", {"metadata": _nested(300)}, "metadata"),
    ("/key/generate", {"budget_duration": "999999999999999999999d"}, "budget_duration"),
    ("/key/generate", {"key_alias": "nul\x00alias"}, "key_alias"),
    ("/key/generate", {"max_budget": 10**30}, "max_budget"),
    ("/team/new", {"team_id": "t\x00"}, "team_id"),
    ("/team/new", {"metadata": _nested(300)}, "metadata"),
    ("/user/new", {"user_id": "u1", "duration": "9999999999d"}, "duration"),
    ("/customer/new", {"user_id": "c" * 2000}, "user_id"),
])
async def test_out_of_range_values_are_400s_and_write_nothing(
    api: Admin, path: str, body: dict[str, Any], param: str
) -> None:
    error = (await api.post(path, body, status=400))["error"]
    assert error["param"] == param
    assert (await api.get("/key/list"))["total_count"] == 0
    assert await api.get("/team/list") == []
    assert (await api.get("/user/list"))["total"] == 0
    assert await api.get("/customer/list") == []


async def test_listings_stay_readable_and_huge_pages_are_400s(api: Admin) -> None:
    key = await api.post("/key/generate", {"duration": "36500d", "metadata": _nested(20)})
    assert (await api.get("/key/info", key=key["token"]))["info"]["expires"].startswith("2")
    assert (await api.get("/key/list", return_full_object="true"))["total_count"] == 1
    for params in ({"page": 10**12}, {"page": "9" * 40}, {"size": 10**6}):
        await api.get("/key/list", status=400, **params)
        await api.get("/spend/logs", status=400, **params)
    for date in ("99999-01-01", str(10**20), "-5"):
        await api.get("/spend/logs", start_date=date, status=400)


async def test_custom_keys_must_be_strong_and_not_the_master_key(api: Admin) -> None:
    for weak in ("sk-12345", "sk-short", "sk-" + "a" * 19, "sk-" + "a" * 19 + " ",
                 "sk-" + "a" * 19 + "\x00", "no-prefix-but-long-enough-really", MASTER_KEY,
                 "sk-" + "é" * 25, 12345):
        error = (await api.post("/key/generate", {"key": weak}, status=400))["error"]
        assert error["param"] == "key"
        assert MASTER_KEY not in error["message"]
    ok = "sk-" + "a" * 20
    assert (await api.post("/key/generate", {"key": ok}))["key"] == ok
    assert (await api.get("/key/list"))["total_count"] == 1


async def test_key_aliases_are_unique(api: Admin) -> None:
    first = await api.post("/key/generate", {"key_alias": "ci"})
    error = (await api.post("/key/generate", {"key_alias": "ci"}, status=409))["error"]
    assert error["param"] == "key_alias"
    other = await api.post("/key/generate", {"key_alias": "other"})
    await api.post("/key/update", {"key": other["token"], "key_alias": "ci"}, status=409)
    # Setting a key's own alias again is not a conflict.
    await api.post("/key/update", {"key": first["token"], "key_alias": "ci"})
    assert (await api.get("/key/list"))["total_count"] == 2


async def test_block_of_several_changes_none_when_one_is_missing(api: Admin) -> None:
    await api.post("/team/new", {"team_id": "a"})
    await api.post("/team/block", {"team_ids": ["a", "ghost"]}, status=404)
    assert (await api.get("/team/info", team_id="a"))["team_info"]["blocked"] is False


async def test_spend_is_tracked_for_keys_without_a_budget(gateway: Gateway, api: Admin
                                                         ) -> None:
    await api.post("/team/new", {"team_id": "nobudget"})
    key = (await api.post("/key/generate", {"team_id": "nobudget"}))["key"]
    await chat(gateway, key)

    async def spent() -> bool:
        info = (await api.get("/key/info", key=key))["info"]
        return bool(info["spend_nanousd"])

    await poll(spent, timeout_s=10, interval_s=0.1)
    info = (await api.get("/key/info", key=key))["info"]
    assert info["spend"] > 0 and info["max_budget"] is None
    team = (await api.get("/team/info", team_id="nobudget"))["team_info"]
    assert team["spend_nanousd"] == info["spend_nanousd"]
