"""Network namespaces on this machine, one per host of a small fleet, on a private bridge.

Every namespace gets one veth pair: its end (``eth0``) inside the namespace with an address
of ``10.77.<n>.0/24``, the other end on a bridge in the root namespace, which holds
``10.77.<n>.1`` (so the test process, its load clients and its fake upstream reach every
host, and every host reaches them). No namespace has a default route: nothing leaves the
subnet. ``<n>`` is the first third octet no address of this machine uses yet.

A host is cut off from another with iptables rules in its own namespace (DROP both ways);
:meth:`Network.heal` removes them. :meth:`Network.destroy` kills what still runs in the
namespaces (by process id, from ``ip netns pids``), deletes them and the bridge; it runs
on every exit of :func:`open_network`, failures included.

Needs root, ``ip`` (iproute2) and ``iptables``; :func:`missing` says what is absent.
Everything here is synchronous (``subprocess``): async callers use ``trio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

SUBNET_PREFIX = "10.77"


def missing() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"needs {tool} on PATH (iproute2, iptables)"
    return None


def _run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _free_octet() -> int:
    used = _run("ip", "-4", "-o", "addr", "show")
    for n in range(0, 250):
        if f" {SUBNET_PREFIX}.{n}." not in used:
            return n
    raise RuntimeError(f"no free {SUBNET_PREFIX}.<n>.0/24 subnet")


@attrs.define
class Network:
    """The namespaces made by :func:`open_network`.

    Attributes:
        tag: the prefix of every name made (namespaces, links).
        gateway_ip: the root namespace's address on the bridge.
        namespaces: role -> namespace name.
        addresses: role -> the address of that namespace's ``eth0``.
    """

    tag: str
    gateway_ip: str
    bridge: str
    namespaces: dict[str, str] = attrs.Factory(dict)
    addresses: dict[str, str] = attrs.Factory(dict)
    _cuts: set[tuple[str, str]] = attrs.Factory(set)

    def prefix(self, role: str) -> list[str]:
        """``ip netns exec <namespace>``: put it before a command to run it in ``role``."""
        return ["ip", "netns", "exec", self.namespaces[role]]

    def _rules(self, role: str, peer: str, action: str) -> None:
        address = self.addresses.get(peer, peer)
        for chain, way in (("OUTPUT", "-d"), ("INPUT", "-s")):
            _run(*self.prefix(role), "iptables", action, chain, way, address, "-j", "DROP")

    def cut(self, role: str, peer: str) -> None:
        """Drop every packet between ``role`` and ``peer`` (a role, or an address such as
        :attr:`gateway_ip`), with rules in ``role``'s namespace."""
        self._rules(role, peer, "-I")
        self._cuts.add((role, peer))

    def heal(self, role: str, peer: str) -> None:
        """Undo :meth:`cut`."""
        self._cuts.discard((role, peer))
        self._rules(role, peer, "-D")

    def pids(self, role: str) -> list[int]:
        """Process ids running in ``role``'s namespace."""
        out = _run("ip", "netns", "pids", self.namespaces[role], check=False)
        return [int(p) for p in out.split()]

    def destroy(self) -> None:
        """Kill what runs in the namespaces, delete them and the bridge (idempotent)."""
        for namespace in self.namespaces.values():
            out = _run("ip", "netns", "pids", namespace, check=False)
            for pid in (int(p) for p in out.split()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for namespace in self.namespaces.values():
            _run("ip", "netns", "del", namespace, check=False)
        _run("ip", "link", "del", self.bridge, check=False)


@contextlib.contextmanager
def open_network(roles: Sequence[str], *, tag: str | None = None) -> Iterator[Network]:
    """One namespace per role on a fresh bridge; all torn down on exit.

    Args:
        roles: short names (letters and digits, at most 5 characters), e.g. ``redis``.
        tag: prefix of the names made (default: ``tgf`` and this process's id).
    """
    tag = tag or f"tgf{os.getpid() % 100000}"
    octet = _free_octet()
    network = Network(tag=tag, gateway_ip=f"{SUBNET_PREFIX}.{octet}.1", bridge=f"{tag}br")
    try:
        _run("ip", "link", "add", network.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{network.gateway_ip}/24", "dev", network.bridge)
        _run("ip", "link", "set", network.bridge, "up")
        for index, role in enumerate(roles):
            if not role.isalnum() or len(role) > 5:
                raise ValueError(f"role {role!r}: letters and digits, at most 5")
            namespace, outside = f"{tag}-{role}", f"{tag}{role}"
            address = f"{SUBNET_PREFIX}.{octet}.{10 + index}"
            network.namespaces[role] = namespace
            network.addresses[role] = address
            _run("ip", "netns", "del", namespace, check=False)  # a leftover of a crashed run
            _run("ip", "netns", "add", namespace)
            _run("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0",
                 "netns", namespace)
            _run("ip", "link", "set", outside, "master", network.bridge, "up")
            inside = network.prefix(role)
            _run(*inside, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
            _run(*inside, "ip", "link", "set", "eth0", "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
        yield network
    finally:
        network.destroy()
