"""Layer 4: a rank's view of a group -- the :class:`Context` API every backend implements, its host stand-in (reference
ranks as threads of one process, exchanging through a :class:`Hub`), and raising an error in a rank's thread.
"""

import ctypes
import os
import threading

import numpy as np

from ._errors import DistributedError, DistributedTimeoutError

__all__ = ["DEFAULT_TIMEOUT", "BACKENDS", "raise_in_thread", "Context", "Hub", "ReferenceContext"]

#: Seconds a collective may take before the group is aborted (``TCGNN_PY_DIST_TIMEOUT`` overrides).
DEFAULT_TIMEOUT = float(os.environ.get("TCGNN_PY_DIST_TIMEOUT", 600))


#: ``"nccl"``: GPUs; ``"reference"``: host ranks with NumPy arrays (the oracle of every distributed operation).
BACKENDS = ("nccl", "reference")


def raise_in_thread(thread_id, error):
    """Raise ``error`` in another thread at its next bytecode (how a watchdog wakes a blocked rank).

    Python raises an asynchronous exception by calling its class with no arguments: a subclass
    of the error's own class carries the message.
    """
    base = type(error)
    cls = type(base.__name__, (base,), {"__init__": lambda self, *a: base.__init__(self, *(a or error.args)),
                                        "__module__": base.__module__})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(cls))


class Context:
    """One rank of a group: its rank, the group's size, its device, and the collectives.

    Not built directly: :func:`init` returns this process's, :func:`spmd` hands one to each rank.

    Attributes
    ----------
    rank, world_size : int
    local_rank : int
        The rank among the processes of its host (its GPU is ``device``).
    device : int or None
        The CUDA device of this rank (None on the host backend).
    xp : module
        ``cupy`` or ``numpy``: the arrays the collectives take.
    comm_stream : cupy.cuda.Stream or None
        The stream this rank's halo exchanges run on, beside the compute stream (None on the host).
    mpi_comm : mpi4py.MPI.Comm or None
        ``MPI_COMM_WORLD`` of a process launched by MPI (None otherwise): for the program's own MPI calls.

    Notes
    -----
    Every rank must issue the same collectives in the same order.  Arrays are C-contiguous and on the
    rank's device.  ``sendrecv`` pairs are matched by peer: what rank ``p`` sends to ``q`` must have the
    size ``q`` expects from ``p``.
    """

    xp = np
    device = None
    comm_stream = None
    mpi_comm = None

    def __init__(self, rank, world_size, timeout):
        self.rank, self.world_size, self.timeout = int(rank), int(world_size), float(timeout)
        self.local_rank = self.rank
        self.failed = None  # the error that stopped the group, once one has
        self._count = 0  # collectives issued (the stall report compares them between ranks)

    def __repr__(self):
        return f"<{type(self).__name__} rank {self.rank} of {self.world_size}, device {self.device}>"

    def _check(self):
        if self.failed is not None:
            raise self.failed

    # --- the collectives (NCCL semantics) ------------------------------------
    def allreduce(self, x):
        """Sum ``x`` over the ranks, in place; returns ``x``.  Every rank gets the same bits."""
        raise NotImplementedError

    def allgather(self, x):
        """``(world_size,) + x.shape``: every rank's ``x``, in rank order."""
        raise NotImplementedError

    def sendrecv(self, send, recv, stream=None):
        """Send ``send[peer]`` to each peer and fill ``recv[peer]`` from each, all at once (one NCCL group).

        ``send`` and ``recv`` map peer ranks to C-contiguous arrays; empty arrays are skipped (both ends
        know the sizes).  ``stream``: where the transfers are queued on the GPU (the current stream by default).
        """
        raise NotImplementedError

    def barrier(self):
        """Wait until every rank has reached this point (an all-reduce of one number)."""
        self.allreduce(self.xp.zeros(1, np.float32))
        self.synchronize()

    def synchronize(self):
        """Wait for this rank's queued work, under the watchdog."""

    def abort(self, error=None):
        """Stop the group: every rank's pending and later collectives raise ``error``."""
        raise NotImplementedError

    def close(self):
        """Free the communicator (after the rank's last collective)."""


class Hub:
    """What the simulated ranks share: a mailbox and a barrier (abort breaks it for every rank)."""

    def __init__(self, world_size, timeout):
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.box = {}
        self.error = None


class ReferenceContext(Context):
    """A rank on the host: NumPy arrays, collectives through shared memory, results exact and in rank order."""

    def __init__(self, rank, hub, world_size, timeout):
        super().__init__(rank, world_size, timeout)
        self._hub = hub

    def _wait(self):
        try:
            self._hub.barrier.wait()
        except threading.BrokenBarrierError:
            err = self._hub.error
            if err is None:
                err = self._hub.error = DistributedTimeoutError(
                    f"rank {self.rank}: a collective did not finish within {self.timeout:g} s "
                    "(a peer rank stalled or issued different collectives)"
                )
            raise err from None

    def _post(self, key, value):
        self._hub.box[key] = value

    def allreduce(self, x):
        self._post(("ar", self.rank), np.array(x, copy=True))
        self._wait()
        total = self._hub.box[("ar", 0)].copy()
        for r in range(1, self.world_size):  # rank order: every rank the same sum
            total += self._hub.box[("ar", r)]
        self._wait()
        x[...] = total
        return x

    def allgather(self, x):
        self._post(("ag", self.rank), np.array(x, copy=True))
        self._wait()
        out = np.stack([self._hub.box[("ag", r)] for r in range(self.world_size)])
        self._wait()
        return out

    def sendrecv(self, send, recv, stream=None):
        for peer, a in send.items():
            self._post(("p2p", self.rank, peer), np.array(a, copy=True))
        self._wait()
        for peer, buf in recv.items():
            got = self._hub.box.get(("p2p", peer, self.rank))
            if got is None or got.size != buf.size:
                size = 0 if got is None else got.size
                raise DistributedError(f"rank {self.rank} expected {buf.size} values from rank {peer}, got {size}")
            buf[...] = got.reshape(buf.shape)
        self._wait()
        for peer in send:
            self._hub.box.pop(("p2p", self.rank, peer), None)

    def abort(self, error=None):
        if self._hub.error is None:
            self._hub.error = error or DistributedError("the group was aborted")
        self._hub.barrier.abort()
