"""``triogate.http.max_connections``: set, it is the server's bound; unset, the bound is
what the open-files limit leaves room for (one upstream descriptor per client one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.app import server_config
from triogate.config import load_config
from triogate.server import connections_for, open_files_limit

if TYPE_CHECKING:
    from pathlib import Path


def test_unset_the_bound_follows_the_open_files_limit() -> None:
    assert server_config(load_config(None, environ={})).max_connections == connections_for(
        open_files_limit())


def test_set_it_is_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text("triogate:\n  http: {max_connections: 300}\n")
    assert server_config(load_config(path, environ={})).max_connections == 300


def test_room_for_one_upstream_descriptor_each_after_the_reserve() -> None:
    assert connections_for(1024) == (1024 - 256) // 2 == 384
    assert connections_for(524_288) == 262_016
    assert connections_for(100) == 32  # never fewer
