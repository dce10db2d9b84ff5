"""``gateway up``'s replicas: one whose port another process took between the pick and its
bind starts again on a new port, rather than failing the whole stack; and ``free_port``
does not hand out a port another process picked and has not bound yet."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import httpx
import pytest

from gateway.stack import triton_server
from gateway.stack.replicas import Replica, ReplicaError, settings_env, stop_all
from gateway.stack.triton_server import free_port
from tests.support.inprocess import make_settings


def test_a_replica_whose_port_was_taken_starts_on_another(tmp_path: Path) -> None:
    env = settings_env(make_settings(triton_url="127.0.0.1:1"))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        replica = Replica(taken, env, tmp_path)
        try:
            replica.start()
            replica.wait_live(60, retry_port=free_port)
            assert replica.port != taken
            assert httpx.get(f"http://{replica.address}/health/live").status_code == 200
        finally:
            stop_all([replica], 10)
        # Without a way to a new port, the same start fails and says why.
        stuck = Replica(taken, env, tmp_path)
        try:
            stuck.start()
            try:
                stuck.wait_live(60)
            except ReplicaError as exc:
                assert f"port {taken} exited" in str(exc)
            else:
                raise AssertionError("a replica started on a port another process holds")
        finally:
            stop_all([stuck], 10)


def test_a_port_another_process_picked_is_not_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes (here: this one, then this one forgetting its own picks, as another
    # process knows none of them) offered the same port before anything binds it.
    monkeypatch.setattr(triton_server, "_RESERVATIONS", tmp_path / "ports")
    offered = [24_321, 24_321, 24_322]
    monkeypatch.setattr(triton_server.random, "choice", lambda _: offered.pop(0))
    assert free_port() == 24_321
    monkeypatch.setattr(triton_server, "_HANDED_OUT", set())
    assert free_port() == 24_322
    # A pick older than RESERVED_S is forgotten: whoever bound the port holds it now.
    old = time.time() - triton_server.RESERVED_S - 1
    os.utime(tmp_path / "ports" / "24321", (old, old))
    monkeypatch.setattr(triton_server, "_HANDED_OUT", set())
    offered.append(24_321)
    assert free_port() == 24_321
