"""Redis memory per request: what governed requests leave in Redis once they are settled.

Starts a private Redis-compatible server and a gateway in-process (no response cache), with
a key in a team, both with budgets and RPM/TPM/parallel limits, and an end user with a
budget; warms up (identity rows, windows, routing state exist), then sends ``--requests``
chat completions and compares ``used_memory`` and the key count before and after. What
grows with the number of requests is the settlement markers (fields of one HASH per
principal per minute, kept for ``settle_marker_ttl``, 24 h); windows, counters and routing
state are bounded. Prints bytes per request, the markers' share (``MEMORY USAGE`` of the
marker hashes), and what that holds at 100 requests/s for the markers' lifetime.

    python bench/redis_memory.py --requests 3000
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
from triogate.batch import RespBackend
from triogate.redis_server import SyncServer
from triogate.testing.fakeupstream import open_fake_upstream

USD = 1_000_000_000
DAY_S = 86_400


async def used_memory(redis: RespBackend) -> tuple[int, int]:
    info, keys = await redis.execute([("INFO", "memory"), ("DBSIZE",)])
    assert isinstance(info, bytes) and isinstance(keys, int)
    fields = dict(line.split(":", 1) for line in info.decode().splitlines() if ":" in line)
    return int(fields["used_memory"]), keys


async def marker_bytes(redis: RespBackend) -> tuple[int, int]:
    """(bytes, fields) of every settlement-marker HASH (``…:done:<minute>``)."""
    total = fields = 0
    cursor = b"0"
    while True:
        (reply,) = await redis.execute([("SCAN", cursor, "MATCH", "*:done:*", "COUNT", 1000)])
        assert isinstance(reply, list)
        cursor, names = reply
        for name in names:
            size, length = await redis.execute([("MEMORY", "USAGE", name, "SAMPLES", "0"),
                                                ("HLEN", name)])
            total += int(size)  # type: ignore[call-overload]
            fields += int(length)  # type: ignore[call-overload]
        if cursor == b"0":
            return total, fields


async def count_keys(redis: RespBackend, pattern: str) -> int:
    count, cursor = 0, b"0"
    while True:
        (reply,) = await redis.execute([("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)])
        assert isinstance(reply, list)
        cursor, names = reply
        count += len(names)
        if cursor == b"0":
            return count


async def send(http: httpx.AsyncClient, url: str, key: str, n: int, tag: str) -> None:
    for i in range(n):
        reply = await http.post(f"{url}/chat/completions", json={
            "model": "gpt-test", "user": "end-user-1", "max_tokens": 16,
            "messages": [{"role": "user", "content": f"{tag} {i}"}]},
            headers={"authorization": f"Bearer {key}"})
        assert reply.status_code == 200, reply.text


async def measure(requests: int, warmup: int, folder: Path) -> None:
    server = SyncServer(folder / "redis")
    redis = RespBackend(server.url, command_timeout_s=10)
    try:
        async with open_fake_upstream() as upstream:
            config = gateway_config(folder / "state", server.url, upstream.base_url,
                                    triogate={"tracing": False})
            async with running_gateway(config) as gateway, httpx.AsyncClient(
                    timeout=30) as http:
                store = gateway.services.store
                assert store is not None
                team = await store.create_team(max_budget_nanousd=100 * USD, rpm_limit=10**6,
                                               tpm_limit=10**9, max_parallel_requests=1000)
                key, _ = await store.create_key(
                    team_id=team.team_id, max_budget_nanousd=100 * USD, rpm_limit=10**6,
                    tpm_limit=10**9, max_parallel_requests=1000)
                await store.create_end_user(user_id="end-user-1", max_budget_nanousd=USD)
                await send(http, gateway.openai_base, key, warmup, "warm-up")
                await gateway.services.settler.wait_drained()
                (before, keys_before), (markers_before, fields_before) = (
                    await used_memory(redis), await marker_bytes(redis))
                routing_before = await count_keys(redis, "*:rec:*")  # one per request before
                await send(http, gateway.openai_base, key, requests, "measured")
                await gateway.services.settler.wait_drained()
                (after, keys_after), (markers_after, fields_after) = (
                    await used_memory(redis), await marker_bytes(redis))
                routing_after = await count_keys(redis, "*:rec:*")
    finally:
        await redis.aclose()
        server.stop()
    per_request = (after - before) / requests
    markers = (markers_after - markers_before) / requests
    fields = (fields_after - fields_before) / requests
    print(f"requests {requests} (after {warmup} to warm up); keys {keys_before} -> {keys_after}")
    print(f"used_memory {before} -> {after} bytes: {per_request:.0f} bytes per request")
    print(f"settlement markers: {fields:.1f} fields and {markers:.0f} bytes per request "
          f"(MEMORY USAGE of the marker hashes)")
    routing = (routing_after - routing_before) / requests
    print(f"routing record markers as STRING keys (one per request and group before "
          f"w5-redis; fields of a HASH per minute since): {routing:.1f} keys per request; "
          f"everything but the settlement markers: {per_request - markers:.0f} bytes")
    held = markers * 100 * DAY_S
    print(f"at 100 requests/s: settlement markers hold {held / 1e9:.2f} GB (24 h); routing "
          f"markers and the rest {(per_request - markers) * 100 * 600 / 1e6:.0f} MB (10 min)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="triogate-mem-") as tmp:
        trio.run(measure, args.requests, args.warmup, Path(tmp))


if __name__ == "__main__":
    main()
