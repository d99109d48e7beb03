"""The command line as a shell runs it (a subprocess): the admin commands stay light, and
an operator's mistake is one line on stderr with exit status 2, not an exception group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: What an admin command must never import: the server, the database layer, the gateway.
HEAVY = ("triogate.server", "httptools", "hypercorn", "sqlalchemy", "triogate.app",
         "triogate.store", "triogate.api")


def triogate(*argv: str, cwd: Path, python: tuple[str, ...] = ()
             ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("TRIOGATE_REDIS_URL", "TRIOGATE_DATABASE_URL", "TRIOGATE_MASTER_KEY"):
        env.pop(name, None)
    return subprocess.run([sys.executable, *python, "-m", "triogate", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def imported(importtime_stderr: str) -> set[str]:
    """Module names from ``python -X importtime`` output."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.mark.parametrize("command", [["keys", "list"], ["teams", "list"], ["tags", "list"],
                                     ["users", "create", "--no-key"]])
def test_admin_commands_do_not_import_the_gateway(command: list[str], tmp_path: Path) -> None:
    done = triogate(*command, "--url", "http://127.0.0.1:9", "--timeout", "2",
                    cwd=tmp_path, python=("-X", "importtime"))
    assert done.returncode == 1
    assert "cannot reach the gateway at http://127.0.0.1:9" in done.stderr
    modules = imported(done.stderr)
    assert "triogate.cli.admin" in modules  # the check sees what was imported
    heavy = {m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY)}
    assert not heavy


def config(tmp_path: Path, database_url: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(f"general_settings:\n  database_url: {database_url}\n"
                    f"triogate:\n  state_dir: {tmp_path / 'state'}\n")
    return path


def test_an_unsupported_database_url_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = triogate("serve", "--port", "0", "--config",
                    str(config(tmp_path, "mysql://u@db/x")), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("triogate:")]
    assert errors == ["triogate: unsupported database_url scheme 'mysql': use sqlite:///PATH "
                      "or postgresql://..."]
    assert "Traceback" not in done.stderr and "ExceptionGroup" not in done.stderr
    assert "+-" not in done.stderr  # no exception-group drawing


def test_an_unreachable_database_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = triogate("serve", "--port", "0", "--config",
                    str(config(tmp_path, "postgresql://nobody@127.0.0.1:1/x")), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("triogate:")]
    assert len(errors) == 1
    assert "connection" in errors[0].lower() and "127.0.0.1" in errors[0]
    assert "Traceback" not in done.stderr


def test_a_missing_config_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = triogate("serve", "--config", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("triogate: cannot read config")


def test_serve_raises_its_open_files_limit_to_the_hard_one(tmp_path: Path) -> None:
    """A shell's soft limit of 1,024 descriptors would fail a worker's upstream connections
    at ~500 streams; ``serve`` raises it to the hard limit before serving."""
    import resource
    import signal

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 512:
        pytest.skip("the hard open-files limit leaves nothing to raise")
    config = tmp_path / "gateway.yaml"
    config.write_text(f"triogate:\n  state_dir: {tmp_path / 'state'}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRIOGATE_LOG_LEVEL": "info"}
    for name in ("TRIOGATE_REDIS_URL", "TRIOGATE_DATABASE_URL", "TRIOGATE_MASTER_KEY"):
        env.pop(name, None)
    process = subprocess.Popen(
        [sys.executable, "-m", "triogate", "serve", "--port", "0", "--config", str(config)],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard)),
    )
    assert process.stderr is not None
    try:
        lines = []
        for line in process.stderr:
            lines.append(line)
            if "Running on" in line:
                break
        assert any("open-files limit raised from 512" in line for line in lines), lines
        limits = Path(f"/proc/{process.pid}/limits").read_text()
        (row,) = [r for r in limits.splitlines() if r.startswith("Max open files")]
        assert int(row.split()[3]) == (1 << 20 if hard == resource.RLIM_INFINITY else hard)
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
