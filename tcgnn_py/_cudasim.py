"""Layer 0: warp intrinsics for the Numba CUDA simulator.

The simulator (``NUMBA_ENABLE_CUDASIM=1``) runs one Python thread per CUDA
thread but has no warp-level intrinsics (numba issue #8433).  :func:`install`
adds them to its fake ``cuda`` module with full-warp semantics, so the very
same kernels that run on the GPU run in CI:

* every collective is a rendezvous of the live lanes named in ``mask``; a lane
  that has exited drops out, as on the hardware;
* reading a lane that did not take part raises (undefined on a GPU);
* return types follow the GPU: ballot and match masks are int32 (bit 31 makes
  them negative), ``all/any/eq`` give bool, ``activemask`` uint32;
* ``popc`` is fixed for negative and 64-bit values;
* a static ``cuda.shared.array`` is made under a lock: the simulator looks it up and stores it unlocked, so two
  threads of a block meeting there could each get an array of their own, and one then read memory no thread wrote.

It relies on private simulator internals (``BlockThread``, ``FakeCUDAModule``)
of numba-cuda 0.30, hence its own tests (``tests/test_cudasim_shim.py``).
"""

import sys
import threading

import numpy as np

__all__ = ["install"]

FULL_MASK = 0xFFFFFFFF
_TIMEOUT_S = 60.0
_installed = False
_registry_lock = threading.Lock()


class _Warp:
    """Rendezvous state of one warp of one simulated block."""

    def __init__(self, lanes):
        self.cond = threading.Condition()
        self.lanes = lanes  # lanes that exist in this warp
        self.exited = set()
        self.arrivals = {}  # lane -> (kind, mask, value)
        self.results = {}  # lane -> result

    def live(self, mask):
        return {l for l in self.lanes if (mask >> l) & 1 and l not in self.exited}


def _as_mask(mask):
    return int(mask) & FULL_MASK


def _thread():
    t = threading.current_thread()
    if not hasattr(t, "thread_id"):
        raise RuntimeError("warp intrinsic called outside a simulated kernel")
    return t


def _warp_of(t):
    mgr = t._manager
    wid = t.thread_id // 32
    with _registry_lock:
        warps = mgr.__dict__.setdefault("_tcgnn_warps", {})
        key = (tuple(t.blockIdx), wid)
        w = warps.get(key)
        if w is None:
            bx, by, bz = mgr._block_dim
            nthreads = bx * by * bz
            lanes = {l for l in range(32) if wid * 32 + l < nthreads}
            w = warps[key] = _Warp(lanes)
    return w


def _collective(kind, mask, value):
    """Rendezvous of the live lanes in ``mask``; ``_COMBINE[kind]`` computes each lane's result."""
    t = _thread()
    lane = t.thread_id % 32
    mask = _as_mask(mask)
    if not (mask >> lane) & 1:
        raise RuntimeError(f"lane {lane} called {kind} with a mask {mask:#x} that excludes it")
    w = _warp_of(t)
    with w.cond:
        w.arrivals[lane] = (kind, mask, value)
        _try_complete(w)
        ok = w.cond.wait_for(lambda: lane in w.results or t.abort, timeout=_TIMEOUT_S)
        if t.abort:
            raise RuntimeError("simulated kernel aborted")
        if not ok:
            raise RuntimeError(
                f"{kind}: lanes {sorted(w.live(mask) - set(w.arrivals))} of mask {mask:#x} "
                "never reached the same collective (divergent or mismatched warp call)"
            )
        res = w.results.pop(lane)
    if isinstance(res, Exception):
        raise res
    return res


def _try_complete(w):
    """Complete every pending collective whose live lanes have all arrived."""
    progressed = True
    while progressed:
        progressed = False
        for lane, (kind, mask, _) in list(w.arrivals.items()):
            group = w.live(mask)
            if not group or not group <= set(w.arrivals):
                continue
            if any(w.arrivals[l][:2] != (kind, mask) for l in group):
                for l in group:
                    w.arrivals.pop(l)
                    w.results[l] = RuntimeError(
                        f"lanes of mask {mask:#x} met different warp collectives"
                    )
            else:
                values = {l: w.arrivals.pop(l)[2] for l in group}
                try:
                    out = _COMBINE[kind](values, mask)
                except Exception as exc:  # reported to every participant
                    out = {l: exc for l in group}
                w.results.update(out)
            w.cond.notify_all()
            progressed = True
            break


def _i32(bits):
    return np.int32(np.uint32(bits & FULL_MASK).view(np.int32))


