"""``triogate serve``'s server options refused before anything starts, each with one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.cli import EXIT_USAGE, main

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == EXIT_USAGE
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("triogate: ")]
    assert len(lines) == 1
    return lines[0]


def test_tls_needs_hypercorn_and_both_files(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("x")
    assert "need --server hypercorn" in refusal(
        ["serve", "--certfile", str(cert), "--keyfile", str(key)], capsys)
    assert "--certfile and --keyfile go together" in refusal(
        ["serve", "--server", "hypercorn", "--certfile", str(cert)], capsys)
    assert f"cannot read {key}" in refusal(
        ["serve", "--server", "hypercorn", "--certfile", str(cert), "--keyfile", str(key)],
        capsys)


def test_the_bind_check_holds_under_hypercorn(capsys: pytest.CaptureFixture[str]) -> None:
    line = refusal(["serve", "--server", "hypercorn", "--host", "0.0.0.0"], capsys)
    assert "refusing to listen on 0.0.0.0 with the example master key" in line
