"""``.ci/run``: runs the README's install and test commands, ruff, mypy and the strict docs
build, and fails when any of them fails or when no test ran. The real script runs here,
with a stand-in ``python3`` first on PATH that records its arguments and answers as each
case needs (so nothing is installed and no suite runs inside the suite)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / ".ci" / "run"

FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$CI_CALLS"
case "$*" in
  *"-m pytest"*) printf '%s\\n' "$PYTEST_OUTPUT"; exit "$PYTEST_STATUS" ;;
  *"-m ruff"*) exit "$RUFF_STATUS" ;;
  *"-m mypy"*) exit "$MYPY_STATUS" ;;
  *"-m mkdocs"*) exit "$MKDOCS_STATUS" ;;
esac
exit 0
"""


def run_ci(tmp_path: Path, *, pytest_status: int = 0, pytest_output: str = "1000 passed",
           ruff: int = 0, mypy: int = 0, mkdocs: int = 0) -> tuple[int, list[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CI_CALLS": str(calls),
           "PYTEST_STATUS": str(pytest_status), "PYTEST_OUTPUT": pytest_output,
           "RUFF_STATUS": str(ruff), "MYPY_STATUS": str(mypy),
           "MKDOCS_STATUS": str(mkdocs)}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    return done.returncode, calls.read_text().splitlines(), done.stderr


def readme_test_command() -> list[list[str]]:
    """The README's second command, split at ``&&``, without the leading ``python3``."""
    line = next(line for line in (ROOT / "README.md").read_text().splitlines()
                if "pip install" in line and "-m pytest" in line)
    return [shlex.split(part)[1:] for part in line.split("#")[0].split("&&")]


def test_a_green_run_installs_lints_type_checks_and_runs_the_readmes_suite(
    tmp_path: Path,
) -> None:
    status, calls, _ = run_ci(tmp_path)
    assert status == 0
    argv = [shlex.split(c) for c in calls]
    install, suite = readme_test_command()
    assert [a for a in argv[0] if a != "-q"] == install
    assert ["-m", "ruff", "check", "triogate", "tests", "bench"] in argv
    assert ["-m", "mypy", "triogate"] in argv
    assert any(a[:4] == ["-m", "mkdocs", "build", "--strict"] for a in argv)
    assert argv[-1] == suite


@pytest.mark.parametrize(("case", "reason"), [
    ({"ruff": 1}, "ruff"),
    ({"mypy": 1}, "mypy"),
    ({"mkdocs": 1}, "mkdocs"),
    ({"pytest_status": 1, "pytest_output": "3 failed, 997 passed"}, "pytest"),
    ({"pytest_status": 5, "pytest_output": "no tests ran"}, "no test ran"),
    ({"pytest_status": 0, "pytest_output": "12 skipped"}, "no test ran"),
])
def test_any_failing_step_or_an_empty_run_fails_ci(
    tmp_path: Path, case: dict[str, int | str], reason: str
) -> None:
    status, calls, stderr = run_ci(tmp_path, **case)
    assert status == 1
    assert reason in stderr
    assert any("-m pytest" in c for c in calls)  # a lint failure does not skip the suite
