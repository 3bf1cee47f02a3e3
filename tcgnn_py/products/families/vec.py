"""Layer 2: the ``"vec"`` family: TF32 SpMM and SDDMM on the vector layout (8-row windows, 8x4 blocks).

The statistics' default launch is the vector layout's (:func:`.._vec_layout.vec_choice`); the timed choice
compares :func:`candidates`, which keep its partition, so every candidate gives the same bits.
"""

import numpy as np

from ..._tuning import options
from .._autotune import choose
from .._launch import SDDMM_OPERANDS, Launch, run_spmm
from .._plans import spmm_plan, vec_plan
from .._values import VEC_DENSE_BYTES_MAX
from .._vec_layout import VecChoice, async_rows, coop_launch, partition_launch, vec_choice

__all__ = ["candidates", "launch", "sddmm_launch", "spmm_launch"]


def spmm_launch(tiling, dtype, D, vec, operands=None):
    """The float32 vector SpMM's launch for ``D`` features (``vec``: 16-byte aligned rows).

    ``operands``: ``(values, X, Y)`` of the call being planned: the launch is then the timed choice among
    :func:`candidates` (unless ``options()["vec_timed_choice"]`` is off).
    """
    if operands is None or not options()["vec_timed_choice"]:
        return launch(tiling, dtype, D, vec)
    from ...kernels.registry import get_kernel

    values, X, Y = operands

    def kernels_of(choice):
        names = []
        launch(tiling, dtype, D, vec, choice, {}, get=lambda family, name: names.append((family, name)))
        return tuple(names)

    return choose(tiling, ("timed", "float32", D, vec), candidates(tiling, D, vec),
                  lambda c, scratch: launch(tiling, dtype, D, vec, c, scratch, get_kernel),
                  lambda la: lambda: run_spmm(la, tiling, values, X, Y), kernels_of, tiling.n_blocks * D)


def launch(tiling, dtype, D, vec, choice=None, scratch=None, get=None):
    """The launch of ``choice`` (default: :func:`vec_choice`); ``get(family, name)``: where kernels come from
    (default: compiled on first use)."""
    from ...kernels import products as kp
    from ...kernels.registry import get_kernel

    get = get or get_kernel
    choice = choice or vec_choice(tiling, D, vec)
    if choice.coop:
        kernel = get("vec", kp.vec_spmm_config(choice.slices, choice.unroll, True, False, coop=True).name)
        return coop_launch(tiling, D, choice, kernel, kp.vec_async_smem(4, choice.slices, choice.unroll,
                                                                        kp.VEC_STAGES))
    nw, smem = options()["vec_warps"], 0
    if choice.cp_async:
        while nw > 1 and kp.vec_async_smem(nw, choice.slices, choice.unroll, kp.VEC_STAGES) > kp.SPMM_SMEM_LIMIT:
            nw //= 2
        smem = kp.vec_async_smem(nw, choice.slices, choice.unroll, kp.VEC_STAGES)
        cfg = kp.vec_spmm_config(choice.slices, choice.unroll, True, choice.combine, choice.dense, l1=choice.l1)
    else:
        cfg = kp.vec_spmm_config(choice.slices, choice.unroll, False, choice.combine)
    return partition_launch(tiling, D, choice, get("vec", cfg.name), smem, nw,
                            lambda: get("vec", kp.fixup_name(np.dtype(dtype).name)), scratch)


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
    """
    from ...kernels import products as kp

    default = vec_choice(tiling, D, vec)
    if options()["vec_kernel"] is not None or not async_rows(D, vec):
        return [default]
    if default.coop:  # its own partition (4 parts per window): candidates among its own shapes
        shapes = [(f, u) for f in ((1, 2) if D > 32 else (1,)) for u in kp.VEC_ASYNC_UNROLL]
        return list(dict.fromkeys([default] + [default._replace(slices=f, unroll=u) for f, u in shapes]))
    has_splits = vec_plan(tiling, default.bpu)["n_slots"] > 0
    gathers = [(u, False, l1) for u in kp.VEC_ASYNC_UNROLL for l1 in (False, True)]
    if tiling.n_blocks * 32 * 4 <= VEC_DENSE_BYTES_MAX:
        gathers.insert(2, (kp.VEC_UNROLL, True, False))
    out = [default]
    for slices in (1, 2) if D > 32 else (1,):
        for unroll, dense, l1 in gathers:
            for combine in (True, False) if has_splits else (False,):
                c = VecChoice(slices, default.bpu, True, combine, unroll, dense, l1=l1)
                if c not in out:
                    out.append(c)
    return out


def sddmm_launch(tiling, D, aligned, multiply_values):
    """The vector SDDMM's :class:`Launch` (``run(values, Xa, Xb, out)``)."""
    from ...kernels import products as kp
    from ...kernels.registry import get_kernel

    units = spmm_plan(tiling, kp.VEC_SDDMM_BLOCKS, np.iinfo(np.int32).max)["units"]
    head = (units, np.int32(units.shape[0]), tiling.block_ptr, tiling.block_cols, tiling.tile_pos)
    return Launch(get_kernel("vec", kp.sddmm_vec_name(aligned)), (-(-units.shape[0] // kp.VEC_WARPS),),
                  (32 * kp.VEC_WARPS,), 0, head, (np.int32(tiling.shape[0]), np.int32(D), np.int32(multiply_values)),
                  SDDMM_OPERANDS)
