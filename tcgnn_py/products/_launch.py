"""Layer 2: the products' launches (:func:`spmm`, :func:`sddmm`, :func:`fixup`: the one
:class:`~tcgnn_py.kernels.launches.Launch` with the products' operands), how one runs, and the two plans the
product families fill in.

A launch is planned once per signature and cached on the tiling under one key (:func:`launch_key`,
:func:`half_launch_key`); :func:`planned` keeps a provisional launch aside while the timed choice's
candidates compile, or while its :class:`Countdown` of calls runs (the ``timed_after`` option).
:func:`f32_plan` (values in the product's own type) and :func:`cast_plan` (values in a cast form: 16-bit,
``(hi, lo)`` pairs, N:M fragments) are a family's ``plan(problem)`` given its launch, and :func:`sddmm_plan` its
``plan_sddmm(problem)``.
"""

import functools
import math
import sys
import threading
from typing import NamedTuple

import numpy as np

from .._device import get_cupy
from .._tuning import overrides_key
from ..kernels.launches import Launch, Scratch, make
from ..kernels.registry import get_kernel
from ._modes import F32, Mode
from ._problem import aligned16
from ._values import values_as, vec_dense_values

__all__ = [
    "Countdown",
    "Launch",
    "Provisional",
    "bindable",
    "bound_form",
    "Scratch",
    "partial_scratch",
    "same_array",
    "recycled",
    "made",
    "RECYCLE_RING",
    "RECYCLE_BYTES",
    "cast_plan",
    "compiled",
    "f32_plan",
    "fixup",
    "half_launch_key",
    "launch_key",
    "planned",
    "run_spmm",
    "sddmm",
    "sddmm_plan",
    "spmm",
]


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
    return _rings(((shape, dtype),), new, True)


def made(specs, how, new=None):
    """``make()``: a bound form's results of ``specs`` (``(shape, dtype)`` each) made by one call, as an iterable
    to unpack.  ``how``: ``"new"`` new arrays (``new``, by default ``cupy.ndarray``); ``"keep"`` the arrays made
    now, written anew by every call (a bound layer call's intermediates, read before its next call on the stream);
    ``"recycle"`` each as :func:`recycled` does (a bound layer call's results).  The first two are C calls, the
    third one Python call for all: a Python call costs a visible share of a small layer's step."""
    new = new or get_cupy().ndarray
    specs = tuple((tuple(shape), np.dtype(dtype)) for shape, dtype in specs)
    if how == "new":
        return functools.partial(map, new, [shape for shape, _ in specs], [dtype for _, dtype in specs])
    if how == "keep":
        return functools.partial(iter, [new(shape, dtype) for shape, dtype in specs])
    if how != "recycle":
        raise ValueError(f"how must be 'new', 'keep' or 'recycle', got {how!r}")
    return _rings(specs, new, False)


def _rings(specs, new, one):
    """:func:`recycled`'s maker for each of ``specs`` (one list of results, or the array alone where ``one``)."""
    rings = [([] if math.prod(shape) * np.dtype(dtype).itemsize <= RECYCLE_BYTES else None, [0], shape, dtype)
             for shape, dtype in specs]
    references, free, lock = sys.getrefcount, _FREE, threading.Lock()

    def make(*_):  # (recycled's callers pass the result's shape and dtype, fixed when the call binds)
        out = []
        with lock:
            for ring, turn, shape, dtype in rings:
                if ring is None:
                    out.append(new(shape, dtype))
                    continue
                for x in ring:
                    if references(x) == free:
                        break
                else:
                    x = new(shape, dtype)
                    if len(ring) < RECYCLE_RING:
                        ring.append(x)
                    else:
                        ring[turn[0]] = x
                        turn[0] = (turn[0] + 1) % RECYCLE_RING
                out.append(x)
        return out[0] if one else out

    return make


def compiled(family, name):
    """Compile (or find) a launch's kernel now, as its product is planned: the timed choice then times no
    compile, and a first product waits for its own kernels only."""
    get_kernel(family, name)


