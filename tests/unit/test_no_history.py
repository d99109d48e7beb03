"""The product speaks to its users: no development history in the tree.

Issue numbers, wave and stop names, goal numbers, result files of one-off runs and commit
hashes mean nothing to a reader of the code, the docs or the benchmarks. Say what a figure
or a decision means instead (what was measured, with which tool); what changed and when
belongs in CHANGELOG.md's prose and in git.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What is searched: the package, tests, benchmarks, docs and the files beside them.
TREES = ("triogate", "tests", "bench", "docs", "config", ".ci")
FILES = ("README.md", "CHANGELOG.md", "Dockerfile", "pyproject.toml", "mkdocs.yml")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".lua", ".c", ".toml", ".txt", ".sh", ".html",
            ".css", ".js", ".cfg", ".ini", ""}
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis", "node_modules"}

HISTORY = re.compile(
    r"\bwaves? ?[0-9]+"            # a milestone's name and number
    r"|\bissues? ?#?[0-9]+"        # a tracker's number, with or without '#'
    r"|\bthis stop\b|\bstops? [0-9]+"
    r"|\bgoals? [0-9]+"            # goal 3 (an issue's numbered goals)
    r"|results/w[0-9]+-|\bw[0-9]+-[a-z]",  # w9-stream.md and its kin
    re.IGNORECASE)
#: A short commit hash in prose: 7 to 12 hex digits with at least two letters and a digit.
COMMIT = re.compile(
    r"(?<![\w/.:#-])(?=(?:[0-9]*[a-f]){2})(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![\w/.-])")


def product_files() -> list[Path]:
    found = [ROOT / name for name in FILES if (ROOT / name).exists()]
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            if (path.is_file() and path.suffix in SUFFIXES
                    and not SKIP_DIRS & set(path.relative_to(ROOT).parts)
                    and path != Path(__file__).resolve()):
                found.append(path)
    return found


def mentions(text: str) -> list[str]:
    """Each line of ``text`` that names development history, with its number."""
    return [f"{number}: {line.strip()[:120]}"
            for number, line in enumerate(text.splitlines(), 1)
            if HISTORY.search(line) or COMMIT.search(line)]


@pytest.mark.parametrize("line", [
    # Spelt in pieces, so that a plain grep of the tree finds no history here either.
    "measured in wa" "ve 10 (bench/res" "ults/w10-cpu.md)", "as iss" "ue #12 asks",
    "(iss" "ue 13, goal 4)", "the tree of this st" "op", "since stop 3", "base = 806cfa8",
    "against 428e0e1",
    "see w7-stream.md",
])
def test_the_patterns_catch_history(line: str) -> None:
    assert mentions(line)


@pytest.mark.parametrize("line", [
    "SIGSTOP 1.5 s", '"duration": "9999999999d"', "sha256 e3b0c44298fc1c149afbf4c8996fb924",
    "a wave of requests", "the goal is one wait", "0x1f2e3d4c", "stop accepting, then drain",
])
def test_the_patterns_leave_ordinary_words(line: str) -> None:
    assert not mentions(line)


def test_no_development_history_in_the_product() -> None:
    files = product_files()
    assert len(files) > 100
    found = [f"{path.relative_to(ROOT)}:{hit}"
             for path in files for hit in mentions(path.read_text(errors="replace"))]
    assert not found, "development history in the product:\n" + "\n".join(found)
