"""Layer 2: the ``"tf32"`` family: TC-GNN's 16x8 tiles on TF32 tensor cores, SpMM and SDDMM.

The launch shape comes from the tiling's statistics (:func:`work_shape`); the kernel's config from the width
and alignment (``options()["tf32_kernel"]`` pins one of the compiled set).
"""

import numpy as np

from ..._tuning import declare, int_option, member_option, options, warp_pair_option
from ...kernels import products as kp
from .._launch import Scratch, f32_plan, partial_scratch, sddmm, sddmm_plan, spmm
from .._plans import SDDMM_BLOCKS_PER_WARP, spmm_plan, tile_mask

__all__ = ["FEW_CTAS", "WHOLE_WINDOW_BLOCKS", "plan", "plan_sddmm", "sddmm_launch", "spmm_launch", "work_shape"]

#: Warps per CTA of the 16x8 SpMM: its ``__launch_bounds__`` (a larger block fails at the driver with an error that
#: names nothing).
MAX_WARPS = kp.SPMM_MAX_THREADS // 32

declare("tf32", {
    # the kernel: a config of kernels.products.TF32_SPMM_CONFIGS; None: tf32_spmm_config by width and alignment
    "tf32_kernel": (None, member_option(kp.TF32_SPMM_CONFIGS, "None or a config of kernels.products.TF32_SPMM_CONFIGS")),
    "tf32_nwarps": (None, warp_pair_option(MAX_WARPS)),  # warps per CTA for 1, 2 chunks, e.g. (4, 4)
    # a unit holds up to nwarps * this many blocks (the CUDA-core SpMM's units too)
    "blocks_per_warp": (None, int_option(1, none=True)),
})

#: Windows of at most this many blocks stay whole (one unit each, no partial tiles, no fixup).
WHOLE_WINDOW_BLOCKS = 256
#: Below this many CTAs (windows x slabs), whole windows get 8 warps instead of 4.
FEW_CTAS = 2048


def plan(problem):
    """The :class:`.._problem.Plan` of a float32 ``A @ X`` on TF32 tensor cores, TC-GNN's 16x8 tiles: this family's
    launch (:func:`spmm_launch`), planned once per width and alignment (:func:`.._launch.f32_plan`)."""
    return f32_plan(problem, spmm_launch)


def spmm_launch(tiling, dtype, D, vec, operands=None):
    """The 16x8 TF32 SpMM's launch for ``D`` features (``vec``: 16-byte aligned rows); split windows (at most
    ``UNITS_PER_WINDOW_MAX`` parts) summed in the launch.  ``operands`` is unused: nothing is timed."""
    cfg = options()["tf32_kernel"] or kp.tf32_spmm_config(1 if D <= 32 else 2, vec)
    if cfg not in kp.TF32_SPMM_CONFIGS:
        raise ValueError(f"tf32_kernel={cfg!r} is not compiled: see kernels.products.TF32_SPMM_CONFIGS")
    if isinstance(cfg, kp.SpmmTF32Async) and not vec:  # cp.async copies 16-byte aligned rows only
        cfg = kp.tf32_spmm_config(cfg.CH, False)
    use_async = isinstance(cfg, kp.SpmmTF32Async)
    chunks = cfg.CH
    n_slabs = -(-D // (32 * chunks))
    nwarps, bpw = work_shape(tiling, n_slabs)
    if options()["tf32_nwarps"] is not None:
        nwarps = options()["tf32_nwarps"][chunks - 1]
    if options()["blocks_per_warp"] is not None:
        bpw = options()["blocks_per_warp"]

    def smem_of(nw):
        return kp.tf32_async_smem(nw, chunks, cfg.NS) if use_async else kp.tf32_spmm_smem(nw, chunks)

    while nwarps > 1 and smem_of(nwarps) > kp.SPMM_SMEM_LIMIT:
        nwarps //= 2
    plan = spmm_plan(tiling, max(nwarps * bpw, 1))
    n_slots = plan["n_slots"]
    # Split windows: their parts write partial tiles, and a window's last part sums them (one counter per
    # (first slot, slab)).
    counters = Scratch("counters", (n_slots * n_slabs,), np.int32, zeros=True) if n_slots else None
    partial, scratch = partial_scratch(tiling, n_slots, 16, D, dtype) if n_slots else (None, None)
    # Slabs of one unit side by side (1-D grid): they share its metadata in L2.
    fixed = dict(units=plan["units"], block_ptr=tiling.block_ptr, block_cols=tiling.block_cols,
                 block_mask=tile_mask(tiling), counters=counters, unit_k0=plan["unit_k0"] if n_slots else None,
                 M=tiling.shape[0], D=D, n_slabs=n_slabs)
    return spmm("tf32", cfg.name, (plan["units"].shape[0] * n_slabs, 1), 32 * nwarps, fixed, smem_of(nwarps),
                partial=partial, scratch=scratch, n_slices=n_slabs)


def work_shape(tiling, n_slabs):
    """``(warps per CTA, blocks per warp)`` of the TF32 SpMM, from the tiling's statistics.

    Chosen from launch sweeps on real graphs:

    * no window holds more than :data:`WHOLE_WINDOW_BLOCKS` blocks: every window
      is one unit, so no window is split -- no partial tiles, no fixup launch.
      With few windows (fewer than :data:`FEW_CTAS` CTAs: facebook, ppi) 8 warps
      share a window for parallelism; with many (wing, 1M-node graphs) 4 warps
      keep the cross-warp sum cheap.
    * hub-heavy graphs split their long windows into units of 4 warps x 16
      blocks per warp at one 64-feature slab, 32 at several.

    Deterministic: the shape depends on the tiling and D only.
    """
    stats = tiling.stats()
    mbw = stats.max_blocks_per_window
    if mbw <= WHOLE_WINDOW_BLOCKS:
        nwarps = 8 if stats.windows * n_slabs < FEW_CTAS else 4
        return nwarps, max(1, -(-mbw // nwarps))
    return 4, 16 if n_slabs == 1 else 32


def plan_sddmm(problem):
    """The :class:`.._problem.Plan` of an SDDMM on TF32 tensor cores, TC-GNN's 16x8 tiles: this family's launch
    (:func:`sddmm_launch`), planned once (:func:`.._launch.sddmm_plan`)."""
    return sddmm_plan(problem, sddmm_launch)


def sddmm_launch(tiling, dtype, D, aligned, multiply_values):
    """The 16x8 TF32 SDDMM's launch (float32; ``run(values, Xa, Xb, out)``)."""
    bpw, warps, n_blocks = SDDMM_BLOCKS_PER_WARP, kp.SDDMM_WARPS, tiling.n_blocks
    fixed = dict(win_ptr=tiling.win_ptr, n_windows=tiling.n_windows, block_ptr=tiling.block_ptr,
                 block_cols=tiling.block_cols, tile_pos=tiling.tile_pos, M=tiling.shape[0], n_blocks=n_blocks, D=D,
                 multiply=int(multiply_values), bpw=bpw)
    return sddmm("tf32", kp.sddmm_tf32_name(aligned), -(-n_blocks // (bpw * warps)), 32 * warps, fixed,
                 warps * kp.SDDMM_TF32_SMEM_PER_WARP)