def spmm(family, name, grid, block, fixed, smem=0, values="values", partial=None, scratch=None, fixup=None,
         extra=(), dense=False, n_slices=1):
    """An SpMM's :class:`~tcgnn_py.kernels.launches.Launch` (its kernel compiled now, as the product is planned):
    each call passes ``(values, X, Y, *extra)`` (``values``: the kernel's name for them); ``partial`` is the
    stream's partial tiles (a :class:`Scratch` of ``scratch``), or None: Y fills the kernel's ``partial`` too;
    ``fixup``, a launch after it on Y.  ``fixed``: every other parameter by name."""
    compiled(family, name)
    if partial is None:
        y = ("Y", "partial")
    else:
        y, fixed = "Y", dict(fixed, partial=partial)
    return make(family, name, grid, block, (values, "X", y) + tuple(extra), fixed, smem, scratch,
                None if fixup is None else (fixup, "Y"), dense=dense, n_slices=n_slices)


def partial_scratch(tiling, n_slots, rows, D, dtype):
    """``(partial, store)``: the partial tiles of ``n_slots`` split windows (``rows`` x ``D`` of ``dtype`` each) as a
    :class:`Scratch`, and the tiling's store of per-stream buffers it comes from.

    The buffer is sized for D rounded up to a power of two and shared by the tiling's launches of that size on a
    stream (calls on one stream run in order, and a launch's fixup reads its partials before the next launch
    starts), so products over many widths hold a few buffers (one per power of two), not one per width.
    """
    return (Scratch("partial", (n_slots, rows, 1 << (D - 1).bit_length()), np.dtype(dtype)),
            tiling.cached("scratch", dict))


def sddmm(family, name, grid, block, fixed, smem=0):
    """An SDDMM's launch (its kernel compiled now): each call passes ``(values, Xa, Xb, out)``."""
    compiled(family, name)
    return make(family, name, grid, block, ("values", "Xa", "Xb", "out"), fixed, smem)


