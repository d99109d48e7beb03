"""The ``triogate:`` section of the config file: everything LiteLLM's file has no name for.

Redis, the failure policies, governance knobs, the response cache's scope, the HTTP
server's and upstream client's bounds, key rotation, and the worker-wide settings. Field
comments (``#:``) and ``name``: paragraphs of the docstrings are the configuration
reference's meanings (``python3 -m triogate.docgen``).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

FailurePolicy = Literal["fail-open", "fail-closed"]

_positive: Any = attrs.validators.gt(0)
_non_negative: Any = attrs.validators.ge(0)


def _optional(validator: Any) -> Any:
    return attrs.validators.optional(validator)


@attrs.frozen(kw_only=True)
class RedisSettings:
    """Where counters, caches and routing state live, and how long to wait for them."""

    url: str | None = attrs.field(default=None, repr=False)
    timeout_s: float = attrs.field(default=0.5, validator=_positive)
    pool_size: int = attrs.field(default=64, validator=_positive)
    #: How long the embedded server (no ``url``) may not answer before liveness fails.
    liveness_grace_s: float = attrs.field(default=30.0, validator=_positive)
    #: With Redis Sentinel or a Redis Cluster: replicas (of each node, on a cluster) that
    #: must acknowledge every pipeline's writes (``WAIT``) before they count as done. 0:
    #: none (replication stays asynchronous, and writes of the last moment before a
    #: failover can be lost with the old primary).
    wait_replicas: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen(kw_only=True)
class PolicySettings:
    """What each check does when Redis does not answer in time."""

    budgets: FailurePolicy = "fail-open"
    rate_limits: FailurePolicy = "fail-open"


@attrs.frozen(kw_only=True)
class GovernanceSettings:
    """Budgets and limits knobs that are not per key."""

    identity_ttl_s: float = attrs.field(default=60.0, validator=_positive)
    #: Output tokens assumed when a request sets no max_tokens (estimates only).
    default_max_output_tokens: int = attrs.field(default=1024, validator=_positive)
    #: Cap on the output tokens an estimate reserves, whatever max_tokens says.
    max_reserved_output_tokens: int = attrs.field(default=4096, validator=_positive)
    #: Output a stream may bring when its request sets no max_tokens: past it (by a
    #: quarter) the stream is ended, so a runaway upstream cannot bill without bound.
    default_max_stream_output_tokens: int = attrs.field(default=16384, validator=_positive)
    #: How long a parallel-request slot or a reservation outlives a dead process.
    lease_s: float = attrs.field(default=600.0, validator=_positive)
    end_user_header: str = "x-end-user-id"
    #: Settle one principal's requests of a settler flush with one script call
    #: (``budget_settle_many.lua``), not one call each: exact, cheaper for Redis.
    merge_settlements: bool = True


@attrs.frozen(kw_only=True)
class ResponseCacheSettings:
    """``triogate.cache``: who may share cached answers, and how big one may be.

    ``scope``: ``team`` (the default: a key in a team shares with its team, a key
    without one only with itself), ``key``, or ``global`` (LiteLLM's behaviour: every
    caller shares; a hit then tells a caller that someone else asked the same).
    """

    scope: Literal["team", "key", "global"] = "team"
    max_entry_bytes: int = attrs.field(default=1_000_000, validator=_positive)


@attrs.frozen(kw_only=True)
class HttpSettings:
    """``triogate.http``: who may read ``/metrics``, and which browser origins may call.

    ``metrics_key``: when set, ``GET /metrics`` needs ``Authorization: Bearer`` with it
    (or the master key); unset, ``/metrics`` is open, as Prometheus scrapers expect.
    ``cors_allow_origins``: origins (``https://app.example``, or ``"*"``) whose browsers
    may call the gateway; preflight ``OPTIONS`` requests are answered for them.
    ``body_read_timeout_s``: a request head must be complete this long after its first
    byte, and a body may go this long without a byte; otherwise the request is answered
    408 and its connection closed (a head trickled a byte at a time is not kept alive).
    ``max_connections``: client connections one worker keeps open at once; at the bound
    an idle kept-alive one is closed for a newcomer, and with none idle newcomers wait in
    the listen queue. Unset: what the open-files limit leaves room for, one upstream
    connection each (``triogate.server._limits``).
    ``max_body_read_s``: a whole request body must arrive within this long after its
    head, however steadily it comes; otherwise 408 and the connection closed.
    ``max_unauthenticated_bodies``: request bodies one worker reads at once for keys not
    yet known to be valid (none in memory); they hold no ``max_in_flight`` slot while
    they arrive, and the others wait their turn (the wait and the read within
    ``max_body_read_s``). A request without any key is refused 401 on its head, before
    its body is read.
    """

    metrics_key: str | None = attrs.field(default=None, repr=False)
    cors_allow_origins: list[str] = attrs.Factory(list)
    cors_max_age_s: int = attrs.field(default=600, validator=_non_negative)
    body_read_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    max_connections: int | None = attrs.field(default=None, validator=_optional(_positive))
    max_body_read_s: float = attrs.field(default=60.0, validator=_positive)
    max_unauthenticated_bodies: int = attrs.field(default=32, validator=_positive)

    #: An upstream's whole (not streamed) answer, error bodies included, is refused past
    #: this many bytes: the client gets 502, the upstream connection is dropped.
    max_upstream_body_bytes: int = attrs.field(default=32 * 1024 * 1024, validator=_positive)
    #: One event of an upstream stream is refused past this many bytes (the stream ends
    #: with an error event, as on any upstream failure).
    max_upstream_event_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=_positive)
    #: The proxy of every deployment that names none (``http://[user:pass@]host:port``).
    proxy: str | None = attrs.field(default=None, repr=False)
    #: TLS verification of every deployment that says nothing: true (``SSL_CERT_FILE``'s
    #: bundle, else certifi's), false, or a CA bundle's path.
    ssl_verify: bool | str = True
    #: A non-streamed request whose client closes its connection before the answer
    #: (its end of file: it left, or only half-closed) cancels its upstream call and is
    #: settled as cancelled at once. False: the call runs on and a half-closed client
    #: still gets its answer.
    cancel_when_client_leaves: bool = True


@attrs.frozen(kw_only=True)
class KeyRotationSettings:
    """``triogate.key_rotation``: the scheduled rotation of keys with ``auto_rotate``.

    ``check_interval_s``: how often each process looks for keys due (one of them
    rotates each key). ``grace_period_s``: how long a rotated-out secret keeps working.
    ``secrets_dir``: where each new secret is written (a file named by the key's alias,
    else its id, mode 0600), for a secret-sync agent to pick up; unset, the new secret
    is shown to nobody and the key's holder asks an admin for one.
    """

    #: How often each process looks for keys due for rotation (one of them rotates each).
    check_interval_s: float = attrs.field(default=60.0, validator=_positive)
    #: How long a rotated-out secret keeps working (0: refused at once).
    grace_period_s: float = attrs.field(default=0.0, validator=_non_negative)
    #: Where each new secret is written (a mode-0600 file per key) for a secret-sync agent.
    secrets_dir: str | None = None


@attrs.frozen(kw_only=True)
class TriogateSettings:
    """The ``triogate:`` section: everything LiteLLM's file has no name for."""

    state_dir: str = ".triogate"
    redis: RedisSettings = attrs.Factory(RedisSettings)
    policies: PolicySettings = attrs.Factory(PolicySettings)
    governance: GovernanceSettings = attrs.Factory(GovernanceSettings)
    cache: ResponseCacheSettings = attrs.Factory(ResponseCacheSettings)
    http: HttpSettings = attrs.Factory(HttpSettings)
    key_rotation: KeyRotationSettings = attrs.Factory(KeyRotationSettings)
    tracing: bool = False
    log_prompts: bool = False
    max_body_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=_positive)
    shutdown_grace_s: float = attrs.field(default=5.0, validator=_non_negative)
    post_call_deadline_s: float = attrs.field(default=1.0, validator=_positive)
    #: Group-commit delay of the settler: a request's post-call writes leave this long
    #: after they were queued, longer (up to four times) while other requests are in
    #: their pre-call checks (``batch.Settler``'s ``delay_s`` and ``busy``; shutdown's
    #: drain does not wait). With one client, a flush sent as the response leaves lands
    #: on the next request's pre-call work; 5 ms later it lands in that request's
    #: upstream wait instead, and under load more requests share a flush
    #: (``bench/load.py``). A settlement that gives back a parallel-request
    #: slot leaves at once (``PostCallBatch.hurry``): a client under
    #: ``max_parallel_requests`` may send its next request as soon as it has the answer.
    #: Meanwhile a budget still holds the request's estimate and a TPM window its
    #: estimated tokens (never less than the actual cost), so a check in those few ms can
    #: only be stricter, never looser. 0: flush at once.
    post_call_settle_delay_s: float = attrs.field(default=0.005, validator=_non_negative)
    spend_log_interval_s: float = attrs.field(default=1.0, validator=_positive)
    spend_log_batch_rows: int = attrs.field(default=500, validator=_positive)
    upstream_max_connections: int = attrs.field(default=1000, validator=_positive)
    #: Most retries a request may ask for (body ``num_retries``, ``x-litellm-num-retries``).
    max_request_retries: int = attrs.field(default=5, validator=_non_negative)
    #: Requests one worker serves at once; beyond, a request is answered 503 at once
    #: (``Retry-After``) instead of queueing behind the others. 0: no limit.
    max_in_flight: int = attrs.field(default=1000, validator=_non_negative)
    #: Requests one worker runs through the pre-call checks at once (``api/gate.py``);
    #: the others wait, in arrival order, up to ``max_admission_wait_s``, then get 503
    #: with ``Retry-After``. Bounds the CPU queue in front of the Redis round trip, so
    #: checks are not failed open under a burst. 0: no bound.
    max_admitting: int = attrs.field(default=64, validator=_non_negative)
    max_admission_wait_s: float = attrs.field(default=5.0, validator=_non_negative)
    #: Longest a stream waits between a client write and its next upstream read while
    #: the worker is behind (``api/pacing.py``): the next read then carries the chunks
    #: of the whole window and one write sends them, instead of every stream waking per
    #: chunk and new requests waiting seconds for their first token. A worker that
    #: keeps up holds nothing; a stream's first event is never held. 0: never hold.
    stream_coalesce_window_s: float = attrs.field(
        default=0.1, validator=[_non_negative, attrs.validators.le(1)])
