"""A full disk under the settler's journal degrades the gateway, never stops it: Redis
killed, post-call writes go to the journal, whose file is /dev/full (every write fails
with ENOSPC, as on a full disk). The gateway keeps answering, readiness says
``degraded``, the failed writes are counted; once the disk and Redis are back, the
journal is written whole, replayed, and nothing is lost."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.e2e.conftest import MASTER_HEADERS, gateway_config, running_gateway
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from pathlib import Path

    from tests.chaos.conftest import KillableServer

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

USD = 1_000_000_000


async def readiness(http: httpx.AsyncClient, url: str) -> dict[str, object]:
    body: dict[str, object] = (await http.get(f"{url}/health/readiness")).json()
    return body


async def test_a_full_disk_under_the_journal_degrades_and_loses_nothing(
    tmp_path: Path, killable_server: KillableServer
) -> None:
    state = tmp_path / "state"
    async with open_fake_upstream() as upstream:
        config = gateway_config(
            state, killable_server.url, upstream.base_url,
            triogate={"redis": {"timeout_s": 0.3},
                      "policies": {"budgets": "fail-open", "rate_limits": "fail-open"}})
        with trio.fail_after(90):
            async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=20) as http:
                store = gateway.services.store
                assert store is not None
                key, _ = await store.create_key(max_budget_nanousd=100 * USD)
                headers = {"authorization": f"Bearer {key}"}
                body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
                assert (await http.post(f"{gateway.url}/v1/chat/completions", json=body,
                                        headers=headers)).status_code == 200
                # The journal's data file (and the file a rewrite goes through) become
                # the full disk.
                (lock,) = list((state / "journal").glob("journal-*.lock"))
                full = [lock.with_suffix(".jsonl"), lock.with_suffix(".tmp")]
                for path in full:
                    path.unlink(missing_ok=True)
                    os.symlink("/dev/full", path)

                killable_server.kill()
                for _ in range(3):
                    answer = await http.post(f"{gateway.url}/v1/chat/completions", json=body,
                                             headers=headers)
                    assert answer.status_code == 200, answer.text
                with trio.fail_after(15):
                    await gateway.services.settler.wait_drained()
                stats = gateway.services.settler.statistics()
                assert stats.disk_errors >= 1 and not stats.disk_ok
                assert stats.journal_pending >= 1  # held in memory
                ready = await readiness(http, gateway.url)
                assert ready["status"] == "degraded"
                assert ready["settler"] == {"queued": 0, "journal_pending": stats.journal_pending,
                                            "disk": "write failed"}
                metrics = (await http.get(f"{gateway.url}/metrics",
                                          headers=MASTER_HEADERS)).text
                assert "triogate_journal_write_errors" in metrics
                # Still serving.
                assert (await http.post(f"{gateway.url}/v1/chat/completions", json=body,
                                        headers=headers)).status_code == 200

                # Disk space back, then Redis: the journal is replayed, readiness recovers.
                for path in full:
                    path.unlink()
                await killable_server.restart()
                with trio.fail_after(30):
                    while True:
                        ready = await readiness(http, gateway.url)
                        settler = ready["settler"]
                        assert isinstance(settler, dict)
                        if ready["status"] == "ready" and not settler["journal_pending"]:
                            break
                        await trio.sleep(0.1)
                assert gateway.services.settler.statistics().replayed >= 1
