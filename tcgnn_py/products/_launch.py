"""Layer 2: planned SpMM launches as named types, their per-stream scratch, the fixup, and how a launch runs.

A launch is planned once per signature and cached on the tiling under one key (:func:`launch_key`,
:func:`half_launch_key`); :func:`planned` keeps a provisional launch aside while the timed choice's
candidates compile.
"""

from typing import NamedTuple

import numpy as np

from .._device import get_cupy
from .._tuning import overrides_key
from ._values import vec_dense_values

__all__ = [
    "CoreSpmmLaunch",
    "Fixup",
    "Provisional",
    "TF32SpmmLaunch",
    "VecSpmmLaunch",
    "bound_launch",
    "cast_closure",
    "half_launch_key",
    "launch_key",
    "overlaps",
    "planned",
    "result_and_operand",
    "run_half",
    "run_spmm",
    "stream_scratch",
]


def overlaps(a, b):
    """Whether two device arrays' byte ranges intersect (O(1), conservative)."""
    a0, b0 = a.data.ptr, b.data.ptr
    return a.nbytes > 0 and b.nbytes > 0 and a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


class Fixup(NamedTuple):
    """Second launch of a split (hub) window: sum its partial tiles in unit order."""

    kernel: object
    grid: tuple
    splits: object  # int4 rows (window, first slot, number of slots, 0)
    n_slots: int

    @classmethod
    def of(cls, kernel, plan, H, D):
        """The fixup of a work ``plan``'s split windows (``H`` rows per tile, ``D`` features): one CTA row per
        split window, its threads over the window's ``H x D`` outputs."""
        from ..kernels.products import FIXUP_THREADS

        grid = (plan["splits"].shape[0], min(-(-(H * D) // FIXUP_THREADS), 1024))
        return cls(kernel, grid, plan["splits"], plan["n_slots"])

    def _args(self, partial, Y, M, D, H):
        """The kernel's arguments (one place for their order; ``Y`` None where a bound launch writes it)."""
        return (self.splits, partial, Y, np.int32(M), np.int32(D), np.int32(H))

    def run(self, partial, Y, M, D, H):
        from ..kernels.products import FIXUP_THREADS

        self.kernel(self.grid, (FIXUP_THREADS,), self._args(partial, Y, M, D, H))

    def bind(self, partial, M, D, H):
        """``f(Y)``: this launch with the split rows, partial tiles and sizes fixed (bound plans)."""
        from ..kernels.driver import BoundLaunch
        from ..kernels.products import FIXUP_THREADS

        return BoundLaunch(self.kernel.kernel.ptr, self.grid, (FIXUP_THREADS,), self._args(partial, None, M, D, H),
                           (2,), get_cupy().cuda.get_current_stream().ptr)


def stream_scratch(store, kind, make):
    """Per-stream scratch kept in a launch's ``store`` (calls on one stream run in order, so they can share it)."""
    key = (kind, get_cupy().cuda.get_current_stream().ptr)
    buf = store.get(key)
    if buf is None:
        buf = store[key] = make()
    return buf


def bound_launch(kernel, grid, block, smem, head, tail, partial, n_extra=0):
    """``f(values, X, Y, *extra)``: ``kernel(head + (values, X, Y, partial or Y) + tail + extra)`` through the driver.

    The parameters are set once (:class:`.kernels.driver.BoundLaunch`); a call writes the operands'
    addresses (``n_extra`` device arrays after the tail) and launches on the stream current now (plans are
    kept per stream).
    """
    from ..kernels.driver import BoundLaunch

    n = len(head)
    args = head + (None, None, None, partial) + tail + (None,) * n_extra
    variable = (n, n + 1, n + 2) if partial is not None else (n, n + 1, (n + 2, n + 3))  # Y is the partial too
    variable += tuple(range(len(args) - n_extra, len(args)))
    return BoundLaunch(kernel.kernel.ptr, grid, block, args, variable, get_cupy().cuda.get_current_stream().ptr,
                       smem)


class TF32SpmmLaunch(NamedTuple):
    """One configuration of ``tcgnn_spmm_tf32``: kernel, geometry and its plan arrays."""

    kernel: object
    grid: tuple
    block: tuple
    smem: int
    units: object  # int4 rows (window, first block, end block, slot or -1)
    mask: object  # (n_blocks, 4) uint32 occupancy masks
    n_slabs: int  # CTAs per unit, side by side in the 1-D grid
    fixup: Fixup = None
    n_slots: int = 0  # partial tiles the launch writes (split windows)
    sizes: tuple = ()  # (M, D, n_slabs) as int32 scalars, made once
    unit_k0: object = None  # int2 rows (first slot of the unit's window, parts): split windows summed in the launch
    scratch: dict = None  # per-stream counters (one per (first slot, slab)) and partial tiles

    def _counters(self):
        """This stream's counters of split windows (each call resets the ones it uses), or None."""
        if self.unit_k0 is None:
            return None
        n = self.n_slots * self.n_slabs
        return stream_scratch(self.scratch, "counters", lambda: get_cupy().zeros(n, np.int32))

    def _fixed(self, tiling, M, D):
        """The arguments around ``(values, X, Y, partial)``: everything but the operands (one place for the order)."""
        head = (self.units, tiling.block_ptr, tiling.block_cols, self.mask)
        sizes = self.sizes or (np.int32(M), np.int32(D), np.int32(self.n_slabs))
        return head, (self._counters(), self.unit_k0, *sizes)

    def run(self, tiling, values, X, Y, partial, M, D):
        head, tail = self._fixed(tiling, M, D)
        self.kernel(self.grid, self.block, head + (values, X, Y, partial) + tail, shared_mem=self.smem)

    def partial(self, dtype, D):
        """This stream's buffer of partial tiles, or None without split windows."""
        if not self.n_slots:
            return None
        return stream_scratch(self.scratch, "partial", lambda: get_cupy().empty((self.n_slots, 16, D), dtype=dtype))

    def bind(self, tiling, dtype, M, D):
        """``f(values, X, Y)``: this launch with everything but the operands fixed (current stream's scratch)."""
        return bound_launch(self.kernel, self.grid, self.block, self.smem, *self._fixed(tiling, M, D), self.partial(dtype, D))


class CoreSpmmLaunch(NamedTuple):
    """One configuration of ``tcgnn_spmm_core`` (CUDA cores, any tile shape)."""

    kernel: object
    grid: tuple
    block: tuple
    smem: int
    units: object
    fixup: Fixup = None
    n_slots: int = 0

    def run(self, tiling, values, X, Y, partial, M, D):
        W = tiling.layout.block
        args = (self.units, tiling.block_ptr, tiling.block_cols, tiling.tile_pos, values, X, Y, partial,
                np.int32(M), np.int32(D), np.int32(W), np.int32(W.bit_length() - 1))
        self.kernel(self.grid, self.block, args, shared_mem=self.smem)


class VecSpmmLaunch(NamedTuple):
    """One configuration of ``tcgnn_spmm_vec`` (vector layout, one warp per unit x feature slice)."""

    kernel: object
    grid: tuple
    block: tuple
    smem: int
    units: object  # int4 rows (window, first block, end block, slot or -1)
    unit_k0: object  # int2 rows (first slot of the unit's window, parts of the window)
    meta: object  # (n_blocks, 2) uint32: occupancy mask, first entry
    n_slices: int
    n_work: int  # units x slices
    n_counters: int  # split windows are summed in the launch: one counter per (first slot, slice); 0: fixup launch
    counters: dict  # per-stream scratch: stream pointer -> int32 counters (each call resets the ones it uses),
    #                 ("partial", stream pointer) -> partial-tile buffer
    fixup: Fixup = None
    n_slots: int = 0
    sizes: tuple = ()  # (M, D, n_slices, n_work) as int32 scalars, made once (per-call cost on small graphs)
    dense: bool = False  # takes vec_dense_values(tiling, values) in place of the values

    def _counters_now(self):
        """This stream's counters of split windows summed in the launch, or None."""
        if not self.n_counters:
            return None
        # keyed by size: launches that share a store (the timed choice's candidates) each get their own
        return stream_scratch(self.counters, ("counters", self.n_counters),
                               lambda: get_cupy().zeros(self.n_counters, np.int32))

    def _fixed(self, tiling, M, D):
        """The arguments around ``(values, X, Y, partial)``: everything but the operands (one place for the order)."""
        sizes = self.sizes or (np.int32(M), np.int32(D), np.int32(self.n_slices), np.int32(self.n_work))
        return (self.units, self.unit_k0, tiling.block_cols, self.meta), (self._counters_now(), *sizes)

    def run(self, tiling, values, X, Y, partial, M, D, extra=()):
        head, tail = self._fixed(tiling, M, D)
        self.kernel(self.grid, self.block, head + (values, X, Y, partial) + tail + tuple(extra), shared_mem=self.smem)

    def partial(self, dtype, D):
        """This stream's buffer of partial tiles (reused: calls on one stream run in order), or None."""
        if not self.n_slots:
            return None
        return stream_scratch(self.counters, ("partial", np.dtype(dtype).char, D),
                               lambda: get_cupy().empty((self.n_slots, 8, D), dtype=dtype))

    def bind(self, tiling, dtype, M, D, n_extra=0):
        """``f(values, X, Y, *extra)``: this launch with everything but the operands fixed (current stream's
        scratch); ``n_extra`` device arrays follow the sizes (the 16-bit kernel's unscale)."""
        return bound_launch(self.kernel, self.grid, self.block, self.smem, *self._fixed(tiling, M, D),
                      self.partial(dtype, D), n_extra)


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


def run_spmm(cp, launch, tiling, values, X, Y, dtype):
    """One call of a planned SpMM launch (and its fixup) into Y."""
    M, D = Y.shape
    partial = Y
    if isinstance(launch, VecSpmmLaunch) and launch.dense:
        values = vec_dense_values(tiling, values)
    if isinstance(launch, (VecSpmmLaunch, TF32SpmmLaunch)):
        buf = launch.partial(dtype, D)
        partial = Y if buf is None else buf
    elif launch.n_slots:
        partial = cp.empty((launch.n_slots, tiling.layout.window, D), dtype=dtype)
    launch.run(tiling, values, X, Y, partial, M, D)
    if launch.fixup is not None:
        launch.fixup.run(partial, Y, M, D, tiling.layout.window)


def run_half(launch, tiling, vals, X, Y, unscale):
    """One call of a planned 16-bit SpMM launch (and its fixup) into Y."""
    M, D = Y.shape
    buf = launch.partial(np.float32, D)
    partial = Y if buf is None else buf
    launch.run(tiling, vals, X, Y, partial, M, D, (unscale,))
    if launch.fixup is not None:
        launch.fixup.run(partial, Y, M, D, 8)


def cast_closure(run, fixup, shape, dtype, key, make, split, general):
    """``f(values, casts, X, out) -> Y``: a bound launch fed, per call, the matrix's cast values.

    ``casts[key]`` (made by ``make(values, casts)`` on a miss, cached on the matrix) is ``(split, values,
    unscale)``; ``run(values, X, Y, unscale or values)`` launches, then the bound ``fixup(Y)`` if any.  The
    16-bit and N:M bound plans: matrices sharing a tiling (``with_values``) each bring their own values, and
    one whose values take the other form than ``split`` (the launch bound) goes the ``general`` way.
    """
    ndarray = get_cupy().ndarray

    def f(values, casts, X, out):
        form, vals, unscale = casts.get(key) or make(values, casts)
        if form != split:  # (hi, lo) pairs against values exact in X's type: another kernel
            return general(values, casts, X, out)
        Y = ndarray(shape, dtype) if out is None else out
        run(vals, X, Y, vals if unscale is None else unscale)
        if fixup is not None:
            fixup(Y)
        return Y

    return f
