"""Layer 4 (bench): Clocks: CUDA events on the GPU, ``perf_counter`` on the host; copy bandwidth."""

import itertools
import statistics
import time

import numpy as np

from ..products import settle  # (the products' own rule, re-exported: what a timing settles first)

__all__ = ["time_events", "time_host", "time_per_call", "time_rotating", "time_back_to_back", "time_queued",
           "copy_bandwidth", "settle"]



def time_events(fn, repeat=20, warmup=3):
    """Median milliseconds of ``fn()`` between CUDA events, and every sample."""
    import cupy as cp

    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(samples), samples


def time_host(fn, repeat=20, warmup=1):
    """Median milliseconds of ``fn()`` by the host clock, and every sample."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(samples), samples


def time_per_call(fn, calls, warmup=10):
    """``(host, wall)`` seconds per call of ``calls`` calls of ``fn()`` issued back to back.

    ``host``: until the last call returns (what the host spends issuing one); ``wall``: until the
    device has finished them all.
    """
    import cupy as cp

    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    cp.cuda.Device().synchronize()
    return (t1 - t0) / calls, (time.perf_counter() - t0) / calls


def time_rotating(fn, n_inputs, repeat=20, warmup=3, gpu=True):
    """Median milliseconds of ``fn(i)``, ``i`` cycling over ``n_inputs`` fresh inputs.

    Rotating inputs keeps one call from finding the last call's operand in L2.
    """
    it = itertools.cycle(range(n_inputs))
    clock = time_events if gpu else time_host
    return clock(lambda: fn(next(it)), repeat, warmup)[0]


def time_back_to_back(fn, n_inputs, calls=20, batches=3, gpu=True):
    """Milliseconds per call when ``calls`` calls run back to back between two events (median of batches).

    The host issues the next call while the GPU runs the last one, so launch
    gaps and Python overhead hide behind GPU time where they can: the time
    per call of a pipeline, against :func:`time_rotating`'s one call from idle.
    """
    it = itertools.cycle(range(n_inputs))

    def batch():
        for _ in range(calls):
            fn(next(it))

    clock = time_events if gpu else time_host
    return clock(batch, batches, 1)[0] / calls


def time_queued(fn, n_inputs, calls=20, repeat=11, spin_ms=2.0):
    """GPU milliseconds per call of ``calls`` calls queued behind a spin kernel (median of ``repeat`` batches).

    A one-thread kernel holds the stream while the host issues the batch, so
    the events around it time the kernels alone: no host issue cost, no launch
    gaps of a host-bound loop (the clock a replayed CUDA graph or a pipelined
    training loop sees).  The spin lasts ``spin_ms``, or twice the host time
    of the warm-up batch if that is longer; a warning says when a batch still
    outlasted it (its figure then holds some host time).
    """
    import warnings

    import cupy as cp

    from ..kernels.timing import spin

    it = itertools.cycle(range(n_inputs))
    samples = []
    for r in range(repeat + 1):  # the first batch warms up and measures the host's time
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        spin(spin_ms)
        t0 = time.perf_counter()
        start.record()
        for _ in range(calls):
            fn(next(it))
        stop.record()
        host_ms = 1e3 * (time.perf_counter() - t0)
        stop.synchronize()
        if r == 0:
            spin_ms = max(spin_ms, 2 * host_ms)
            continue
        if host_ms > spin_ms:
            warnings.warn(f"time_queued: issuing a batch took {host_ms:.2f} ms, longer than the spin", stacklevel=2)
        samples.append(cp.cuda.get_elapsed_time(start, stop) / calls)
    return statistics.median(samples)


def copy_bandwidth(gpu=True, nbytes=1 << 30, repeat=10):
    """Bytes per second of a large buffer copy, counting the read and the write."""
    if gpu:
        import cupy as cp

        a = cp.ones(nbytes // 4, cp.float32)
        b = cp.empty_like(a)
        ms = time_events(lambda: b.__setitem__(Ellipsis, a), repeat, 2)[0]
    else:
        nbytes = min(nbytes, 1 << 26)
        a = np.ones(nbytes // 4, np.float32)
        b = np.empty_like(a)
        ms = time_host(lambda: np.copyto(b, a), repeat, 1)[0]
    return 2 * a.nbytes / (ms * 1e-3)
