"""Errors of the gateway (the batch library has its own tree, in ``triogate.batch``).

The tree::

    TriogateError
    ├── ConfigError              bad YAML or values; the message names the field path
    ├── ProviderError            an upstream model provider failed
    │   ├── ProviderTimeout          no answer in time
    │   ├── ProviderConnectError     could not connect, or the connection broke
    │   ├── ProviderStatusError      an HTTP error status (.status, .body)
    │   └── ProviderProtocolError    a reply we could not parse (bad JSON, broken stream)
    ├── StoreError               the SQL side failed
    └── TranslationError         a request the upstream's API cannot express (a 400)
"""

from __future__ import annotations


class TriogateError(Exception):
    """Base class of the gateway's own errors."""


class ConfigError(TriogateError, ValueError):
    """Raised by config loading when a file, key or value is wrong; names the path."""


class ProviderError(TriogateError):
    """Raised by a provider when the upstream call failed."""

    #: Whether another deployment may succeed where this one failed.
    retryable: bool = True


class ProviderTimeout(ProviderError):
    """Raised by a provider when the upstream did not answer within its timeout."""


class ProviderConnectError(ProviderError):
    """Raised by a provider when it cannot connect to the upstream or the connection broke."""


class ProviderStatusError(ProviderError):
    """Raised by a provider when the upstream answered with an error status."""

    def __init__(self, status: int, body: bytes | str, *, message: str | None = None) -> None:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        super().__init__(message or f"upstream returned {status}: {text[:500]}")
        self.status = status
        self.body = text

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        """429, 408 and 5xx may succeed elsewhere; other 4xx are the request's fault."""
        return self.status in (408, 429) or self.status >= 500


class ProviderProtocolError(ProviderError):
    """Raised by a provider when the upstream's reply could not be parsed."""


class StoreError(TriogateError):
    """Raised by the SQL store when a query fails or the database is unreachable."""


class TranslationError(TriogateError, ValueError):
    """Raised by the request translators for what the upstream's API cannot express.

    The message is fit for the client (it names the field); the API layer answers it as a
    400. It is also a ``ValueError`` so that translators stay usable as plain functions.
    """
