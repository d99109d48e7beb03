"""The command line: bad configuration is a clear message and exit status 2."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from triogate.cli import main, operator_errors

if TYPE_CHECKING:
    from pathlib import Path


def test_a_missing_config_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    assert main(["serve", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read config" in capsys.readouterr().err


def test_an_invalid_config_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("router_settings:\n  routing_strategy: fastest\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert "$.router_settings.routing_strategy" in capsys.readouterr().err


@pytest.mark.parametrize(("url", "reason"), [
    ("redis://:pw1@h:1/0?ssl_ca_certs=/ca.pem", "need a rediss:// URL"),
    ("rediss+cluster://:pw1@h:1?ssl_cert_reqs=sometimes", "none, optional or required"),
    ("redis+sentinel://:pw1@h:1", "names the service"),
    ("memcached://h:1", "unsupported Redis URL scheme"),
])
def test_a_redis_url_that_cannot_work_is_refused_before_starting(
    url: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"triogate:\n  redis:\n    url: '{url}'\n")
    assert main(["serve", "--config", str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "triogate.redis.url" in err and reason in err
    assert "pw1" not in err


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3"])
def test_the_example_master_key_is_refused_on_a_public_address(
    host: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRIOGATE_MASTER_KEY", raising=False)
    assert main(["serve", "--host", host, "--port", "0"]) == 2
    assert "example master key" in capsys.readouterr().err


def test_a_group_of_operator_errors_is_one_line_each_without_repeats() -> None:
    from triogate.errors import ConfigError, StoreError

    group = ExceptionGroup("outer", [
        ExceptionGroup("inner", [StoreError("create schema failed:\n  connection refused")]),
        StoreError("create schema failed:\n  connection refused"),
        ConfigError("bad"),
    ])
    assert operator_errors(group) == ["create schema failed: connection refused", "bad"]
    assert operator_errors(OSError(98, "Address already in use")) == [
        "OSError: [Errno 98] Address already in use"]


def test_a_bug_anywhere_in_the_group_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from triogate.cli import serve
    from triogate.errors import StoreError

    assert operator_errors(ExceptionGroup("g", [StoreError("x"), KeyError("bug")])) is None

    def broken(*_: object) -> int:
        raise ExceptionGroup("g", [StoreError("x"), KeyError("bug")])

    monkeypatch.setattr(serve, "run", broken)
    with pytest.raises(ExceptionGroup):
        main(["serve"])
