"""``triogate keys|teams|users|tags``: the admin CLI against a running gateway over HTTP.

The CLI is synchronous (httpx); each call runs in a worker thread while the gateway
serves in the test's trio loop.
"""

from __future__ import annotations

import argparse
import io
import json
from typing import TYPE_CHECKING

import pytest
import trio

from tests.e2e.conftest import MASTER_KEY
from tests.e2e.test_admin_api import chat
from triogate.cli import admin as admin_cli
from triogate.store import hash_key

if TYPE_CHECKING:
    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def parser() -> argparse.ArgumentParser:
    """A parser shaped like cli.py's: a ``command`` subparser the admin commands join."""
    top = argparse.ArgumentParser(prog="triogate")
    admin_cli.add_parsers(top.add_subparsers(dest="command", required=True))
    return top


async def cli(gateway: Gateway, *argv: str, environ: dict[str, str] | None = None
              ) -> tuple[int, str, str]:
    """Run one admin command against ``gateway``; (exit status, stdout, stderr)."""
    args = parser().parse_args([*argv, "--url", gateway.url])
    out, err = io.StringIO(), io.StringIO()
    env = {"TRIOGATE_MASTER_KEY": MASTER_KEY} if environ is None else environ
    with trio.fail_after(30):
        code = await trio.to_thread.run_sync(
            lambda: admin_cli.run(args, env, stdout=out, stderr=err))
    return code, out.getvalue(), err.getvalue()


async def test_keys_create_list_info_delete(gateway: Gateway) -> None:
    code, out, _ = await cli(gateway, "teams", "create", "--team-id", "ops", "--alias", "Ops",
                             "--models", "gpt-test", "--max-budget", "5")
    assert code == 0 and "ops" in out and "Ops" in out
    code, out, _ = await cli(gateway, "keys", "create", "--alias", "deploy", "--team-id", "ops",
                             "--models", "gpt-test,claude-test", "--max-budget", "0.5",
                             "--budget-duration", "30d", "--rpm-limit", "10", "--json")
    assert code == 0
    created = json.loads(out)
    raw = created["key"]
    assert created["token"] == hash_key(raw) and created["models"] == ["gpt-test",
                                                                        "claude-test"]
    assert created["max_budget_nanousd"] == 500_000_000
    assert (await chat(gateway, raw)).choices

    code, out, _ = await cli(gateway, "keys", "list", "--team-id", "ops")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["token", "key_name", "key_alias"]
    assert created["token"] in lines[1] and "deploy" in lines[1]
    assert raw not in out and "1 of 1" in out

    code, out, _ = await cli(gateway, "keys", "info", raw)
    assert code == 0 and "deploy" in out and "budget_reset_at" in out and raw not in out

    code, out, _ = await cli(gateway, "keys", "block", created["token"])
    assert code == 0 and "yes" in out
    code, out, _ = await cli(gateway, "keys", "delete", raw)
    assert code == 0 and created["token"] in out
    code, out, _ = await cli(gateway, "keys", "list", "--json")
    assert json.loads(out)["keys"] == []


async def test_teams_list_and_delete(gateway: Gateway) -> None:
    for team in ("alpha", "beta"):
        assert (await cli(gateway, "teams", "create", "--team-id", team))[0] == 0
    code, out, _ = await cli(gateway, "teams", "list")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["team_id", "alpha", "beta"]
    code, out, _ = await cli(gateway, "teams", "delete", "alpha", "beta")
    assert code == 0 and "deleted team alpha" in out
    code, out, _ = await cli(gateway, "teams", "list", "--json")
    assert json.loads(out) == []


async def test_users_and_tags(gateway: Gateway) -> None:
    code, out, _ = await cli(gateway, "users", "create", "--user-id", "grace",
                             "--email", "grace@example.com", "--json")
    assert code == 0 and json.loads(out)["key"].startswith("sk-")
    code, out, _ = await cli(gateway, "users", "create", "--user-id", "linus", "--no-key",
                             "--json")
    assert code == 0 and "key" not in json.loads(out)
    code, out, _ = await cli(gateway, "tags", "create", "nightly", "--max-budget", "1",
                             "--budget-duration", "1d", "--description", "jobs")
    assert code == 0 and "nightly" in out
    code, out, _ = await cli(gateway, "tags", "list")
    assert code == 0 and out.splitlines()[1].split()[:2] == ["nightly", "jobs"]


async def test_errors_print_the_api_message_and_exit_1(gateway: Gateway) -> None:
    code, out, err = await cli(gateway, "keys", "create", "--duration", "9999999999d")
    assert code == 1 and out == ""
    assert "400" in err and "'duration'" in err
    code, _, err = await cli(gateway, "keys", "delete", "sk-never-issued")
    assert code == 1 and "not found" in err and "sk-never-issued" not in err
    code, _, err = await cli(gateway, "keys", "list", environ={})
    assert code == 1 and "401" in err
    code, _, err = await cli(gateway, "teams", "list", "--master-key", "sk-wrong")
    assert code == 1 and "401" in err and "invalid API key" in err


async def test_an_unreachable_gateway_is_a_clear_error() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = parser().parse_args(["keys", "list", "--url", f"http://127.0.0.1:{port}"])
    err = io.StringIO()
    with trio.fail_after(30):
        code = await trio.to_thread.run_sync(
            lambda: admin_cli.run(args, {}, stdout=io.StringIO(), stderr=err))
    assert code == 1 and "cannot reach the gateway" in err.getvalue()
