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

The context API and its host stand-in are :mod:`._group`'s, the MPI job :mod:`._mpi`'s, NCCL :mod:`._nccl`'s.
"""

import threading
import time

import numpy as np

from .._device import gpu_unusable_reason
from ._errors import DistributedError, DistributedTimeoutError
from ._group import BACKENDS, DEFAULT_TIMEOUT, Context, Hub, ReferenceContext
from ._mpi import MpiHostContext, install_failure_hooks, job_of
from ._nccl import NcclContext, nccl_module

__all__ = ["Context", "DistributedError", "DistributedTimeoutError", "spmd", "init", "unique_id", "DEFAULT_TIMEOUT",
           "BACKENDS"]

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
        hub = Hub(n, timeout)
        contexts = [ReferenceContext(r, hub, n, timeout) for r in range(n)]
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
    comms = nccl_module().NcclCommunicator.initAll(devices)
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
                ctx = NcclContext(r, n, devices[r], contexts_or_comms[r], timeout, meet)
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
    return nccl_module().get_unique_id()


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
        job = job_of(mpi_comm)
        ctx = MpiHostContext(job, timeout)
        install_failure_hooks(ctx, job)
        return ctx
    _need_gpu("distributed.init()", "backend='reference' runs the same program on host ranks without one")
    job = job_of(mpi_comm)
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
    nccl = nccl_module()
    uid = job.comm.bcast(nccl.get_unique_id() if job.rank == 0 else None, root=0)
    comm = nccl.NcclCommunicator(job.size, uid, job.rank)
    ctx = NcclContext(job.rank, job.size, device, comm, timeout, job=job)
    install_failure_hooks(ctx, job)
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
    comm = nccl_module().NcclCommunicator(world_size, nccl_id, rank)
    return NcclContext(rank, world_size, device, comm, timeout)
