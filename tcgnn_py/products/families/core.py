"""Layer 2: the ``"core"`` family: SpMM and SDDMM on CUDA cores, any tile shape, in the data's own precision.

The exact path: float64 products, ``precision="fp32"``, and tile shapes without tensor-core kernels.
"""

import numpy as np

from ..._tuning import declare, int_option, options
from ...kernels import products as kp
from .._launch import f32_plan, fixup, partial_scratch, sddmm, sddmm_plan, spmm
from .._plans import SDDMM_BLOCKS_PER_WARP, spmm_plan

__all__ = ["MAX_WARPS", "plan", "plan_sddmm", "sddmm_launch", "spmm_launch"]

#: Warps per CTA of the CUDA-core SpMM: its ``__launch_bounds__``.
MAX_WARPS = kp.SPMM_MAX_THREADS // 32

declare("core", {"core_nwarps": (4, int_option(1, MAX_WARPS))})


def plan(problem):
    """The :class:`.._problem.Plan` of ``A @ X`` on CUDA cores in the data's own precision: this family's launch
    (:func:`spmm_launch`), planned once per width (:func:`.._launch.f32_plan`)."""
    return f32_plan(problem, spmm_launch)


def spmm_launch(tiling, dtype, D, vec=False, operands=None):
    """The CUDA-core SpMM's launch for ``D`` features of ``dtype``; split windows summed by the fixup launch.
    ``vec`` and ``operands`` are unused (any alignment; nothing is timed)."""
    H, W, M = tiling.tile_shape[0], tiling.layout.block, tiling.shape[0]
    nwarps = options()["core_nwarps"]
    plan = spmm_plan(tiling, nwarps * (options()["blocks_per_warp"] or 16))
    scratch, partial, fix = None, None, None
    if plan["n_slots"]:  # split windows: partial tiles, summed by the fixup launch
        partial, scratch = partial_scratch(tiling, plan["n_slots"], tiling.layout.window, D, dtype)
        fix = fixup("core", kp.fixup_name(dtype.name), plan, M, tiling.layout.window, D, partial, scratch)
    fixed = dict(units=plan["units"], block_ptr=tiling.block_ptr, block_cols=tiling.block_cols,
                 tile_pos=tiling.tile_pos, M=M, D=D, W=W, wshift=W.bit_length() - 1)
    return spmm("core", kp.spmm_core_name(dtype.name, H, tiling.tile_pos.dtype.name),
                (plan["units"].shape[0], -(-D // 32)), 32 * nwarps, fixed,
                kp.core_spmm_smem(nwarps, H, dtype.itemsize), partial=partial, scratch=scratch, fixup=fix,
                n_slices=-(-D // 32))


def plan_sddmm(problem):
    """The :class:`.._problem.Plan` of an SDDMM on CUDA cores, any tile shape: this family's launch
    (:func:`sddmm_launch`), planned once (:func:`.._launch.sddmm_plan`)."""
    return sddmm_plan(problem, sddmm_launch)


def sddmm_launch(tiling, dtype, D, aligned, multiply_values):
    """The CUDA-core SDDMM's launch (any tile shape, any alignment; ``run(values, Xa, Xb, out)``)."""
    H, W = tiling.tile_shape
    bpw, warps, n_blocks = SDDMM_BLOCKS_PER_WARP, kp.SDDMM_WARPS, tiling.n_blocks
    fixed = dict(win_ptr=tiling.win_ptr, n_windows=tiling.n_windows, block_ptr=tiling.block_ptr,
                 block_cols=tiling.block_cols, tile_pos=tiling.tile_pos, n_blocks=n_blocks, D=D, H=H, W=W,
                 wshift=W.bit_length() - 1, multiply=int(multiply_values), bpw=bpw)
    return sddmm("core", kp.sddmm_core_name(np.dtype(dtype).name, tiling.tile_pos.dtype.name),
                 -(-n_blocks // (bpw * warps)), 32 * warps, fixed)
