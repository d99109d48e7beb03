"""The thread wrapper: runs off the loop thread and maps errors without secrets."""

from __future__ import annotations

import sqlite3
import threading

import pytest
import sqlalchemy.exc

from triogate.errors import StoreError
from triogate.store import StoreConflict
from triogate.store._threads import SqlThreads


async def test_functions_run_in_a_worker_thread() -> None:
    threads = SqlThreads(2)
    assert await threads.run("op", threading.get_ident) != threading.get_ident()


async def test_the_limiter_bounds_concurrent_threads() -> None:
    assert SqlThreads(3).limiter.total_tokens == 3


def _raise(exc: BaseException) -> None:
    raise exc


async def test_sql_errors_become_store_errors_with_the_secret_scrubbed() -> None:
    threads = SqlThreads(1, secrets=["hunter2", None])
    orig = sqlite3.OperationalError('password "hunter2" rejected\nsecond line')
    exc = sqlalchemy.exc.OperationalError("SELECT :p", {"p": "param-value"}, orig)
    with pytest.raises(StoreError) as info:
        await threads.run("ping", _raise, exc)
    assert str(info.value) == 'ping failed: OperationalError: password "***" rejected'
    assert info.value.__cause__ is exc
    assert "param-value" not in str(info.value)


async def test_integrity_errors_are_conflicts() -> None:
    exc = sqlalchemy.exc.IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE failed"))
    with pytest.raises(StoreConflict, match="create team failed: IntegrityError: UNIQUE"):
        await SqlThreads(1).run("create team", _raise, exc)


async def test_os_errors_are_store_errors_and_other_errors_pass_through() -> None:
    with pytest.raises(StoreError, match="mkdir failed: PermissionError"):
        await SqlThreads(1).run("mkdir", _raise, PermissionError("denied"))
    with pytest.raises(KeyError):
        await SqlThreads(1).run("op", _raise, KeyError("bug"))


def test_long_messages_are_cut() -> None:
    message = SqlThreads(1).message("op", RuntimeError("x" * 1000))
    assert len(message) < 400 and message.endswith("...")
