"""Layer 2: the ``"vec"`` family: TF32 SpMM and SDDMM on the vector layout (8-row windows, 8x4 blocks).

A launch is a :class:`Config`: a compiled kernel (:data:`.kernels.products.VEC_SPMM_CONFIGS`) and the partition
it runs on.  :func:`default` is the tiling statistics' rule; the timed choice compares :func:`candidates`,
which keep its partition, so every candidate gives the same bits.
"""

import dataclasses
import functools
import sys

import numpy as np

from ..._tuning import bool_option, declare, int_option, member_option, options, positive_option
from ...kernels import products as kp
from .._autotune import choose
from .._launch import f32_plan, sddmm, sddmm_plan
from .._plans import spmm_plan, vec_counts
from .._values import VEC_DENSE_BYTES_MAX
from .._vec_layout import Config, Shape, async_l1, async_rows, async_unroll, layout_launches, partition, vec_coop

__all__ = ["MAX_WARPS", "Config", "candidates", "default", "kernels", "launch", "launches", "plan", "plan_sddmm",
           "sddmm_launch", "spmm_launch"]


#: Warps per CTA of the vector SpMM: its ``__launch_bounds__(128)`` (a larger block fails at the driver).
MAX_WARPS = kp.VEC_WARPS

# The vector layout's options, TF32 and 16-bit (the partition's are read by .._vec_layout): the balanced units and
# the grid.
declare("vec", {
    # the kernel: a config of kernels.products.VEC_SPMM_CONFIGS (no timed choice then; cp.async configs fall back to
    # the rule's on rows cp.async cannot copy); None: the statistics' rule and the timed choice
    "vec_kernel": (None, member_option(kp.VEC_SPMM_CONFIGS, "None or a config of kernels.products.VEC_SPMM_CONFIGS")),
    # the statistics' cap on float4 groups per lane (a warp covers 32 * this many features)
    "vec_max_slices": (2, int_option(1, 2)),
    "vec_blocks_per_unit": (None, int_option(1, none=True)),  # blocks per balanced unit
    "vec_target_warps": (16, int_option(1)),  # aim for this many warps per SM in the grid
    "vec_tail_factor": (4, positive_option(none=True)),  # longest unit <= this x the blocks per resident warp
    "vec_tail_floor": (128, int_option(1, none=True)),  # and <= max(the blocks per resident warp, this)
    "vec_warps": (4, int_option(1, MAX_WARPS)),  # warps per CTA (independent: each takes its own unit x slice)
    "vec_sort_units": (True, bool_option()),  # longest units first: the grid's tail is made of short ones
    "vec_coop": (None, bool_option(none=True)),  # one CTA per window x slice; None: by the grid
    "vec_coop_chain": (1, int_option(0)),  # by the grid only where a quarter of the longest window <= this many units
    "vec_combine": (True, bool_option()),  # sum split windows inside the launch (else: the fixup launch)
    "vec_combine_parts_max": (64, int_option(0)),  # ... when no window has more parts than this
    # time the bit-identical launches once and keep the fastest; it overrides the combine option (False pins it)
    "vec_timed_choice": (True, bool_option()),
})


def plan(problem):
    """The :class:`.._problem.Plan` of a float32 ``A @ X`` on TF32 tensor cores, vector layout: this family's launch
    (:func:`spmm_launch`), planned once per width and alignment (:func:`.._launch.f32_plan`)."""
    return f32_plan(problem, spmm_launch)


def spmm_launch(tiling, dtype, D, vec, operands=None):
    """The float32 vector SpMM's launch for ``D`` features (``vec``: 16-byte aligned rows).

    ``operands``: ``(values, X, Y)`` of the call being planned: the launch is then the timed choice among
    :func:`candidates` (unless ``options()["vec_timed_choice"]`` is off).
    """
    if operands is None or not options()["vec_timed_choice"]:
        return launch(tiling, dtype, D, vec)
    return choose(sys.modules[__name__], tiling, dtype, D, vec, ("timed", "float32", D, vec),
                  functools.partial(candidates, tiling, D, vec), operands)


