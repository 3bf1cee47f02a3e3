"""Layer 2: the ``"half"`` family: 16-bit X products on the vector layout (m16n8k16 MMAs, float32 accumulation):
the launch, the timed choice's candidates, and the binding for repeated calls.

The matrix's values go as X's type, or as (hi, lo) pairs of it (:func:`.._values.half_values`).
"""

import dataclasses
import functools
import sys

import numpy as np

from ..._tuning import bool_option, declare, int_option, options
from ...kernels import products as kp
from .._autotune import choose
from .._launch import cast_plan, half_launch_key
from .._plans import vec_counts
from .._values import half_key, half_values
from .._vec_layout import Config, Shape, layout_launches, partition, vec_coop

__all__ = ["Config", "candidates", "default", "kernels", "launch", "launches", "plan", "spmm_launch"]


def _half_shape(value):
    """A ``kernels.products.SpmmVech`` whose shape is compiled (its types and alignment come from the operands)."""
    if value is None:
        return None
    if not isinstance(value, kp.SpmmVech):
        raise TypeError
    if (value.FS, value.KS, value.NS) not in (kp.VEC_HALF_COOP if value.COOP else kp.VEC_HALF):
        raise ValueError
    return value


declare("half", {
    # vec_tail_floor for 16-bit blocks (half the bytes: shorter units pay)
    "half_tail_floor": (64, int_option(1, none=True)),
    # the kernel's shape: a kernels.products.SpmmVech whose (FS, KS, NS, COMBINE, COOP) are compiled (its types and
    # alignment come from the operands; no timed choice then); None: the rule and the timed choice
    "half_kernel": (None, (_half_shape, "None or a kernels.products.SpmmVech whose (FS, KS, NS) is in VEC_HALF "
                                        "(COOP: VEC_HALF_COOP)")),
    # values X's type holds exactly (unweighted, small integers): one MMA, not two on (hi, lo) pairs
    "half_exact_values": (True, bool_option()),
})


def spmm_launch(tiling, dtype, D, vec, half, operands=None):
    """The 16-bit vector SpMM's launch: ``half`` is ``(X type, split values, Y type)``; with ``operands``
    ``(values, X, Y, unscale)`` of the call being planned, the timed choice among :func:`candidates`."""
    if operands is None or not options()["vec_timed_choice"]:
        return launch(tiling, dtype, D, vec, half)
    return choose(sys.modules[__name__], tiling, dtype, D, vec, ("timed", half, D, vec),
                  functools.partial(candidates, tiling, D, vec, half), operands)


@functools.cache
def _compiled(kernel):
    """``(name, shared memory for 1, 2, ... warps per CTA)`` of a kernel config, worked out once per process."""
    return kernel.name, tuple(kp.vech_smem(nw, kernel.FS, kernel.KS, kernel.NS) for nw in range(1, kp.VEC_WARPS + 1))


def _kernels(tiling, dtype, configs):
    """:func:`kernels` of each of ``configs``, which share one partition (the timed choice's candidates)."""
    compiled = [_compiled(c.kernel) for c in configs]
    fixup = (configs and vec_counts(tiling, configs[0].bpu)["n_slots"]
             and ("half", kp.fixup_name("float32", np.dtype(dtype).name)))
    return [(("half", name),) + ((fixup,) if fixup and not c.kernel.COOP and not c.kernel.COMBINE else ())
            for c, (name, _) in zip(configs, compiled)]


def kernels(tiling, dtype, config):
    """``(family, name)`` of the kernels ``config``'s launch runs (nothing compiled, no launch built): the SpMM,
    and the fixup where split windows are not summed in it."""
    return _kernels(tiling, dtype, [config])[0]


def default(tiling, D, vec, half):
    """The statistics' launch (no timing) for ``half`` ``(X type, split values, Y type)``: the vector layout's
    partition (:func:`.._vec_layout.partition`, the 16-bit units), one k16 chunk a step, two steps in flight,
    and one CTA per window where :func:`.._vec_layout.vec_coop` says it pays.  Rows not 16-byte aligned have
    one compiled shape (``HALF_DEFAULT``).

    ``options()["half_kernel"]`` pins the shape (its ``FS, KS, NS, COMBINE, COOP``; the types and alignment come
    from the operands) on aligned rows.
    """
    forced = options()["half_kernel"]
    if forced is not None and (forced.FS, forced.KS, forced.NS) not in (kp.VEC_HALF_COOP if forced.COOP
                                                                        else kp.VEC_HALF):
        raise ValueError(f"half_kernel={forced!r} has no compiled shape: see kernels.products.VEC_HALF")
    forced = forced if vec else None  # unaligned rows: one configuration
    slices = forced.FS if forced is not None else None if vec else kp.HALF_DEFAULT[0]
    slices, bpu, combine = partition(tiling, D, half=True, slices=slices)
    x, split, y = half
    _, ks, stages = kp.HALF_DEFAULT
    base = kp.SpmmVech(TX=kp.HALF_TYPES[x], SPLIT=split, TY=kp.cuda_type(y), FS=slices, KS=ks, NS=stages,
                       COMBINE=combine, AL=vec)
    if forced is not None:
        return Config(dataclasses.replace(base, KS=forced.KS, NS=forced.NS, COMBINE=forced.COMBINE and not forced.COOP,
                                          COOP=forced.COOP), bpu)
    if vec and (slices, ks, stages) in kp.VEC_HALF_COOP and vec_coop(tiling, D, True):
        return Config(dataclasses.replace(base, COMBINE=False, COOP=True), bpu)
    return Config(base, bpu)


