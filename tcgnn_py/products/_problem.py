"""Layer 2: what a product's plan is made of: its dense operands (:class:`Operand`), the problem they pose
(:class:`Problem`), both decided once per signature, and the :class:`Plan` that runs every call of it.

A product's signature (the front door's ``signature``) holds each operand's shape, strides, dtype and base address
modulo 16, so what an :class:`Operand` records is the same for every call of the signature: a family reads the
operands' kind, width and alignment from the :class:`Problem` and decides none of them per call.
"""

from typing import NamedTuple

import numpy as np

from ._modes import F32, TC_TILES, Mode, compute_dtype, resolve_precision

__all__ = ["Operand", "Plan", "Problem", "aligned16", "overlaps"]


def overlaps(a, b):
    """Whether two device arrays' byte ranges intersect (O(1), conservative)."""
    a0, b0 = a.data.ptr, b.data.ptr
    return a.nbytes > 0 and b.nbytes > 0 and a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


class Operand(NamedTuple):
    """A dense device operand as a plan sees it (:meth:`of`): the fields its signature fixes."""

    dtype: np.dtype
    shape: tuple
    contiguous: bool  # C-contiguous: taken as it is (else the general path copies it)
    base16: bool  # base address 16-byte aligned

    @classmethod
    def of(cls, a):
        """The operand ``a`` (a device array; None stays None)."""
        return None if a is None else cls(a.dtype, a.shape, a.flags.c_contiguous, a.data.ptr % 16 == 0)

    @property
    def width(self):
        """Features per row (the last axis)."""
        return self.shape[-1]


def aligned16(D, *operands, multiple=4):
    """Whether rows of ``D`` elements take 16-byte loads and stores: ``D`` a multiple of ``multiple`` (4 floats;
    8 for the 16-bit and N:M kernels, whose vectors are 8 columns) and every :class:`Operand`'s base 16-byte
    aligned (None stands for an array the memory pool gives, 256-byte aligned).  The one statement of the rule."""
    return D % multiple == 0 and all(o is None or o.base16 for o in operands)


class Plan:
    """How every product of one signature runs.

    ``general(values, casts, *operands)`` is always right for the signature: it converts what
    needs converting and plans (or finds) its launch on the tiling.  ``binder`` (None where the
    signature can never take a bound launch: CUDA cores, a copy of X or of the result) returns,
    once the launch is final, ``f(values, casts, *operands)`` that only allocates and launches --
    None while it is not (the timed choice's candidates still compile): the next call tries again.
    Where ``f.fixed(values, casts, *operands)`` exists it gives a replay of those very operands,
    every kernel slot written once (or None where the call cannot take one).  Where ``f.countdown`` is
    not None (the default launch, in use for a number of calls before the timed choice) each bound call
    counts, and the call that ends the count goes the general way, which makes the choice and binds the
    launch chosen (or, while its candidates compile, nothing yet).
    """

    __slots__ = ("general", "binder", "bound")

    def __init__(self, general, binder=None):
        self.general = general
        self.binder = binder
        self.bound = None

    def __call__(self, values, casts, *operands):
        bound = self.bound
        if bound is not None:
            return bound(values, casts, *operands)
        Y = self.general(values, casts, *operands)
        if self.binder is not None:
            f = self.binder(values, casts, *operands, general=self.general)
            self.bound = f if getattr(f, "countdown", None) is None else self._counted(f)
        return Y

    def _counted(self, f):
        """``f`` counting its calls on ``f.countdown``: once it is done, unbound, and its calls go through the plan
        (the first the general way, which makes the timed choice; then the launch chosen, bound), so a caller
        that kept it (:func:`tcgnn_py._tiled.bound_spmm`) reaches the launch chosen too."""
        countdown = f.countdown

        def counted(values, casts, *operands):
            if countdown.done():
                if self.bound is counted:
                    self.bound = None
                return self(values, casts, *operands)
            return f(values, casts, *operands)

        counted.countdown = countdown  # (a caller that keeps a replay waits for the launch chosen)
        fixed = getattr(f, "fixed", None)
        if fixed is not None:  # (a replay keeps the launch it was made with: every launch gives the same bits)
            counted.fixed = fixed
        return counted


