"""Lua scripts as objects: source from a package file, SHA computed once.

A :class:`Script` is sent as ``EVALSHA`` first. When a server answers NOSCRIPT (it was
restarted, or ``SCRIPT FLUSH`` ran), the flush retries *that owner's* command alone with
``EVAL``, which also loads the script for next time; the other owners of the pipeline are
not delayed (see ``_flush.py``). We do not use coredis's registered scripts: they add
``SCRIPT EXISTS``/``SCRIPT LOAD`` round trips inside a pipeline.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import final

import attrs


@final
@attrs.frozen(repr=False)
class Script:
    """A Lua script: its name, its source and the SHA1 the server knows it by."""

    name: str
    source: bytes
    sha: str

    @classmethod
    def from_source(cls, name: str, source: str | bytes) -> Script:
        """Build a script from Lua source text."""
        raw = source.encode() if isinstance(source, str) else source
        return cls(name=name, source=raw, sha=hashlib.sha1(raw).hexdigest())

    @classmethod
    def from_package(cls, package: str, resource: str) -> Script:
        """Load ``resource`` from ``package`` (``importlib.resources``), e.g. ``triogate.lua``."""
        raw = resources.files(package).joinpath(resource).read_bytes()
        return cls.from_source(resource.removesuffix(".lua"), raw)

    def __repr__(self) -> str:
        return f"Script({self.name!r}, sha={self.sha[:8]})"
