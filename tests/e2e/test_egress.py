"""Egress as companies run it: an https upstream whose certificate a CA made by the test
signs (``ssl_verify`` per deployment and globally, ``SSL_CERT_FILE``), and proxies (a
per-deployment or global ``proxy``, ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``) run by
the test: CONNECT tunnels for https, absolute-form forwarding for http."""

from __future__ import annotations

import base64
import ssl
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import openai
import orjson
import pytest
import trio
import trustme

from tests.e2e.conftest import MASTER_KEY, UPSTREAM_KEY, gateway_config, running_gateway
from tests.e2e.hostile_upstream import (
    STREAM_HEAD,
    Hostile,
    chat_chunk,
    chat_completion,
    chunked,
    serve_hostile,
)
from triogate.testing.fakeazure import open_fake_azure
from triogate.testing.fakegemini import open_fake_gemini

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


async def answer_json(stream: trio.abc.Stream) -> None:
    body = chat_completion("through")
    await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (len(body), body))


async def answer_stream(stream: trio.abc.Stream) -> None:
    await stream.send_all(STREAM_HEAD + chunked(chat_chunk("through"))
                          + chunked(chat_chunk("", "stop"))
                          + chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")


@attrs.define
class Proxy:
    """An HTTP proxy: CONNECT tunnels and absolute-form forwarding, both to loopback.
    Records each request's first line and its Proxy-Authorization; with ``refuse`` it
    answers 407 to everything."""

    port: int = 0
    lines: list[bytes] = attrs.Factory(list)
    auth: list[bytes | None] = attrs.Factory(list)
    refuse: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, client: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            more = await client.receive_some(65536)
            if not more:
                return
            data += more
        head = data.split(b"\r\n\r\n", 1)[0]
        line = head.split(b"\r\n", 1)[0]
        self.lines.append(line)
        found = [h.split(b":", 1)[1].strip() for h in head.split(b"\r\n")[1:]
                 if h.lower().startswith(b"proxy-authorization:")]
        self.auth.append(found[0] if found else None)
        if self.refuse:
            await client.send_all(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                                  b"content-length: 0\r\n\r\n")
            await client.aclose()
            return
        method, target, _ = line.split(b" ", 2)
        if method == b"CONNECT":
            host, port = target.rsplit(b":", 1)
            upstream = await trio.open_tcp_stream(host.decode(), int(port))
            await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            rest = data.split(b"\r\n\r\n", 1)[1]
        else:
            authority = target.split(b"//", 1)[1].split(b"/", 1)[0]
            host, port = authority.rsplit(b":", 1)
            upstream = await trio.open_tcp_stream(host.decode(), int(port))
            rest = data
        if rest:
            await upstream.send_all(rest)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipe, client, upstream, nursery.cancel_scope)
            nursery.start_soon(pipe, upstream, client, nursery.cancel_scope)


async def pipe(source: trio.abc.Stream, sink: trio.abc.Stream, scope: trio.CancelScope) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    scope.cancel()


@attrs.define
class Servers:
    """The https upstream (and its CA's bundle), the plain one, and the proxy."""

    ca_file: str
    tls: Hostile
    plain: Hostile
    proxy: Proxy


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server_context)
    tls, plain, proxy = Hostile(), Hostile(), Proxy()
    tls.script = partial(_either_of, tls)
    plain.script = partial(_either_of, plain)
    async with trio.open_nursery() as nursery:
        await serve_hostile(nursery, tls, server_context)
        await serve_hostile(nursery, plain)
        listeners = await nursery.start(partial(trio.serve_tcp, proxy.handle, 0,
                                                host="127.0.0.1"))
        proxy.port = listeners[0].socket.getsockname()[1]
        yield Servers(str(ca_file), tls, plain, proxy)
        nursery.cancel_scope.cancel()


