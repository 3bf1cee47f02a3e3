"""Layer 1: GPU-only timing of launches, the ``"timing"`` RawModule family.

A one-thread kernel spins on the GPU's global timer while the host queues the
launches to time, with an event between each two: the events then time the
kernels alone, not the host's cost of issuing them.  The products' timed
launch choice (:func:`tcgnn_py.products._autotune.choose`) and the benchmarks' GPU-only
clock (:func:`tcgnn_py.bench.time_queued`) use it.
"""

from .launches import make
from .registry import register

__all__ = ["SOURCE", "NAMES", "FAMILIES", "SPIN", "spin", "time_round_robin"]

SOURCE = r"""
// One thread waits ns nanoseconds of the GPU's global timer: work queued behind
// it starts only when the host has issued all of it.
extern "C" __global__ void tcgnn_spin(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""

#: The spin kernel's name.
SPIN = "tcgnn_spin"
NAMES = (SPIN,)
FAMILIES = {"timing": (SOURCE, NAMES)}
register("timing", SOURCE, NAMES)


def spin(ms):
    """Hold the current stream for ``ms`` milliseconds of GPU time (one thread)."""
    make("timing", SPIN, 1, 1, (), {"ns": int(ms * 1e6)}).run()


def time_round_robin(fns, rounds=3, spin_ms=3.0):
    """GPU milliseconds per call of each of ``fns``: the least of ``rounds`` calls.

    One untimed round warms up; then ``rounds`` rounds call every function once,
    in turn (so drifting clocks touch all of them alike), all queued behind a
    spin of ``spin_ms`` with an event between each two calls.  Should the host
    take longer to issue them than the spin lasts (its gaps would then be
    timed), everything runs once more behind a spin of twice the host's time.
    Synchronizes.
    """
    import time

    import cupy as cp

    n = len(fns)
    for _ in range(2):
        spin(spin_ms)
        t0 = time.perf_counter()
        for f in fns:
            f()
        events = [cp.cuda.Event()]
        events[0].record()
        for _ in range(rounds):
            for f in fns:
                f()
                events.append(cp.cuda.Event())
                events[-1].record()
        host_ms = 1e3 * (time.perf_counter() - t0)
        events[-1].synchronize()  # synchronize!
        if host_ms < spin_ms:
            break
        spin_ms = 2 * host_ms
    return [min(cp.cuda.get_elapsed_time(events[r * n + i], events[r * n + i + 1]) for r in range(rounds))
            for i in range(n)]
