"""The round-trip table: ``python bench/roundtrips.py [--requests N] [--out DIR]``.

The same as ``triogate bench roundtrips``; the harness lives in
``triogate/bench/roundtrips.py`` so that the installed command can run it.
"""

from __future__ import annotations

from triogate.bench.roundtrips import main

if __name__ == "__main__":
    raise SystemExit(main())
