"""Scheduled key rotation: keys with ``auto_rotate`` get a new secret every
``rotation_interval`` (LiteLLM's ``auto_rotate`` / ``rotation_interval``).

A :class:`KeyRotator` runs in the app nursery of every process. Every
``check_interval_s`` it asks SQL for keys whose ``key_rotation_at`` has passed and
rotates each: a new secret, the same id, limits and spend; the old secret is accepted
``grace_period_s`` more. The rotation is a conditional update on ``key_rotation_at``,
so when several processes find the same key due, one rotates it and the others change
nothing. Each rotation is announced like an admin change (the old secret is refused
everywhere within a second, once its grace period is over).

The new secret is written to ``secrets_dir`` when one is configured (a file per key,
mode 0600, for a secret-sync agent) and never logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from typing import TYPE_CHECKING

import trio

from triogate.batch import BackendUnavailable
from triogate.errors import StoreError
from triogate.store.records import parse_duration

if TYPE_CHECKING:
    from collections.abc import Callable

    from triogate.config_settings import KeyRotationSettings
    from triogate.governance.identity import IdentityResolver
    from triogate.store import KeyRow, Store

logger = logging.getLogger("triogate.governance.rotation")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class KeyRotator:
    """Rotates the keys that are due, every ``settings.check_interval_s``."""

    def __init__(self, store: Store, identities: IdentityResolver,
                 settings: KeyRotationSettings, clock_ms: Callable[[], int]) -> None:
        self._store = store
        self._identities = identities
        self._settings = settings
        self._clock_ms = clock_ms
        self.rotated = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Check, rotate, sleep; until cancelled."""
        task_status.started()
        while True:
            try:
                # Bounded: a database that hangs delays the next check, not shutdown.
                with trio.move_on_after(max(30.0, self._settings.check_interval_s)):
                    await self.rotate_due()
            except StoreError as exc:
                logger.warning("scheduled key rotation: database unavailable (%s); "
                               "retried at the next check", exc)
            await trio.sleep(self._settings.check_interval_s)

    async def rotate_due(self) -> int:
        """Rotate every key due now; how many this process rotated. A checkpoint.

        Raises:
            StoreError: the database failed (keys rotated before stay rotated).
        """
        done = 0
        while True:
            due = await self._store.keys_due_for_rotation(limit=100)
            if not due:
                return done
            progressed = False
            for row in due:
                if await self._rotate(row):
                    done += 1
                    progressed = True
            if not progressed:  # all taken by other processes meanwhile
                return done

    async def _rotate(self, row: KeyRow) -> bool:
        if row.rotation_interval is None:
            return False
        now = self._clock_ms()
        rotated = await self._store.rotate_key(
            row.token_hash, grace_ms=int(self._settings.grace_period_s * 1000),
            next_rotation_at_ms=now + parse_duration(row.rotation_interval) * 1000,
            due_at_ms=row.key_rotation_at_ms)
        if rotated is None:
            return False  # another process rotated it, or it was deleted
        raw, new_row, old_secret = rotated
        self.rotated += 1
        logger.info("key %s rotated (rotation %d); next rotation due at %d",
                    new_row.key_hint, new_row.rotation_count or 0,
                    new_row.key_rotation_at_ms or 0)
        if self._settings.secrets_dir is not None:
            await self._deliver(trio.Path(self._settings.secrets_dir), new_row, raw)
        # On failure the change waits in the identity outbox until Redis answers.
        with contextlib.suppress(BackendUnavailable, StoreError):
            await self._identities.announce(("key", new_row.token_hash), ("key", old_secret))
        return True

    async def _deliver(self, folder: trio.Path, row: KeyRow, raw: str) -> None:
        """Write the new secret where a secret-sync agent picks it up (mode 0600)."""
        path = folder / _UNSAFE.sub("_", row.key_alias or row.token_hash)

        def write() -> None:
            tmp = f"{path}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(raw + "\n")
            os.replace(tmp, path)

        try:
            await folder.mkdir(parents=True, exist_ok=True)
            await trio.to_thread.run_sync(write)
        except OSError as exc:
            logger.error("key %s rotated but its new secret could not be written to %s: %s",
                         row.key_hint, folder, exc.strerror)
