"""Layer 2: work plans and tiling-derived data of the product launches (units, masks, histograms).

Each is computed once per tiling and cached on it (:meth:`Tiling.cached`); small tilings are planned on the
host with NumPy and uploaded, larger ones with CuPy where they live.
"""


import numpy as np

from .. import _reference as ref
from .._device import device_attributes, scratch_views, to_host
from ..tiles import HOST_PLAN_MAX, kernels_ran


__all__ = [
    "SDDMM_BLOCKS_PER_WARP",
    "UNITS_PER_WINDOW_MAX",
    "VEC_UNITS_PER_WINDOW_MAX",
    "DEVICE_PLAN_WINDOWS_MAX",
    "DEVICE_SORT_LONGEST_MAX",
    "LENGTH_TABLE_MAX",
    "build_plan",
    "device_plan",
    "plan_counts",
    "sm_count",
    "sorted_plan",
    "spmm_plan",
    "tile_mask",
    "vec_counts",
    "vec_hist",
    "vec_longer",
    "vec_longest",
    "vec_meta",
    "vec_plan",
]


# Work decomposition of the SpMM kernels (see the kernels.products package).
UNITS_PER_WINDOW_MAX = 64  # a hub window is split over at most this many CTAs
#: Blocks each warp of the 16x8 and CUDA-core SDDMM takes.
SDDMM_BLOCKS_PER_WARP = 4


#: A window of the vector layout is cut into at most this many units (their partial tiles are summed in order).
VEC_UNITS_PER_WINDOW_MAX = 1024


def vec_plan(tiling, bpu):
    return spmm_plan(tiling, bpu, VEC_UNITS_PER_WINDOW_MAX)


def vec_counts(tiling, bpu):
    """``{"units", "n_slots", "max_parts"}`` of :func:`vec_plan` on ``bpu`` blocks per unit, from the blocks-per-window
    histogram on the host (cached): what choosing a launch reads of a plan, without building or uploading one."""
    def build():
        units, n_slots, max_parts, _ = plan_counts(tiling, bpu, VEC_UNITS_PER_WINDOW_MAX)
        return {"units": units, "n_slots": n_slots, "max_parts": max_parts}

    return tiling.cached(("vec_counts", bpu), build)