async def _either_of(hostile: Hostile, stream: trio.abc.Stream) -> None:
    """A chat completion, whole or streamed as the request asked."""
    if b'"stream":true' in hostile.bodies[-1]:
        await answer_stream(stream)
    else:
        await answer_json(stream)


def config(tmp_path: Path, redis_url: str, api_base: str, params: dict[str, Any] | None = None,
           http: dict[str, Any] | None = None) -> Any:
    return gateway_config(
        tmp_path / "state", redis_url, api_base,
        model_list=[{"model_name": "gpt-test", "litellm_params": {
            "model": "openai/gpt-up", "api_base": f"{api_base}/v1", "api_key": UPSTREAM_KEY,
            "input_cost_per_token": "0.000001", "output_cost_per_token": "0.000002",
            **(params or {})}}],
        router_settings={"num_retries": 0},
        triogate={"http": http or {}})


async def chat(config: Any, *, stream: bool = False) -> str:
    """One chat completion through a gateway running ``config``: its text."""
    failed: list[openai.APIError] = []
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            try:
                return await _chat(gw, stream)
            except openai.APIError as exc:  # raised outside the gateway's nursery
                failed.append(exc)
    raise failed[0]


async def _chat(gw: Any, stream: bool) -> str:
    """One chat completion through the running gateway ``gw``: its text."""
    client = openai.AsyncOpenAI(base_url=gw.openai_base, api_key=MASTER_KEY,
                                max_retries=0, timeout=20)
    messages: Any = [{"role": "user", "content": "hi"}]
    if not stream:
        reply = await client.chat.completions.create(
            model="gpt-test", max_tokens=5, messages=messages)
        return reply.choices[0].message.content or ""
    parts = []
    async for chunk in await client.chat.completions.create(
            model="gpt-test", max_tokens=5, messages=messages, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def https(servers: Servers) -> str:
    return f"https://127.0.0.1:{servers.tls.port}"


# ------------------------------------------------------------------ TLS


async def test_an_https_upstream_signed_by_an_unknown_ca_is_refused(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        await chat(config(tmp_path, redis_url, https(servers)))
    assert caught.value.status_code == 502
    assert servers.tls.requests == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_ssl_verify_names_a_ca_bundle_per_deployment(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers, stream: bool
) -> None:
    text = await chat(config(tmp_path, redis_url, https(servers),
                             {"ssl_verify": servers.ca_file}), stream=stream)
    assert text == "through"
    assert servers.tls.requests == 1


async def test_ssl_verify_globally(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers
) -> None:
    assert await chat(config(tmp_path, redis_url, https(servers),
                             http={"ssl_verify": servers.ca_file})) == "through"


async def test_ssl_verify_false_skips_verification(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers
) -> None:
    assert await chat(config(tmp_path, redis_url, https(servers),
                             {"ssl_verify": False})) == "through"


async def test_ssl_cert_file_from_the_environment(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", servers.ca_file)
    assert await chat(config(tmp_path, redis_url, https(servers))) == "through"


# ------------------------------------------------------------------ proxies


@pytest.mark.parametrize("stream", [False, True])
async def test_https_proxy_from_the_environment_tunnels_with_connect(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers,
    monkeypatch: pytest.MonkeyPatch, stream: bool,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", servers.proxy.url)
    text = await chat(config(tmp_path, redis_url, https(servers),
                             {"ssl_verify": servers.ca_file}), stream=stream)
    assert text == "through"
    assert servers.proxy.lines == [b"CONNECT 127.0.0.1:%d HTTP/1.1" % servers.tls.port]


async def test_a_deployments_proxy_forwards_plain_http_with_its_credentials(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers
) -> None:
    proxy = servers.proxy.url.replace("http://", "http://alice:s%40cret@")
    text = await chat(config(tmp_path, redis_url, servers.plain.url, {"proxy": proxy}))
    assert text == "through"
    assert servers.proxy.lines == [
        b"POST http://127.0.0.1:%d/v1/chat/completions HTTP/1.1" % servers.plain.port]
    assert servers.proxy.auth == [b"Basic " + base64.b64encode(b"alice:s@cret")]


async def test_a_global_proxy_tunnels_https(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers
) -> None:
    text = await chat(config(tmp_path, redis_url, https(servers),
                             {"ssl_verify": servers.ca_file},
                             http={"proxy": servers.proxy.url}), stream=True)
    assert text == "through"
    assert len(servers.proxy.lines) == 1 and servers.proxy.lines[0].startswith(b"CONNECT ")


async def test_no_proxy_names_hosts_that_go_direct(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", servers.proxy.url)
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    assert await chat(config(tmp_path, redis_url, servers.plain.url)) == "through"
    assert servers.proxy.lines == []
    assert servers.plain.requests == 1


async def test_a_proxy_that_refuses_is_a_502(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers
) -> None:
    servers.proxy.refuse = True
    with pytest.raises(openai.APIStatusError) as caught:
        await chat(config(tmp_path, redis_url, https(servers),
                          {"ssl_verify": servers.ca_file, "proxy": servers.proxy.url}))
    assert caught.value.status_code == 502
    assert servers.tls.requests == 0


# ------------------------------------------------------------------ token endpoints


async def _chat_on(tmp_path: Path, redis_url: str, deployment: dict[str, Any]) -> str:
    """One chat completion through a gateway whose only group, ``cloud``, is ``deployment``."""
    model_list = [{"model_name": "gpt-test", **deployment}]
    async with running_gateway(gateway_config(
            tmp_path / "state", redis_url, "http://127.0.0.1:9", model_list=model_list,
            router_settings={"num_retries": 0})) as gw:
        return await _chat(gw, stream=False)


async def test_the_entra_token_is_fetched_through_the_deployments_proxy(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers
) -> None:
    """Behind a proxy that is the only way out, the token request must take it too."""
    async with open_fake_azure(deployments={"gpt-4o-prod"}) as azure:
        deployment = {"litellm_params": {
            "model": "azure/gpt-4o-prod", "api_base": azure.base_url,
            "api_version": "2024-10-21", "tenant_id": "contoso",
            "client_id": azure.client_id, "client_secret": azure.client_secret,
            "azure_authority_host": azure.base_url, "proxy": servers.proxy.url,
            "input_cost_per_token": "0.000001", "output_cost_per_token": "0.000002"}}
        with trio.fail_after(30):
            assert await _chat_on(tmp_path, redis_url, deployment)
        assert len(azure.token_requests) == 1
    port = azure.base_url.rsplit(":", 1)[1].encode()
    assert servers.proxy.lines[0] == (
        b"POST http://127.0.0.1:%s/contoso/oauth2/v2.0/token HTTP/1.1" % port)


async def test_the_vertex_token_is_fetched_through_the_global_proxy(
    tmp_path: Path, redis: RespBackend, redis_url: str, servers: Servers
) -> None:
    async with open_fake_gemini() as google:
        deployment = {"litellm_params": {
            "model": "vertex_ai/gemini-1.5-pro", "api_base": google.base_url,
            "vertex_project": "test-project", "vertex_location": "europe-west4",
            "vertex_credentials": orjson.dumps(google.service_account()).decode(),
            "input_cost_per_token": "0.000001", "output_cost_per_token": "0.000002"}}
        model_list = [{"model_name": "gpt-test", **deployment}]
        config = gateway_config(tmp_path / "state", redis_url, "http://127.0.0.1:9",
                                model_list=model_list, router_settings={"num_retries": 0},
                                triogate={"http": {"proxy": servers.proxy.url}})
        with trio.fail_after(30):
            async with running_gateway(config) as gw:
                assert await _chat(gw, stream=False)
        assert google.token_requests == 1
    port = google.base_url.rsplit(":", 1)[1].encode()
    assert servers.proxy.lines[0] == b"POST http://127.0.0.1:%s/token HTTP/1.1" % port