def _ballot(values, mask):
    bits = 0
    for l, v in values.items():
        if v:
            bits |= 1 << l
    r = _i32(bits)
    return {l: r for l in values}


def _shfl_from(values, src_of):
    out = {}
    for l, (v, arg) in values.items():
        src = src_of(l, arg)
        if src not in values:
            out[l] = RuntimeError(f"shfl: lane {l} reads lane {src}, which did not take part")
        else:
            out[l] = values[src][0]
    return out


def _match_any(values, mask):
    out = {}
    for l, v in values.items():
        bits = 0
        for m, u in values.items():
            if u == v:
                bits |= 1 << m
        out[l] = _i32(bits)
    return out


def _match_all(values, mask):
    vals = list(values.values())
    same = all(v == vals[0] for v in vals)
    bits = 0
    for l in values:
        bits |= 1 << l
    r = (_i32(bits) if same else np.int32(0), same)
    return {l: r for l in values}


_COMBINE = {
    "ballot_sync": _ballot,
    "all_sync": lambda vals, m: {l: all(bool(v) for v in vals.values()) for l in vals},
    "any_sync": lambda vals, m: {l: any(bool(v) for v in vals.values()) for l in vals},
    "eq_sync": lambda vals, m: {
        l: len({bool(v) for v in vals.values()}) == 1 for l in vals
    },
    "shfl_sync": lambda vals, m: _shfl_from(vals, lambda l, a: int(a) % 32),
    "shfl_up_sync": lambda vals, m: _shfl_from(vals, lambda l, a: l - int(a) if l >= int(a) else l),
    "shfl_down_sync": lambda vals, m: _shfl_from(
        vals, lambda l, a: l + int(a) if l + int(a) < 32 else l
    ),
    "shfl_xor_sync": lambda vals, m: _shfl_from(vals, lambda l, a: l ^ (int(a) % 32)),
    "match_any_sync": _match_any,
    "match_all_sync": _match_all,
    "syncwarp": lambda vals, m: {l: None for l in vals},
}


def _popc(self, val):
    if isinstance(val, np.integer):
        bits = val.dtype.itemsize * 8
    else:
        bits = 32 if -(1 << 31) <= int(val) < (1 << 32) else 64
    return bin(int(val) & ((1 << bits) - 1)).count("1")


def install():
    """Add warp intrinsics to the simulator; idempotent.  Requires ``NUMBA_ENABLE_CUDASIM=1``."""
    global _installed
    if _installed:
        return
    from numba.cuda.simulator import kernel as simkernel
    from numba.cuda.simulator import kernelapi

    Fake = kernelapi.FakeCUDAModule

    def _mk(kind, nargs):
        if nargs == 2:

            def f(self, mask, value):
                return _collective(kind, mask, value)

        else:

            def f(self, mask, value, arg):
                return _collective(kind, mask, (value, arg))

        f.__name__ = kind
        return f

    for kind in ("ballot_sync", "all_sync", "any_sync", "eq_sync", "match_any_sync", "match_all_sync"):
        setattr(Fake, kind, _mk(kind, 2))
    for kind in ("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync"):
        setattr(Fake, kind, _mk(kind, 3))
    Fake.syncwarp = lambda self, mask=FULL_MASK: _collective("syncwarp", mask, None)

    def activemask(self):
        t = _thread()
        w = _warp_of(t)
        with w.cond:
            return np.uint32(sum(1 << l for l in w.live(FULL_MASK)))

    Fake.activemask = activemask
    Fake.lanemask_lt = lambda self: np.uint32((1 << (_thread().thread_id % 32)) - 1)
    Fake.popc = _popc

    Shared = kernelapi.FakeCUDAShared
    dynamic_array = Shared.array

    def shared_array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:  # (dynamic shared memory: one buffer, no lookup)
            return dynamic_array(self, shape, dtype, alignment)
        if isinstance(dtype, kernelapi.types.Type):
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)  # the simulator's key: one array per source line
        with _registry_lock:
            res = self._allocations.get(key)
            if res is None:
                res = self._allocations[key] = np.empty(shape, dtype)
        return res

    Shared.array = shared_array

    # Record lane exits so that collectives stop waiting for them.
    orig_run = simkernel.BlockThread.run

    def run(self):
        try:
            orig_run(self)
        finally:
            w = _warp_of(self)
            with w.cond:
                w.exited.add(self.thread_id % 32)
                _try_complete(w)
                w.cond.notify_all()

    simkernel.BlockThread.run = run
    _installed = True