def plan_counts(tiling, bpu, max_units):
    """``(units, slots, most parts, windows cut)`` of :func:`spmm_plan`'s plan (cached): the translation's counts
    where it made them for this unit size (:class:`~tcgnn_py.tiles.WindowStats`), else from the blocks-per-window
    histogram on the host; counted once, for choosing a launch and for making the plan on the device."""
    def build():
        longest, n = vec_longest(tiling), tiling.n_windows
        if longest <= bpu:  # (no window cut: a unit each, counted without a pass)
            return n, 0, min(n, 1), 0
        stats = tiling.peek("window_stats")
        if stats is not None and max_units == stats.max_units and bpu in stats.sizes:  # (the translation's counts)
            i = stats.sizes.index(bpu)
            units, cut = stats.capped[i], stats.cut[i]
            return units, units - (n - cut), min(-(-longest // bpu), max_units), cut
        if longest > LENGTH_TABLE_MAX:
            return _counts(vec_hist(tiling), bpu, max_units)
        longer = vec_longer(tiling)
        units = int(longer[:max_units * bpu:bpu].sum()) + n - int(longer[0])  # (an empty window keeps one unit)
        cut = int(longer[bpu]) if max_units > 1 else 0
        return units, units - (n - cut), min(-(-longest // bpu), max_units), cut

    return tiling.cached(("plan_counts", bpu, max_units), build)


#: Tilings whose longest window has at most this many blocks count their plans' units from :func:`vec_longer`, a
#: table as long as that window; longer ones pass over their windows instead.
LENGTH_TABLE_MAX = 1 << 16


def vec_longer(tiling):
    """``longer[x]``: the windows of more than ``x`` blocks, ``x`` from 0 to the longest window's blocks (cached on
    the tiling).  A window of ``nb`` blocks is ``ceil(nb / s)`` units of ``s``, one for each ``j`` with ``nb > j s``,
    so a plan's units of any size are one strided sum of this table: choosing a new matrix's launch counts the
    units of several sizes, and NumPy's calls over the windows, one per size, were most of that."""
    def build():
        nb = vec_hist(tiling)
        return nb.shape[0] - np.cumsum(np.bincount(nb, minlength=1))

    return tiling.cached("vec_longer", build)


def _counts(nb, bpu, max_units):
    """:func:`plan_counts` of the histogram ``nb``: one pass of :func:`_parts`."""
    k = _parts(np, nb, bpu, max_units)
    cut = k > 1
    return int(k.sum()), int(k[cut].sum()), int(k.max(initial=0)), int(np.count_nonzero(cut))


def vec_longest(tiling):
    """Blocks of the longest window (cached on the tiling): the translation's count, where it made one."""
    def build():
        stats = tiling.peek("window_stats")
        return int(vec_hist(tiling).max(initial=0)) if stats is None else stats.longest

    return tiling.cached("vec_longest", build)


def sm_count(tiling):
    """Multiprocessors of the device the tiling lives on (cached on it)."""
    return tiling.cached("sm_count", lambda: device_attributes()["MultiProcessorCount"])


def sorted_plan(tiling, bpu):
    """``(plan, units, unit_k0)``: the vector plan's splits and counts (the plan without its units), and its units
    and split rows longest first, computed where :func:`_planner` computes and uploaded together -- or, where
    :func:`spmm_plan` makes the plan on the device, made and sorted there in one launch (:func:`device_plan`)."""
    top = None  # (no unit of the plan is longer; bounded where the histogram is on the host already)
    if _plans_on_device(tiling):
        top = max(bpu, -(-vec_longest(tiling) // VEC_UNITS_PER_WINDOW_MAX))
    if top is not None and top <= DEVICE_SORT_LONGEST_MAX:
        plan = device_plan(tiling.xp, tiling.win_ptr, None, bpu, VEC_UNITS_PER_WINDOW_MAX,
                           counts=plan_counts(tiling, bpu, VEC_UNITS_PER_WINDOW_MAX), longest=top)
        rest = {k: v for k, v in plan.items() if k not in ("units", "unit_k0")}
        return rest, plan["units"], plan["unit_k0"]
    xp, _ = _planner(tiling)
    on_host = xp is not tiling.xp
    plan = _plan_where_planned(tiling, bpu, VEC_UNITS_PER_WINDOW_MAX) if on_host else vec_plan(tiling, bpu)
    rest = {k: v for k, v in plan.items() if k not in ("units", "unit_k0")}
    return _uploaded(tiling, (rest,) + _longest_first(xp, plan["units"], plan["unit_k0"]))


def _longest_first(xp, units, unit_k0):
    """Units (and their split rows) sorted by decreasing block count, stable: on the host, by the counts' distance
    from the longest in the narrowest unsigned type that holds it (NumPy's stable sort of 8- and 16-bit keys is
    a radix sort, linear; a first product plans here)."""
    length = units[:, 2] - units[:, 1]
    if xp is np and length.shape[0]:
        key = int(length.max()) - length
        top = int(key.max())
        key = key.astype(np.uint8 if top < 1 << 8 else np.uint16 if top < 1 << 16 else np.int64)
    else:
        key = -length.astype(np.int64)
    order = xp.argsort(key, kind="stable")
    return units.take(order, axis=0), unit_k0.take(order, axis=0)  # (rows gathered: a contiguous copy)


def vec_hist(tiling):
    """Blocks per window on the host (cached on the tiling), from its window pointers there (the translation's
    copy, where it made one)."""
    def build():
        win_ptr = _host(tiling, "win_ptr")
        return np.subtract(win_ptr[1:], win_ptr[:-1], dtype=np.int64)

    return tiling.cached("vec_hist", build)


def _host(tiling, name):
    """A structure array of the tiling on the host (cached: the translation may have put the copy there)."""
    return tiling.cached(("host", name), lambda: to_host(getattr(tiling, name)))  # synchronize!


def vec_meta(tiling):
    """``(n_blocks, 2)`` uint32 of an 8x4 tiling: occupancy mask (bit ``4 * row + slot``) and first entry."""
    return _block_meta(tiling, "vec_meta", 1, 2)


def tile_mask(tiling):
    """``(n_blocks, 4)`` uint32 of a 16x8 tiling: bit ``p`` of block ``b`` set when tile position ``p`` is stored
    (cached on it)."""
    return _block_meta(tiling, "mask", 4, 4)


def _block_meta(tiling, key, words, columns):
    """The tiling's block metadata (:func:`tcgnn_py._reference.block_meta`): the translation's, where it made them (the
    same words), else computed where :func:`_planner` computes and cached under ``key``.  The translation's are
    structure arrays like its block columns, made with them on their stream and complete when they are: caching them
    as derived data would wait for the stream (:meth:`Tiling.cached`), a host wait in every new matrix's first
    product."""
    meta = tiling.peek("block_meta")
    if meta is not None and meta.shape[1] == columns:
        return meta

    def build():
        _, arrays = _planner(tiling)
        return _uploaded(tiling, ref.block_meta(arrays("block_ptr"), arrays("tile_pos"), words, columns))

    return tiling.cached(key, build)


def _planner(tiling):
    """``(xp, arrays)``: where the tiling's plans are computed, and its structure arrays there (cached)."""
    if tiling.xp is np or tiling.nnz > HOST_PLAN_MAX:
        return tiling.xp, lambda name: getattr(tiling, name)
    return np, lambda name: _host(tiling, name)


#: Byte alignment of each array in a plan's one upload (:func:`_uploaded`): kernels read plans as int4 / uint4.
_UPLOAD_ALIGN = 256


def _uploaded(tiling, value):
    """A plan built by :func:`_planner`, with its arrays on the tiling's device: copied in one upload (views of one
    device buffer, each :data:`_UPLOAD_ALIGN`-aligned) -- a plan of several arrays is planned on a new matrix's
    first product, and each copy of its own would cost that call a round trip."""
    if tiling.xp is np:
        return value
    arrays = []
    _map_arrays(value, arrays.append)
    if not arrays:
        return value
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // _UPLOAD_ALIGN) * _UPLOAD_ALIGN
    staged = np.empty(max(total, 1), np.uint8)
    for a, o in zip(arrays, offsets):
        staged[o:o + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    buffer = tiling.xp.empty(staged.shape[0], np.uint8)
    # from pageable memory: the driver stages it before returning, without waiting for the stream (cupy.asarray
    # would copy it into pinned memory first, and watch that memory with an event)
    buffer.data.copy_from_host_async(staged.ctypes.data, staged.nbytes, tiling.xp.cuda.get_current_stream())
    ndarray, base = tiling.xp.ndarray, buffer.data
    views = iter([ndarray(a.shape, a.dtype, memptr=base + o if a.nbytes else None) for a, o in zip(arrays, offsets)])
    return _map_arrays(value, lambda a: next(views))


def _map_arrays(value, f):
    """``value`` (a plan: NumPy arrays in dicts and tuples, beside plain values) with ``f(a)`` for each array ``a``,
    in a fixed order."""
    if isinstance(value, np.ndarray):
        return f(value)
    if isinstance(value, dict):
        return {k: _map_arrays(v, f) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_map_arrays(v, f) for v in value)
    return value


def spmm_plan(tiling, blocks_per_unit, max_units=None):
    """Work plan of the SpMM kernels for one unit size, cached on the tiling.

    ``units`` rows are ``(window, first block, end block, slot)``: a window of
    ``nb`` blocks becomes ``k = ceil(nb / blocks_per_unit)`` units (at most
    ``max_units``, default ``UNITS_PER_WINDOW_MAX``; an empty window keeps one unit, which writes its
    zero rows).  Units of a split window (``k > 1``) write partial tiles to
    consecutive slots; ``splits`` rows are ``(window, first slot, k, 0)``.
    """
    max_units = UNITS_PER_WINDOW_MAX if max_units is None else max_units

    def build():
        if _plans_on_device(tiling):
            return device_plan(tiling.xp, tiling.win_ptr, None, blocks_per_unit, max_units,
                               counts=plan_counts(tiling, blocks_per_unit, max_units))
        return _uploaded(tiling, _plan_where_planned(tiling, blocks_per_unit, max_units))

    return tiling.cached(("plan", blocks_per_unit, max_units), build)


#: Tilings of at most this many windows, planned on the host (:func:`_planner`) and translated on the device, have
#: their plans made on the device by one CTA (:func:`device_plan`).  The CTA's loops grow with the windows, but more
#: slowly than the host's NumPy passes and the plan's upload do at every size measured; the bound stays within twice
#: the largest tiling measured.
DEVICE_PLAN_WINDOWS_MAX = 1 << 16


def _plans_on_device(tiling):
    """Whether :func:`spmm_plan` makes ``tiling``'s plans on the device: its window pointers are on the host too (a
    tiling planned there), it has at most :data:`DEVICE_PLAN_WINDOWS_MAX` windows, and the translation kernels
    have run in this process (Numba's kernels are in use: a cold process, whose first builds translate on the host
    while those kernels compile, plans on the host meanwhile)."""
    return (tiling.xp is not np and 0 < tiling.n_windows <= DEVICE_PLAN_WINDOWS_MAX and _planner(tiling)[0] is np
            and kernels_ran())


def device_plan(xp, win_ptr, nb, blocks_per_unit, max_units, threads=None, counts=None, longest=None):
    """:func:`build_plan`'s plan of ``win_ptr`` (``xp``: CuPy, or NumPy in the simulator) by one launch of one CTA
    (:func:`~tcgnn_py.kernels.sgt.plan_units`), its sizes from ``counts`` (:func:`plan_counts`'s), or counted from
    ``nb`` (blocks per window on the host; None with ``counts``): the same arrays, written where the kernels read
    them.  With ``longest`` (no unit longer than that many blocks) its units and split rows come longest first
    (:func:`_longest_first`'s order), sorted by the same CTA in the same launch
    (:func:`~tcgnn_py.kernels.sgt.plan_longest_first`).  The plan and the CTA's scratch are views of one
    allocation, each :data:`_UPLOAD_ALIGN`-aligned, the scratch one array: each launch, allocation and array passed
    costs a new matrix's first product host time of its own.  ``threads``: the CTA's (the simulator's tests use
    fewer)."""
    from ..kernels import sgt as k
    from ..kernels.launch import launch_numba

    n_units, n_slots, max_parts, n_split = counts or _counts(nb, blocks_per_unit, max_units)
    threads = threads or k.cta_threads(xp is np)
    work = k.plan_work(win_ptr.shape[0] - 1)  # (each window's counts and their scans)
    shapes = [(n_units, 4), (n_units, 2), (n_split, 4), work]
    if longest is not None:
        keys = (longest + 1) * (threads // 32)  # (a count per length and warp)
        shapes[3] = work + 2 * keys + 1  # (then the sort's counts and their scan)
        shapes += [(n_units, 4), (n_units, 2)]  # (the plan before its sort)
    views = scratch_views(xp, shapes, align=_UPLOAD_ALIGN // 4)
    units, unit_k0, splits, work = views[:4]
    if longest is None:
        launch_numba(k.plan_units, 1, threads, win_ptr, blocks_per_unit, max_units, work, units, unit_k0, splits)
    else:
        launch_numba(k.plan_longest_first, 1, threads, win_ptr, blocks_per_unit, max_units, work, keys, *views[4:],
                     splits, units, unit_k0)
    return {"units": units, "unit_k0": unit_k0, "splits": splits, "n_slots": n_slots, "max_parts": max_parts}


#: Plans made on the device are sorted there while no unit can be longer than this many blocks: the sort counts
#: each length per warp (the unit sizes the rule picks are far below it; a larger size set by hand sorts on the
#: host).
DEVICE_SORT_LONGEST_MAX = 1024


def _plan_where_planned(tiling, blocks_per_unit, max_units):
    """:func:`spmm_plan` on the side :func:`_planner` computes on (the host copy is kept for derived plans)."""
    xp, arrays = _planner(tiling)
    if xp is tiling.xp:
        return build_plan(xp, tiling.win_ptr, blocks_per_unit, max_units)
    return tiling.cached(("host_plan", blocks_per_unit, max_units),
                         lambda: build_plan(xp, arrays("win_ptr"), blocks_per_unit, max_units))


def _parts(xp, nb, blocks_per_unit, max_units):
    """Units of each owner of ``nb`` items: ``ceil(nb / blocks_per_unit)``, at least 1 (an empty window's unit
    writes its zero rows), at most ``max_units``."""
    return xp.minimum(xp.maximum(-(-nb // blocks_per_unit), 1), max_units)  # (clip's own overhead is a call's)


def build_plan(xp, win_ptr, blocks_per_unit, max_units=UNITS_PER_WINDOW_MAX, even=True):
    """The plan of :func:`spmm_plan` from ``win_ptr`` (any device): each owner (a window of blocks, a row of
    entries) cut into ``ceil(items / blocks_per_unit)`` units (1 to ``max_units``), of near-equal lengths
    (``even``), else of ``blocks_per_unit`` items each but the last (the attention passes' parts).  A unit is
    ``(owner, first, end, slot or -1)``; the owners cut in several give their units consecutive slots."""
    if xp is np:
        return _host_plan(np.asarray(win_ptr), blocks_per_unit, max_units, even)
    nb = xp.diff(win_ptr).astype(np.int64)
    k = _parts(xp, nb, blocks_per_unit, max_units)
    unit_ptr = xp.concatenate((xp.zeros(1, np.int64), xp.cumsum(k)))
    n_units = int(unit_ptr[-1])  # synchronize!
    uid = xp.arange(n_units, dtype=np.int64)
    uw = xp.searchsorted(unit_ptr, uid, side="right") - 1
    j = uid - unit_ptr[uw]
    kw = k[uw]
    split, slot, first, end = _cuts(xp, j, kw, nb[uw], win_ptr[uw].astype(np.int64), blocks_per_unit, even)
    units = xp.stack([uw, first, end, slot], axis=1)
    sw = xp.flatnonzero(k > 1)
    splits = xp.stack([sw, slot[unit_ptr[sw]], k[sw], xp.zeros_like(sw)], axis=1)
    unit_k0 = xp.stack([slot[unit_ptr[uw]], kw], axis=1)
    return {
        "units": xp.ascontiguousarray(units.astype(np.int32)),
        "unit_k0": xp.ascontiguousarray(unit_k0.astype(np.int32)),
        "splits": xp.ascontiguousarray(splits.astype(np.int32)),
        "n_slots": int(split.sum()),  # synchronize!
        "max_parts": int(k.max()) if k.shape[0] else 0,  # synchronize!
    }


def _cuts(xp, j, kw, nbw, start, blocks_per_unit, even):
    """``(split, slot, first, end)`` of each unit: ``j``-th of its owner's ``kw`` parts of the ``nbw`` items from
    ``start`` (:func:`build_plan`'s cut, ``even`` or by ``blocks_per_unit``); the units of owners cut in several
    (``split``) take consecutive slots, the others -1."""
    split = kw > 1
    slot = xp.where(split, xp.cumsum(split) - 1, -1)
    if even:
        return split, slot, start + j * nbw // kw, start + (j + 1) * nbw // kw
    first = start + j * blocks_per_unit
    return split, slot, first, xp.minimum(first + blocks_per_unit, start + nbw)


def _host_plan(win_ptr, blocks_per_unit, max_units, even):
    """:func:`build_plan` with NumPy, in fewer passes (the same arrays): each owner's units by ``repeat``, the
    units written into their int32 columns, the unsplit owners' units (most of them) without division.  A new
    matrix's first product plans here, on a few thousand windows, where each NumPy call's overhead is the cost."""
    start = win_ptr[:-1].astype(np.int64)
    nb = win_ptr[1:] - start
    n_owners = nb.shape[0]
    if n_owners == 0 or nb.max() <= blocks_per_unit:  # (no owner cut: a unit per owner)
        units = np.empty((n_owners, 4), np.int32)
        unit_k0 = np.empty((n_owners, 2), np.int32)
        units[:, 0] = np.arange(n_owners)
        units[:, 1] = start
        units[:, 2] = win_ptr[1:] if even else np.minimum(start + blocks_per_unit, win_ptr[1:])
        units[:, 3] = -1
        unit_k0[:, 0] = -1
        unit_k0[:, 1] = 1
        return {"units": units, "unit_k0": unit_k0, "splits": np.empty((0, 4), np.int32), "n_slots": 0,
                "max_parts": min(n_owners, 1)}
    k = _parts(np, nb, blocks_per_unit, max_units)
    n_units = int(k.sum())
    sw = np.flatnonzero(k > 1)
    units = np.empty((n_units, 4), np.int32)
    unit_k0 = np.empty((n_units, 2), np.int32)
    uw = np.repeat(np.arange(n_owners), k)
    unit_ptr = np.concatenate((np.zeros(1, np.int64), np.cumsum(k)))
    owner_first = unit_ptr[:-1][uw]  # (each unit's owner's first unit)
    kw = k[uw]
    split, slot, first, end = _cuts(np, np.arange(n_units) - owner_first, kw, nb[uw], start[uw], blocks_per_unit,
                                    even)
    units[:, 0], units[:, 1], units[:, 2], units[:, 3] = uw, first, end, slot
    unit_k0[:, 0], unit_k0[:, 1] = slot[owner_first], kw
    splits = np.zeros((sw.shape[0], 4), np.int32)
    splits[:, 0], splits[:, 1], splits[:, 2] = sw, slot[unit_ptr[sw]], k[sw]
    return {"units": units, "unit_k0": unit_k0, "splits": splits, "n_slots": int(split.sum()),
            "max_parts": int(k.max())}
