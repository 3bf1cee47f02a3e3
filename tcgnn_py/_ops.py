"""Layer 2: products over the tiled format -- operand handling, precision, dispatch.

``spmm_raw`` and ``sddmm_raw`` are the private raw-buffer entry points: the
public :func:`tcgnn_py.spmm` / :func:`tcgnn_py.sddmm` and
``TiledMatrix.__matmul__`` check shapes with scipy's wording, then land here.
On the GPU they launch the RawModule kernels of :mod:`tcgnn_py.kernels.products`;
on the host they run the NumPy/SciPy reference.

Precision
---------
``precision=None`` (default) picks tensor cores where the tiles have kernels
(``16 x 8`` and the vector layout's ``8 x 4``): TF32 for float32 products, and
on the vector layout float16 / bfloat16 MMAs when X is 16-bit; CUDA cores in
the data's own precision otherwise.  ``"tf32"`` demands TF32 tensor cores (an
error where they cannot be used), ``"fp32"`` demands CUDA cores, ``"fp16"`` /
``"bf16"`` demand the 16-bit MMA (X of that type, vector layout).  Every
tensor-core product accumulates in float32.  16-bit operands elsewhere are
widened to float32 (exactly) and the product is rounded once to the result
dtype.  float64 products always run on CUDA cores in float64: tensor cores have
no float64 TF32 mode, and silently dropping 29 mantissa bits would be a wrong
answer.  On the host every product is exact in its dtype (float32 for 16-bit
data, rounded once) and ``precision`` only gets validated.
"""

import functools

import numpy as np

from . import _reference as ref
from ._device import DeviceMismatchError, get_cupy, is_cupy_array, is_device_array
from ._tuning import options
from ._validation import check_exact, check_real_dtype, is_half, promote, value_dtype
from ._plans import aligned16, spmm_plan, tile_mask, values_as
from ._launches import CoreSpmmLaunch, Fixup, TF32SpmmLaunch, launch_key, overlaps, planned, run_spmm
from ._vec_choice import vec_launch, vec_timed
from ._half import half_values, spmm_half

__all__ = [
    "F32",
    "FEW_CTAS",
    "HALF_MODES",
    "HALF_PRECISIONS",
    "MISMATCH",
    "PRECISIONS",
    "SDDMM_BLOCKS_PER_WARP",
    "TC_TILES",
    "VEC_TILE",
    "WHOLE_WINDOW_BLOCKS",
    "as_operand",
    "check_out",
    "compute_dtype",
    "nm_products",
    "register_nm_products",
    "resolve_precision",
    "result_dtype",
    "sddmm_raw",
    "spmm_raw",
]


MISMATCH = "matmul: dimension mismatch with signature"
PRECISIONS = (None, "tf32", "fp32", "fp16", "bf16")
#: The 16-bit precisions and the operand dtype each needs.
HALF_PRECISIONS = {"fp16": "float16", "bf16": "bfloat16"}
HALF_MODES = frozenset(HALF_PRECISIONS.values())
F32 = np.dtype(np.float32)
#: Tile shapes with TF32 tensor-core kernels: TC-GNN's 16x8 tiles and the vector layout's 8x4 blocks.
TC_TILES = ((16, 8), (8, 4))
VEC_TILE = (8, 4)
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
            return check_exact(X, "X"), "cupy"
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
    return check_exact(X, "X"), kind


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
    """Promotion of the two (:func:`~tcgnn_py._validation.promote`), integer operands made float."""
    return promote(matrix_dtype, value_dtype(operand_dtype))


def compute_dtype(dtype):
    """The dtype a product is computed in: float32 for 16-bit results (rounded once), else ``dtype``."""
    return F32 if is_half(dtype) else np.dtype(dtype)


