"""Layer 2: the ``"sparse"`` family: SpMM on the N:M layouts through sparse tensor cores (``mma.sp``).

The ``"2:4"`` and ``"1:2"`` layouts (:data:`tcgnn_py.LAYOUTS`) group each
16-row window's column slots so that every row holds at most N entries in each
M consecutive slots.  A block is then the sparse A operand of one ``mma.sp``:
``m16n8k16`` with float16 / bfloat16 X on ``"2:4"`` (16-slot blocks),
``m16n8k8`` with TF32 on ``"1:2"`` (8-slot blocks).  This module packs each
block's values in compressed fragment order (N of every M, per lane) with the
metadata the instruction needs, and launches ``tcgnn_spmm_sp``
(:mod:`tcgnn_py.kernels.products`, family ``"sparse"``).

Packing, for entry ``(row r, slot s)`` of block ``b`` (``q = s // M``, ``i = s % M``):

* metadata word ``meta[b, g]`` (``g < 8``): bits ``4q .. 4q+3`` describe row
  ``g``'s group ``q``, bits ``16 + 4q ..`` row ``g + 8``'s.  2:4: two ascending
  2-bit positions (an entry alone at ``i`` pairs with ``i + 1``, or with 2 when
  ``i = 3``; an empty group is ``(0, 1)``); 1:2 (TF32 counts as two 16-bit
  halves): ``0x4`` keeps the first element of the pair, ``0xE`` the second.
* values: lane ``(r % 8) * 4 + q``, register ``r // 8``, and (2:4) the
  entry's place among the two kept positions.

:func:`tcgnn_py.tiles._nm_windows.sp_dense_blocks` reads the packing back the way the
instruction does (checked on the H200 with every sparsity selector): the CI
oracle of this module.
"""

import numpy as np

from ... import _reference as ref
from ..._device import get_cupy, publish
from ..._tuning import declare, int_option, options, overrides_key
from ...kernels import products as kp
from .._launch import cast_plan, fixup, partial_scratch, spmm
from .._plans import VEC_UNITS_PER_WINDOW_MAX, spmm_plan
from .._values import half_values, values_as

__all__ = ["pack_structure", "pack_values", "plan", "sp_launch_key", "sp_meta", "sp_values"]

F32 = np.dtype(np.float32)

declare("sparse", {"sp_blocks_per_unit": (32, int_option(1))})  # blocks per balanced unit (NM_BLOCKS_PER_UNIT)


def _luts(n, m):
    """``(nibble, where)``: metadata nibble of a group's occupancy mask, and each position's kept slot (-1: none)."""
    nib = np.zeros(1 << m, np.int64)
    where = np.full((1 << m, m), -1, np.int64)
    for mask in range(1 << m):
        bits = [i for i in range(m) if mask >> i & 1]
        if len(bits) > n:
            continue  # cannot occur in a conforming layout
        if (n, m) == (2, 4):
            if len(bits) == 2:
                idx = bits
            elif len(bits) == 1:
                idx = [bits[0], bits[0] + 1] if bits[0] < 3 else [2, 3]
            else:
                idx = [0, 1]
            nib[mask] = idx[0] | idx[1] << 2
            for k, i in enumerate(idx):
                if i in bits:
                    where[mask, i] = k
        elif (n, m) == (1, 2):
            i = bits[0] if bits else 0
            nib[mask] = (2 * i) | (2 * i + 1) << 2  # a TF32 element is two 16-bit halves
            if bits:
                where[mask, i] = 0
        else:
            raise ValueError(f"no mma.sp packing for {n}:{m}")
    return nib, where


