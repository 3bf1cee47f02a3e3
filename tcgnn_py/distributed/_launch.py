"""Layer 4: ``python -m tcgnn_py.distributed``: start one process per GPU and watch them.

Each process gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (the names torchrun uses) and calls :func:`tcgnn_py.distributed.init`.
When a rank exits with an error, the launcher stops the others (they would wait
for it in their next collective) and exits with that rank's code.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

__all__ = ["main", "launch"]


def _free_port(addr):
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m tcgnn_py.distributed",
        description="Run a tcgnn_py program as one process per GPU (each calls tcgnn_py.distributed.init()).",
    )
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="processes (GPUs) on this host; default: every visible GPU")
    p.add_argument("--nnodes", type=int, default=1, help="hosts in the group (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this host's number, 0 .. nnodes-1")
    p.add_argument("--master-addr", default="127.0.0.1", help="host of rank 0 (default 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=29500,
                   help="free TCP port on rank 0's host; 0 picks one (single host only)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds the other ranks get to exit after SIGTERM before SIGKILL")
    p.add_argument("-m", dest="module", action="store_true", help="run the program as a module (python -m)")
    p.add_argument("program", help="script (or module with -m) to run in every process")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def _visible_gpus():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 -- no driver, no CuPy
        return 0


def launch(command, nproc, *, nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29500, grace=5.0,
           env=None, log=sys.stderr):
    """Start ``nproc`` copies of ``command`` with the rank variables set; return the first failure's code (or 0)."""
    if nproc < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"need nproc >= 1, nnodes >= 1 and 0 <= node_rank < nnodes; got {nproc}, {nnodes}, "
                         f"{node_rank}")
    if master_port == 0:
        if nnodes > 1:
            raise ValueError("--master-port 0 (pick one) works on a single host only")
        master_port = _free_port(master_addr)
    base = dict(os.environ if env is None else env)
    procs = []
    for local in range(nproc):
        e = dict(base, RANK=str(node_rank * nproc + local), LOCAL_RANK=str(local),
                 WORLD_SIZE=str(nnodes * nproc), LOCAL_WORLD_SIZE=str(nproc),
                 MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        procs.append(subprocess.Popen(command, env=e))
    code = 0
    try:
        while True:
            running = False
            for rank, p in enumerate(procs):
                rc = p.poll()
                if rc is None:
                    running = True
                elif rc != 0 and code == 0:
                    code = rc if rc > 0 else 128 - rc
                    print(f"tcgnn_py.distributed: rank {node_rank * nproc + rank} exited with "
                          f"{'code ' + str(rc) if rc > 0 else 'signal ' + str(-rc)}; stopping the other ranks",
                          file=log, flush=True)
                    _stop(procs, grace)
            if not running:
                return code
            time.sleep(0.1)
    except KeyboardInterrupt:
        _stop(procs, grace)
        return 130


def _stop(procs, grace):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv=None):
    a = _parser().parse_args(argv)
    nproc = a.nproc_per_node if a.nproc_per_node is not None else _visible_gpus()
    if nproc < 1:
        print("tcgnn_py.distributed: no GPU visible; pass --nproc-per-node", file=sys.stderr)
        return 2
    cmd = [sys.executable] + (["-m", a.program] if a.module else [a.program]) + list(a.args)
    return launch(cmd, nproc, nnodes=a.nnodes, node_rank=a.node_rank, master_addr=a.master_addr,
                  master_port=a.master_port, grace=a.grace)
