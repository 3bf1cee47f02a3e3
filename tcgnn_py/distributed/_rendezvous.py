"""Layer 4: rank 0 hands the NCCL id to the other ranks over TCP (the only thing not sent by NCCL).

The id is 128 bytes; rank 0 listens on ``MASTER_ADDR:MASTER_PORT`` and answers each
rank that connects, the others retry until ``timeout``.  Nothing else goes over
this socket: tensors move with NCCL.
"""

import json
import os
import socket
import time

from ._errors import DistributedTimeoutError

__all__ = ["exchange_id", "env_int"]


def env_int(name, default=None):
    """An integer environment variable, with a clear error when it is missing or malformed."""
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise KeyError(
                f"{name} is not set: start one process per GPU with `python -m tcgnn_py.distributed` "
                "(or torchrun / mpirun setting RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)"
            )
        return int(default)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _timeout_error(msg):

    return DistributedTimeoutError(msg)


def exchange_id(rank, world_size, addr, port, make_id, timeout):
    """The group's NCCL id on every rank: rank 0 makes it (``make_id()``) and serves it to ``world_size - 1`` ranks."""
    deadline = time.monotonic() + timeout
    if rank == 0:
        uid = make_id()
        # CuPy's NCCL id is 128 bytes; tuples of ints (tests) travel as they are.
        payload = json.dumps({"world_size": world_size, "id": list(uid), "bytes": isinstance(uid, bytes)}).encode()
        with socket.create_server((addr, port), reuse_port=False) as srv:
            srv.settimeout(0.5)
            served = set()
            while len(served) < world_size - 1:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(1, world_size)) - served)
                    raise _timeout_error(f"rendezvous on {addr}:{port}: ranks {missing} did not connect "
                                         f"within {timeout:g} s")
                try:
                    conn, _ = srv.accept()
                except socket.timeout:
                    continue
                with conn:
                    conn.settimeout(5)
                    try:
                        peer = int(conn.recv(16).decode().strip() or -1)
                    except (OSError, ValueError):
                        continue
                    conn.sendall(payload)
                    served.add(peer)
        return uid
    while True:
        try:
            with socket.create_connection((addr, port), timeout=5) as conn:
                conn.sendall(f"{rank}\n".encode())
                chunks = []
                while True:
                    b = conn.recv(65536)
                    if not b:
                        break
                    chunks.append(b)
            msg = json.loads(b"".join(chunks))
            if msg["world_size"] != world_size:
                raise ValueError(f"rank 0 runs a group of {msg['world_size']} ranks, this rank was told "
                                 f"WORLD_SIZE={world_size}")
            return bytes(msg["id"]) if msg.get("bytes") else tuple(msg["id"])
        except (ConnectionRefusedError, ConnectionResetError, socket.timeout, json.JSONDecodeError):
            if time.monotonic() > deadline:
                raise _timeout_error(f"rendezvous: rank 0 did not answer on {addr}:{port} within {timeout:g} s")
            time.sleep(0.2)
