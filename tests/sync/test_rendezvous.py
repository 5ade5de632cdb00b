"""Local rendezvous: what the listener check sees, and gloo/NCCL pointed at loopback."""

from __future__ import annotations

import os
import socket
import stat
import threading
import uuid

import pytest
import torch

from asyncrl.sync.collective import broadcast, destroy_collective, get_collective, init_collective
from asyncrl.sync.rendezvous import (
    LocalRendezvous,
    is_loopback,
    keep_local,
    loopback_interface,
    new_store_path,
    remove_store,
    tcp_listeners,
)


@pytest.mark.parametrize("family, host, exposed", [
    (socket.AF_INET, "127.0.0.1", False), (socket.AF_INET, "0.0.0.0", True),
    (socket.AF_INET6, "::1", False), (socket.AF_INET6, "::", True)])
def test_tcp_listeners_sees_this_process_listening(family: int, host: str, exposed: bool) -> None:
    with socket.socket(family) as server:
        server.bind((host, 0))
        server.listen()
        port = server.getsockname()[1]
        mine = [(a, p) for a, p in tcp_listeners(os.getpid()) if p == port]
    assert len(mine) == 1 and is_loopback(mine[0][0]) is not exposed, mine


def test_mapped_ipv4_loopback_is_loopback() -> None:
    assert is_loopback("::ffff:127.0.0.1") and not is_loopback("::ffff:192.0.2.2") and not is_loopback("0.0.0.0")


def test_keep_local_points_gloo_and_nccl_at_loopback_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")  # the user's choice wins
    keep_local()
    assert os.environ["GLOO_SOCKET_IFNAME"] == loopback_interface() == "lo"
    assert os.environ["NCCL_SOCKET_IFNAME"] == "ib0"


def test_local_rendezvous_is_private_and_removed() -> None:
    rendezvous = LocalRendezvous()
    assert stat.S_IMODE(os.stat(rendezvous.dir).st_mode) == 0o700
    assert os.path.dirname(rendezvous.path) == rendezvous.dir
    rendezvous.close()
    assert not os.path.exists(rendezvous.dir)


def test_a_one_host_sync_group_meets_through_a_file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks (threads here) join through a FileStore and broadcast; while the group lives this
    process listens on no address outside loopback (a TCPStore would listen on all of them)."""
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(var, raising=False)  # keep_local sets them; undone after the test
    path, tag, got = new_store_path(), uuid.uuid4().hex[:8], [0.0, 0.0]
    exposed: list[tuple[str, int]] = []
    before = set(tcp_listeners(os.getpid()))  # this process's own (a Ray driver's, in the suite)
    joined = threading.Barrier(2)

    def rank_main(rank: int) -> None:
        name = f"test-fs-{tag}-{rank}"
        init_collective(name, rank, 2, "gloo", "", 0, timeout_s=30, store_path=path)
        try:
            value = torch.tensor([7.0 if rank == 0 else 0.0])
            broadcast(get_collective(name), value).wait()
            got[rank] = float(value.item())
            if rank == 0:
                exposed.extend(a for a in tcp_listeners(os.getpid())
                               if not is_loopback(a[0]) and a not in before)
            joined.wait(30)
        finally:
            destroy_collective(name)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    remove_store(path)
    assert got == [7.0, 7.0] and exposed == [] and not os.path.exists(os.path.dirname(path))
