"""Journal bytes per request: what one request's post-call writes cost on disk while Redis
is unreachable.

Starts a gateway in-process against a Redis URL nobody listens on (every post-call batch is
journaled), with a key in a team, budgets and rate limits on both, and the response cache
on; sends ``--requests`` chat completions and divides the journal's size by them.

    python bench/journal_bytes.py --requests 50
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.conftest import gateway_config, running_gateway
from triogate.testing.fakeupstream import open_fake_upstream

USD = 1_000_000_000


async def measure(requests: int) -> tuple[int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        async with open_fake_upstream() as upstream:
            config = gateway_config(
                state, f"unix://{tmp}/nobody.sock", upstream.base_url,
                litellm_settings={"cache": True, "cache_params": {"ttl": 60}},
                triogate={"redis": {"timeout_s": 0.2}})
            async with running_gateway(config) as gateway:
                store = gateway.services.store
                assert store is not None
                team = await store.create_team(max_budget_nanousd=100 * USD, rpm_limit=10_000)
                key, _ = await store.create_key(
                    team_id=team.team_id, max_budget_nanousd=100 * USD, rpm_limit=10_000,
                    tpm_limit=10_000_000, max_parallel_requests=100)
                async with httpx.AsyncClient(timeout=30) as http:
                    for i in range(requests):
                        reply = await http.post(
                            f"{gateway.openai_base}/chat/completions",
                            json={"model": "gpt-test", "user": "end-user-1",
                                  "messages": [{"role": "user", "content": f"q{i}"}]},
                            headers={"authorization": f"Bearer {key}"})
                        assert reply.status_code == 200, reply.text
                await gateway.services.settler.wait_drained()
                size = sum(p.stat().st_size for p in (state / "journal").glob("*.jsonl"))
                entries = gateway.services.settler.statistics().journal_pending
        return size, entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    size, entries = trio.run(measure, args.requests)
    print(f"requests {args.requests}  journal entries {entries}  bytes {size}  "
          f"bytes/request {size / args.requests:.0f}")


if __name__ == "__main__":
    main()
