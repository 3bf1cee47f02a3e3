"""Layer 2: the vector layout's SpMM launches: the statistics' default, the timed choice's candidates, the launch.

Every candidate keeps the partition of the work, so all give the same bits; the timed choice
(:func:`vec_timed`) only changes speed.
"""

import functools
from typing import NamedTuple

import numpy as np

from ._tuning import options, overrides_key
from ._plans import VEC_DENSE_BYTES_MAX, VEC_UNITS_PER_WINDOW_MAX, sm_count, sorted_units, vec_coop_units, vec_hist, vec_meta, vec_plan
from ._launches import Fixup, Provisional, VecSpmmLaunch, run_half, run_spmm

__all__ = [
    "VEC_COOP_CTAS",
    "VEC_RESIDENT_WARPS",
    "VEC_TIMED_MARGIN",
    "VEC_TIMED_MAX_WORK",
    "VEC_TIMED_ROUNDS",
    "VEC_UNIT_SIZES",
    "VEC_WIDE_WARPS",
    "VecChoice",
    "half_candidates",
    "pick_fastest",
    "timed_choices",
    "vec_candidates",
    "vec_choice",
    "vec_coop",
    "vec_launch",
    "vec_timed",
    "vec_unit_size",
]


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


class VecChoice(NamedTuple):
    """One launch of the vector SpMM: the knobs the timed choice varies and the partition it keeps."""

    slices: int  # float4 groups per lane: a warp covers 32 * slices features
    bpu: int  # blocks per unit: fixes the partition of each window, hence the order of every sum
    cp_async: bool  # X rows through the cp.async pipeline (16-byte aligned rows), else straight to registers
    combine: bool  # split windows summed inside the launch, else by the fixup launch
    unroll: int = 4  # blocks per step (their loads issued together; the MMAs pair the same blocks whatever it is)
    dense: bool = False  # values read dense, 32 per block (vec_dense_values): no metadata, one load per block
    ks: int = 0  # 16-bit kernel: k16 chunks (4 blocks each) per step (0: 1)
    stages: int = 0  # 16-bit kernel: steps in flight per warp (0: 2)
    coop: bool = False  # one CTA per window x slice, its 4 parts summed in shared memory (vec_coop_units)
    l1: bool = False  # cp.async copies of X rows through L1 (TF32)


def _async_rows(D, vec):
    """Whether the cp.async vector SpMM can gather X's rows: 16-byte aligned, and 4 D bytes fit an int."""
    return vec and D < 1 << 29