def pack_structure(xp, block_ptr, tile_pos, n_blocks, layout):
    """``(meta, dest)``: the metadata words ``(n_blocks, 8)`` (uint32) and each entry's compressed index.

    ``dest`` indexes a ``(n_blocks, 32 lanes, 2 registers, N)`` array of values.
    """
    H, W = layout.tile_shape
    n, m = layout.pattern
    G = W // m
    nnz = tile_pos.shape[0]
    eb = ref.entry_blocks(block_ptr, nnz).astype(np.int64)
    p = tile_pos.astype(np.int64)
    r, s = p // W, p % W
    q, i = s // m, s % m
    key = (eb * H + r) * G + q
    second = xp.zeros(nnz, bool)
    if nnz > 1:
        second[1:] = key[1:] == key[:-1]  # tiled order: a (block, row, group)'s entries are adjacent
    bit = xp.left_shift(xp.int64(1), i)
    mask = xp.zeros(max(n_blocks * H * G, 1), np.int64)
    first = ~second
    mask[key[first]] = bit[first]
    mask[key[second]] += bit[second]  # at most one second entry per group (N <= 2)
    nib_t, where_t = (xp.asarray(a) for a in _luts(n, m))
    nib = nib_t[mask[: n_blocks * H * G]].reshape(n_blocks, H, G)
    row_meta = (nib << (4 * xp.arange(G, dtype=np.int64))).sum(axis=2)
    meta = (row_meta[:, :8] | (row_meta[:, 8:] << 16)).astype(np.uint32)
    where = where_t[mask[key], i]
    lane = (r % 8) * 4 + q
    dest = ((eb * 32 + lane) * 2 + r // 8) * n + where
    return xp.ascontiguousarray(meta), dest


def pack_values(xp, dest, n_blocks, layout, values, split=False):
    """The compressed A fragments of every block (zeros where no entry is).

    ``values``: float32 (``"1:2"``), or 16-bit bits (uint16; ``"2:4"``), or, with
    ``split``, uint32 ``hi | lo << 16`` pairs, stored per lane as hi registers then lo registers.
    """
    n = layout.pattern[0]
    if not split:
        comp = xp.zeros(n_blocks * 32 * 2 * n, values.dtype)
        comp[dest] = values
        return comp
    comp = xp.zeros(n_blocks * 32 * 8, np.uint16)
    hi = (dest // 4) * 8 + dest % 4
    comp[hi] = (values & 0xFFFF).astype(np.uint16)
    comp[hi + 4] = (values >> 16).astype(np.uint16)
    return comp


def sp_meta(tiling):
    """``(meta, dest)`` of :func:`pack_structure` for a tiling (structure only: cached on it)."""
    return tiling.cached("sp_meta", lambda: pack_structure(tiling.xp, tiling.block_ptr, tiling.tile_pos,
                                                           tiling.n_blocks, tiling.layout))


def sp_values(tiling, values, xdt, casts):
    """``(split, compressed values, unscale)`` for X of type ``xdt``, cached per matrix in ``casts``."""
    key = _sp_key(xdt)
    hit = casts.get(key)
    if hit is not None:
        return hit
    cp = get_cupy()
    _, dest = sp_meta(tiling)
    nb, layout = tiling.n_blocks, tiling.layout
    if layout.pattern == (1, 2):
        v = values_as(values, F32, casts)
        out = (False, pack_values(cp, dest, nb, layout, v), None)
    else:
        split, vals, unscale = half_values(values, np.dtype(xdt), casts)
        bits = vals if split else vals.view(np.uint16)
        out = (split, pack_values(cp, dest, nb, layout, bits, split), unscale)
    casts[key] = publish(out)
    return out


def _sp_key(xdt):
    """The key of :func:`sp_values`' result in a matrix's cache of casts (it follows ``half_values``)."""
    return ("sp_values", np.dtype(xdt).name, options()["half_exact_values"])


def _sp_launch(tiling, xname, split, yname, D, aligned):
    """The launch of ``tcgnn_spmm_sp`` (``run(values, X, Y, unscale)``): balanced units of 4 warps, split windows'
    partial rows summed by the fixup launch."""
    cfg = kp.sp_spmm_config(xname, split, yname, aligned)
    n_slices = -(-D // (8 * cfg.NT))
    plan = spmm_plan(tiling, options()["sp_blocks_per_unit"], VEC_UNITS_PER_WINDOW_MAX)
    units, unit_k0, M = plan["units"], plan["unit_k0"], tiling.shape[0]
    n_work = units.shape[0] * n_slices
    scratch, partial, fix = None, None, None
    if plan["n_slots"]:  # split windows: their parts' partial rows summed by the fixup launch
        partial, scratch = partial_scratch(tiling, plan["n_slots"], 16, D, F32)
        fix = fixup("sparse", kp.fixup_name("float32", yname), plan, M, 16, D, partial, scratch)
    # unit_k0 again where the in-launch sums' counters go: unread (the compiled shapes sum split windows by the fixup)
    fixed = dict(units=units, unit_k0=unit_k0, block_cols=tiling.block_cols, meta=sp_meta(tiling)[0],
                 counters=unit_k0, M=M, D=D, n_slices=n_slices, n_work=n_work)
    return spmm("sparse", cfg.name, -(-n_work // 4), 128, fixed, values="avals", partial=partial, scratch=scratch,
                fixup=fix, extra=("unscale_p",), n_slices=n_slices)


def sp_launch_key(x_dtype, split, dtype, D, aligned):
    """The one key of an N:M SpMM launch (X's type, value pairs or not, result's dtype, D, alignment)."""
    return ("sp_launch", np.dtype(x_dtype).name, split, np.dtype(dtype).name, D, aligned, overrides_key())


def plan(problem):
    """The :class:`.._problem.Plan` of ``A @ X`` on an N:M layout through ``mma.sp``: 16-bit X on ``"2:4"``, float32
    X (TF32) on ``"1:2"``, the kernel writing float32 or X's 16-bit type; the matrix's compressed values
    (:func:`sp_values`) kept per matrix, and the launch bound for repeated calls once it is final."""
    tiling, kdt, D = problem.tiling, problem.kdt, problem.width
    xdt = problem.X.dtype if problem.mode.half else F32
    return cast_plan(problem, xdt, _sp_key(xdt), lambda values, casts: sp_values(tiling, values, xdt, casts),
                     lambda split, aligned: sp_launch_key(xdt, split, kdt, D, aligned),
                     lambda split, aligned, operands: _sp_launch(tiling, xdt.name, split, kdt.name, D, aligned))
