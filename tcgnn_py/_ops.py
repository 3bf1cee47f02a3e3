"""Layer 2: products over the tiled format -- operand handling, precision, dispatch.

``spmm_raw`` and ``sddmm_raw`` are the private raw-buffer entry points: the
public :func:`tcgnn_py.spmm` / :func:`tcgnn_py.sddmm` and
``TiledMatrix.__matmul__`` check shapes with scipy's wording, then land here.
On the GPU they launch the RawModule kernels of :mod:`tcgnn_py.kernels.products`;
on the host they run the NumPy/SciPy reference.

Precision
---------
``precision=None`` (default) picks TF32 tensor cores when the product is
float32 and the tiles are ``16 x 8``, and CUDA cores in the data's own
precision otherwise.  ``"tf32"`` demands tensor cores (an error where they
cannot be used), ``"fp32"`` demands CUDA cores.  float64 products always run on
CUDA cores in float64: tensor cores have no float64 TF32 mode, and silently
dropping 29 mantissa bits would be a wrong answer.  On the host every product is
exact in its dtype and ``precision`` only gets validated.
"""

import functools
from typing import NamedTuple

import numpy as np

from . import _reference as ref
from ._device import DeviceMismatchError, get_cupy, is_cupy_array, is_device_array
from ._validation import check_real_dtype, value_dtype

__all__ = [
    "as_operand",
    "result_dtype",
    "check_out",
    "resolve_precision",
    "spmm_raw",
    "sddmm_raw",
    "MISMATCH",
    "PRECISIONS",
    "UNITS_PER_WINDOW_MAX",
    "build_plan",
    "spmm_plan",
    "block_mask",
    "TUNING",
    "set_tuning",
]

MISMATCH = "matmul: dimension mismatch with signature"
PRECISIONS = (None, "tf32", "fp32")
_TC_TILE = (16, 8)

# Work decomposition of the SpMM kernels (see kernels/products.py).
UNITS_PER_WINDOW_MAX = 64  # a hub window is split over at most this many CTAs
SDDMM_BLOCKS_PER_WARP = 4


def as_operand(X, on_device):
    """Return ``(array, kind)``: X as an array on the matrix's device, and what to return.

    ``kind`` is ``"numpy"`` (hand back a NumPy array) or ``"cupy"``.  Device
    producers (``__cuda_array_interface__`` or ``__dlpack__`` with a CUDA
    device) are wrapped without a copy and answered with CuPy arrays.
    """
    if isinstance(X, np.ndarray):
        kind = "numpy"
    elif is_cupy_array(X):
        if on_device:
            check_real_dtype(X.dtype, "operand")
            return X, "cupy"
        kind = "cupy"
    elif is_device_array(X) or _is_cuda_dlpack(X):
        kind = "cupy"
    else:
        X = np.asarray(X)
        kind = "numpy"
    check_real_dtype(X.dtype, "operand")
    if on_device:
        cp = get_cupy()
        if kind == "cupy" and not hasattr(X, "__cuda_array_interface__"):
            X = cp.from_dlpack(X)
        else:
            X = cp.asarray(X)
    elif kind == "cupy":
        raise DeviceMismatchError("a device operand needs a matrix on the GPU, but this one lives on the CPU")
    return X, kind


