"""The SQL store (SQLAlchemy Core in trio worker threads) and the spend-log writer.

``open_store`` gives a :class:`Store` (keys, teams, users, end users, tags, spend logs);
``SpendLogWriter`` batches spend-log rows into it. See ``queries.py`` and ``spendlog.py``.
"""

from __future__ import annotations

from ._threads import StoreConflict as StoreConflict
from ._threads import StoreDataError as StoreDataError
from .queries import Store as Store
from .queries import open_store as open_store
from .queries_spend import SpendFilter as SpendFilter
from .records import BudgetRow as BudgetRow
from .records import DailySpend as DailySpend
from .records import EndUserRow as EndUserRow
from .records import KeyRow as KeyRow
from .records import SpendLogRow as SpendLogRow
from .records import SpendTotals as SpendTotals
from .records import TagRow as TagRow
from .records import TeamMember as TeamMember
from .records import TeamRow as TeamRow
from .records import UserRow as UserRow
from .records import generate_key as generate_key
from .records import hash_key as hash_key
from .records import key_hint as key_hint
from .records import parse_duration as parse_duration
from .spendlog import SpendLogStatistics as SpendLogStatistics
from .spendlog import SpendLogWriter as SpendLogWriter
