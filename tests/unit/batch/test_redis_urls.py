"""Redis URLs: TLS options (redis-py's ``ssl_*`` spellings), how a cluster's nodes and a
sentinel's primary inherit them with the credentials, and passwords kept out of logs."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

import pytest
import trustme

from triogate.batch import RedisAddress, SentinelAddress, TlsOptions, redact_url
from triogate.batch._cluster_map import cluster_seeds, node_url

if TYPE_CHECKING:
    from pathlib import Path


def test_rediss_takes_the_ssl_query_parameters() -> None:
    address = RedisAddress.from_url(
        "rediss://app:p%40ss@cache.example:6380/2?ssl_ca_certs=/etc/ca.pem"
        "&ssl_certfile=/etc/me.pem&ssl_keyfile=/etc/me.key&ssl_cert_reqs=optional"
        "&ssl_check_hostname=false")
    assert address.tls and (address.host, address.port, address.db) == ("cache.example", 6380, 2)
    assert (address.username, address.password) == ("app", "p@ss")
    assert address.tls_options == TlsOptions(
        ca_file="/etc/ca.pem", cert_file="/etc/me.pem", key_file="/etc/me.key",
        cert_reqs="optional", check_hostname=False)
    assert RedisAddress.from_url("rediss://h").tls_options == TlsOptions()


@pytest.mark.parametrize(("url", "message"), [
    ("redis://h?ssl_ca_certs=/ca.pem", "need a rediss:// URL"),
    ("rediss://h?ssl_cert_reqs=maybe", "none, optional or required"),
    ("rediss://h?ssl_check_hostname=perhaps", "true or false"),
    ("rediss://h?ssl_keyfile=/k.pem", "ssl_keyfile needs ssl_certfile"),
    ("rediss://h?ssl_cert_reqs=none&ssl_check_hostname=true", "other than none"),
])
def test_tls_parameters_that_cannot_work_are_refused(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisAddress.from_url(url)


def test_a_cluster_node_inherits_tls_options_and_credentials() -> None:
    (seed,) = cluster_seeds("rediss+cluster://app:p%40ss@10.0.0.1:7000"
                            "?ssl_ca_certs=/etc/ca%20dir/ca.pem&ssl_cert_reqs=none")
    node = RedisAddress.from_url(node_url(seed, "10.0.0.7:7005"))
    assert (node.host, node.port, node.tls) == ("10.0.0.7", 7005, True)
    assert (node.username, node.password) == ("app", "p@ss")
    assert node.tls_options == seed.tls_options
    assert node.tls_options.ca_file == "/etc/ca dir/ca.pem"
    plain = RedisAddress.from_url(node_url(cluster_seeds("redis+cluster://:pw@h:1")[0], "[::1]:2"))
    assert (plain.host, plain.port, plain.tls, plain.password) == ("::1", 2, False, "pw")


def test_a_sentinels_primary_and_sentinels_inherit_tls_options() -> None:
    address = SentinelAddress.from_url(
        "rediss+sentinel://app:pw@10.0.0.1:26379/svc?ssl_ca_certs=/ca.pem"
        "&sentinel_username=watch&sentinel_password=sp")
    primary = RedisAddress.from_url(address.primary_url("10.0.0.9", 6379))
    sentinel = RedisAddress.from_url(address.sentinel_url("10.0.0.1", 26379))
    assert primary.tls and primary.tls_options.ca_file == "/ca.pem"
    assert (primary.username, primary.password) == ("app", "pw")
    assert sentinel.tls and sentinel.tls_options.ca_file == "/ca.pem"
    assert (sentinel.username, sentinel.password) == ("watch", "sp")
    with pytest.raises(ValueError, match="rediss"):
        SentinelAddress.from_url("redis+sentinel://h:1/svc?ssl_ca_certs=/ca.pem")


def test_the_context_trusts_the_private_ca_and_shows_the_client_certificate(
    tmp_path: Path,
) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client = ca.issue_cert("client@example.org")
    client.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "me.pem"))
    options = TlsOptions(ca_file=str(tmp_path / "ca.pem"), cert_file=str(tmp_path / "me.pem"))
    context = options.context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert len(context.get_ca_certs()) == 1  # the private CA, not the system's
    unchecked = TlsOptions(cert_reqs="none").context()
    assert unchecked.verify_mode == ssl.CERT_NONE and not unchecked.check_hostname
    with pytest.raises(OSError):
        TlsOptions(ca_file=str(tmp_path / "missing.pem")).context()


def test_passwords_are_redacted_wherever_they_are() -> None:
    shown = redact_url("rediss+sentinel://:pw1@h:1/svc?sentinel_password=pw2&password=pw3"
                       "&ssl_ca_certs=/etc/ca.pem")
    assert "pw1" not in shown and "pw2" not in shown and "pw3" not in shown
    assert "ssl_ca_certs=/etc/ca.pem" in shown
    assert redact_url("redis://h:1/0") == "redis://h:1/0"
