"""TLS (``rediss://``) and an ACL user for every Redis mode: one server, a cluster, Sentinel.

The servers listen on a TLS port only, with certificates of a private CA the test makes
(trustme), and know one ACL user (the default user is off). The client trusts the CA
through ``?ssl_ca_certs=``; a cluster's nodes and a sentinel's primary inherit the TLS
options and the credentials of the URL. Refusals (an unknown CA, a wrong password, no
client certificate where one is required, plain TCP to a TLS port) are
:class:`BackendUnavailable` with a reason that never shows the password. A replica
promoted after its primary died is reached over TLS as the user, though no seed named it.
"""

from __future__ import annotations

import subprocess
import time
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import pytest
import trio

from tests.integration.cluster_server import (
    ClusterUnavailable,
    LocalCluster,
    Security,
    answers,
    free_ports,
    tls_binaries,
)
from tests.integration.sentinel_server import LocalSentinel
from triogate.batch import BackendUnavailable, ClusterBackend, RespBackend, SentinelBackend

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration

TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def security(tmp_path_factory: pytest.TempPathFactory) -> Security:
    try:
        tls_binaries()
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    return Security.make(tmp_path_factory.mktemp("certs"))


class TlsServer:
    """One TLS-only server that requires client certificates, with the ACL user."""

    def __init__(self, folder: Path, security: Security) -> None:
        server, _cli = tls_binaries()
        (self.port,) = free_ports(1)
        self.security = security
        folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [server, "--bind", "127.0.0.1", *security.server_args(self.port, auth_clients=True),
             "--save", "", "--appendonly", "no", "--dir", str(folder),
             "--logfile", str(folder / "server.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def url(self, *, password: str | None = None, **query: str) -> str:
        """``rediss://app:…@127.0.0.1:port/0`` with the CA and client certificate, and
        ``query`` on top (an empty value leaves a parameter out)."""
        cert, key = self.security.client_cert
        params = {"ssl_ca_certs": str(self.security.ca_file), "ssl_certfile": str(cert),
                  "ssl_keyfile": str(key)} | query
        secret = self.security.password if password is None else password
        auth = Security(self.security.folder, user="app", password=secret).auth()
        return (f"rediss://{auth}127.0.0.1:{self.port}/0?"
                f"{urlencode({k: v for k, v in params.items() if v})}")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


@pytest.fixture(scope="module")
def tls_server(security: Security, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[TlsServer]:
    server = TlsServer(tmp_path_factory.mktemp("tls-server"), security)
    try:
        deadline = time.monotonic() + 10
        # A client certificate is needed to PING it: ask with the full client context.
        while not _answers_with_client_cert(server):
            assert server.process.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "the TLS server did not start"
            time.sleep(0.02)
        yield server
    finally:
        server.stop()


def _answers_with_client_cert(server: TlsServer) -> bool:
    import socket
    import ssl

    context = ssl.create_default_context(cafile=str(server.security.ca_file))
    context.load_cert_chain(*map(str, server.security.client_cert))
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=0.5) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"-NOAUTH")  # the default user is off
    except OSError:
        return False


async def roundtrip(url: str) -> list[object]:
    backend = RespBackend(url, command_timeout_s=TIMEOUT_S)
    try:
        with trio.fail_after(10):
            return await backend.execute([("SET", "tls-key", "v"), ("GET", "tls-key"),
                                          ("ACL", "WHOAMI")])
    finally:
        await backend.aclose()


# --------------------------------------------------------------------------- one server


async def test_one_server_over_tls_as_an_acl_user(tls_server: TlsServer) -> None:
    assert await roundtrip(tls_server.url()) == [b"OK", b"v", b"app"]


async def test_a_tls_connection_is_reused_not_made_again(tls_server: TlsServer) -> None:
    # Bytes a TLS server sends on its own (session tickets) must not make an idle
    # connection look closed: one handshake serves every pipeline.
    backend = RespBackend(tls_server.url(), command_timeout_s=TIMEOUT_S)
    try:
        with trio.fail_after(20):
            for i in range(30):
                assert await backend.execute([("INCR", "tls-reuse"), ("PING",)]) == [
                    i + 1, b"PONG"]
        stats = backend.statistics()
        assert (stats.connections_open, stats.stale_discarded, stats.stale_retries) == (
            1, 0, 0)
    finally:
        await backend.aclose()


async def test_no_certificate_check_still_encrypts(tls_server: TlsServer) -> None:
    url = tls_server.url(ssl_ca_certs="", ssl_cert_reqs="none")
    assert await roundtrip(url) == [b"OK", b"v", b"app"]


@pytest.mark.parametrize(("change", "reason"), [
    ({"ssl_ca_certs": ""}, "CERTIFICATE_VERIFY_FAILED"),
    ({"password": "wrong"}, "WRONGPASS"),
    ({"ssl_certfile": "", "ssl_keyfile": ""}, ""),
    ({"plain": "yes"}, ""),
], ids=["unknown CA", "wrong password", "no client certificate", "plain TCP"])
async def test_refusals_are_unavailable_without_the_password(
    tls_server: TlsServer, change: dict[str, str], reason: str,
) -> None:
    query = dict(change)
    password = query.pop("password", None)
    url = tls_server.url(password=password, **{k: v for k, v in query.items() if k != "plain"})
    if "plain" in query:
        url = f"redis://{tls_server.security.auth()}127.0.0.1:{tls_server.port}/0"
    with pytest.raises(BackendUnavailable) as caught:
        await roundtrip(url)
    assert reason in str(caught.value)
    assert tls_server.security.password not in str(caught.value)


# --------------------------------------------------------------------------- a cluster


@pytest.fixture(scope="module")
def tls_cluster(security: Security, tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[LocalCluster]:
    try:
        cluster = LocalCluster(tmp_path_factory.mktemp("tls-cluster"), security=security)
    except ClusterUnavailable as exc:
        pytest.skip(f"cannot run a TLS Redis Cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_cluster_nodes_inherit_tls_and_credentials(tls_cluster: LocalCluster) -> None:
    url = tls_cluster.cluster_url
    assert url.startswith("rediss+cluster://app:") and "ssl_ca_certs=" in url
    # One seed: every other node is reached with the seed's TLS options and user.
    backend = ClusterBackend(url.replace(
        ",".join(f"127.0.0.1:{p}" for p in tls_cluster.ports),
        f"127.0.0.1:{tls_cluster.ports[0]}"), command_timeout_s=TIMEOUT_S)
    try:
        keys = [f"tls-{i}" for i in range(12)]
        with trio.fail_after(20):
            replies = await backend.execute([("SET", k, k) for k in keys]
                                            + [("GET", k) for k in keys])
        assert replies == [b"OK"] * len(keys) + [k.encode() for k in keys]
        assert len(backend.nodes) == 3
        assert {backend.node_of(k) for k in keys} == set(backend.nodes)
        stats = backend.statistics()
        assert stats.failures == 0 and stats.connections_open >= 3
    finally:
        await backend.aclose()


async def test_a_cluster_refuses_a_wrong_password(tls_cluster: LocalCluster) -> None:
    url = tls_cluster.cluster_url.replace("app-secret", "wrong-secret")
    backend = ClusterBackend(url, command_timeout_s=TIMEOUT_S)
    try:
        with trio.fail_after(20), pytest.raises(BackendUnavailable, match="WRONGPASS"):
            await backend.execute([("GET", "k")])
    finally:
        await backend.aclose()


# --------------------------------------------------------------------------- Sentinel


@pytest.fixture
def tls_pair(security: Security, tmp_path: Path) -> Iterator[LocalSentinel]:
    try:
        pair = LocalSentinel(tmp_path, security=security)
    except ClusterUnavailable as exc:
        pytest.skip(f"cannot run a TLS sentinel: {exc}")
    try:
        yield pair
    finally:
        pair.stop()


async def test_sentinel_over_tls_follows_a_failover_with_the_credentials(
    tls_pair: LocalSentinel,
) -> None:
    backend = SentinelBackend(tls_pair.url, command_timeout_s=2.0)
    try:
        # WAIT 1: replication is asynchronous, and only a write the replica acknowledged
        # is promised to outlive the primary's kill -9.
        with trio.fail_after(10):
            assert await backend.execute(
                [("SET", "k", "v"), ("ACL", "WHOAMI"), ("WAIT", 1, 2000)]) == [b"OK", b"app", 1]
        assert backend.primary == ("127.0.0.1", tls_pair.primary)
        await trio.to_thread.run_sync(tls_pair.kill, tls_pair.primary)
        promoted = await trio.to_thread.run_sync(tls_pair.wait_failover)
        with trio.fail_after(30):
            while True:
                try:
                    replies = await backend.execute([("GET", "k"), ("ACL", "WHOAMI")])
                    break
                except BackendUnavailable:
                    await trio.sleep(0.1)
        assert replies == [b"v", b"app"]
        assert backend.primary == ("127.0.0.1", promoted)
    finally:
        await backend.aclose()


def test_a_plain_client_cannot_reach_the_tls_sentinel(tls_pair: LocalSentinel) -> None:
    assert not answers(tls_pair.sentinel)
    assert answers(tls_pair.sentinel, tls_pair.security)


async def test_a_promoted_replica_is_reached_over_tls_as_the_user(
    security: Security, tmp_path: Path,
) -> None:
    try:
        cluster = await trio.to_thread.run_sync(lambda: LocalCluster(
            tmp_path / "cluster", replicas=1, node_timeout_ms=1000, security=security))
    except ClusterUnavailable as exc:
        pytest.skip(f"cannot run a TLS Redis Cluster: {exc}")
    backend: ClusterBackend | None = None
    try:
        primaries = await trio.to_thread.run_sync(cluster.primaries)
        victim, seed = primaries[0], primaries[1]
        # One seed that survives: the promoted replica is known from the slot map only.
        url = cluster.cluster_url.replace(",".join(f"127.0.0.1:{p}" for p in cluster.ports),
                                          f"127.0.0.1:{seed}")
        backend = ClusterBackend(url, command_timeout_s=1.0, min_refresh_interval_s=0.2,
                                 wait_replicas=1)
        await backend.execute([("PING",)])  # the slot map
        key = next(f"k{i}" for i in range(10_000)
                   if backend.node_of(f"k{i}") == f"127.0.0.1:{victim}")
        assert await backend.execute([("SET", key, "before")]) == [b"OK"]
        (sha,) = await backend.execute([("SCRIPT", "LOAD", "return 7")])
        assert isinstance(sha, bytes)
        await trio.to_thread.run_sync(cluster.kill, victim)
        promoted = await trio.to_thread.run_sync(cluster.wait_promoted, victim)
        with trio.fail_after(30):
            # The promoted replica answers (over TLS, as the user) but has no replica of
            # its own: with WAIT 1 nothing it does counts until the dead node is back.
            while True:
                try:
                    await backend.execute([("GET", key)])
                except BackendUnavailable as exc:
                    if "0 of 1 replicas acknowledged" in exc.reason:
                        break
                await trio.sleep(0.1)
        assert backend.node_of(key) == f"127.0.0.1:{promoted}"
        # The script cache is not replicated: the backend loaded it on the new primary.
        assert await trio.to_thread.run_sync(
            cluster.command, promoted, "SCRIPT", "EXISTS", sha) == [1]
        await trio.to_thread.run_sync(cluster.restart, victim)
        await trio.to_thread.run_sync(cluster.wait_replica_of, victim, promoted)
        with trio.fail_after(30):
            while True:
                try:
                    (reply,) = await backend.execute([("GET", key)])
                    break
                except BackendUnavailable:
                    await trio.sleep(0.1)
        # Acknowledged by the replica before the kill (WAIT 1): it survived.
        assert reply == b"before"
    finally:
        if backend is not None:
            await backend.aclose()
        await trio.to_thread.run_sync(cluster.stop)



async def test_sentinel_announcements_arrive_over_tls_as_the_user(
    tls_pair: LocalSentinel,
) -> None:
    backend = SentinelBackend(tls_pair.url, command_timeout_s=2.0)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.watch)
            with trio.fail_after(10):
                assert await backend.execute([("SET", "k", "v")]) == [b"OK"]
            # A planned failover: the old primary lives on, so only the sentinel's
            # +switch-master (a subscription over TLS, as the sentinels' user) tells.
            await trio.to_thread.run_sync(tls_pair.failover)
            promoted = await trio.to_thread.run_sync(tls_pair.wait_failover)
            with trio.fail_after(30):
                while backend.primary != ("127.0.0.1", promoted):
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert backend.switches == 1
    finally:
        await backend.aclose()