def fixup(family, name, plan, M, H, D, partial, scratch):
    """The fixup launch of a work ``plan``'s split windows (``M`` result rows, ``H`` rows per tile, ``D`` features):
    one CTA row per split window, its threads over the window's ``H x D`` outputs, summing the ``partial`` tiles
    (the main launch's, from the same ``scratch`` store) in part order.  Each call passes Y."""
    from ..kernels.products import FIXUP_THREADS

    compiled(family, name)
    grid = (plan["splits"].shape[0], min(-(-(H * D) // FIXUP_THREADS), 1024))
    return make(family, name, grid, FIXUP_THREADS, ("Y",), dict(splits=plan["splits"], partial=partial, M=M, D=D,
                                                                H=H), scratch=scratch)


def launch_key(mode, dtype, D, vec):
    """The one key under which a tiling caches its SpMM launch for ``mode``, the result's dtype, D and alignment."""
    return ("launch", mode, np.dtype(dtype).char, D, vec, overrides_key())


def half_launch_key(x_dtype, split, dtype, D, aligned):
    """The one key of a 16-bit X's vector SpMM launch (X's type, value pairs or not, result's dtype, D, alignment)."""
    return ("half_launch", np.dtype(x_dtype).name, split, np.dtype(dtype).name, D, aligned, overrides_key())


class Provisional(NamedTuple):
    """A launch in use until its ``futures`` are done: the timed choice's candidates compiling in the background,
    or a :class:`Countdown` of calls before the timed choice."""

    launch: object
    futures: list  # the background compiles it waits for, or one Countdown


class Countdown:
    """A stand-in for a background compile that is done once it has been asked ``n + 1`` times: the calls a
    product runs the default launch before its timed choice.  The general path asks once a call
    (:func:`planned`), and so does a call bound to the launch (:func:`bindable`): both count."""

    __slots__ = ("left",)

    def __init__(self, n):
        self.left = n

    def done(self):
        self.left -= 1
        return self.left < 0


def kept(tiling, key):
    """The final launch kept under ``key`` in the tiling's store of bound calls, or None."""
    return tiling.bound().get(key)


def bindable(tiling, key):
    """``(launch, countdown)``: what a binder binds under ``key``: the final launch (``countdown`` None), or the
    default launch a :class:`Countdown` keeps in use before the timed choice, with that countdown (a bound call
    counts as a call, and goes the general way once it is done, where the choice runs); ``(None, None)`` while
    there is neither (the timed choice's candidates compile, or a count ended that no planning has taken up)."""
    launch = kept(tiling, key)
    if launch is not None:
        return launch, None
    prov = tiling.peek(("provisional", key))
    if prov is not None and len(prov.futures) == 1 and isinstance(prov.futures[0], Countdown) \
            and prov.futures[0].left >= 0:
        return prov.launch, prov.futures[0]
    return None, None


def keep_launch(tiling, key, launch):
    """Keep a final launch in the tiling's store (among its launches, at most ``BOUND_KEEP``); returns it."""
    return tiling.bound().put(key, launch, "launches")


def planned(tiling, key, plan):
    """The launch of ``plan()``, kept in the tiling's store under ``key`` once it is final.

    A :class:`Provisional` launch (the timed choice ran while some candidates were
    compiling, or waits for its :class:`Countdown`) is kept aside and used until those are
    done; the next call then plans again, timing every candidate, and that launch is the one
    cached (and bound by the plans).  Every candidate gives the same bits, so only speed changes.
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
    return kept(tiling, key) or keep_launch(tiling, key, launch)


def run_spmm(launch, tiling, values, X, Y):
    """One call of a planned SpMM launch (and its fixup) into Y: the values dense where the launch reads them so."""
    launch.run(vec_dense_values(tiling, values) if launch.dense else values, X, Y)


def bound_form(memo, launch):
    """``launch.bind()``, bound once while ``launch`` is the one ``memo`` (a plan's own dict) holds: a plan's general
    path runs its launch in the bound form and the plan's binder takes up that very form, so a new matrix's first
    product binds its launch once instead of running it and then binding it (two passes over its arguments)."""
    hit = memo.get("bound")
    if hit is None or hit[0] is not launch:
        hit = memo["bound"] = (launch, launch.bind())
    return hit[1]


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
    binds = mode is Mode.tf32 and problem.X.dtype == F32 and problem.values == F32 and problem.bindable
    memo = {}  # (the launch the general path ran bound, and that form: the binder takes it up)

    def run(values, casts, X, Y):
        direct = Y is not None
        Y, X = _result_and_operand(shape, kdt, X, Y, kdt)
        if X is None:
            return Y
        values = values_as(values, kdt, casts)
        launch = kept(tiling, keys[direct])  # planned once: no closure per call
        if launch is None:
            launch = planned(tiling, keys[direct], lambda: spmm_launch(tiling, kdt, D, vecs[direct], (values, X, Y)))
        if binds:
            bound_form(memo, launch)(vec_dense_values(tiling, values) if launch.dense else values, X, Y)
        else:
            run_spmm(launch, tiling, values, X, Y)
        return Y

    if not binds:
        return problem.plan(run)

    def binder(values, casts, X, out, general):
        launch, countdown = bindable(tiling, keys[True])
        if not isinstance(launch, Launch):
            return None
        bound = bound_form(memo, launch)
        if launch.dense:  # the launch reads the values dense
            on_dense = bound

            def bound(values, X, Y):
                on_dense(vec_dense_values(tiling, values), X, Y)

        ndarray = get_cupy().ndarray

        def f(values, casts, X, out):
            Y = ndarray(shape, F32) if out is None else out  # cupy.empty without its wrapper
            bound(values, X, Y)
            return Y

        def fixed(values, casts, X, out):  # (the dense values' array, held by the replay, keeps its address)
            if out is None:
                return None
            return launch.fixed(vec_dense_values(tiling, values) if launch.dense else values, X, out)

        f.fixed, f.countdown = fixed, countdown
        return f

    return problem.plan(run, binder)


def cast_plan(problem, x_dtype, key, make, launch_key_of, plan_launch):
    """The :class:`.._problem.Plan` of a product fed the matrix's values in a cast form (the 16-bit and N:M products),
    X read as ``x_dtype``.

    ``make(values, casts)`` gives ``(split, values, unscale)``, kept per matrix in ``casts[key]``; the launch for
    that form, under ``launch_key_of(split, aligned)``, is ``plan_launch(split, aligned, (values, X, Y, extra))``,
    planned once and kept on the tiling; a call runs it on ``(values, X, Y, unscale or values)``.  Bound once the
    general path's first call has cast the values and the launch is final or counting down (:func:`bindable`; X
    passed as it is): per call the bound launch takes the matrix's cast values, and matrices sharing the tiling
    (``with_values``) each bring their own; one whose values take the other form (``(hi, lo)`` pairs against
    values exact in X's type: another kernel) goes the general way.
    """
    tiling, kdt = problem.tiling, problem.kdt
    shape = (tiling.shape[0], problem.width)
    aligns = tuple(problem.aligned(8, cast=x_dtype, direct=d) for d in (False, True))
    binds = problem.X.dtype == x_dtype and problem.bindable
    memo = {}  # (the launch the general path ran bound, and that form: the binder takes it up)

    def run(values, casts, X, Y):
        direct = Y is not None
        Y, X = _result_and_operand(shape, kdt, X, Y, x_dtype)
        if X is None:
            return Y
        split, vals, unscale = make(values, casts)
        extra = vals if unscale is None else unscale
        k = launch_key_of(split, aligns[direct])
        launch = kept(tiling, k)
        if launch is None:
            launch = planned(tiling, k, lambda: plan_launch(split, aligns[direct], (vals, X, Y, extra)))
        (bound_form(memo, launch) if binds else launch.run)(vals, X, Y, extra)
        return Y

    if not binds:
        return problem.plan(run)

    def binder(values, casts, X, out, general):
        hit = casts.get(key)
        if hit is None:
            return None
        split = hit[0]
        launch, countdown = bindable(tiling, launch_key_of(split, aligns[True]))
        if not isinstance(launch, Launch):
            return None
        bound = bound_form(memo, launch)
        ndarray = get_cupy().ndarray

        def f(values, casts, X, out):
            form, vals, unscale = casts.get(key) or make(values, casts)
            if form != split:
                return general(values, casts, X, out)
            Y = ndarray(shape, kdt) if out is None else out
            bound(vals, X, Y, vals if unscale is None else unscale)
            return Y

        f.countdown = countdown
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
    Xb = problem.Xb
    binds = (problem.mode is Mode.tf32 and kdt == F32 and problem.values == F32 and problem.X.dtype == F32
             and Xb.dtype == F32 and len(Xb.shape) == 2 and Xb.contiguous and nnz and problem.out is None
             and problem.bindable)
    memo = {}  # (the launch the general path ran bound, and that form: the binder takes it up)

    def launch():
        return kept(tiling, key) or keep_launch(tiling, key, sddmm_launch(tiling, kdt, D, aligned, mv))

    def run(values, casts, Xa, Xb, e):
        cp = get_cupy()
        e = cp.empty(nnz, dtype=kdt) if e is None else e
        if nnz == 0:
            return e
        if D == 0:
            e.fill(0)
            return e
        Xa, Xb = cp.ascontiguousarray(Xa, dtype=kdt), cp.ascontiguousarray(Xb, dtype=kdt)
        la = launch()
        (bound_form(memo, la) if binds else la.run)(values_as(values, kdt, casts), Xa, Xb, e)
        return e

    if not binds:
        return problem.plan(run)

    def binder(values, casts, Xa, Xb, out, general):
        bound, empty = bound_form(memo, launch()), get_cupy().empty

        def f(values, casts, Xa, Xb, out):
            e = empty(nnz, F32)
            bound(values, Xa, Xb, e)
            return e

        return f

    return problem.plan(run, binder)
