"""Layer 2: the one type of a planned launch (:class:`Launch`), its per-stream scratch, the fixup, how one runs,
and the two plans the product families fill in.

A launch is planned once per signature and cached on the tiling under one key (:func:`launch_key`,
:func:`half_launch_key`); :func:`planned` keeps a provisional launch aside while the timed choice's
candidates compile.  :func:`f32_plan` (values in the product's own type) and :func:`cast_plan` (values in a cast
form: 16-bit, ``(hi, lo)`` pairs, N:M fragments) are a family's ``plan(problem)`` given its launch, and
:func:`sddmm_plan` its ``plan_sddmm(problem)``.
"""

import math
import sys
import threading
from typing import NamedTuple

import numpy as np

from .._device import get_cupy
from .._tuning import overrides_key
from ._modes import F32, Mode
from ._problem import aligned16
from ._values import values_as, vec_dense_values

__all__ = [
    "Launch",
    "Provisional",
    "SDDMM_OPERANDS",
    "SPMM_OPERANDS",
    "Scratch",
    "same_array",
    "recycled",
    "RECYCLE_RING",
    "RECYCLE_BYTES",
    "cast_plan",
    "f32_plan",
    "fixup",
    "half_launch_key",
    "launch_key",
    "planned",
    "run_spmm",
    "sddmm_plan",
]


def _stream():
    """The current stream's pointer (CuPy is loaded wherever a launch runs); read per call, in this module."""
    return sys.modules["cupy"].cuda.get_current_stream().ptr


class Scratch(NamedTuple):
    """A buffer a launch needs on each stream (partial tiles, counters of split windows): made on a stream's first
    call and reused there (calls on one stream run in order).  Launches that share a store share equal buffers."""

    kind: str  # what it holds: "partial", "counters", or an attention pass's ("fwd part", ...)
    shape: tuple
    dtype: object
    zeros: bool = False  # counters start at zero (each call resets the ones it uses)

    def get(self, store, stream):
        """This buffer on ``stream`` (a stream pointer), from ``store``."""
        buf = store.get((self, stream))
        if buf is None:
            cp = get_cupy()
            buf = store[self, stream] = (cp.zeros if self.zeros else cp.empty)(self.shape, self.dtype)
        return buf


def same_array(array):
    """``f(shape, dtype) -> array``: in place of ``cupy.ndarray`` in a bound function's call, the one array made at
    its binding, written anew by every call (a bound layer call's intermediate, read before the call's next one on
    its stream: calls on one stream run in order)."""
    return lambda shape, dtype: array


#: Arrays a bound call keeps per result for reuse: a training loop holds one call's results until the next call
#: of its layer has returned (the step's vjp is replaced then), so the results of the call before are free again.
RECYCLE_RING = 2
#: The largest result a bound call reuses (bytes): below it a new array's host time (its allocation and its
#: ``cupy.ndarray``, a few microseconds) is a visible share of a call; above it the kernels outlast the host, and
#: arrays kept per call would add up over layers.
RECYCLE_BYTES = 1 << 24


def _free_references():
    """``sys.getrefcount`` of an array that only a ring and the loop over it hold, as :func:`recycled` asks it."""
    ring = [object()]
    for x in ring:
        return sys.getrefcount(x)


_FREE = _free_references()


def recycled(shape, dtype, new=None):
    """``f(shape, dtype) -> array``: in place of ``cupy.ndarray`` (or ``new``) in a bound layer call, for a result
    of this shape and dtype: one the call returned before that nothing else holds any more, else a new one, kept
    in the place of the oldest (:data:`RECYCLE_RING` per result).  A result nobody holds is free memory, which
    the pool would hand out again on this stream (whose calls run in order); the array itself comes back, without
    the host time of a new ``cupy.ndarray``.  Above :data:`RECYCLE_BYTES`, ``cupy.ndarray`` itself.  Only for
    bound calls, never under a capture (whose arrays the graph holds)."""
    new = new or get_cupy().ndarray
    if math.prod(shape) * np.dtype(dtype).itemsize > RECYCLE_BYTES:
        return new
    ring, turn = [], [0]
    references, free, lock = sys.getrefcount, _FREE, threading.Lock()

    def make(shape_, dtype_):  # (the result's shape and dtype, fixed when the call binds)
        with lock:
            for x in ring:
                if references(x) == free:
                    return x
            x = new(shape, dtype)
            if len(ring) < RECYCLE_RING:
                ring.append(x)
            else:
                ring[turn[0]] = x
                turn[0] = (turn[0] + 1) % RECYCLE_RING
            return x

    return make


