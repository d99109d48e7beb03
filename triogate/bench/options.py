"""The options of ``triogate bench roundtrips``, apart from the harness (which imports the
whole gateway) so that building the command line stays cheap."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse


def add_roundtrips_arguments(parser: argparse.ArgumentParser) -> None:
    """``--requests`` and ``--out``, shared by the CLI and ``python bench/roundtrips.py``."""
    parser.add_argument("--requests", type=int, default=5,
                        help="traced requests per shape, after one warm-up (default 5)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"),
                        help="folder for roundtrips.md and roundtrips.json "
                             "(default bench/results)")
