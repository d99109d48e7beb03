"""Redis Cluster routing, pure and sync: hash slots, and which keys a wire command names.

A command goes to the primary serving its keys' slot. The slot of a key is CRC16-XMODEM
of the key modulo 16384, where only the *hash tag* is hashed when the key has one: the
bytes between the first ``{`` and the first ``}`` after it, if that span is not empty
(``{user1000}.following`` → ``user1000``; ``foo{}{bar}`` → the whole key). This is how
triogate keeps the keys one script touches in one slot (``governance/keys.py``).

:func:`command_slot` reads the keys out of a wire tuple with a table (see ``_FIRST_KEY``
and friends). A command the table does not know is routed by its first argument, when it
has one: right for the many ``CMD key ...`` commands not listed, and a wrong guess only
costs a ``MOVED`` redirection, which the cluster backend follows. Commands without keys
go to any node, or to every primary (:data:`Spread.ALL`) when they change per-node state
that every node must share, such as the script cache (``SCRIPT LOAD``/``FLUSH``).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._backend import Wire
    from ._command import Arg

#: Hash slots in a Redis Cluster.
SLOTS = 16384


def _crc16_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC16 = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster computes it."""
    crc = 0
    table = _CRC16
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[(crc >> 8) ^ byte]
    return crc


def arg_bytes(arg: Arg) -> bytes:
    """An argument as the wire sends it (hiredis: UTF-8 text, decimal ints, ``repr`` floats)."""
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    return repr(arg).encode() if isinstance(arg, float) else str(arg).encode()


def key_slot(key: Arg) -> int:
    """The hash slot (0-16383) of ``key``, honouring hash tags."""
    raw = arg_bytes(key)
    start = raw.find(b"{")
    if start != -1:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return crc16(raw) % SLOTS


class Spread(enum.Enum):
    """Where a command without a single slot goes."""

    #: No keys: any one node can answer (PING, ECHO, PUBLISH, TIME, ...).
    ANY = "any"
    #: Per-node state every primary must share: sent to all (SCRIPT LOAD, FLUSHALL, ...).
    ALL = "all"
    #: Keys in more than one slot: answered with a CROSSSLOT error, never sent.
    CROSSSLOT = "crossslot"
    #: Needs one connection across commands (MULTI/EXEC, WATCH): refused, never sent.
    UNSUPPORTED = "unsupported"


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Commands whose first argument (index 1) is their only key.
_FIRST_KEY = _names("""
    GET SET SETNX SETEX PSETEX GETSET GETDEL GETEX GETRANGE SETRANGE APPEND STRLEN SUBSTR
    INCR DECR INCRBY DECRBY INCRBYFLOAT
    HGET HSET HSETNX HMSET HMGET HINCRBY HINCRBYFLOAT HDEL HGETALL HKEYS HVALS HLEN
    HEXISTS HSTRLEN HSCAN HRANDFIELD
    LPUSH RPUSH LPUSHX RPUSHX LPOP RPOP LLEN LRANGE LINDEX LSET LREM LTRIM LINSERT LPOS
    SADD SREM SMEMBERS SISMEMBER SMISMEMBER SCARD SPOP SRANDMEMBER SSCAN
    ZADD ZREM ZCARD ZCOUNT ZSCORE ZMSCORE ZINCRBY ZRANGE ZRANGEBYSCORE ZREVRANGE
    ZREVRANGEBYSCORE ZRANGEBYLEX ZREVRANGEBYLEX ZRANK ZREVRANK ZREMRANGEBYSCORE
    ZREMRANGEBYRANK ZREMRANGEBYLEX ZPOPMIN ZPOPMAX ZSCAN ZLEXCOUNT ZRANDMEMBER
    EXPIRE PEXPIRE EXPIREAT PEXPIREAT EXPIRETIME PEXPIRETIME PERSIST PTTL TTL TYPE
    DUMP RESTORE PFADD GETBIT SETBIT BITCOUNT BITPOS BITFIELD BITFIELD_RO
    XADD XLEN XRANGE XREVRANGE XDEL XTRIM XACK XPENDING XCLAIM XAUTOCLAIM XSETID
    GEOADD GEODIST GEOHASH GEOPOS GEOSEARCH SORT SORT_RO SPUBLISH
""")

# Commands whose every argument is a key.
_ALL_KEYS = _names("""
    MGET DEL EXISTS UNLINK TOUCH SINTER SUNION SDIFF SINTERSTORE SUNIONSTORE SDIFFSTORE
    PFCOUNT PFMERGE
""")

# Commands whose first two arguments are keys.
_TWO_KEYS = _names("RENAME RENAMENX RPOPLPUSH LMOVE SMOVE COPY GEOSEARCHSTORE")

# Keys, then a trailing timeout.
_KEYS_THEN_TIMEOUT = _names("BLPOP BRPOP BZPOPMIN BZPOPMAX")

