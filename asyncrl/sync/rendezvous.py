"""Rendezvous for process groups on one host, with no TCP listener outside loopback.

torch's `TCPStore` listens on all interfaces whatever host it is given, without authentication:
anyone who reaches the port can read and write the group's keys. On one host there is no need for
it: `LocalRendezvous` makes a private directory (mode 0700, in the system temp dir: FileStore locks
with flock, unreliable on network file systems where run directories often live) whose
`FileStore` file the ranks meet through; it is removed when the run ends. `keep_local()`, called
in each rank's process before the group is created, points gloo's and NCCL's own connections at
the loopback interface (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`; a value the user set wins),
so their listening sockets are on 127.0.0.1 rather than on the address the hostname resolves to.

Not here: multi-node groups (Ray's broadcast transport keeps a TCPStore on the node's address;
docs/reliability.md says what to firewall).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import tempfile

_LOOPBACK_NAMES = ("lo", "lo0")


class LocalRendezvous:
    """A private directory holding one FileStore file; `close()` removes it."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="asyncrl-rendezvous-")  # 0700: only this user reads the store
        self.path = os.path.join(self.dir, "store")

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def new_store_path() -> str:
    """A fresh FileStore path in a private directory of its own (remove it with `remove_store`)."""
    return LocalRendezvous().path


def remove_store(path: str) -> None:
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def loopback_interface() -> str:
    """The loopback interface's name ("lo" on Linux), or "" where none is found."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return ""
    return next((n for n in _LOOPBACK_NAMES if n in names), "")


def keep_local() -> None:
    """In a rank's process, before its group exists: gloo and NCCL listen on loopback only."""
    interface = loopback_interface()
    if interface:
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, interface)




def tcp_listeners(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` holds in LISTEN state (Linux /proc; the
    caller must be allowed to read /proc/<pid>/fd). Used to check what a run exposes."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    address, port = fields[1].split(":")
                    found.append((str(_address(address)), int(port, 16)))
    return found


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp{,6}'s address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    flipped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.IPv4Address(flipped) if len(raw) == 4 else ipaddress.IPv6Address(flipped)


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


__all__ = ["LocalRendezvous", "is_loopback", "keep_local", "loopback_interface", "new_store_path", "remove_store",
           "tcp_listeners"]
