"""Layer 2: the vector layout's partition, shared by its float32 and 16-bit families: the statistics' rule
(:func:`partition`: features per warp, the unit size, in-launch sums), the one-CTA-per-window choice, and the
launches of a kernel on either.

The partition (blocks per unit) fixes the order of every sum; the families pick kernels for it.
"""

import dataclasses
from typing import NamedTuple

import numpy as np

from .._tuning import options, overrides_key
from ._launch import Scratch, compiled, fixup, partial_scratch, spmm
from ._plans import (LENGTH_TABLE_MAX, VEC_UNITS_PER_WINDOW_MAX, sm_count, sorted_plan, vec_counts, vec_hist,
                     vec_longer, vec_longest, vec_meta, vec_plan)

__all__ = ["Config", "NO_PLAN", "Shape", "VEC_COOP_CTAS", "VEC_L1_MAX_D", "VEC_L1_SKEW", "VEC_ONE_WAVE_WARPS",
           "VEC_RESIDENT_WARPS", "VEC_SHORT_UNIT", "VEC_UNIT_SIZES", "VEC_WIDE_WARPS", "async_l1", "async_rows",
           "async_unroll", "coop_launch", "layout_launches", "partition", "partition_launch", "partition_units",
           "vec_coop", "vec_unit_size"]


#: 64 features per warp (instead of 32) while units x slices still give this many warps per SM: a warp then
#: reads each block's metadata once for twice the features, which pays only while enough warps remain to hide
#: the gathers' latency (graphs of few, long windows lose with fewer warps).
VEC_WIDE_WARPS = 32
#: Blocks per unit the automatic choice of the vector layout considers (4 blocks = 16 column vectors).
#: Windows of fewer than 16 blocks are never cut: a part's partial tile, fence and counter cost more than
#: the parallelism gained.
VEC_UNIT_SIZES = (16, 32, 64, 128, 256)
#: Warps of the vector SpMM resident per SM (8 CTAs of 4 warps at 64 registers).
VEC_RESIDENT_WARPS = 32
#: Units of at most this many blocks on average take 2-block cp.async steps (:func:`async_unroll`).
VEC_SHORT_UNIT = 16
#: A grid of at most this many warps per SM keeps its plan's order (:func:`partition_units`): the fewest the vector
#: SpMM kernels' launch bounds promise resident (4 CTAs of 4 warps), so such a grid is one wave whichever kernel
#: runs it.  Some hold fewer than :data:`VEC_RESIDENT_WARPS` (the cp.async kernels of 64 features per warp fit six
#: CTAs of 36 KB of stages), and a grid between the two ran in more than one wave with its longest units last.
VEC_ONE_WAVE_WARPS = 16


def async_rows(D, vec):
    """Whether the cp.async vector SpMM can gather X's rows: 16-byte aligned, and 4 D bytes fit an int."""
    return vec and D < 1 << 29


