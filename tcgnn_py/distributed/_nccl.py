"""Layer 4: the NCCL backend -- one rank's communicator on its GPU, every collective watched and the communicator
aborted (once) when one outlasts the timeout or a peer fails.
"""

import contextlib
import threading
import time

import numpy as np

from ._errors import DistributedError, DistributedTimeoutError
from ._group import Context, raise_in_thread

__all__ = ["nccl_module", "nccl_type", "NcclContext"]

def nccl_module():
    from cupy.cuda import nccl

    return nccl


def nccl_type(dtype):
    nccl = nccl_module()
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


class NcclContext(Context):
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
                self.comm.allReduce(x.data.ptr, x.data.ptr, x.size, nccl_type(x.dtype), nccl_module().NCCL_SUM,
                                    self._stream())
            self._issued()
        return x

    def allgather(self, x):
        self._check()
        x = self.xp.ascontiguousarray(x)
        out = self.xp.empty((self.world_size,) + x.shape, dtype=x.dtype)
        if x.size:
            nccl = nccl_module()
            with self._aborted_as_error():
                self.comm.allGather(x.data.ptr, out.data.ptr, x.nbytes, nccl.NCCL_UINT8, self._stream())
            self._issued()
        return out

    def sendrecv(self, send, recv, stream=None):
        self._check()
        nccl = nccl_module()
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
                raise_in_thread(self._thread, self.failed)

    def close(self):
        """Stop the watchdog and free the communicator (after the rank's last collective)."""
        self._stop.set()
        if self.failed is None:
            self._teardown("destroy")