def _is_cuda_dlpack(X):
    dev = getattr(X, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return dev()[0] in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
    except Exception:
        return False


@functools.lru_cache(maxsize=256)
def result_dtype(matrix_dtype, operand_dtype):
    """NumPy promotion of the two, with integer and float16 operands made float."""
    return np.result_type(matrix_dtype, value_dtype(operand_dtype))


def check_out(out, shape, dtype, xp):
    """Validate an ``out=`` array: the right module, shape, dtype and C-contiguous."""
    if xp is np and not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray here, got {type(out).__name__}")
    if xp is not np and not isinstance(out, xp.ndarray):
        raise TypeError(f"out must be a cupy.ndarray here, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"out has shape {out.shape}, expected {shape}")
    if out.dtype != dtype:
        raise ValueError(f"out has dtype {out.dtype}, expected {dtype}")
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")


def resolve_precision(precision, dtype, tile_shape):
    """``"tf32"`` (tensor cores) or ``"exact"`` (CUDA cores in ``dtype``) for a product."""
    if not (precision is None or isinstance(precision, str)) or precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return _resolve(precision, np.dtype(dtype), tuple(tile_shape))


@functools.lru_cache(maxsize=64)
def _resolve(precision, dtype, tile_shape):
    tc_ok = dtype == np.float32 and tile_shape == _TC_TILE
    if precision == "tf32" and not tc_ok:
        if dtype != np.float32:
            raise TypeError(
                f"precision='tf32' needs a float32 product, this one is {dtype}: "
                "cast the matrix and the operands with .astype(numpy.float32), or leave precision=None"
            )
        raise ValueError(f"precision='tf32' needs tile_shape=(16, 8), got {tile_shape}")
    if precision == "fp32" or not tc_ok:
        return "exact"
    return "tf32"


# --- SpMM ------------------------------------------------------------------


def spmm_raw(tiling, values, X, dtype, precision=None, out=None, casts=None):
    """``A @ X`` for a 2-D X of shape ``(tiling.shape[1], D)`` already on the tiling's device.

    ``out`` (optional) is a validated C-contiguous array of the result's shape
    and dtype on the same device.  Work plans are cached on the tiling (they
    depend on the structure only); ``casts`` caches ``values`` cast to the
    product's dtype (per matrix).
    """
    mode = resolve_precision(precision, dtype, tiling.tile_shape)
    if isinstance(X, np.ndarray):
        Y = ref.spmm(tiling.arrays(values), tiling.shape, tiling.layout.window, X, dtype)
        if out is None:
            return Y
        out[...] = Y
        return out
    return _spmm_gpu(tiling, values, X, np.dtype(dtype), mode, out, {} if casts is None else casts)


#: Launch shape of the SpMM kernels.  Change it through :func:`set_tuning` only
#: (launch parameters are cached per tiling under the tuning's version).
TUNING = {
    "tf32_max_chunks": 2,  # column chunks of 32 per CTA (registers grow with it)
    "tf32_nwarps": None,  # warps per CTA for 1, 2, 4 chunks, e.g. (4, 4, 4); None: from the tiling (below)
    "core_nwarps": 4,
    "blocks_per_warp": None,  # a unit holds up to nwarps * this many blocks; None: from the tiling (below)
    "prefetch_values": True,  # TF32 register kernel: load the next block's values with its X rows
    "tf32_async_stages": 2,  # cp.async kernel's blocks in flight per warp (0: the register kernel)
    "tf32_async_min_blocks": 3,  # __launch_bounds__ minimum CTAs of 256 threads: 3 caps registers at 80
}
_TUNING_VERSION = [0]


def set_tuning(**kw):
    """Change :data:`TUNING` (benchmark sweeps); unknown keys raise."""
    unknown = set(kw) - set(TUNING)
    if unknown:
        raise KeyError(f"unknown tuning keys {sorted(unknown)}")
    TUNING.update(kw)
    _TUNING_VERSION[0] += 1


def _overlap(a, b):
    """Whether two device arrays' byte ranges intersect (O(1), conservative)."""
    a0, b0 = a.data.ptr, b.data.ptr
    return a.nbytes > 0 and b.nbytes > 0 and a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


class Fixup(NamedTuple):
    """Second launch of a split (hub) window: sum its partial tiles in unit order."""

    kernel: object
    grid: tuple
    splits: object  # int4 rows (window, first slot, number of slots, 0)
    n_slots: int

    def run(self, partial, Y, M, D, H):
        from .kernels.products import FIXUP_THREADS

        self.kernel(self.grid, (FIXUP_THREADS,), (self.splits, partial, Y, np.int32(M), np.int32(D), np.int32(H)))


class TF32SpmmLaunch(NamedTuple):
    """One configuration of ``tcgnn_spmm_tf32``: kernel, geometry and its plan arrays."""

    kernel: object
    grid: tuple
    block: tuple
    smem: int
    units: object  # int4 rows (window, first block, end block, slot or -1)
    mask: object  # (n_blocks, 4) uint32 occupancy masks
    n_slabs: int  # CTAs per unit, side by side in the 1-D grid
    fixup: Fixup = None

    def run(self, tiling, values, X, Y, partial, M, D):
        args = (self.units, tiling.block_ptr, tiling.block_cols, self.mask, values, X, Y, partial,
                np.int32(M), np.int32(D), np.int32(self.n_slabs))
        self.kernel(self.grid, self.block, args, shared_mem=self.smem)


class CoreSpmmLaunch(NamedTuple):
    """One configuration of ``tcgnn_spmm_core`` (CUDA cores, any tile shape)."""

    kernel: object
    grid: tuple
    block: tuple
    smem: int
    units: object
    fixup: Fixup = None

    def run(self, tiling, values, X, Y, partial, M, D):
        W = tiling.layout.block
        args = (self.units, tiling.block_ptr, tiling.block_cols, tiling.tile_pos, values, X, Y, partial,
                np.int32(M), np.int32(D), np.int32(W), np.int32(W.bit_length() - 1))
        self.kernel(self.grid, self.block, args, shared_mem=self.smem)


def _spmm_gpu(tiling, values, X, dtype, mode, out, casts):
    cp = get_cupy()
    M = tiling.shape[0]
    D = X.shape[1]
    out_final = None
    if out is not None and _overlap(out, X):
        out_final, out = out, None  # the kernel reads X while writing: go through a temporary
    Y = cp.empty((M, D), dtype=dtype) if out is None else out
    if M == 0 or D == 0:
        return Y if out_final is None else out_final
    if X.dtype != dtype or not X.flags.c_contiguous:
        X = cp.ascontiguousarray(X, dtype=dtype)
    values = _values_as(values, dtype, casts)
    vec = mode == "tf32" and _aligned16(D, X, Y)
    key = ("launch", mode, dtype.char, D, vec, _TUNING_VERSION[0])
    launch = tiling._cache.get(key)  # hot path: no closure per call
    if launch is None:
        launch = tiling.cached(key, lambda: _spmm_launch(cp, tiling, mode, dtype, D, vec))
    partial = Y
    if launch.fixup is not None:
        partial = cp.empty((launch.fixup.n_slots, tiling.layout.window, D), dtype=dtype)
    launch.run(tiling, values, X, Y, partial, M, D)
    if launch.fixup is not None:
        launch.fixup.run(partial, Y, M, D, tiling.layout.window)
    if out_final is not None:
        out_final[...] = Y
        return out_final
    return Y


def _spmm_launch(cp, tiling, mode, dtype, D, vec):
    """The launch (kernel, geometry, plan arrays, fixup) of one SpMM configuration."""
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    H, W = tiling.tile_shape
    if mode == "tf32":
        chunks = min(TUNING["tf32_max_chunks"], 1 if D <= 32 else 2 if D <= 64 else 4)
        n_slabs = -(-D // (32 * chunks))
        nwarps, bpw = _tf32_work_shape(tiling, n_slabs)
        if TUNING["tf32_nwarps"] is not None:
            nwarps = TUNING["tf32_nwarps"][{1: 0, 2: 1, 4: 2}[chunks]]
        if TUNING["blocks_per_warp"] is not None:
            bpw = TUNING["blocks_per_warp"]
        stages = TUNING["tf32_async_stages"]
        min_blocks = TUNING["tf32_async_min_blocks"]
        use_async = vec and (chunks, stages, min_blocks) in kp.TF32_ASYNC  # cp.async needs 16-byte aligned rows

        def smem_of(nw):
            return kp.tf32_async_smem(nw, chunks, stages) if use_async else kp.tf32_spmm_smem(nw, chunks)

        while nwarps > 1 and smem_of(nwarps) > kp.SPMM_SMEM_LIMIT:
            nwarps //= 2
        family = "tf32"
        plan = spmm_plan(tiling, max(nwarps * bpw, 1))
        # Slabs of one unit side by side (1-D grid): they share its metadata in L2.
        if use_async:
            kernel = get_kernel(family, kp.spmm_tf32_async_name(chunks, stages, min_blocks))
        else:
            kernel = get_kernel(family, kp.spmm_tf32_name(chunks, vec, TUNING["prefetch_values"]))
        smem = smem_of(nwarps)
        launch = TF32SpmmLaunch(
            kernel, (plan["units"].shape[0] * n_slabs, 1), (32 * nwarps,), smem, plan["units"],
            tiling.cached("mask", lambda: block_mask(cp, tiling.block_ptr, tiling.tile_pos, tiling.n_blocks)),
            n_slabs,
        )
    else:
        nwarps = TUNING["core_nwarps"]
        family = "core"
        plan = spmm_plan(tiling, nwarps * (TUNING["blocks_per_warp"] or 16))
        launch = CoreSpmmLaunch(
            get_kernel(family, kp.spmm_core_name(dtype.name, H, tiling.tile_pos.dtype.name)),
            (plan["units"].shape[0], -(-D // 32)), (32 * nwarps,), kp.core_spmm_smem(nwarps, H, dtype.itemsize),
            plan["units"],
        )
    if plan["n_slots"]:
        fix_grid = (plan["splits"].shape[0], min(-(-(H * D) // kp.FIXUP_THREADS), 1024))
        fixup = Fixup(get_kernel(family, kp.fixup_name(dtype.name)), fix_grid, plan["splits"], plan["n_slots"])
        launch = launch._replace(fixup=fixup)
    return launch


#: Windows of at most this many blocks stay whole (one unit each, no partial tiles, no fixup).
WHOLE_WINDOW_BLOCKS = 256
#: Below this many CTAs (windows x slabs), whole windows get 8 warps instead of 4.
FEW_CTAS = 2048


def _tf32_work_shape(tiling, n_slabs):
    """``(warps per CTA, blocks per warp)`` of the TF32 SpMM, from the tiling's statistics.

    Chosen from the launch sweeps and harness runs in ``tools/profiles`` (H200):

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


def _aligned16(D, *arrays):
    """16-byte loads/stores need rows of a multiple of 4 floats and 16-byte aligned bases."""
    return D % 4 == 0 and all(a.data.ptr % 16 == 0 for a in arrays)


def _values_as(values, dtype, cache):
    if values.dtype == dtype:
        return values
    key = ("values", dtype.str)
    if key not in cache:
        cache[key] = values.astype(dtype)
    return cache[key]


def spmm_plan(tiling, blocks_per_unit):
    """Work plan of the SpMM kernels for one unit size, cached on the tiling.

    ``units`` rows are ``(window, first block, end block, slot)``: a window of
    ``nb`` blocks becomes ``k = ceil(nb / blocks_per_unit)`` units (at most
    ``UNITS_PER_WINDOW_MAX``; an empty window keeps one unit, which writes its
    zero rows).  Units of a split window (``k > 1``) write partial tiles to
    consecutive slots; ``splits`` rows are ``(window, first slot, k, 0)``.
    """
    return tiling.cached(("plan", blocks_per_unit), lambda: build_plan(tiling.xp, tiling.win_ptr, blocks_per_unit))


def build_plan(xp, win_ptr, blocks_per_unit):
    """The plan of :func:`spmm_plan` from ``win_ptr`` (any device)."""
    nb = xp.diff(win_ptr).astype(np.int64)
    k = xp.clip(-(-nb // blocks_per_unit), 1, UNITS_PER_WINDOW_MAX)
    unit_ptr = xp.concatenate((xp.zeros(1, np.int64), xp.cumsum(k)))
    n_units = int(unit_ptr[-1])  # synchronize!
    uid = xp.arange(n_units, dtype=np.int64)
    uw = xp.searchsorted(unit_ptr, uid, side="right") - 1
    j = uid - unit_ptr[uw]
    kw, nbw, start = k[uw], nb[uw], win_ptr[uw].astype(np.int64)
    split = kw > 1
    slot = xp.where(split, xp.cumsum(split) - 1, -1)
    units = xp.stack([uw, start + j * nbw // kw, start + (j + 1) * nbw // kw, slot], axis=1)
    sw = xp.flatnonzero(k > 1)
    splits = xp.stack([sw, slot[unit_ptr[sw]], k[sw], xp.zeros_like(sw)], axis=1)
    return {
        "units": xp.ascontiguousarray(units.astype(np.int32)),
        "splits": xp.ascontiguousarray(splits.astype(np.int32)),
        "n_slots": int(split.sum()),  # synchronize!
    }


def block_mask(xp, block_ptr, tile_pos, n_blocks):
    """``(n_blocks, 4)`` uint32: bit ``p`` of block ``b`` set when tile position ``p`` is stored.

    Positions within a block are distinct, so summing ``1 << bit`` per word is
    an OR; float64 holds those sums (< 2**32) exactly.
    """
    entry_block = ref.entry_blocks(block_ptr, tile_pos.shape[0])
    pos = tile_pos.astype(np.int64)
    words = xp.bincount(entry_block.astype(np.int64) * 4 + (pos >> 5), weights=(1 << (pos & 31)).astype(np.float64),
                        minlength=4 * n_blocks)
    return xp.ascontiguousarray(words.astype(np.uint32).reshape(n_blocks, 4))


# --- SDDMM -----------------------------------------------------------------


def sddmm_raw(tiling, values, Xa, Xb, dtype, multiply_values=False, precision=None, casts=None, out=None):
    """Values ``<Xa[i], Xb[j]>`` (times the entry's value if ``multiply_values``) in tiled order.

    ``Xa`` is ``(shape[0], D)`` and ``Xb`` ``(shape[1], D)``, on the tiling's device;
    ``out`` (device only) is a C-contiguous ``(nnz,)`` array of ``dtype`` to write.
    """
    mode = resolve_precision(precision, dtype, tiling.tile_shape)
    if isinstance(Xa, np.ndarray):
        return ref.sddmm(tiling.arrays(values), tiling.shape, tiling.layout.window, Xa, Xb, dtype, multiply_values)
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    cp = get_cupy()
    dtype = np.dtype(dtype)
    nnz = tiling.nnz
    if out is None:
        out = cp.empty(nnz, dtype=dtype)
    n_blocks = tiling.n_blocks
    D = Xa.shape[1]
    if nnz == 0:
        return out
    if D == 0:
        out.fill(0)
        return out
    H, W = tiling.tile_shape
    Xa = cp.ascontiguousarray(Xa, dtype=dtype)
    Xb = cp.ascontiguousarray(Xb, dtype=dtype)
    values = _values_as(values, dtype, {} if casts is None else casts)
    bpw = SDDMM_BLOCKS_PER_WARP
    warps = kp.SDDMM_WARPS
    grid = (-(-n_blocks // (bpw * warps)),)
    common = (tiling.win_ptr, np.int32(tiling.n_windows), tiling.block_ptr, tiling.block_cols, tiling.tile_pos,
              values, Xa, Xb, out)
    if mode == "tf32":
        kernel = get_kernel("tf32", kp.sddmm_tf32_name(_aligned16(D, Xa, Xb)))
        args = common + (np.int32(tiling.shape[0]), np.int32(n_blocks), np.int32(D), np.int32(multiply_values),
                         np.int32(bpw))
        kernel(grid, (32 * warps,), args, shared_mem=warps * kp.SDDMM_TF32_SMEM_PER_WARP)
    else:
        kernel = get_kernel("core", kp.sddmm_core_name(dtype.name, tiling.tile_pos.dtype.name))
        args = common + (np.int32(n_blocks), np.int32(D), np.int32(H), np.int32(W), np.int32(W.bit_length() - 1),
                         np.int32(multiply_values), np.int32(bpw))
        kernel(grid, (32 * warps,), args)
    return out
