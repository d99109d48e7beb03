"""Structured JSON log lines, each carrying the request id of the task that logged it.

The request id lives in a ContextVar set by the ASGI handler; Trio copies context into
child tasks, so participants and flushes log under their request's id. Nothing here
logs prompts or keys: callers pass only what is safe (see ``log_prompts`` in config).
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time

import orjson

#: The current request's id ("-" outside a request).
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

_RESERVED = frozenset(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, extras."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or request_id_var.get(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def remember_request_ids() -> None:
    """Make every record take the request id when it is *made* (idempotent).

    A handler that formats later, in another task, then still names the right request.
    """
    make_record = logging.getLogRecordFactory()
    if getattr(make_record, "_triogate", False):
        return

    def with_request_id(*args: object, **kwargs: object) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        record.request_id = request_id_var.get()
        return record

    with_request_id._triogate = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(with_request_id)


def configure_logging(level: str = "info") -> None:
    """Send every log line (``triogate``, the HTTP server, libraries) to stderr as JSON."""
    remember_request_ids()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