def launch(tiling, dtype, D, vec, half, config=None):
    """The launch of ``config`` (default: :func:`default`) for ``half`` ``(X type, split values, Y type)``, its
    kernels compiled on first use."""
    return launches(tiling, dtype, D, vec, [config or default(tiling, D, vec, half)])[0]


def launches(tiling, dtype, D, vec, configs):
    """The launches of ``configs``, built in one pass (:func:`.._vec_layout.layout_launches`: those of one partition
    share its scratch, and those of one geometry differ only in their kernel)."""
    for c in configs:
        k = c.kernel
        if not k.COOP and (k.FS, k.KS, k.NS) not in kp.VEC_HALF:
            raise ValueError(f"no 16-bit SpMM compiled for (slices, ks, stages) = {(k.FS, k.KS, k.NS)}: see "
                             "kernels.products.VEC_HALF")
    shapes = [Shape(c.kernel.FS, c.bpu, c.kernel.COMBINE, c.kernel.COOP, ("half", name), smem)
              for c, (name, smem) in ((c, _compiled(c.kernel)) for c in configs)]
    return layout_launches(tiling, D, shapes, kp.fixup_name("float32", np.dtype(dtype).name), extra=("unscale_p",))


def candidates(tiling, D, vec, half, first_only=False):
    """The 16-bit vector SpMM launches the timed choice compares: the default first.

    As :func:`.vec.candidates`, every candidate keeps the default's partition, and
    the 16-bit kernel's compiled shapes (:data:`.kernels.products.VEC_HALF`: 32 or
    64 features per warp, 1 or 2 k16 chunks per step, 2 or 3 steps in flight) only
    change which warp computes an output and how far its loads run ahead: each
    output is the same MMAs in the same order, and split windows are summed in part
    order by the launch or by the fixup.  Unaligned rows have one compiled shape.
    """
    def fits(slices):  # 64 features per warp only for D > 32, and within the cap
        return slices == 1 or (16 * slices < D and slices <= options()["vec_max_slices"])

    first = default(tiling, D, vec, half)
    k = first.kernel
    alone = not vec or options()["half_kernel"] is not None
    if first_only:
        return first, alone
    if alone:
        return [first]
    if k.COOP:  # its own partition (4 parts per window): candidates among its own shapes
        shapes = tuple((("FS", f), ("KS", ks), ("NS", ns)) for f, ks, ns in kp.VEC_HALF_COOP if fits(f))
    else:
        sums = (True, False) if vec_counts(tiling, first.bpu)["n_slots"] > 0 else (False,)
        shapes = tuple((("FS", f), ("KS", ks), ("NS", ns), ("COMBINE", c)) for f, ks, ns in kp.VEC_HALF if fits(f)
                       for c in sums)
    return [Config(kernel, first.bpu) for kernel in _variants(k, shapes)]


@functools.cache
def _variants(kernel, shapes):
    """``kernel`` and ``kernel`` with each of ``shapes`` (``((field, value), ...)``) replaced, in order, without
    repeats: worked out once per process, as kernel configs are built and hashed in Python."""
    return tuple(dict.fromkeys([kernel] + [dataclasses.replace(kernel, **dict(shape)) for shape in shapes]))


def plan(problem):
    """The :class:`.._problem.Plan` of ``A @ X`` for a 16-bit X on the vector layout: m16n8k16 MMAs, float32
    accumulation, one rounding; the matrix's values as X's type or (hi, lo) pairs of it (:func:`.._values.half_values`),
    bound for repeated calls once the launch for their form is final."""
    tiling, xdt, kdt, D = problem.tiling, problem.X.dtype, problem.kdt, problem.width
    return cast_plan(problem, xdt, half_key(xdt), lambda values, casts: half_values(values, xdt, casts),
                     lambda split, aligned: half_launch_key(xdt, split, kdt, D, aligned),
                     lambda split, aligned, operands: spmm_launch(tiling, kdt, D, aligned, (xdt.name, split, kdt.name),
                                                                  operands))