# Key count at index 2, keys after it: scripts and functions.
_NUMKEYS_AT_2 = _names("EVAL EVALSHA EVAL_RO EVALSHA_RO FCALL FCALL_RO")

# Key count at index 1, keys after it.
_NUMKEYS_AT_1 = _names("ZUNION ZINTER ZDIFF ZINTERCARD SINTERCARD LMPOP ZMPOP")

# A destination key, then a key count and keys.
_DEST_NUMKEYS = _names("ZUNIONSTORE ZINTERSTORE ZDIFFSTORE")

# Key, value pairs.
_PAIRS = _names("MSET MSETNX")

# Keyless, answered by any node.
_ANY = _names("""
    PING ECHO PUBLISH INFO TIME DBSIZE LASTSAVE CLUSTER COMMAND CLIENT HELLO READONLY
    READWRITE ROLE LOLWUT
""")

# Keyless and per-node: every primary must get it; (name, subcommand or "").
_ALL = frozenset({
    ("FLUSHALL", ""), ("FLUSHDB", ""),
    ("SCRIPT", "LOAD"), ("SCRIPT", "FLUSH"), ("SCRIPT", "EXISTS"),
    ("FUNCTION", "LOAD"), ("FUNCTION", "FLUSH"), ("FUNCTION", "DELETE"),
    ("FUNCTION", "RESTORE"), ("CONFIG", "SET"), ("CONFIG", "RESETSTAT"),
})

# Key at index 2, after a subcommand.
_SUBCOMMAND_KEY = frozenset({("OBJECT", ""), ("MEMORY", "USAGE"), ("XINFO", "")})

_UNSUPPORTED = _names("MULTI EXEC DISCARD WATCH UNWATCH")


def command_name(wire: Wire) -> str:
    """The command's name, upper case (``wire[0]``)."""
    return arg_bytes(wire[0]).decode(errors="replace").upper()


def _subcommand(wire: Wire) -> str:
    return arg_bytes(wire[1]).decode(errors="replace").upper() if len(wire) > 1 else ""


def _count(arg: Arg) -> int | None:
    try:
        count = int(arg_bytes(arg))
    except ValueError:
        return None
    return count if count >= 0 else None


def _counted(wire: Wire, at: int) -> tuple[Arg, ...] | None:
    count = _count(wire[at]) if len(wire) > at else None
    if count is None or len(wire) < at + 1 + count:
        return None
    return wire[at + 1 : at + 1 + count]


def command_keys(wire: Wire) -> tuple[Arg, ...] | Spread:
    """The keys ``wire`` names, or where it goes when it names none (see :class:`Spread`).

    An ``EVAL``/``EVALSHA``/``FCALL`` with a malformed key count is routed as keyless:
    whichever node gets it answers the error.
    """
    name = command_name(wire)
    args = wire[1:]
    if name in _FIRST_KEY:
        return args[:1] if args else Spread.ANY
    if name in _NUMKEYS_AT_2:
        keys = _counted(wire, 2)
        return keys if keys else Spread.ANY
    if name in _ALL_KEYS:
        return args if args else Spread.ANY
    if name in _PAIRS:
        return args[::2] if args else Spread.ANY
    if name in _TWO_KEYS:
        return args[:2] if args else Spread.ANY
    if name in _KEYS_THEN_TIMEOUT:
        return args[:-1] if len(args) > 1 else Spread.ANY
    if name in _NUMKEYS_AT_1:
        keys = _counted(wire, 1)
        return keys if keys else Spread.ANY
    if name in _DEST_NUMKEYS:
        keys = _counted(wire, 2)
        return (wire[1], *keys) if keys is not None else Spread.ANY
    if name in _ANY:
        return Spread.ANY
    if name in _UNSUPPORTED:
        return Spread.UNSUPPORTED
    sub = _subcommand(wire)
    if (name, sub) in _ALL or (name, "") in _ALL:
        return Spread.ALL
    if (name, sub) in _SUBCOMMAND_KEY or (name, "") in _SUBCOMMAND_KEY:
        return wire[2:3] if len(wire) > 2 else Spread.ANY
    if name in ("SCRIPT", "FUNCTION", "CONFIG", "SLOWLOG", "LATENCY", "MEMORY", "ACL"):
        return Spread.ANY
    # Not in the tables: by convention the first argument is the key. A wrong guess
    # costs a MOVED redirection, which the cluster backend follows.
    return args[:1] if args else Spread.ANY


def command_slot(wire: Wire) -> int | Spread:
    """The one slot ``wire``'s keys hash to, or a :class:`Spread`.

    Keys in more than one slot give :data:`Spread.CROSSSLOT`, as Redis would refuse them.
    """
    keys = command_keys(wire)
    if isinstance(keys, Spread):
        return keys
    slot = key_slot(keys[0])
    for key in keys[1:]:
        if key_slot(key) != slot:
            return Spread.CROSSSLOT
    return slot
