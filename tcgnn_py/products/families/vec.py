"""Layer 2: the ``"vec"`` family: TF32 SpMM and SDDMM on the vector layout (8-row windows, 8x4 blocks).

A launch is a :class:`Config`: a compiled kernel (:data:`.kernels.products.VEC_SPMM_CONFIGS`) and the partition
it runs on.  :func:`default` is the tiling statistics' rule; the timed choice compares :func:`candidates`,
which keep its partition, so every candidate gives the same bits.
"""

import dataclasses

import numpy as np

from ..._tuning import bool_option, declare, int_option, member_option, options, positive_option
from ...kernels import products as kp
from .._autotune import choose
from .._launch import SDDMM_OPERANDS, Launch, f32_plan, sddmm_plan
from .._plans import spmm_plan, vec_plan
from .._values import VEC_DENSE_BYTES_MAX, vec_dense_values
from .._vec_layout import async_rows, layout_launch, partition, vec_coop

__all__ = ["MAX_WARPS", "Config", "candidates", "default", "kernels", "launch", "plan", "plan_sddmm", "sddmm_launch",
           "spmm_launch"]


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


@dataclasses.dataclass(frozen=True)
class Config:
    """One launch of the vector SpMM: the kernel (``SpmmVec`` register gathers, or ``SpmmVecAsync``) and the
    blocks per unit, which fix the partition of each window, hence the order of every sum."""

    kernel: object
    bpu: int


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
    from ...kernels.registry import get_kernel

    values, X, Y = operands
    frames = {}  # the candidates' launches differ from one another's only in their kernel (and shared memory)
    return choose(tiling, ("timed", "float32", D, vec), candidates(tiling, D, vec),
                  lambda c, scratch: launch(tiling, dtype, D, vec, c, scratch, get_kernel, frames),
                  lambda la: la.bound_call(vec_dense_values(tiling, values) if la.dense else values, X, Y),
                  lambda c: kernels(tiling, dtype, c), tiling.n_blocks * D)


def kernels(tiling, dtype, config):
    """``(family, name)`` of the kernels ``config``'s launch runs (nothing compiled, no launch built): the SpMM,
    and the fixup where split windows are not summed in it."""
    from ...kernels import products as kp

    k = config.kernel
    fixup = not getattr(k, "COOP", False) and not k.COMBINE and vec_plan(tiling, config.bpu)["n_slots"]
    return (("vec", k.name),) + ((("vec", kp.fixup_name(np.dtype(dtype).name)),) if fixup else ())


def default(tiling, D, vec):
    """The statistics' launch (no timing): :func:`.._vec_layout.partition`'s, cp.async gathers where rows allow
    (16-byte aligned), one CTA per window where :func:`.._vec_layout.vec_coop` says it pays.

    ``options()["vec_kernel"]`` (a config of :data:`.kernels.products.VEC_SPMM_CONFIGS`) pins the kernel; the
    partition is the statistics' all the same, and rows cp.async cannot copy take the rule's kernel.
    """
    from ...kernels import products as kp

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
    return Config(kp.SpmmVecAsync(FS=slices, U=kp.VEC_UNROLL, NS=kp.VEC_STAGES, COMBINE=combine and not coop, RX=True,
                                  PV=True, COOP=coop), bpu)


def launch(tiling, dtype, D, vec, config=None, scratch=None, get=None, frames=None):
    """The launch of ``config`` (default: :func:`default`); ``get(family, name)``: where kernels come from
    (default: compiled on first use); ``frames``: the timed choice's store of launches by geometry
    (:func:`.._vec_layout.layout_launch`)."""
    from ...kernels import products as kp
    from ...kernels.registry import get_kernel

    get = get or get_kernel
    config = config or default(tiling, D, vec)
    k = config.kernel
    is_async = isinstance(k, kp.SpmmVecAsync)
    coop = is_async and k.COOP
    return layout_launch(tiling, D, k.FS, config.bpu, k.COMBINE, coop, get("vec", k.name),
                         lambda nw: kp.vec_async_smem(nw, k.FS, k.U, k.NS) if is_async else 0,
                         lambda: get("vec", kp.fixup_name(np.dtype(dtype).name)), scratch, frames,
                         dense=is_async and k.DV and not coop)


def candidates(tiling, D, vec):
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
    from ...kernels import products as kp

    first = default(tiling, D, vec)
    k = first.kernel
    if options()["vec_kernel"] is not None or not async_rows(D, vec):
        return [first]
    widths = (1, 2) if D > 32 else (1,)
    if k.COOP:  # its own partition (4 parts per window): candidates among its own shapes
        shapes = [dict(FS=f, U=u) for f in widths for u in kp.VEC_ASYNC_UNROLL]
    else:
        gathers = [dict(U=u, DV=False, L1=l1) for u in kp.VEC_ASYNC_UNROLL for l1 in (False, True)]
        if tiling.n_blocks * 32 * 4 <= VEC_DENSE_BYTES_MAX:
            gathers.insert(2, dict(U=kp.VEC_UNROLL, DV=True, L1=False))
        sums = (True, False) if vec_plan(tiling, first.bpu)["n_slots"] > 0 else (False,)
        shapes = [dict(FS=f, COMBINE=c, **g) for f in widths for g in gathers for c in sums]
    out = [first] + [Config(dataclasses.replace(k, **shape), first.bpu) for shape in shapes]
    return [c for c in dict.fromkeys(out) if c.kernel in kp.VEC_SPMM_CONFIGS]


def plan_sddmm(problem):
    """The :class:`.._problem.Plan` of an SDDMM on TF32 tensor cores, vector layout: this family's launch
    (:func:`sddmm_launch`), planned once (:func:`.._launch.sddmm_plan`)."""
    return sddmm_plan(problem, sddmm_launch)


def sddmm_launch(tiling, dtype, D, aligned, multiply_values):
    """The vector SDDMM's :class:`Launch` (float32; ``run(values, Xa, Xb, out)``)."""
    from ...kernels import products as kp
    from ...kernels.registry import get_kernel

    units = spmm_plan(tiling, kp.VEC_SDDMM_BLOCKS, np.iinfo(np.int32).max)["units"]
    head = (units, np.int32(units.shape[0]), tiling.block_ptr, tiling.block_cols, tiling.tile_pos)
    return Launch(get_kernel("vec", kp.sddmm_vec_name(aligned)), (-(-units.shape[0] // kp.VEC_WARPS),),
                  (32 * kp.VEC_WARPS,), 0, head, (np.int32(tiling.shape[0]), np.int32(D), np.int32(multiply_values)),
                  SDDMM_OPERANDS)