def check_out(out, shape, dtype, xp, half_ok=False):
    """Validate an ``out=`` array: the right module, shape, dtype and C-contiguous.

    ``half_ok``: a product computed in float32 (float32 or 16-bit result) may
    go to any of float32, float16, bfloat16 (rounded once).
    """
    if xp is np and not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray here, got {type(out).__name__}")
    if xp is not np and not isinstance(out, xp.ndarray):
        raise TypeError(f"out must be a cupy.ndarray here, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"out has shape {out.shape}, expected {shape}")
    f32_family = half_ok and compute_dtype(dtype) == np.float32
    if out.dtype != dtype and not (f32_family and compute_dtype(out.dtype) == np.float32):
        extra = " (or float32, float16, bfloat16)" if f32_family else ""
        raise ValueError(f"out has dtype {out.dtype}, expected {dtype}{extra}")
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")


def resolve_precision(precision, dtype, tile_shape, operand=None, pattern=None):
    """How a product runs: ``"tf32"``, ``"exact"`` (CUDA cores) or ``"float16"`` / ``"bfloat16"`` (16-bit MMA).

    ``dtype`` is the result's dtype, ``operand`` the dtype of the gathered
    operand X (16-bit MMAs need a 16-bit X on the vector or 2:4 layout);
    ``pattern`` is the layout's N:M pattern, if any.
    """
    if not (precision is None or isinstance(precision, str)) or precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    op = None if operand is None else np.dtype(operand)
    return _resolve(precision, np.dtype(dtype), tuple(tile_shape), op, pattern)


@functools.lru_cache(maxsize=64)
def _resolve(precision, dtype, tile_shape, operand, pattern=None):
    cdt = compute_dtype(dtype)
    tc_ok = cdt == np.float32 and tile_shape in TC_TILES
    half_tile = tile_shape == VEC_TILE or pattern == (2, 4)  # layouts with 16-bit MMA kernels
    half_op = operand is not None and is_half(operand) and cdt == np.float32
    if precision in HALF_PRECISIONS:
        want = HALF_PRECISIONS[precision]
        if cdt != np.float32:
            raise TypeError(
                f"precision={precision!r} needs a float32 or 16-bit product, this one is {dtype}: "
                "cast the matrix and the operands with .astype(numpy.float32), or leave precision=None"
            )
        if operand is None or operand.name != want:
            raise TypeError(
                f"precision={precision!r} needs {want} operands, got {operand}: "
                f"cast them with .astype({want!r}), or leave precision=None"
            )
        if not half_tile:
            raise ValueError(f"precision={precision!r} needs layout='vector' or '2:4', got tile_shape {tile_shape}")
        return want
    if precision == "tf32" and not tc_ok:
        if cdt != np.float32:
            raise TypeError(
                f"precision='tf32' needs a float32 product, this one is {dtype}: "
                "cast the matrix and the operands with .astype(numpy.float32), or leave precision=None"
            )
        raise ValueError(f"precision='tf32' needs tile_shape=(16, 8) or (8, 4), got {tile_shape}")
    if precision is None and half_op and half_tile:
        return operand.name
    if precision == "fp32" or not tc_ok:
        return "exact"
    return "tf32"


# --- SpMM ------------------------------------------------------------------

_NM_PRODUCTS = []  # (spmm, bind) of the N:M layouts, registered by _sparse_tc (which builds on this module)


def register_nm_products(spmm, bind):
    """Install the N:M layouts' SpMM and its hot-path binder (``_sparse_tc`` calls it when imported)."""
    _NM_PRODUCTS[:] = [(spmm, bind)]


def nm_products():
    if not _NM_PRODUCTS:
        raise RuntimeError("the N:M layouts' products are not registered: import tcgnn_py._sparse_tc first")
    return _NM_PRODUCTS[0]


def spmm_raw(tiling, values, X, dtype, precision=None, out=None, casts=None):
    """``A @ X`` for a 2-D X of shape ``(tiling.shape[1], D)`` already on the tiling's device.

    ``out`` (optional) is a validated C-contiguous array of the result's shape
    and dtype on the same device.  Work plans are cached on the tiling (they
    depend on the structure only); ``casts`` caches ``values`` cast to the
    product's dtype (per matrix).
    """
    dtype = np.dtype(dtype)
    mode = resolve_precision(precision, dtype, tiling.tile_shape, X.dtype, tiling.layout.pattern)
    if isinstance(X, np.ndarray):
        Y = ref.spmm(tiling.arrays(values), tiling.shape, tiling.layout.window, X, compute_dtype(dtype))
        Y = Y.astype(dtype, copy=False)
        if out is None:
            return Y
        out[...] = Y
        return out
    casts = {} if casts is None else casts
    # The kernels write ``kdt``: the result's dtype, or float32 rounded once into it afterwards (a 16-bit
    # result the kernel does not write, or one computed on widened X).
    sp = tiling.layout.pattern is not None and mode != "exact"  # sparse tensor cores (N:M layouts)
    if mode in HALF_MODES:
        hv = None if sp else half_values(values, X.dtype, casts)
        kdt = dtype if dtype in (F32, X.dtype) else F32
    else:
        hv, kdt = None, compute_dtype(dtype)
    # An out the kernel can write directly, unless it overlaps X (read while writing): then a temporary.
    direct = out if out is not None and kdt == dtype and not overlaps(out, X) else None
    if sp:  # 16-bit X on "2:4", TF32 on "1:2"
        Xs = X if mode in HALF_MODES else X.astype(F32, copy=False)
        Y = nm_products()[0](tiling, values, Xs, kdt, direct, casts)
    elif hv is not None:
        Y = spmm_half(tiling, hv, X, kdt, direct)
    else:
        Y = _spmm_gpu(tiling, values, X, kdt, mode, direct, casts)
    if out is None:
        return Y if kdt == dtype else Y.astype(dtype)
    if Y is not out:
        out[...] = Y
    return out


def _spmm_gpu(tiling, values, X, dtype, mode, out, casts):
    cp = get_cupy()
    M = tiling.shape[0]
    D = X.shape[1]
    Y = cp.empty((M, D), dtype=dtype) if out is None else out
    if M == 0 or D == 0:
        return Y
    if X.dtype != dtype or not X.flags.c_contiguous:
        X = cp.ascontiguousarray(X, dtype=dtype)
    values = values_as(values, dtype, casts)
    vec = mode == "tf32" and aligned16(D, X, Y)
    key = launch_key(mode, dtype, D, vec)
    launch = tiling.peek(key)  # hot path: no closure per call
    if launch is None:
        launch = planned(tiling, key, lambda: _spmm_launch(cp, tiling, mode, dtype, D, vec, (values, X, Y)))
    run_spmm(cp, launch, tiling, values, X, Y, dtype)
    return Y


def _spmm_launch(cp, tiling, mode, dtype, D, vec, operands=None):
    """The launch (kernel, geometry, plan arrays, fixup) of one SpMM configuration.

    ``operands``: ``(values, X, Y)`` of the call being planned; the vector layout's launch is then
    chosen by timing (:func:`vec_timed`).
    """
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    H, W = tiling.tile_shape
    if mode == "tf32" and (H, W) == VEC_TILE:
        if operands is not None and options()["vec_timed_choice"] and dtype == F32:
            return vec_timed(cp, tiling, dtype, D, vec, *operands)
        return vec_launch(cp, tiling, dtype, D, vec)
    if mode == "tf32":
        chunks = min(options()["tf32_max_chunks"], 1 if D <= 32 else 2 if D <= 64 else 4)
        n_slabs = -(-D // (32 * chunks))
        nwarps, bpw = _tf32_work_shape(tiling, n_slabs)
        if options()["tf32_nwarps"] is not None:
            nwarps = options()["tf32_nwarps"][{1: 0, 2: 1, 4: 2}[chunks]]
        if options()["blocks_per_warp"] is not None:
            bpw = options()["blocks_per_warp"]
        stages = options()["tf32_async_stages"]
        min_blocks = options()["tf32_async_min_blocks"]
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
            kernel = get_kernel(family, kp.spmm_tf32_name(chunks, vec, options()["prefetch_values"]))
        smem = smem_of(nwarps)
        launch = TF32SpmmLaunch(
            kernel, (plan["units"].shape[0] * n_slabs, 1), (32 * nwarps,), smem, plan["units"],
            tile_mask(tiling),
            n_slabs, sizes=tuple(np.int32(v) for v in (tiling.shape[0], D, n_slabs)),
        )
    else:
        nwarps = options()["core_nwarps"]
        family = "core"
        plan = spmm_plan(tiling, nwarps * (options()["blocks_per_warp"] or 16))
        launch = CoreSpmmLaunch(
            get_kernel(family, kp.spmm_core_name(dtype.name, H, tiling.tile_pos.dtype.name)),
            (plan["units"].shape[0], -(-D // 32)), (32 * nwarps,), kp.core_spmm_smem(nwarps, H, dtype.itemsize),
            plan["units"],
        )
    if plan["n_slots"] and family == "tf32" and options()["tf32_combine"]:  # at most UNITS_PER_WINDOW_MAX parts
        launch = launch._replace(n_slots=plan["n_slots"], unit_k0=plan["unit_k0"], scratch={})
    elif plan["n_slots"]:
        fix_grid = (plan["splits"].shape[0], min(-(-(H * D) // kp.FIXUP_THREADS), 1024))
        fixup = Fixup(get_kernel(family, kp.fixup_name(dtype.name)), fix_grid, plan["splits"], plan["n_slots"])
        launch = launch._replace(fixup=fixup, n_slots=plan["n_slots"], **({"scratch": {}} if family == "tf32" else {}))
    return launch


#: Windows of at most this many blocks stay whole (one unit each, no partial tiles, no fixup).
WHOLE_WINDOW_BLOCKS = 256
#: Below this many CTAs (windows x slabs), whole windows get 8 warps instead of 4.
FEW_CTAS = 2048


def _tf32_work_shape(tiling, n_slabs):
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


# --- SDDMM -----------------------------------------------------------------


def sddmm_raw(tiling, values, Xa, Xb, dtype, multiply_values=False, precision=None, casts=None, out=None):
    """Values ``<Xa[i], Xb[j]>`` (times the entry's value if ``multiply_values``) in tiled order.

    ``Xa`` is ``(shape[0], D)`` and ``Xb`` ``(shape[1], D)``, on the tiling's device;
    ``out`` (device only) is a C-contiguous ``(nnz,)`` array of ``dtype`` to write.
    """
    dtype = np.dtype(dtype)
    cdt = compute_dtype(dtype)
    operand = Xa.dtype if Xa.dtype == Xb.dtype else None
    mode = resolve_precision(precision, dtype, tiling.tile_shape, operand, tiling.layout.pattern)
    if mode in HALF_MODES:
        # 16-bit inputs widen exactly to TF32: the same products, accumulated in float32 (CUDA cores on 2:4 tiles).
        mode = "tf32" if tiling.tile_shape in TC_TILES else "exact"
    if isinstance(Xa, np.ndarray):
        e = ref.sddmm(tiling.arrays(values), tiling.shape, tiling.layout.window, Xa, Xb, cdt, multiply_values)
        return e.astype(dtype, copy=False)
    if cdt != dtype:
        e = sddmm_raw(tiling, values, Xa, Xb, cdt, multiply_values, "tf32" if mode == "tf32" else "fp32", casts)
        if out is None:
            return e.astype(dtype)
        out[...] = e
        return out
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
    values = values_as(values, dtype, {} if casts is None else casts)
    bpw = SDDMM_BLOCKS_PER_WARP
    warps = kp.SDDMM_WARPS
    grid = (-(-n_blocks // (bpw * warps)),)
    common = (tiling.win_ptr, np.int32(tiling.n_windows), tiling.block_ptr, tiling.block_cols, tiling.tile_pos,
              values, Xa, Xb, out)
    if mode == "tf32" and (H, W) == VEC_TILE:
        units = spmm_plan(tiling, kp.VEC_SDDMM_BLOCKS, np.iinfo(np.int32).max)["units"]
        n_units = units.shape[0]
        kernel = get_kernel("vec", kp.sddmm_vec_name(aligned16(D, Xa, Xb)))
        args = (units, np.int32(n_units), tiling.block_ptr, tiling.block_cols, tiling.tile_pos, values, Xa, Xb, out,
                np.int32(tiling.shape[0]), np.int32(D), np.int32(multiply_values))
        kernel((-(-n_units // kp.VEC_WARPS),), (32 * kp.VEC_WARPS,), args)
    elif mode == "tf32":
        kernel = get_kernel("tf32", kp.sddmm_tf32_name(aligned16(D, Xa, Xb)))
        args = common + (np.int32(tiling.shape[0]), np.int32(n_blocks), np.int32(D), np.int32(multiply_values),
                         np.int32(bpw))
        kernel(grid, (32 * warps,), args, shared_mem=warps * kp.SDDMM_TF32_SMEM_PER_WARP)
    else:
        kernel = get_kernel("core", kp.sddmm_core_name(dtype.name, tiling.tile_pos.dtype.name))
        args = common + (np.int32(n_blocks), np.int32(D), np.int32(H), np.int32(W), np.int32(W.bit_length() - 1),
                         np.int32(multiply_values), np.int32(bpw))
        kernel(grid, (32 * warps,), args)
    return out