def partition(tiling, D, half=False, slices=None):
    """``(slices, blocks per unit, combine)`` of the vector SpMM from the tiling's statistics and the SM count.

    ``slices`` (float4 groups per lane: a warp covers ``32 * slices`` features) unless given: 2 while the grid
    still holds :data:`VEC_WIDE_WARPS` warps per SM (a warp then reads each block's metadata once for twice
    the features), else 1.  The blocks per unit fix the partition of each window, hence the order of every
    sum (:func:`vec_unit_size`).  ``combine``: split windows of at most ``options()["vec_combine_parts_max"]``
    parts are summed inside the launch (the last part's warp reads them all); longer ones go to the fixup
    launch, which spreads each sum over threads.  Without split windows it is False: the kernel then carries no
    code for sums it would never make.  ``half``: the 16-bit kernel's units.
    """
    def shape(slices):
        n_slices = -(-D // (32 * slices))
        return n_slices, options()["vec_blocks_per_unit"] or vec_unit_size(tiling, n_slices, half)

    if slices is None:
        slices = 1
        if D > 32 and options()["vec_max_slices"] >= 2:
            n2, bpu2 = shape(2)
            wide = VEC_WIDE_WARPS * sm_count(tiling)
            if _units_bound(tiling, bpu2) * n2 >= wide and vec_counts(tiling, bpu2)["units"] * n2 >= wide:
                slices = 2
    bpu = shape(slices)[1]
    max_parts = vec_counts(tiling, bpu)["max_parts"]
    return slices, bpu, 1 < max_parts <= options()["vec_combine_parts_max"] and options()["vec_combine"]


def async_unroll(tiling, bpu, coop):
    """Blocks per cp.async step of the vector SpMM (2 or 4) on ``bpu`` blocks per unit.

    2 where units are short: one CTA per window (:func:`vec_coop`: a small grid, whose time is a warp's chain of
    steps), or at most :data:`VEC_SHORT_UNIT` blocks per unit on average, where 4-block steps leave a unit too
    few steps to keep two in flight; else 4, which halves the steps of long units.
    """
    if coop:
        return 2
    return 2 if tiling.n_blocks <= VEC_SHORT_UNIT * max(vec_counts(tiling, bpu)["units"], 1) else 4


#: The cp.async gathers of at most this many features go through L1 on skewed tilings (:func:`async_l1`): a row
#: of 64 features is two 128-byte lines, and wider rows' lines evict more of what the SM's warps gather again.
VEC_L1_MAX_D = 64
#: ... where the longest window holds at least this many times the mean blocks per window: hub rows, and in the
#: graphs measured hub columns with them, whose X rows an SM's warps gather again and again.
VEC_L1_SKEW = 8


def async_l1(tiling, D):
    """Whether the vector SpMM's cp.async gathers of ``D`` features copy X's rows through L1: at most
    :data:`VEC_L1_MAX_D` features, on a tiling whose longest window is at least :data:`VEC_L1_SKEW` times its mean
    (the window histogram's statistics, read once per tiling).  Through L1 a hub's row that an SM gathers again hits
    there, not in L2; on even tilings the copies only take L1 from the staged rows."""
    if D > VEC_L1_MAX_D or not tiling.n_blocks:
        return False
    return vec_longest(tiling) * tiling.n_windows >= VEC_L1_SKEW * tiling.n_blocks


def partition_units(tiling, bpu, n_slices=None):
    """``(plan, units, unit_k0, meta)`` of the usual launch on ``bpu`` blocks per unit: its plan's splits and counts
    (:func:`.vec_plan`), its units in launch order (longest first, unless ``options()["vec_sort_units"]`` is off:
    the grid's tail is then made of short ones) and the blocks' metadata.  A grid of ``n_slices`` per unit that
    every SM holds at once (:data:`VEC_ONE_WAVE_WARPS` warps each) keeps the plan's order: it has no tail to
    order, and a new matrix's first product would pay the sort.  Where such a plan cuts no window its units are
    the windows in order, which the kernels read from the window pointers: ``units`` and ``unit_k0`` are None,
    and no plan is built or uploaded (:data:`NO_PLAN`)."""
    counts = vec_counts(tiling, bpu)
    one_wave = n_slices is not None and counts["units"] * n_slices <= VEC_ONE_WAVE_WARPS * sm_count(tiling)
    if options()["vec_sort_units"] and not one_wave:
        return tiling.cached(("vec_sorted", bpu), lambda: sorted_plan(tiling, bpu)) + (vec_meta(tiling),)
    if counts["max_parts"] <= 1:
        return NO_PLAN, None, None, vec_meta(tiling)
    plan = vec_plan(tiling, bpu)
    return plan, plan["units"], plan["unit_k0"], vec_meta(tiling)


#: The plan of a launch whose units the kernels read from the window pointers (no window cut): no slots.
NO_PLAN = {"n_slots": 0}


def partition_launch(tiling, D, slices, units, combine, kernel, smem, nw, fix_kernel, extra=(), dense=False):
    """The launch of ``kernel`` (``(family, name)``) on the usual ``units`` (:func:`partition_units`; not COOP),
    ``32 * slices`` features per warp, ``nw`` warps per CTA and ``smem`` bytes: split windows summed in it
    (``combine``), or by the fixup launch of ``fix_kernel`` (a name of the family), their buffers the tiling's
    (:func:`.._launch.partial_scratch`); ``extra``: the operands after ``(values, X, Y)`` (the 16-bit kernel's
    unscale); ``dense``: the kernel reads the values dense."""
    plan, units, unit_k0, meta = units
    n_slices = -(-D // (32 * slices))
    n_units = tiling.n_windows if units is None else units.shape[0]
    n_work, n_slots, M = n_units * n_slices, plan["n_slots"], tiling.shape[0]
    # split windows summed in the launch: one counter per (first slot, slice)
    counters = Scratch("counters", (n_slots * n_slices,), np.int32, zeros=True) if n_slots and combine else None
    partial, scratch = partial_scratch(tiling, n_slots, 8, D, np.float32) if n_slots else (None, None)
    fix = None
    if n_slots and not combine:
        fix = fixup(kernel[0], fix_kernel, plan, M, 8, D, partial, scratch)
    fixed = dict(units=units, win_ptr=tiling.win_ptr, unit_k0=unit_k0, block_cols=tiling.block_cols, meta=meta,
                 counters=counters, M=M, D=D, n_slices=n_slices, n_work=n_work)
    return spmm(*kernel, -(-n_work // nw), 32 * nw, fixed, smem, partial=partial, scratch=scratch, fixup=fix,
                extra=extra, dense=dense, n_slices=n_slices)


def coop_launch(tiling, D, slices, kernel, smem, extra=()):
    """The one-CTA-per-window launch of ``kernel`` (``(family, name)``; ``32 * slices`` features per warp, 4 warps,
    ``smem`` bytes; no partial tiles, counters or fixup).  Its units, each window's blocks in 4 balanced parts
    (possibly empty; the CTA sums them in shared memory), the kernels read from the window pointers: no plan is
    built or uploaded."""
    n_slices = -(-D // (32 * slices))
    n_windows = tiling.n_windows
    fixed = dict(units=None, win_ptr=tiling.win_ptr, unit_k0=None, block_cols=tiling.block_cols,
                 meta=vec_meta(tiling), counters=None, M=tiling.shape[0], D=D, n_slices=n_slices,
                 n_work=4 * n_windows * n_slices)
    return spmm(*kernel, n_windows * n_slices, 128, fixed, smem, extra=extra, n_slices=n_slices)


@dataclasses.dataclass(frozen=True)
class Config:
    """One launch on the vector layout, float32 or 16-bit X: the kernel's config (``SpmmVec``, ``SpmmVecAsync`` or
    ``SpmmVech``) and the blocks per unit, which fix the partition of each window, hence the order of every sum."""

    kernel: object
    bpu: int


class Shape(NamedTuple):
    """One launch on the vector layout, as :func:`layout_launches` takes it."""

    slices: int  # float4 groups per lane: a warp covers 32 x this many features
    bpu: int  # blocks per unit (the partition)
    combine: bool  # split windows summed in the launch (else: the fixup launch)
    coop: bool  # one CTA of 4 warps per window x slice
    kernel: tuple  # (family, name) of the kernel
    smem: tuple  # its shared memory in bytes for 1, 2, ... warps per CTA
    dense: bool = False  # it reads the values dense


def layout_launches(tiling, D, shapes, fix_kernel, extra=()):
    """The launches of ``shapes`` (:class:`Shape`) on the vector layout, built in one pass:
    one CTA of 4 warps per window x slice (``coop``, :func:`coop_launch`), or the usual units of ``bpu`` blocks
    (:func:`partition_launch`) with ``options()["vec_warps"]`` warps per CTA, halved while a CTA would take more
    shared memory than it may; ``fix_kernel``: the fixup kernel's name in the shapes' family, where split windows
    are not summed in the launch; ``extra``: the operands after ``(values, X, Y)``.

    Launches of one geometry (the timed choice's candidates) are built once and differ only in their kernel, shared
    memory and ``dense`` flag.
    """
    from ..kernels.products import SPMM_SMEM_LIMIT

    warps, frames, units, out = options()["vec_warps"], {}, {}, []
    for s in shapes:
        nw = 4 if s.coop else warps
        while not s.coop and nw > 1 and s.smem[nw - 1] > SPMM_SMEM_LIMIT:
            nw //= 2
        geometry = (s.coop, s.slices, s.bpu, s.combine, nw)
        frame = frames.get(geometry)
        if frame is not None:
            compiled(*s.kernel)
            out.append(frame.with_kernel(s.kernel[1], s.smem[nw - 1], s.dense))
            continue
        if s.coop:
            frame = coop_launch(tiling, D, s.slices, s.kernel, s.smem[nw - 1], extra=extra)
        else:
            n_slices = -(-D // (32 * s.slices))
            if (s.bpu, n_slices) not in units:
                units[s.bpu, n_slices] = partition_units(tiling, s.bpu, n_slices)
            frame = partition_launch(tiling, D, s.slices, units[s.bpu, n_slices], s.combine, s.kernel,
                                     s.smem[nw - 1], nw, fix_kernel, extra=extra, dense=s.dense)
        out.append(frames.setdefault(geometry, frame))
    return out


#: The automatic choice of the one-CTA-per-window launch (:func:`vec_coop`): at most this many CTAs of a window
#: x 32 features per SM (and a warp's quarter of the longest window at most options()["vec_coop_chain"] usual units).
VEC_COOP_CTAS = 16


def vec_coop(tiling, D, half=False):
    """Whether the vector SpMM (float32 or 16-bit X) takes one CTA per window x slice (:func:`coop_launch`).

    ``options()["vec_coop"]`` True / False, or None: by the grid, where it pays: at most
    :data:`VEC_COOP_CTAS` CTAs per SM (a small grid, whose time is a warp's chain of steps), a window the
    usual units split (its parts summed through global partial tiles: a fence, a counter and a second read),
    and none so long that a warp's quarter of it exceeds ``options()["vec_coop_chain"]`` usual units (a CTA's
    4 warps take a long window alone).  Grids of short unsplit windows gain nothing from it, and long
    windows lose, so neither takes it.
    """
    mode = options()["vec_coop"]
    if mode is not None:
        return bool(mode)
    n_slices = -(-D // 32)
    if tiling.n_windows * n_slices > VEC_COOP_CTAS * sm_count(tiling):
        return False
    longest = vec_longest(tiling)
    bpu = options()["vec_blocks_per_unit"] or vec_unit_size(tiling, n_slices, half)
    return bpu < longest <= 4 * options()["vec_coop_chain"] * bpu


def vec_unit_size(tiling, n_slices, half=False):
    """Blocks per unit of the vector SpMM, from the tiling's blocks-per-window histogram.

    The largest size in :data:`VEC_UNIT_SIZES` whose units x slices still give
    ``options()["vec_target_warps"]`` warps per SM: long windows are cut into balanced parts only as far
    as the GPU needs parallelism (each cut costs a partial tile written and read
    again), and no further than keeps the longest unit within
    ``options()["vec_tail_factor"]`` times the blocks each resident warp gets on
    average: on small grids that longest unit is the kernel's critical path.
    Nor beyond ``max(that mean, options()["vec_tail_floor"])`` blocks: on large grids
    units twice a resident warp's share leave SMs idle while the last of them run.
    ``half``: the 16-bit kernel's units, capped by ``options()["half_tail_floor"]``
    instead: it moves half the bytes a block, so its grids run short of warps sooner.
    No separate rule for hub windows: the caps bound their units, and a rule of its
    own cut them too finely.
    """
    def build():
        target = options()["vec_target_warps"] * sm_count(tiling)
        smallest = VEC_UNIT_SIZES[0]
        if (_units_bound(tiling, smallest) * n_slices < target
                and tiling.n_blocks <= smallest * VEC_UNITS_PER_WINDOW_MAX):
            return smallest  # (no size reaches the target: the rule's answer, without a pass over the windows)
        return _unit_size(_size_stats(tiling), sm_count(tiling), n_slices, half)

    return tiling.cached(("vec_unit_size", n_slices, half, overrides_key()), build)


def _units_bound(tiling, bpu):
    """At least the units of any plan of ``bpu`` or more blocks per unit, in O(1): a window of ``nb`` blocks takes
    at most ``nb // bpu + 1`` units.  A small grid's launch is chosen from it without passes over the windows, which
    a new matrix's first product would pay in NumPy calls."""
    return tiling.n_blocks // bpu + tiling.n_windows


def _size_stats(tiling):
    """``(longest window, blocks, units per size of VEC_UNIT_SIZES)`` of the blocks-per-window histogram (cached on
    the tiling): what :func:`_unit_size` reads, for every width: the translation's counts where it made them for
    these sizes (:class:`~tcgnn_py.tiles.WindowStats`), else from one table of the windows' lengths
    (:func:`.vec_longer`), or one pass over the windows where the longest is too long for it."""
    def build():
        stats = tiling.peek("window_stats")
        if stats is not None and stats.sizes == VEC_UNIT_SIZES:  # (an empty window keeps one unit)
            return stats.longest, tiling.n_blocks, tuple([u + stats.empty for u in stats.units])
        longest = vec_longest(tiling)
        if longest > LENGTH_TABLE_MAX:
            nb = np.asarray(vec_hist(tiling))
            empty = int(np.count_nonzero(nb == 0))  # (an empty window keeps one unit)
            units = tuple([int(((nb + (size - 1)) // size).sum()) + empty for size in VEC_UNIT_SIZES])
            return longest, int(nb.sum()), units
        longer = vec_longer(tiling)
        empty = tiling.n_windows - int(longer[0])
        return longest, int(longer.sum()), tuple([int(longer[::size].sum()) + empty for size in VEC_UNIT_SIZES])

    return tiling.cached("vec_size_stats", build)


def _unit_size(stats, sms, n_slices, half):
    """:func:`vec_unit_size` of the histogram's :func:`_size_stats` on ``sms`` multiprocessors."""
    longest, blocks, units_per_size = stats
    target = options()["vec_target_warps"] * sms
    floor = -(-longest // VEC_UNITS_PER_WINDOW_MAX)
    factor = options()["vec_tail_factor"]
    # The grid's critical path is its longest unit: keep it within `factor` x the mean work of a resident warp.
    per_warp = blocks * n_slices / (VEC_RESIDENT_WARPS * sms)
    cap = np.inf if factor is None else factor * per_warp
    tail_floor = options()["half_tail_floor" if half else "vec_tail_floor"]
    if tail_floor:
        cap = min(cap, max(per_warp, tail_floor))
    best = VEC_UNIT_SIZES[0]
    for size, units in zip(VEC_UNIT_SIZES, units_per_size):
        if units * n_slices >= target and min(size, longest) <= max(cap, VEC_UNIT_SIZES[0]):
            best = size
    return max(best, floor)
