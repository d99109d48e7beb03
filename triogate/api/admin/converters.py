"""What a field converter is: the context it gets and its signature (a leaf module).

``fields.py`` (the implemented fields) and ``compat.py`` (the accepted no-ops) both build
tables of converters; both import these from here, so neither imports the other's types.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, final

import attrs


@final
@attrs.frozen(kw_only=True)
class FieldContext:
    """What converters need besides the value.

    Attributes:
        groups: the model groups the gateway serves (``models`` must name them).
        now_ms: the wall clock, for ``duration`` → ``expires_at_ms``.
    """

    groups: frozenset[str]
    now_ms: int


Converter = Callable[[str, Any, FieldContext], dict[str, Any]]
