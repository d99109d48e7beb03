"""The whole gateway on a local three-node Redis Cluster: a governed request with key,
team and end-user budgets, limits, usage-based routing and the cache still waits once
before the model call and once after, and decisions are right. The same holds on a
cluster with a replica per primary, reached over TLS as an ACL user, with every node
pipeline acknowledged by its replica (``wait_replicas: 1``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway
from tests.integration.cluster_server import (
    ClusterUnavailable,
    LocalCluster,
    Security,
    tls_binaries,
)
from triogate.batch import ClusterBackend

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

USD = 1_000_000_000


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    try:
        cluster = LocalCluster(tmp_path_factory.mktemp("gateway-cluster"))
    except ClusterUnavailable as exc:
        pytest.skip(f"no local Redis Cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def secure_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three primaries with a replica each, TLS only, one ACL user."""
    try:
        tls_binaries()
        security = Security.make(tmp_path_factory.mktemp("gateway-certs"))
        cluster = LocalCluster(tmp_path_factory.mktemp("gateway-tls-cluster"), replicas=1,
                               security=security)
    except ClusterUnavailable as exc:
        pytest.skip(f"no local TLS Redis Cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_a_governed_request_on_a_cluster_waits_once_each_side(
    tmp_path: Path, three_nodes: LocalCluster, upstream: FakeUpstream
) -> None:
    await governed_requests(tmp_path, three_nodes, upstream)


async def test_over_tls_with_replicas_acknowledging_still_once_each_side(
    tmp_path: Path, secure_nodes: LocalCluster, upstream: FakeUpstream
) -> None:
    assert secure_nodes.cluster_url.startswith("rediss+cluster://app:")
    backend = await governed_requests(tmp_path, secure_nodes, upstream,
                                      redis={"wait_replicas": 1})
    # WAIT rode every node pipeline: none failed for want of an acknowledgement.
    assert backend.statistics().failures == 0


async def governed_requests(tmp_path: Path, cluster: LocalCluster, upstream: FakeUpstream,
                            **triogate: object) -> ClusterBackend:
    """Four governed requests (rpm_limit 3) through a gateway on ``cluster``; checks the
    decisions and the waits; the gateway's backend."""
    await trio.to_thread.run_sync(cluster.flush_all)
    config = gateway_config(
        tmp_path / "state", cluster.cluster_url, upstream.base_url,
        router_settings={"routing_strategy": "usage-based-routing"},
        litellm_settings={"cache": True}, triogate=triogate)
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            backend = gateway.services.backends["counters"]
            assert isinstance(backend, ClusterBackend)
            store = gateway.services.store
            assert store is not None
            team = await store.create_team(max_budget_nanousd=10 * USD, rpm_limit=100)
            key, _ = await store.create_key(team_id=team.team_id, max_budget_nanousd=USD,
                                            rpm_limit=3)
            await store.create_end_user(user_id="eu", max_budget_nanousd=USD)
            nodes = {backend.node_of(k) for k in (
                "tg:{key:x}", f"tg:{{team:{team.team_id}}}", "tg:{end_user:eu}",
                "tg:{rt:gpt-test}", "tg:{id}")}
            statuses, summaries = [], []
            async with httpx.AsyncClient(timeout=20) as http:
                for i in range(4):
                    response = await http.post(
                        f"{gateway.openai_base}/chat/completions",
                        headers={"authorization": f"Bearer {key}"},
                        json={"model": "gpt-test", "user": "eu",
                              "messages": [{"role": "user", "content": f"cluster {i}"}]})
                    statuses.append(response.status_code)
                    await gateway.services.settler.wait_drained()
                    assert gateway.services.tracer is not None
                    summaries.append(gateway.services.tracer.summary(
                        response.headers["x-triogate-trace-id"]))
    assert len(nodes) > 1  # the principals really live on different nodes
    assert statuses == [200, 200, 200, 429]  # rpm_limit=3, counted across the nodes
    first, *warm = summaries
    assert first.waits <= 3  # identity from SQL on the first request
    for summary in warm:
        assert (summary.waits_before, summary.waits_after) == (1, 1)
    return backend
