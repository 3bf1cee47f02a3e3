"""Layer 2: the one type of a planned launch (:class:`Launch`), its per-stream scratch, the fixup, and how one runs.

A launch is planned once per signature and cached on the tiling under one key (:func:`launch_key`,
:func:`half_launch_key`); :func:`planned` keeps a provisional launch aside while the timed choice's
candidates compile.
"""

import functools
import sys
from typing import NamedTuple

import numpy as np

from .._device import get_cupy
from .._tuning import overrides_key
from ._plans import aligned16
from ._values import vec_dense_values

__all__ = [
    "Launch",
    "Provisional",
    "SDDMM_OPERANDS",
    "SPMM_OPERANDS",
    "Scratch",
    "cast_binder",
    "cast_closure",
    "fixup",
    "half_launch_key",
    "launch_key",
    "overlaps",
    "planned",
    "result_and_operand",
    "run_spmm",
]


def _stream():
    """The current stream's pointer (CuPy is loaded wherever a launch runs); read per call, in this module."""
    return sys.modules["cupy"].cuda.get_current_stream().ptr


def overlaps(a, b):
    """Whether two device arrays' byte ranges intersect (O(1), conservative)."""
    a0, b0 = a.data.ptr, b.data.ptr
    return a.nbytes > 0 and b.nbytes > 0 and a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


class Scratch(NamedTuple):
    """A buffer a launch needs on each stream (partial tiles, counters of split windows): made on a stream's first
    call and reused there (calls on one stream run in order).  Launches that share a store share equal buffers."""

    kind: str  # what it holds: "partial", "counters", or an attention pass's ("fwd part", "tdot", ...)
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
        from ..kernels.driver import BoundLaunch

        names = self._arrays()
        slots = tuple(object() for _ in range(len(names) + self.n_extra))  # stand-ins for the call's arrays
        args = self._args(slots)
        variable = [tuple(i for i, a in enumerate(args) if a is s) for s in slots]  # Y may fill the partial's too
        args = tuple(None if any(a is s for s in slots) else a for a in args)
        then = None if self.fixup is None else (self.fixup.bind(), names.index("Y"))
        return BoundLaunch(self.kernel.kernel.ptr, self.grid, self.block, args, variable, _stream(), self.smem, then)

    def bound_call(self, *arrays):
        """A call of this launch on ``arrays``, bound (:meth:`bind`): how the timed choice calls its candidates, since
        repeated products run bound."""
        return functools.partial(self.bind(), *arrays)


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


def result_and_operand(cp, tiling, X, dtype, out):
    """``(Y, X)``: the result (``out``, or a new array) and X C-contiguous; ``X`` None when there is nothing to do."""
    M, D = tiling.shape[0], X.shape[1]
    Y = cp.empty((M, D), dtype=dtype) if out is None else out
    if M == 0 or D == 0:
        return Y, None
    return Y, X if X.flags.c_contiguous else cp.ascontiguousarray(X)


def run_spmm(launch, tiling, values, X, Y):
    """One call of a planned SpMM launch (and its fixup) into Y: the values dense where the launch reads them so."""
    launch.run(vec_dense_values(tiling, values) if launch.dense else values, X, Y)


def cast_binder(tiling, dtype, key, launch_key_of, make):
    """The binder of a product fed the matrix's cast values (the 16-bit and N:M products, the kernel writing
    ``dtype``).

    ``binder(values, casts, X, out, general)`` returns ``f(values, casts, X, out) -> Y`` (:func:`cast_closure`)
    once the general path's first call has cached the values' form in ``casts[key]`` (``(split, values,
    unscale)``, made by ``make(values, casts)``) and the launch for that form, ``tiling.peek(launch_key_of(split,
    D, aligned))``, is final; else None.
    """
    M = tiling.shape[0]

    def binder(values, casts, X, out, general):
        D = X.shape[1]
        hit = casts.get(key)
        if hit is None:
            return None
        aligned = aligned16(D, X, out, multiple=8)  # out None: a new result, as the general path's was
        launch = tiling.peek(launch_key_of(hit[0], D, aligned))
        if not isinstance(launch, Launch):
            return None
        return cast_closure(launch.bind(), (M, D), dtype, key, make, hit[0], general)

    return binder


def cast_closure(run, shape, dtype, key, make, split, general):
    """``f(values, casts, X, out) -> Y``: a bound launch fed, per call, the matrix's cast values.

    ``casts[key]`` (made by ``make(values, casts)`` on a miss, cached on the matrix) is ``(split, values,
    unscale)``; ``run(values, X, Y, unscale or values)`` launches (and its fixup).  The 16-bit and N:M bound
    plans: matrices sharing a tiling (``with_values``) each bring their own values, and one whose values take
    the other form than ``split`` (the launch bound) goes the ``general`` way.
    """
    ndarray = get_cupy().ndarray

    def f(values, casts, X, out):
        form, vals, unscale = casts.get(key) or make(values, casts)
        if form != split:  # (hi, lo) pairs against values exact in X's type: another kernel
            return general(values, casts, X, out)
        Y = ndarray(shape, dtype) if out is None else out
        run(vals, X, Y, vals if unscale is None else unscale)
        return Y

    return f
