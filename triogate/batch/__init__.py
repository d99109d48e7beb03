"""triogate.batch: a request waits on Redis once per dependency level, not once per subsystem.

A library on its own (it imports trio, hiredis, attrs and orjson; nothing of
the gateway). The pieces:

* :func:`open_batch_scope`: a nursery whose *participants* declare commands on a shared
  batch and await handles; one pipeline per backend leaves when every live participant
  waits. See ``_scope.py`` for the flush rule.
* :func:`open_post_call_batch` (:func:`post_call_batch` for callbacks that never wait)
  and :class:`Settler`: writes after the model call, sent
  with group commit, journaled when Redis is down or busy (transient error replies),
  replayed in chunks, dead-lettered when they never can land, drained on shutdown.
* :class:`Script`: Lua as a file plus its SHA; EVALSHA with a per-owner EVAL fallback.
  The script calls of one pipeline are fused into one EVALSHA where the backend allows
  it (``_fusion.py``); every owner still gets its own call's reply.
* Backends: :class:`RespBackend` (own pipelined RESP2 client), :class:`ClusterBackend`
  (Redis Cluster: one pipeline per node, the nodes concurrently, so a round is still
  one wait), :class:`SentinelBackend` (the primary a Redis Sentinel names, followed across
  failovers) and the :class:`Backend` protocol.
* :class:`MemoryTracer` and :class:`FlushRecord`: every flush, for counting waits.

Errors: :class:`BatchError` ├ :class:`BackendUnavailable` ├ :class:`CommandError`
└ :class:`BatchClosed`.
"""

from ._backend import Backend as Backend
from ._backend import RedisAddress as RedisAddress
from ._backend import TlsOptions as TlsOptions
from ._backend import redact_url as redact_url
from ._cluster import ClusterBackend as ClusterBackend
from ._cluster import ClusterStatistics as ClusterStatistics
from ._cluster_map import cluster_seeds as cluster_seeds
from ._command import Command as Command
from ._deadletter import DeadLetter as DeadLetter
from ._deadletter import DeadLetterFile as DeadLetterFile
from ._errors import BackendUnavailable as BackendUnavailable
from ._errors import BatchClosed as BatchClosed
from ._errors import BatchError as BatchError
from ._errors import CommandError as CommandError
from ._handle import Handle as Handle
from ._journal import Journal as Journal
from ._journal import JournalEntry as JournalEntry
from ._merge import Merge as Merge
from ._resp import BackendStatistics as BackendStatistics
from ._resp import RespBackend as RespBackend
from ._resp import Subscription as Subscription
from ._scope import Batch as Batch
from ._scope import BatchScope as BatchScope
from ._scope import BatchStatistics as BatchStatistics
from ._scope import Participant as Participant
from ._scope import open_batch_scope as open_batch_scope
from ._scripts import Script as Script
from ._sentinel import SentinelAddress as SentinelAddress
from ._sentinel import SentinelBackend as SentinelBackend
from ._settler import PostCallBatch as PostCallBatch
from ._settler import PostCallWrites as PostCallWrites
from ._settler import Settler as Settler
from ._settler import SettlerStatistics as SettlerStatistics
from ._settler import open_post_call_batch as open_post_call_batch
from ._settler import post_call_batch as post_call_batch
from ._tracer import AFTER as AFTER
from ._tracer import BEFORE as BEFORE
from ._tracer import FlushRecord as FlushRecord
from ._tracer import MemoryTracer as MemoryTracer
from ._tracer import Tracer as Tracer
from ._tracer import TraceSummary as TraceSummary

__all__ = (
    "AFTER",
    "BEFORE",
    "Backend",
    "BackendStatistics",
    "BackendUnavailable",
    "Batch",
    "BatchClosed",
    "BatchError",
    "BatchScope",
    "BatchStatistics",
    "ClusterBackend",
    "ClusterStatistics",
    "Command",
    "CommandError",
    "DeadLetter",
    "DeadLetterFile",
    "FlushRecord",
    "Handle",
    "Journal",
    "JournalEntry",
    "MemoryTracer",
    "Merge",
    "Participant",
    "PostCallBatch",
    "PostCallWrites",
    "RedisAddress",
    "RespBackend",
    "Script",
    "SentinelAddress",
    "SentinelBackend",
    "Settler",
    "SettlerStatistics",
    "Subscription",
    "TlsOptions",
    "TraceSummary",
    "Tracer",
    "cluster_seeds",
    "open_batch_scope",
    "open_post_call_batch",
    "post_call_batch",
    "redact_url",
)
