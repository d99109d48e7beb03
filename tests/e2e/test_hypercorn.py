"""The gateway under hypercorn: HTTP/2 (h2c with prior knowledge, and ALPN over TLS) with
httpx and the openai SDK, several hypercorn workers sharing an external Redis, and the one
clear line when workers would each start their own embedded server."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
import trio
import trustme
import yaml

from tests.e2e.conftest import (
    MASTER_HEADERS,
    MASTER_KEY,
    UPSTREAM_KEY,
    gateway_config,
    running_gateway,
    short_request,
    spend_rows,
)
from triogate.redis_server import server_spec

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


async def test_http2_prior_knowledge_over_cleartext(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url)
    with trio.fail_after(60):
        async with running_gateway(config, server="hypercorn") as gateway, httpx.AsyncClient(
            http1=False, http2=True, timeout=20,
        ) as http:
            answers = []
            async with trio.open_nursery() as nursery:  # several streams on one connection

                async def one(content: str) -> None:
                    answers.append(await http.post(
                        f"{gateway.openai_base}/chat/completions", headers=MASTER_HEADERS,
                        json=short_request("chat", content)))

                for n in range(4):
                    nursery.start_soon(one, f"hello {n}")
            assert [a.http_version for a in answers] == ["HTTP/2"] * 4
            assert [a.status_code for a in answers] == [200] * 4
            bad = await http.post(f"{gateway.openai_base}/chat/completions",
                                  headers=MASTER_HEADERS, content=b"{not json")
            assert bad.status_code == 400 and bad.http_version == "HTTP/2"
            assert bad.json()["error"]["type"] == "invalid_request_error"
            # No key: refused on the head (its connection header is HTTP/1's only).
            keyless = await http.post(f"{gateway.openai_base}/chat/completions",
                                      json=short_request("chat", "no key"))
            assert keyless.status_code == 401 and keyless.http_version == "HTTP/2"
            assert keyless.json()["error"]["code"] == "missing_key"
            rows = await spend_rows(gateway, 4)
            assert {row.status for row in rows} == {"success"}


async def test_tls_with_alpn_h2_and_the_openai_sdk(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url)
    with trio.fail_after(60):
        async with running_gateway(config, server="hypercorn", certfile=tmp_path / "cert.pem",
                                   keyfile=tmp_path / "key.pem") as gateway:
            assert gateway.url.startswith("https://127.0.0.1:")
            async with httpx.AsyncClient(http2=True, verify=client_context, timeout=20) as http:
                models = await http.get(f"{gateway.openai_base}/models", headers=MASTER_HEADERS)
                assert models.http_version == "HTTP/2" and models.status_code == 200
                client = openai.AsyncOpenAI(api_key=MASTER_KEY, base_url=gateway.openai_base,
                                            http_client=http, max_retries=0)
                stream = await client.chat.completions.create(
                    model="gpt-test", max_tokens=5, stream=True,
                    messages=[{"role": "user", "content": "over tls"}])
                text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream
                                if chunk.choices])
                assert text
                with pytest.raises(openai.AuthenticationError):
                    await openai.AsyncOpenAI(api_key="sk-wrong", base_url=gateway.openai_base,
                                             http_client=http, max_retries=0,
                                             ).models.list()
            async with httpx.AsyncClient(verify=client_context, timeout=20) as http1:
                plain = await http1.get(f"{gateway.url}/health/liveliness")
                assert plain.http_version == "HTTP/1.1" and plain.status_code == 200
            await spend_rows(gateway, 1)


def write_config(path: Path, upstream_url: str, redis_url: str | None) -> None:
    triogate: dict[str, object] = {"state_dir": str(path.parent / "state")}
    if redis_url is not None:
        triogate["redis"] = {"url": redis_url}
    path.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "gpt-test", "model_info": {"id": "a"},
                        "litellm_params": {"model": "openai/gpt", "api_key": UPSTREAM_KEY,
                                           "api_base": f"{upstream_url}/v1"}}],
        "general_settings": {"master_key": MASTER_KEY},
        "triogate": triogate,
    }))


def hypercorn_workers(config: Path, workers: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "hypercorn", "--worker-class", "trio", "--workers",
         str(workers), "--bind", "127.0.0.1:0", "triogate.asgi:app"],
        stderr=subprocess.PIPE,
        env={**os.environ, "TRIOGATE_CONFIG": str(config), "TRIOGATE_LOG_LEVEL": "info"},
    )


def read_until_ready(process: subprocess.Popen[bytes], workers: int
                     ) -> tuple[str, dict[str, bytes]]:
    """Read hypercorn's stderr (in a thread) until it has named its URL and ``workers``
    workers have logged "gateway ready": the URL and each worker's line, by pid."""
    assert process.stderr is not None
    url, ready = "", {}
    for line in process.stderr:
        found = re.search(rb"Running on (http://127\.0\.0\.1:\d+)", line)
        if found:
            url = found.group(1).decode()
        pid = re.search(rb'"gateway ready".*"pid":(\d+)', line)
        if pid:
            ready[pid.group(1).decode()] = line
        if url and len(ready) == workers:
            return url, ready
    raise AssertionError("the workers exited before they were ready")