@functools.cache
def _compiled(kernel):
    """``(name, shared memory for 1, 2, ... warps per CTA)`` of a kernel config, worked out once per process."""
    per_warp = kp.vec_async_smem(1, kernel.FS, kernel.U, kernel.NS) if isinstance(kernel, kp.SpmmVecAsync) else 0
    return kernel.name, tuple([nw * per_warp for nw in range(1, MAX_WARPS + 1)])  # (each warp its own stages)


def _kernels(tiling, dtype, configs):
    """:func:`kernels` of each of ``configs``, which share one partition (the timed choice's candidates)."""
    compiled = [_compiled(c.kernel) for c in configs]
    fixup = configs and vec_counts(tiling, configs[0].bpu)["n_slots"] and ("vec", kp.fixup_name(np.dtype(dtype).name))
    return [(("vec", name),) + ((fixup,) if fixup and not getattr(c.kernel, "COOP", False) and not c.kernel.COMBINE
                                else ()) for c, (name, _) in zip(configs, compiled)]


def kernels(tiling, dtype, config):
    """``(family, name)`` of the kernels ``config``'s launch runs (nothing compiled, no launch built): the SpMM,
    and the fixup where split windows are not summed in it."""
    return _kernels(tiling, dtype, [config])[0]


def default(tiling, D, vec):
    """The statistics' launch (no timing): :func:`.._vec_layout.partition`'s, cp.async gathers where rows allow
    (16-byte aligned), through L1 where :func:`.._vec_layout.async_l1` says so, one CTA per window where
    :func:`.._vec_layout.vec_coop` says it pays.

    ``options()["vec_kernel"]`` (a config of :data:`.kernels.products.VEC_SPMM_CONFIGS`) pins the kernel; the
    partition is the statistics' all the same, and rows cp.async cannot copy take the rule's kernel.
    """
    forced = options()["vec_kernel"]
    if forced is not None and forced not in kp.VEC_SPMM_CONFIGS:
        raise ValueError(f"vec_kernel={forced!r} is not compiled: see kernels.products.VEC_SPMM_CONFIGS")
    slices, bpu, combine = partition(tiling, D, slices=None if forced is None else forced.FS)
    cp_async = async_rows(D, vec)
    if forced is not None and (cp_async or isinstance(forced, kp.SpmmVec)):
        return Config(forced, bpu)
    if not cp_async:
        return Config(kp.SpmmVec(FS=slices, U=kp.VEC_UNROLL, VEC=False, COMBINE=combine), bpu)
    coop = vec_coop(tiling, D)
    if coop and D > 32 and options()["vec_max_slices"] >= 2:  # (a few CTAs per SM: 64 features per warp read
        slices = 2  # each block's metadata once)
    return Config(kp.SpmmVecAsync(FS=slices, U=async_unroll(tiling, bpu, coop), NS=kp.VEC_STAGES,
                                  COMBINE=combine and not coop, RX=True, PV=True, COOP=coop,
                                  L1=not coop and async_l1(tiling, D)), bpu)


def launch(tiling, dtype, D, vec, config=None):
    """The launch of ``config`` (default: :func:`default`), its kernels compiled on first use."""
    return launches(tiling, dtype, D, vec, [config or default(tiling, D, vec)])[0]


def launches(tiling, dtype, D, vec, configs):
    """The launches of ``configs``, built in one pass (:func:`.._vec_layout.layout_launches`: those of one partition
    share its scratch, and those of one geometry differ only in their kernel)."""
    shapes = []
    for c in configs:
        k = c.kernel
        name, smem = _compiled(k)
        coop = isinstance(k, kp.SpmmVecAsync) and k.COOP
        shapes.append(Shape(k.FS, c.bpu, k.COMBINE, coop, ("vec", name), smem, getattr(k, "DV", False) and not coop))
    return layout_launches(tiling, D, shapes, kp.fixup_name(np.dtype(dtype).name))