#: The arrays an SpMM launch takes per call, between its fixed head and tail: ``partial`` is its partial tiles
#: (:attr:`Launch.partial`), or the result itself where it has none.
SPMM_OPERANDS = ("values", "X", "Y", "partial")


#: ... and an SDDMM's: the values, the two dense operands, the result.
SDDMM_OPERANDS = ("values", "Xa", "Xb", "out")


class Launch(NamedTuple):
    """One planned kernel launch: the kernel, its geometry, and its arguments around what a call supplies.

    The kernel's arguments are ``head + operands + tail + extra``: ``operands`` names the arrays a call
    passes (in order; ``"partial"`` is this stream's :attr:`partial` buffer, or ``"Y"`` where there is none),
    a :class:`Scratch` in ``tail`` is this stream's buffer, and ``n_extra`` arrays follow the tail (the 16-bit
    kernels' unscale).  The one type of every product launch: :meth:`run` launches through CuPy, :meth:`bind`
    fixes everything but the call's arrays for the driver, and a ``fixup`` launch (split windows' partial
    tiles summed into Y) runs after it.
    """

    kernel: object
    grid: tuple
    block: tuple
    smem: int = 0
    head: tuple = ()
    tail: tuple = ()
    operands: tuple = SPMM_OPERANDS
    partial: Scratch = None
    scratch: dict = None  # the per-stream store (the timed choice's candidates share one)
    fixup: "Launch" = None
    dense: bool = False  # takes the values dense (vec_dense_values)
    n_extra: int = 0
    n_slices: int = 1  # CTAs (feature slices) per unit: what the launch covers, for reports

    def _arrays(self):
        """The names of the arrays a call passes, in order."""
        return tuple(n for n in self.operands if n != "partial")

    def _args(self, arrays):
        """The kernel's arguments for a call's ``arrays`` (the one place their order is assembled)."""
        names = self._arrays()
        env = dict(zip(names, arrays))
        tail = self.tail
        if self.scratch is not None:  # this stream's buffers
            stream = _stream()
            tail = tuple(t.get(self.scratch, stream) if isinstance(t, Scratch) else t for t in tail)
            if self.partial is not None:
                env["partial"] = self.partial.get(self.scratch, stream)
        env.setdefault("partial", env.get("Y"))
        return self.head + tuple(env[n] for n in self.operands) + tail + tuple(arrays[len(names):])

    def run(self, *arrays):
        """Launch on the current stream with these arrays (:attr:`operands` but ``partial``, then the extras)."""
        self.kernel(self.grid, self.block, self._args(arrays), shared_mem=self.smem)
        if self.fixup is not None:
            self.fixup.run(arrays[self._arrays().index("Y")])

    def bind(self):
        """``f(*arrays)``: this launch (and its fixup) through the driver, everything but the call's arrays fixed,
        on the stream current now (plans are kept per stream)."""
        from ..kernels.driver import bound_launch

        names = self._arrays()
        slots = tuple(object() for _ in range(len(names) + self.n_extra))  # stand-ins for the call's arrays
        args = self._args(slots)
        variable = [tuple(i for i, a in enumerate(args) if a is s) for s in slots]  # Y may fill the partial's too
        args = tuple(None if any(a is s for s in slots) else a for a in args)
        then = None if self.fixup is None else (self.fixup.bind(), names.index("Y"))
        return bound_launch(self.kernel.kernel.ptr, self.grid, self.block, args, variable, _stream(), self.smem, then)