def vec_choice(tiling, D, vec, half=None):
    """The vector SpMM's launch from the tiling's statistics and the SM count (no timing).

    ``options()["vec_kernel"]`` (a config of :data:`.kernels.products.VEC_SPMM_CONFIGS`) fixes the
    float32 kernel instead; the partition (blocks per unit) is the statistics' all the same.
    """
    from .kernels import products as kp

    def shape(slices):
        n_slices = -(-D // (32 * slices))
        return n_slices, options()["vec_blocks_per_unit"] or vec_unit_size(tiling, n_slices, half is not None)

    forced = options()["vec_kernel" if half is None else "half_kernel"]
    if forced is not None and half is not None:
        if (forced.FS, forced.KS, forced.NS) not in (kp.VEC_HALF_COOP if forced.COOP else kp.VEC_HALF):
            raise ValueError(f"half_kernel={forced!r} has no compiled shape: see kernels.products.VEC_HALF")
        if not vec:
            forced = None  # unaligned rows: one configuration
    elif forced is not None and forced not in kp.VEC_SPMM_CONFIGS:
        raise ValueError(f"vec_kernel={forced!r} is not compiled: see kernels.products.VEC_SPMM_CONFIGS")
    if forced is not None:
        slices = forced.FS
    elif half is not None and not vec:
        slices = kp.HALF_DEFAULT[0]  # unaligned rows: one configuration
    else:
        # Wider slices (64 features per warp) read each block's metadata half as often, but halve the warps:
        # keep them only while the grid still holds VEC_WIDE_WARPS warps per SM.
        slices = 1
        if D > 32 and options()["vec_max_slices"] >= 2:
            n2, bpu2 = shape(2)
            if vec_plan(tiling, bpu2)["units"].shape[0] * n2 >= VEC_WIDE_WARPS * sm_count(tiling):
                slices = 2
    bpu = shape(slices)[1]
    # Split windows of at most options()["vec_combine_parts_max"] parts are summed inside the SpMM launch (the
    # last part's warp reads them all); longer ones go to the fixup launch, which spreads each sum over threads.
    max_parts = vec_plan(tiling, bpu)["max_parts"]
    combine = 0 < max_parts <= options()["vec_combine_parts_max"] and options()["vec_combine"]
    cp_async = half is None and _async_rows(D, vec)
    if isinstance(forced, kp.SpmmVech):
        return VecChoice(slices, bpu, False, forced.COMBINE and not forced.COOP, ks=forced.KS, stages=forced.NS,
                         coop=forced.COOP)
    if isinstance(forced, kp.SpmmVec):
        return VecChoice(slices, bpu, False, forced.COMBINE, forced.U)
    if forced is not None and cp_async:  # (rows cp.async cannot copy take the rule's launch)
        if forced.COOP:
            return VecChoice(slices, bpu, True, False, forced.U, coop=True)
        return VecChoice(slices, bpu, True, forced.COMBINE, forced.U, forced.DV, l1=forced.L1)
    if cp_async and vec_coop(tiling, D):
        return VecChoice(slices, bpu, True, False, kp.VEC_UNROLL, coop=True)
    if half is not None and vec and (slices, 1, 2) in kp.VEC_HALF_COOP and vec_coop(tiling, D, True):
        return VecChoice(slices, bpu, False, False, ks=1, stages=2, coop=True)
    return VecChoice(slices, bpu, cp_async, combine, kp.VEC_UNROLL)


def vec_candidates(tiling, D, vec):
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
    from .kernels import products as kp

    default = vec_choice(tiling, D, vec)
    if options()["vec_kernel"] is not None or not _async_rows(D, vec):
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


def half_candidates(tiling, D, vec, half):
    """The 16-bit vector SpMM launches the timed choice compares: the default first.

    As :func:`vec_candidates`, every candidate keeps the default's partition, and
    the 16-bit kernel's compiled shapes (:data:`.kernels.products.VEC_HALF`: 32 or
    64 features per warp, 1 or 2 k16 chunks per step, 2 or 3 steps in flight) only
    change which warp computes an output and how far its loads run ahead: each
    output is the same MMAs in the same order, and split windows are summed in part
    order by the launch or by the fixup.  Unaligned rows have one compiled shape.
    """
    from .kernels import products as kp

    def fits(slices):  # 64 features per warp only for D > 32, and within the cap
        return slices == 1 or (16 * slices < D and slices <= options()["vec_max_slices"])

    default = vec_choice(tiling, D, vec, half)
    if not vec or options()["half_kernel"] is not None:
        return [default]
    if default.coop:  # its own partition (4 parts per window): candidates among its own shapes
        return list(dict.fromkeys([default] + [default._replace(slices=f, ks=ks, stages=ns)
                                               for f, ks, ns in kp.VEC_HALF_COOP if fits(f)]))
    default = default._replace(ks=1, stages=2)
    has_splits = vec_plan(tiling, default.bpu)["n_slots"] > 0
    out = [default]
    for slices, ks, stages in kp.VEC_HALF:
        if not fits(slices):
            continue
        for combine in (True, False) if has_splits else (False,):
            c = default._replace(slices=slices, ks=ks, stages=stages, combine=combine)
            if c not in out:
                out.append(c)
    return out


#: The timed choice replaces the default launch only with one at least this much faster: timing noise
#: must not flip a product between launches from one process to the next.
VEC_TIMED_MARGIN = 0.03
#: Timed calls of each candidate (after a warm-up round); the least counts.
VEC_TIMED_ROUNDS = 3
#: Products of more blocks x features than this keep the statistics' launch untimed: calls of ~0.3 ms and more,
#: where timing 16 candidates costs ~100 ms and picked the statistics' launch on the 1M-node graphs anyway.
VEC_TIMED_MAX_WORK = 10**8


def pick_fastest(ms, margin=VEC_TIMED_MARGIN):
    """Index of the fastest of ``ms``, or 0 (the default) unless that one is ``margin`` faster.

    >>> pick_fastest([10.0, 9.8, 12.0]), pick_fastest([10.0, 9.0, 12.0])
    (0, 1)
    """
    best = min(range(len(ms)), key=ms.__getitem__)
    return best if ms[best] < (1.0 - margin) * ms[0] else 0


def vec_timed(cp, tiling, dtype, D, vec, values, X, Y, half=None, unscale=None):
    """The fastest launch of :func:`vec_candidates` on the operands of the call being planned.

    Timed once per (tiling, D, alignment, tuning), GPU time only (the calls are
    queued behind a spin kernel): one warm-up and :data:`VEC_TIMED_ROUNDS` calls
    of each candidate, which write Y (the planned call then writes it again).
    The candidates give bit-identical results, so the choice changes speed only.
    Under CUDA-graph capture nothing can be timed, and large products
    (:data:`VEC_TIMED_MAX_WORK`) are not: the default is kept.  The
    times are kept on the tiling, under ``("vec_timed", D, vec, tuning version)``.
    ``half``: ``(X type, split values, Y type)`` of the 16-bit kernel, whose candidates are
    :func:`half_candidates` (``values`` its 16-bit values, ``unscale`` theirs; times under
    ``("half_timed", half, D, vec, tuning version)``).
    """
    from .kernels.registry import background_compiles, compile_in_background, is_compiled
    from .kernels.timing import time_round_robin

    if tiling.n_blocks * D > VEC_TIMED_MAX_WORK or cp.cuda.get_current_stream().is_capturing():
        return vec_launch(cp, tiling, dtype, D, vec, half)
    choices = vec_candidates(tiling, D, vec) if half is None else half_candidates(tiling, D, vec, half)
    # A first product must not wait for a family's worth of compiles: the default (compiled now) and the
    # candidates compiled already are timed; the others compile in the background, and the launch stays
    # provisional until they are done (planned).
    needs = [_choice_kernels(cp, tiling, dtype, D, vec, half, c) for c in choices]
    missing = {k for ks in needs[1:] for k in ks if not is_compiled(*k)} - set(needs[0])
    if not background_compiles():
        missing = set()  # compiled here, by vec_launch, before the timing
    futures = []
    if missing:
        for family in sorted({f for f, _ in missing}):
            futures += compile_in_background(family, sorted(n for f, n in missing if f == family))
        choices = [c for i, c in enumerate(choices) if i == 0 or not missing.intersection(needs[i])]
    scratch = {}  # one set of partial tiles for all candidates (same partition), not one each
    launches = [vec_launch(cp, tiling, dtype, D, vec, half, choice=c, scratch=scratch) for c in choices]
    if len(launches) == 1:
        return Provisional(launches[0], futures) if futures else launches[0]
    if half is None:
        calls = [functools.partial(run_spmm, cp, launch, tiling, values, X, Y, dtype) for launch in launches]
        key = ("vec_timed", D, vec, overrides_key())
    else:
        calls = [functools.partial(run_half, launch, tiling, values, X, Y, unscale) for launch in launches]
        key = ("half_timed", half, D, vec, overrides_key())
    ms = time_round_robin(calls, VEC_TIMED_ROUNDS)
    tiling.put(key, dict(zip(choices, ms)))
    best = launches[pick_fastest(ms)]
    return Provisional(best, futures) if futures else best


def timed_choices(tiling):
    """What the timed choices on ``tiling`` measured: one dict per product signature timed (oldest first).

    Each has ``"x_dtype"``, ``"D"``, ``"aligned"``, ``"tuning"`` (the overrides in effect), ``"ms"``
    (each candidate's :class:`VecChoice` as a dict -> milliseconds, the default first) and ``"kept"``
    (the index of the launch kept, :func:`pick_fastest`).
    """
    out = []
    for kind in ("vec_timed", "half_timed"):
        for key, ms in tiling.cached_items(kind):
            xdt = "float32" if kind == "vec_timed" else key[1][0]
            D, aligned, tuned = key[-3:]
            times = list(ms.values())
            out.append({"x_dtype": xdt, "D": D, "aligned": aligned, "tuning": dict(tuned),
                        "ms": [(c._asdict(), t) for c, t in ms.items()], "kept": pick_fastest(times)})
    return out


def _choice_kernels(cp, tiling, dtype, D, vec, half, choice):
    """``(family, name)`` of every kernel the launch of ``choice`` needs (nothing is compiled to find out)."""
    names = []

    def record(family, name):
        names.append((family, name))

    vec_launch(cp, tiling, dtype, D, vec, half, choice=choice, scratch={}, get=record)
    return tuple(names)


def vec_launch(cp, tiling, dtype, D, vec, half=None, choice=None, scratch=None, get=None):
    """The launch of the vector-layout SpMM; split windows summed in it, or by a fixup launch for hubs.

    ``half``: ``(X type, split values, Y type)`` of the 16-bit kernel (``vec``: rows aligned for cp.async).
    ``choice``: a :class:`VecChoice` (default: :func:`vec_choice`).  ``scratch``: the per-stream scratch
    store, shared by launches of one partition (the timed choice's candidates: one set of partial tiles).
    ``get(family, name)``: where kernels come from (default: compiled on first use).
    """
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    get_kernel = get or get_kernel
    choice = choice or vec_choice(tiling, D, vec, half)
    if choice.coop:
        return _vec_coop_launch(tiling, D, choice, half, get_kernel)
    slices, bpu, cp_async, combine, unroll, dense, ks, stages, _, l1 = choice
    n_slices = -(-D // (32 * slices))
    plan = vec_plan(tiling, bpu)
    units, unit_k0 = plan["units"], plan["unit_k0"]
    if options()["vec_sort_units"]:
        units, unit_k0 = tiling.cached(("vec_sorted", bpu), lambda: sorted_units(tiling, bpu))
    n_work = units.shape[0] * n_slices
    nw = options()["vec_warps"]
    smem = 0
    if half is not None:
        cfg = (slices, ks or 1, stages or 2) if vec else kp.HALF_DEFAULT
        if cfg not in kp.VEC_HALF:
            raise ValueError(f"no 16-bit SpMM compiled for (slices, ks, stages) = {cfg}: see kernels.products.VEC_HALF")
        while nw > 1 and kp.vech_smem(nw, *cfg) > kp.SPMM_SMEM_LIMIT:
            nw //= 2
        smem = kp.vech_smem(nw, *cfg)
        kernel = get_kernel("half", kp.spmm_vech_name(half[0], half[1], half[2], *cfg, combine, vec))
    elif cp_async:
        while nw > 1 and kp.vec_async_smem(nw, slices, unroll, kp.VEC_STAGES) > kp.SPMM_SMEM_LIMIT:
            nw //= 2
        smem = kp.vec_async_smem(nw, slices, unroll, kp.VEC_STAGES)
        kernel = get_kernel("vec", kp.vec_spmm_config(slices, unroll, True, combine, dense, l1=l1).name)
    else:
        kernel = get_kernel("vec", kp.vec_spmm_config(slices, unroll, False, combine).name)
    launch = VecSpmmLaunch(kernel, (-(-n_work // nw),), (32 * nw,), smem, units, unit_k0, vec_meta(tiling),
                           n_slices, n_work, plan["n_slots"] * n_slices if combine else 0,
                           {} if scratch is None else scratch,
                           n_slots=plan["n_slots"],
                           sizes=tuple(np.int32(v) for v in (tiling.shape[0], D, n_slices, n_work)),
                           dense=bool(dense and cp_async))
    if plan["n_slots"] and not combine:
        fix_grid = (plan["splits"].shape[0], min(-(-(8 * D) // kp.FIXUP_THREADS), 1024))
        fix = (get_kernel("vec", kp.fixup_name(dtype.name)) if half is None else
               get_kernel("half", kp.fixup_name("float32", dtype.name)))
        launch = launch._replace(fixup=Fixup(fix, fix_grid, plan["splits"], plan["n_slots"]))
    return launch


#: The automatic choice of the one-CTA-per-window launch (:func:`vec_coop`): at most this many CTAs of a window
#: x 32 features per SM (and a warp's quarter of the longest window at most options()["vec_coop_chain"] usual units).
VEC_COOP_CTAS = 16


def vec_coop(tiling, D, half=False):
    """Whether the vector SpMM (float32 or 16-bit X) takes one CTA per window x slice (:func:`vec_coop_units`).

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
    longest = int(vec_hist(tiling).max(initial=0))
    bpu = options()["vec_blocks_per_unit"] or vec_unit_size(tiling, n_slices, half)
    return bpu < longest <= 4 * options()["vec_coop_chain"] * bpu


def _vec_coop_launch(tiling, D, choice, half=None, get=None):
    """The one-CTA-per-window launch of ``choice`` (2 stages; no partial tiles, counters or fixup).

    ``half``: ``(X type, split values, Y type)`` of the 16-bit kernel (aligned rows), as :func:`vec_launch`.
    """
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    get_kernel = get or get_kernel
    n_slices = -(-D // (32 * choice.slices))
    units = vec_coop_units(tiling)
    n_windows = units.shape[0] // 4
    if half is None:
        kernel = get_kernel("vec", kp.vec_spmm_config(choice.slices, choice.unroll, True, False, coop=True).name)
        smem = kp.vec_async_smem(4, choice.slices, choice.unroll, kp.VEC_STAGES)
    else:
        cfg = (choice.slices, choice.ks, choice.stages)
        kernel = get_kernel("half", kp.spmm_vech_name(*half, *cfg, coop=True))
        smem = kp.vech_smem(4, *cfg)
    return VecSpmmLaunch(kernel, (n_windows * n_slices,), (128,), smem,
                         units, units, vec_meta(tiling), n_slices, units.shape[0] * n_slices, 0, {},  # unit_k0: unread
                         sizes=tuple(np.int32(v) for v in (tiling.shape[0], D, n_slices, units.shape[0] * n_slices)))


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
    nb, sms = vec_hist(tiling), sm_count(tiling)
    target = options()["vec_target_warps"] * sms
    longest = int(nb.max(initial=0))
    floor = -(-longest // VEC_UNITS_PER_WINDOW_MAX)
    factor = options()["vec_tail_factor"]
    # The grid's critical path is its longest unit: keep it within `factor` x the mean work of a resident warp.
    per_warp = int(nb.sum()) * n_slices / (VEC_RESIDENT_WARPS * sms)
    cap = np.inf if factor is None else factor * per_warp
    tail_floor = options()["half_tail_floor" if half else "vec_tail_floor"]
    if tail_floor:
        cap = min(cap, max(per_warp, tail_floor))
    best = VEC_UNIT_SIZES[0]
    for size in VEC_UNIT_SIZES:
        units = int(np.maximum(-(-nb // size), 1).sum())
        if units * n_slices >= target and min(size, longest) <= max(cap, VEC_UNIT_SIZES[0]):
            best = size
    return max(best, floor)
