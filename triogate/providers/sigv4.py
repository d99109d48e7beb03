"""AWS Signature Version 4 for one request (header form), as AWS's reference describes it.

The canonical request takes the path as sent, percent-encoded once more (every AWS
service but S3 double-encodes: a Bedrock model id's ``:`` is ``%3A`` on the wire and
``%253A`` in the canonical path), the signed headers sorted and trimmed, and the SHA-256
of the exact body bytes. The signing key is derived from the secret, the date, the
region and the service. No I/O, no clock of its own: ``now`` is the caller's.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from typing import TYPE_CHECKING
from urllib.parse import quote

import attrs
import httpx

if TYPE_CHECKING:
    from collections.abc import Mapping

ALGORITHM = "AWS4-HMAC-SHA256"


@attrs.frozen(kw_only=True)
class AwsCredentials:
    """An access key, its secret and (for temporary credentials) the session token."""

    access_key_id: str
    secret_access_key: str = attrs.field(repr=False)
    session_token: str | None = attrs.field(default=None, repr=False)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The key of one day, region and service (``AWS4`` + secret, HMAC-chained)."""
    key = _hmac(f"AWS4{secret}".encode(), date)
    return _hmac(_hmac(_hmac(key, region), service), "aws4_request")


def canonical_request(method: str, raw_path: str, query: str,
                      headers: Mapping[str, str], payload_hash: str) -> tuple[str, str]:
    """The canonical request and the signed-headers list (names lower-case, sorted)."""
    names = sorted(headers)
    canonical_headers = "".join(f"{n}:{' '.join(headers[n].split())}\n" for n in names)
    pairs = sorted(tuple(p.split("=", 1)) if "=" in p else (p, "")
                   for p in query.split("&") if p)
    canonical_query = "&".join(f"{k}={v}" for k, v in pairs)
    signed = ";".join(names)
    text = "\n".join([method, quote(raw_path or "/", safe="/~"), canonical_query,
                      canonical_headers, signed, payload_hash])
    return text, signed


def sign(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    credentials: AwsCredentials,
    region: str,
    service: str,
    now: datetime.datetime,
) -> dict[str, str]:
    """``headers`` plus ``host``, ``x-amz-date``, the session token and ``authorization``.

    Every header given is signed (names are lower-cased); send them all as returned.
    """
    parsed = httpx.URL(url)
    amz_date = now.astimezone(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = {k.lower(): v for k, v in headers.items()}
    out["host"] = parsed.netloc.decode("ascii")
    out["x-amz-date"] = amz_date
    if credentials.session_token:
        out["x-amz-security-token"] = credentials.session_token
    payload_hash = hashlib.sha256(body).hexdigest()
    text, signed = canonical_request(method, parsed.raw_path.decode("ascii").split("?")[0],
                                     parsed.query.decode("ascii"), out, payload_hash)
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, amz_date, scope,
                         hashlib.sha256(text.encode()).hexdigest()])
    key = signing_key(credentials.secret_access_key, amz_date[:8], region, service)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["authorization"] = (f"{ALGORITHM} Credential={credentials.access_key_id}/{scope}, "
                            f"SignedHeaders={signed}, Signature={signature}")
    return out