def fixup(kernel, plan, M, H, D, partial, scratch):
    """The fixup launch of a work ``plan``'s split windows (``M`` result rows, ``H`` rows per tile, ``D`` features):
    one CTA row per split window, its threads over the window's ``H x D`` outputs, summing the ``partial`` tiles
    (the main launch's, from the same ``scratch`` store) in part order."""
    from ..kernels.products import FIXUP_THREADS

    grid = (plan["splits"].shape[0], min(-(-(H * D) // FIXUP_THREADS), 1024))
    return Launch(kernel, grid, (FIXUP_THREADS,), 0, (plan["splits"],), tuple(np.int32(v) for v in (M, D, H)),
                  ("partial", "Y"), partial, scratch)


def launch_key(mode, dtype, D, vec):
    """The one key under which a tiling caches its SpMM launch for ``mode``, the result's dtype, D and alignment."""
    return ("launch", mode, np.dtype(dtype).char, D, vec, overrides_key())


def half_launch_key(x_dtype, split, dtype, D, aligned):
    """The one key of a 16-bit X's vector SpMM launch (X's type, value pairs or not, result's dtype, D, alignment)."""
    return ("half_launch", np.dtype(x_dtype).name, split, np.dtype(dtype).name, D, aligned, overrides_key())


class Provisional(NamedTuple):
    """A launch chosen while some of the timed choice's candidates were still compiling in the background."""

    launch: object
    futures: list  # the background compiles it waits for


def planned(tiling, key, plan):
    """The launch of ``plan()``, cached on the tiling under ``key`` once it is final.

    A :class:`Provisional` launch (the timed choice ran while some candidates were
    compiling) is kept aside and used until those compiles finish; the next call then
    plans again, timing every candidate, and that launch is the one cached (and bound
    by the plans).  Every candidate gives the same bits, so only speed changes.
    """
    aside = ("provisional", key)
    prov = tiling.peek(aside)
    if prov is not None:
        if not all(f.done() for f in prov.futures):
            return prov.launch
        tiling.drop(aside)
    launch = plan()
    if isinstance(launch, Provisional):
        tiling.put(aside, launch)
        return launch.launch
    return tiling.cached(key, lambda: launch)


def run_spmm(launch, tiling, values, X, Y):
    """One call of a planned SpMM launch (and its fixup) into Y: the values dense where the launch reads them so."""
    launch.run(vec_dense_values(tiling, values) if launch.dense else values, X, Y)


def _result_and_operand(shape, dtype, X, Y, x_dtype):
    """``(Y, X)``: the result (``Y``, or a new array of ``dtype``) and X as the kernel reads it (C-contiguous, of
    ``x_dtype``); X None where there is nothing to compute."""
    cp = get_cupy()
    Y = cp.empty(shape, dtype=dtype) if Y is None else Y
    if 0 in shape:
        return Y, None
    if X.dtype != x_dtype or not X.flags.c_contiguous:
        X = cp.ascontiguousarray(X, dtype=x_dtype)
    return Y, X


def f32_plan(problem, spmm_launch):
    """The :class:`.._problem.Plan` of a product fed the values in its own type (float32 on TF32 tensor cores, any type
    on CUDA cores), its launch made by the family's ``spmm_launch(tiling, dtype, D, vec, operands)``: planned once
    per width and alignment and kept on the tiling, bound where the product is TF32 on float32 X and values (one
    launch, or two with a fixup)."""
    tiling, mode, kdt, D = problem.tiling, problem.mode, problem.kdt, problem.width
    shape = (tiling.shape[0], D)
    # the launch's key for a new result (False) or for out (True): X is read as kdt, C-contiguous
    vecs = tuple(mode is Mode.tf32 and problem.aligned(cast=kdt, direct=d) for d in (False, True))
    keys = tuple(launch_key(mode, kdt, D, v) for v in vecs)

    def run(values, casts, X, Y):
        direct = Y is not None
        Y, X = _result_and_operand(shape, kdt, X, Y, kdt)
        if X is None:
            return Y
        values = values_as(values, kdt, casts)
        launch = tiling.peek(keys[direct])  # planned once: no closure per call
        if launch is None:
            launch = planned(tiling, keys[direct], lambda: spmm_launch(tiling, kdt, D, vecs[direct], (values, X, Y)))
        run_spmm(launch, tiling, values, X, Y)
        return Y

    if not (mode is Mode.tf32 and problem.X.dtype == F32 and problem.values == F32):
        return problem.plan(run)

    def binder(values, casts, X, out, general):
        launch = tiling.peek(keys[True])
        if not isinstance(launch, Launch):
            return None
        bound = launch.bind()
        if launch.dense:  # the launch reads the values dense
            on_dense = bound

            def bound(values, X, Y):
                on_dense(vec_dense_values(tiling, values), X, Y)

        ndarray = get_cupy().ndarray

        def f(values, casts, X, out):
            Y = ndarray(shape, F32) if out is None else out  # cupy.empty without its wrapper
            bound(values, X, Y)
            return Y

        return f

    return problem.plan(run, binder)


def cast_plan(problem, x_dtype, key, make, launch_key_of, plan_launch):
    """The :class:`.._problem.Plan` of a product fed the matrix's values in a cast form (the 16-bit and N:M products),
    X read as ``x_dtype``.

    ``make(values, casts)`` gives ``(split, values, unscale)``, kept per matrix in ``casts[key]``; the launch for
    that form, under ``launch_key_of(split, aligned)``, is ``plan_launch(split, aligned, (values, X, Y, extra))``,
    planned once and kept on the tiling; a call runs it on ``(values, X, Y, unscale or values)``.  Bound once the
    general path's first call has cast the values and the launch is final (X passed as it is): per call the bound
    launch takes the matrix's cast values, and matrices sharing the tiling (``with_values``) each bring their own;
    one whose values take the other form (``(hi, lo)`` pairs against values exact in X's type: another kernel)
    goes the general way.
    """
    tiling, kdt = problem.tiling, problem.kdt
    shape = (tiling.shape[0], problem.width)
    aligns = tuple(problem.aligned(8, cast=x_dtype, direct=d) for d in (False, True))

    def run(values, casts, X, Y):
        direct = Y is not None
        Y, X = _result_and_operand(shape, kdt, X, Y, x_dtype)
        if X is None:
            return Y
        split, vals, unscale = make(values, casts)
        extra = vals if unscale is None else unscale
        k = launch_key_of(split, aligns[direct])
        launch = tiling.peek(k)
        if launch is None:
            launch = planned(tiling, k, lambda: plan_launch(split, aligns[direct], (vals, X, Y, extra)))
        launch.run(vals, X, Y, extra)
        return Y

    if problem.X.dtype != x_dtype:
        return problem.plan(run)

    def binder(values, casts, X, out, general):
        hit = casts.get(key)
        if hit is None:
            return None
        split = hit[0]
        launch = tiling.peek(launch_key_of(split, aligns[True]))
        if not isinstance(launch, Launch):
            return None
        bound = launch.bind()
        ndarray = get_cupy().ndarray

        def f(values, casts, X, out):
            form, vals, unscale = casts.get(key) or make(values, casts)
            if form != split:
                return general(values, casts, X, out)
            Y = ndarray(shape, kdt) if out is None else out
            bound(vals, X, Y, vals if unscale is None else unscale)
            return Y

        return f

    return problem.plan(run, binder)


def sddmm_plan(problem, sddmm_launch):
    """The :class:`.._problem.Plan` of an SDDMM (``<Xa_i, Xb_j>`` per entry, times its value if asked, in tiled
    order), its launch made by the family's ``sddmm_launch(tiling, dtype, D, aligned, multiply_values)``: planned
    once and kept on the tiling, bound where it is TF32 on float32 operands and values into a new result."""
    tiling, kdt, D, mv = problem.tiling, problem.kdt, problem.width, problem.multiply_values
    nnz = tiling.nnz
    aligned = aligned16(D, problem.read(problem.X, kdt), problem.read(problem.Xb, kdt))
    key = ("sddmm_launch", problem.mode, kdt.char, D, aligned, mv)

    def launch():
        return tiling.cached(key, lambda: sddmm_launch(tiling, kdt, D, aligned, mv))

    def run(values, casts, Xa, Xb, e):
        cp = get_cupy()
        e = cp.empty(nnz, dtype=kdt) if e is None else e
        if nnz == 0:
            return e
        if D == 0:
            e.fill(0)
            return e
        Xa, Xb = cp.ascontiguousarray(Xa, dtype=kdt), cp.ascontiguousarray(Xb, dtype=kdt)
        launch().run(values_as(values, kdt, casts), Xa, Xb, e)
        return e

    Xb = problem.Xb
    if not (problem.mode is Mode.tf32 and kdt == F32 and problem.values == F32 and problem.X.dtype == F32
            and Xb.dtype == F32 and len(Xb.shape) == 2 and Xb.contiguous and nnz and problem.out is None):
        return problem.plan(run)

    def binder(values, casts, Xa, Xb, out, general):
        bound, empty = launch().bind(), get_cupy().empty

        def f(values, casts, Xa, Xb, out):
            e = empty(nnz, F32)
            bound(values, Xa, Xb, e)
            return e

        return f

    return problem.plan(run, binder)
