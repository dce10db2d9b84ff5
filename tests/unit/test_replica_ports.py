"""``gateway up``'s replicas: one whose port another process took between the pick and its
bind starts again on a new port, rather than failing the whole stack."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

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