async def test_several_hypercorn_workers_share_an_external_redis(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
) -> None:
    write_config(tmp_path / "config.yaml", upstream.base_url, redis_url)
    process = hypercorn_workers(tmp_path / "config.yaml", 2)
    assert process.stderr is not None
    try:
        with trio.fail_after(60):
            url, ready = await trio.to_thread.run_sync(read_until_ready, process, 2)
            pids = set(ready)
            async with httpx.AsyncClient(timeout=20) as http:
                for n in range(6):
                    response = await http.post(f"{url}/v1/chat/completions",
                                               headers=MASTER_HEADERS,
                                               json=short_request("chat", f"n{n}"))
                    assert response.status_code == 200
            process.send_signal(signal.SIGTERM)
            code = await trio.to_thread.run_sync(process.wait, 30)
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0
    assert len(pids) == 2
    # Both workers counted in the one Redis.
    usage = await redis.execute([("KEYS", "tg:{rt:gpt-test}:usage:*")])
    (key,) = usage[0]
    assert await redis.execute([("HGET", key, "rpm:a")]) == [b"6"]


async def test_workers_that_would_each_start_an_embedded_server_are_refused(
    tmp_path: Path, upstream: FakeUpstream,
) -> None:
    write_config(tmp_path / "config.yaml", upstream.base_url, None)
    process = hypercorn_workers(tmp_path / "config.yaml", 2)
    try:
        _, stderr = await trio.to_thread.run_sync(process.communicate, None, 60)
    finally:
        if process.poll() is None:
            process.kill()
    # Every worker stopped (hypercorn's own exit status says 0 even so).
    assert process.returncode is not None
    refusals = [line for line in stderr.decode().splitlines()
                if "is in use by another gateway" in line and "gateway not started" in line]
    assert len(refusals) == 1, stderr.decode()[-3000:]
    assert "triogate.redis.url" in refusals[0]


async def test_serve_with_hypercorn_workers_runs_one_embedded_server_for_them(
    tmp_path: Path, upstream: FakeUpstream,
) -> None:
    write_config(tmp_path / "config.yaml", upstream.base_url, None)
    process = subprocess.Popen(
        [sys.executable, "-m", "triogate", "serve", "--server", "hypercorn", "--workers", "2",
         "--port", "0", "--config", str(tmp_path / "config.yaml")],
        stderr=subprocess.PIPE, env={**os.environ, "TRIOGATE_LOG_LEVEL": "info"})
    assert process.stderr is not None
    try:
        with trio.fail_after(60):
            url, ready = await trio.to_thread.run_sync(read_until_ready, process, 2)
            pids = set(ready)
            redis = {re.search(rb'"redis":"([^"]+)"', line).group(1)  # type: ignore[union-attr]
                     for line in ready.values()}
            async with httpx.AsyncClient(timeout=20) as http:
                response = await http.post(f"{url}/v1/chat/completions",
                                           headers=MASTER_HEADERS,
                                           json=short_request("chat", "two workers"))
                assert response.status_code == 200
            process.send_signal(signal.SIGTERM)
            code = await trio.to_thread.run_sync(process.wait, 30)
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0
    assert len(pids) == 2 and len(redis) == 1  # both on the supervisor's one server
    spec = server_spec(tmp_path / "state" / "redis", persistent=True)
    assert not spec.socket_path.exists()  # stopped with the supervisor
