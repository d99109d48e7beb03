"""How the gateway reaches an upstream: through which proxy, trusting which certificates.

An :class:`Egress` is a deployment's ``proxy`` and ``ssl_verify`` (each falling back to
the global ``triogate.http`` setting, see ``config.py``). The transport resolves it per
request (:func:`proxy_for`): an explicit proxy is used as given; without one,
``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` from the environment apply, except for
hosts ``NO_PROXY`` names. An https upstream is reached through an ``http://`` proxy by a
``CONNECT`` tunnel (:func:`open_tunnel`), TLS then running end to end inside it; a plain
http upstream is sent to the proxy with the absolute URL as the request target.

``ssl_verify``: true (the default: the CA bundle ``SSL_CERT_FILE`` names, else certifi's,
as httpx), false (no verification: for tests and closed networks only), or the path of a
CA bundle (PEM) to trust instead.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import ssl
import urllib.parse
from typing import TYPE_CHECKING, final

import attrs
import httpx

if TYPE_CHECKING:
    from collections.abc import Mapping

    import trio

#: The most bytes a proxy's answer to CONNECT may take.
MAX_CONNECT_HEAD_BYTES = 16 * 1024


@final
@attrs.frozen(cache_hash=True)  # a key of the pools, hashed per request
class Egress:
    """A deployment's way out: ``proxy`` (None: the environment's, if any) and
    ``ssl_verify`` (True, False, or a CA bundle's path)."""

    proxy: str | None = None
    ssl_verify: bool | str = True


DIRECT = Egress()


@final
@attrs.frozen
class Proxy:
    """A parsed ``http://[user:password@]host:port`` proxy."""

    host: str
    port: int
    #: ``Proxy-Authorization`` value, from the URL's user and password; None without.
    authorization: str | None = attrs.field(default=None, repr=False)


def parse_proxy(url: str) -> Proxy:
    """``url`` as a :class:`Proxy`. Only ``http://`` proxies are supported (CONNECT and
    plain forwarding over a plain connection to the proxy).

    Raises:
        ValueError: not an http:// URL with a host.
    """
    if "://" not in url:
        url = "http://" + url  # "proxy:3128", as curl and requests take it
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"proxy {_redact(url)!r} must be an http:// URL with a host")
    authorization = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return Proxy(parts.hostname, parts.port or 80, authorization)


def _redact(url: str) -> str:
    """``url`` without its password (it goes to errors and logs)."""
    return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", url)


@final
class EnvironmentProxies:
    """``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY`` and ``NO_PROXY`` as read once (at
    start-up; upper or lower case, as curl reads them)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        found: dict[str, str] = {}
        for name, value in env.items():
            lname = name.lower()
            # Lower case wins, as in urllib (and curl).
            if value and lname.endswith("_proxy") and (lname not in found or name == lname):
                found[lname] = value
        self._by_scheme = {scheme: found.get(f"{scheme}_proxy") or found.get("all_proxy")
                           for scheme in ("http", "https")}
        self._no_proxy = [entry.strip().lower().lstrip("*").lstrip(".").split(":")[0]
                          for entry in found.get("no_proxy", "").split(",")]
        self._no_proxy = [entry for entry in self._no_proxy if entry] or (
            ["*"] if found.get("no_proxy", "").strip() == "*" else [])

    def proxy_for(self, scheme: str, host: str) -> str | None:
        url = self._by_scheme.get(scheme)
        if url is None or self._bypassed(host):
            return None
        return url

    def _bypassed(self, host: str) -> bool:
        """``NO_PROXY``: ``*``, or names whose host or subdomains go direct (curl's
        rules, without CIDR ranges; a port in an entry is ignored)."""
        host = host.lower().strip("[]")
        return any(entry == "*" or host == entry or host.endswith("." + entry)
                   for entry in self._no_proxy)


def proxy_for(egress: Egress, env: EnvironmentProxies, scheme: str, host: str
              ) -> Proxy | None:
    """The proxy a request to ``scheme://host`` goes through, if any."""
    url = egress.proxy if egress.proxy is not None else env.proxy_for(scheme, host)
    if not url:
        return None
    return _parsed(url)


@functools.lru_cache(maxsize=64)
def _parsed(url: str) -> Proxy:
    return parse_proxy(url)


@functools.lru_cache(maxsize=16)
def ssl_context(verify: bool | str, cert_file: str | None) -> ssl.SSLContext:
    """The TLS context for ``ssl_verify`` = ``verify``; ``cert_file`` is ``SSL_CERT_FILE``
    (used when ``verify`` is True). Built once per value (loading a bundle costs ms)."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    if cert_file:
        return ssl.create_default_context(cafile=cert_file)
    return httpx.create_ssl_context()


async def open_tunnel(stream: trio.SocketStream, proxy: Proxy, host: str, port: int) -> None:
    """Ask the proxy on ``stream`` for a tunnel to ``host:port`` (``CONNECT``); return
    once it answered 2xx, having read its answer's head and nothing more.

    Raises:
        httpx.ProxyError: the proxy refused, or answered something that is not HTTP.
    """
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.authorization is not None:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        # One byte at a time: what follows the head belongs to the tunnel (TLS), and a
        # CONNECT answer is short.
        data = await stream.receive_some(1)
        if not data:
            raise httpx.ProxyError("the proxy closed the connection during CONNECT")
        head += data
        if len(head) > MAX_CONNECT_HEAD_BYTES:
            raise httpx.ProxyError("the proxy's answer to CONNECT is too long")
    status_line = head.split(b"\r\n", 1)[0]
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise httpx.ProxyError(f"the proxy answered CONNECT with {status_line[:80]!r}")
    status = int(parts[1])
    if not 200 <= status < 300:
        raise httpx.ProxyError(f"the proxy refused CONNECT to {authority}: "
                               f"{status_line[:80].decode('latin-1')}")