class Problem(NamedTuple):
    """A product of one signature, as the front door hands it to a family: ``A @ X`` (:meth:`spmm`) or the SDDMM
    ``<X_i, Xb_j>`` over A's entries (:meth:`sddmm`).

    ``dtype`` is the result's; the kernels write ``kdt``: ``dtype``, or float32 rounded once into it afterwards (a
    16-bit result the kernel does not write, or one computed on widened operands).  :attr:`route` is the key of
    the family that plans it in the front door's tables.
    """

    tiling: object
    mode: Mode
    dtype: np.dtype
    kdt: np.dtype
    values: np.dtype  # the matrix's values' dtype
    X: Operand
    out: Operand  # or None: a new result
    Xb: Operand = None  # the SDDMM's second operand (None: an SpMM)
    multiply_values: bool = False  # the SDDMM's scores times the entries' values

    @classmethod
    def spmm(cls, tiling, values, X, dtype, precision, out):
        """The problem of ``A @ X`` (device arrays; ``out`` optional), its precision resolved."""
        mode = resolve_precision(precision, dtype, tiling.tile_shape, X.dtype, tiling.layout.pattern)
        if mode.half:
            kdt = dtype if dtype in (F32, X.dtype) else F32
        else:
            kdt = compute_dtype(dtype)
        return cls(tiling, mode, dtype, kdt, values.dtype, Operand.of(X), Operand.of(out))

    @classmethod
    def sddmm(cls, tiling, values, Xa, Xb, dtype, precision, out, multiply_values):
        """The problem of the SDDMM of ``Xa`` and ``Xb`` (device arrays; ``out`` optional), its precision resolved:
        16-bit operands widen exactly to TF32 (the same products, accumulated in float32; CUDA cores on tiles
        without tensor-core kernels)."""
        operand = Xa.dtype if Xa.dtype == Xb.dtype else None
        mode = resolve_precision(precision, dtype, tiling.tile_shape, operand, tiling.layout.pattern)
        if mode.half:
            mode = Mode.tf32 if tiling.tile_shape in TC_TILES else Mode.exact
        return cls(tiling, mode, dtype, compute_dtype(dtype), values.dtype, Operand.of(Xa), Operand.of(out),
                   Operand.of(Xb), bool(multiply_values))

    @property
    def route(self):
        """``(mode, tile shape, N:M pattern)``: what picks the family (``"half"`` for either 16-bit mode; CUDA
        cores, ``Mode.exact``, take any tiling: ``(Mode.exact, None, None)``; an SDDMM's kernels read any tiling
        of their tile shape: no pattern)."""
        if self.mode is Mode.exact:
            return Mode.exact, None, None
        layout = self.tiling.layout
        pattern = layout.pattern if self.Xb is None else None
        return "half" if self.mode.half else self.mode, layout.tile_shape, pattern

    @property
    def width(self):
        return self.X.width

    @staticmethod
    def read(operand, cast=None):
        """``operand`` as the kernel reads it: itself, or None for a copy from the pool (not C-contiguous, or not
        of ``cast``)."""
        copied = not operand.contiguous or (cast is not None and operand.dtype != cast)
        return None if copied else operand

    def aligned(self, multiple=4, cast=None, direct=True):
        """:func:`aligned16` for this problem's SpMM launch: X as the kernel reads it (:meth:`read`) and the result
        it writes (``out`` where ``direct``, else new)."""
        out = self.out if direct and self.kdt == self.dtype else None
        return aligned16(self.X.width, self.read(self.X, cast), out, multiple=multiple)

    @property
    def bindable(self):
        """Whether a bound launch can take X as it is and write the result itself (else: always the general way)."""
        X, out = self.X, self.out
        return (self.kdt == self.dtype and self.tiling.shape[0] and X.width and len(X.shape) == 2 and X.contiguous
                and (out is None or len(out.shape) == 2 and out.contiguous))

    def plan(self, run, binder=None):
        """The :class:`Plan` of a family's ``run(values, casts, X, [Xb,] Y) -> Y`` (``Y``: the result to write, or
        None for a new one of ``kdt``) and ``binder`` (used only where :attr:`bindable`).

        The general form writes ``out`` directly where the kernel writes its dtype and it does not overlap X (read
        while written), else a temporary, rounded or copied into it; a bound launch with an ``out`` goes the
        general way for one that overlaps X.
        """
        kdt, dtype = self.kdt, self.dtype

        def general(values, casts, X, *rest):
            out = rest[-1]
            direct = out if out is not None and kdt == dtype and not overlaps(out, X) else None
            Y = run(values, casts, X, *rest[:-1], direct)
            if out is None:
                return Y if kdt == dtype else Y.astype(dtype)
            if Y is not out:
                out[...] = Y
            return out

        if binder is None or not self.bindable:
            return Plan(general)
        if self.out is not None:
            binder = _guard_overlap(binder)
        return Plan(general, binder)


def _guard_overlap(binder):
    """A binder whose launch goes the general way for an ``out`` that overlaps X (read while written)."""
    def bind(values, casts, X, out, general):
        f = binder(values, casts, X, out, general=general)
        if f is None:
            return None

        def guarded(values, casts, X, out):
            if overlaps(out, X):
                return general(values, casts, X, out)
            return f(values, casts, X, out)

        fixed = getattr(f, "fixed", None)
        if fixed is not None:  # (no replay for an out that overlaps X: that call goes the general way)
            guarded.fixed = lambda values, casts, X, out: None if overlaps(out, X) else fixed(values, casts, X, out)
        guarded.countdown = getattr(f, "countdown", None)
        return guarded

    return bind