def candidates(tiling, D, vec, first_only=False):
    """The float32 vector SpMM launches the timed choice compares: the default first.

    Every candidate keeps the default's partition (blocks per unit), so each
    output is the same MMAs over the same block pairs in the same order, and
    split windows are summed in part order by either the launch or the fixup:
    the results are bit-identical whichever wins (a GPU test checks it).
    Candidates, on rows cp.async can copy: 32 or 64 features per warp; cp.async
    gathers of 4 or 2 blocks per step (values through the block's mask, or dense
    with 4), each also through L1 (the L1 copies win where an SM's warps gather
    the same X rows again, e.g. blogcatalog3, and lose elsewhere); in-launch sums
    or the fixup launch.  Other rows have one launch, the register gathers.
    Each is the default's kernel config with fields replaced, kept if compiled.
    """
    first = default(tiling, D, vec)
    k = first.kernel
    alone = options()["vec_kernel"] is not None or not async_rows(D, vec)
    if first_only:
        return first, alone
    if alone:
        return [first]
    widths = (1, 2) if D > 32 else (1,)
    if k.COOP:  # its own partition (4 parts per window): candidates among its own shapes
        shapes = tuple((("FS", f), ("U", u)) for f in widths for u in kp.VEC_ASYNC_UNROLL)
    else:
        gathers = [(("U", u), ("DV", False), ("L1", l1)) for u in kp.VEC_ASYNC_UNROLL for l1 in (False, True)]
        if tiling.n_blocks * 32 * 4 <= VEC_DENSE_BYTES_MAX:
            gathers.insert(2, (("U", kp.VEC_UNROLL), ("DV", True), ("L1", False)))
        sums = (True, False) if vec_counts(tiling, first.bpu)["n_slots"] > 0 else (False,)
        shapes = tuple((("FS", f), ("COMBINE", c)) + g for f in widths for g in gathers for c in sums)
    return [Config(kernel, first.bpu) for kernel in _variants(k, shapes)]


@functools.cache
def _variants(kernel, shapes):
    """The compiled ones among ``kernel`` and ``kernel`` with each of ``shapes`` (``((field, value), ...)``) replaced,
    in order, without repeats: worked out once per process, by the configs' fields (a config's ``==`` and hash are
    Python calls each, and a search of the compiled ones would compare with each)."""
    compiled = _compiled_by_fields()
    names = [f.name for f in dataclasses.fields(kernel)]
    base = dict(zip(names, _fields(kernel)[1:]))
    keys = [_fields(kernel)] + [(type(kernel),) + tuple([dict(shape).get(k, v) for k, v in base.items()])
                                for shape in shapes]
    return tuple([compiled[key] for key in dict.fromkeys(keys) if key in compiled])


def _fields(kernel):
    """A kernel config as ``(type, *field values)``: a key that hashes and compares without a Python call."""
    return (type(kernel),) + tuple([getattr(kernel, f.name) for f in dataclasses.fields(kernel)])


@functools.cache
def _compiled_by_fields():
    """The compiled vector SpMM configs by :func:`_fields`."""
    return {_fields(c): c for c in kp.VEC_SPMM_CONFIGS}


def plan_sddmm(problem):
    """The :class:`.._problem.Plan` of an SDDMM on TF32 tensor cores, vector layout: this family's launch
    (:func:`sddmm_launch`), planned once (:func:`.._launch.sddmm_plan`)."""
    return sddmm_plan(problem, sddmm_launch)


def sddmm_launch(tiling, dtype, D, aligned, multiply_values):
    """The vector SDDMM's launch (float32; ``run(values, Xa, Xb, out)``)."""
    units = spmm_plan(tiling, kp.VEC_SDDMM_BLOCKS, np.iinfo(np.int32).max)["units"]
    fixed = dict(units=units, n_units=units.shape[0], block_ptr=tiling.block_ptr, block_cols=tiling.block_cols,
                 tile_pos=tiling.tile_pos, M=tiling.shape[0], D=D, multiply=int(multiply_values))
    return sddmm("vec", kp.sddmm_vec_name(aligned), -(-units.shape[0] // kp.VEC_WARPS), 32 * kp.VEC_WARPS, fixed)
