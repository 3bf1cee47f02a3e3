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

import numpy as np

from . import _reference as ref
from ._device import get_cupy, is_device_array
from ._validation import value_dtype

__all__ = [
    "as_operand",
    "result_dtype",
    "check_out",
    "resolve_precision",
    "spmm_raw",
    "sddmm_raw",
    "MISMATCH",
    "PRECISIONS",
]

MISMATCH = "matmul: dimension mismatch with signature"
PRECISIONS = (None, "tf32", "fp32")
_TC_TILE = (16, 8)

# Work decomposition of the SpMM kernels (see kernels/products.py).
_UNITS_PER_WINDOW_MAX = 64  # a hub window is split over at most this many CTAs
_SDDMM_BLOCKS_PER_WARP = 4


def as_operand(X, on_device):
    """Return ``(array, kind)``: X as an array on the matrix's device, and what to return.

    ``kind`` is ``"numpy"`` (hand back a NumPy array) or ``"cupy"``.  Device
    producers (``__cuda_array_interface__`` or ``__dlpack__`` with a CUDA
    device) are wrapped without a copy and answered with CuPy arrays.
    """
    if isinstance(X, np.ndarray):
        kind = "numpy"
    elif is_device_array(X) or _is_cuda_dlpack(X):
        kind = "cupy"
    else:
        X = np.asarray(X)
        kind = "numpy"
    if X.dtype.kind not in "biuf":
        raise TypeError(f"operand dtype {X.dtype} is not supported (real numbers only)")
    if on_device:
        cp = get_cupy()
        if kind == "cupy" and not hasattr(X, "__cuda_array_interface__"):
            X = cp.from_dlpack(X)
        else:
            X = cp.asarray(X)
    elif kind == "cupy":
        raise RuntimeError("a device operand needs a TiledMatrix on the GPU, but no GPU path is usable")
    return X, kind


def _is_cuda_dlpack(X):
    dev = getattr(X, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return dev()[0] in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
    except Exception:
        return False


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
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    tc_ok = np.dtype(dtype) == np.float32 and tuple(tile_shape) == _TC_TILE
    if precision == "tf32" and not tc_ok:
        if np.dtype(dtype) != np.float32:
            raise TypeError(
                f"precision='tf32' needs a float32 product, this one is {np.dtype(dtype)}: "
                "cast the matrix and the operands with .astype(numpy.float32), or leave precision=None"
            )
        raise ValueError(f"precision='tf32' needs tile_shape=(16, 8), got {tuple(tile_shape)}")
    if precision == "fp32" or not tc_ok:
        return "exact"
    return "tf32"


# --- SpMM ------------------------------------------------------------------


def spmm_raw(tiles, shape, tile_shape, X, dtype, precision=None, out=None, plans=None, casts=None):
    """``A @ X`` for a 2-D X of shape ``(shape[1], D)`` already on the tiles' device.

    ``out`` (optional) is a validated C-contiguous array of the result's shape
    and dtype on the same device.  ``plans`` caches work plans (they depend on
    the tiling only, so matrices that share a tiling may share it); ``casts``
    caches the values cast to the product's dtype (per matrix).
    """
    mode = resolve_precision(precision, dtype, tile_shape)
    if isinstance(X, np.ndarray):
        Y = ref.spmm(tiles, shape, tile_shape[0], X, dtype)
        if out is None:
            return Y
        out[...] = Y
        return out
    plans = {} if plans is None else plans
    casts = {} if casts is None else casts
    return _spmm_gpu(tiles, shape, tile_shape, X, np.dtype(dtype), mode, out, plans, casts)


def _spmm_gpu(tiles, shape, tile_shape, X, dtype, mode, out, plans, casts):
    from .kernels import products as kp

    cp = get_cupy()
    M, N = shape
    D = X.shape[1]
    if out is not None and cp.may_share_memory(out, X):
        out_final, out = out, None  # the kernel reads X while writing: go through a temporary
    else:
        out_final = None
    Y = out if out is not None else cp.empty((M, D), dtype=dtype)
    if M == 0 or D == 0:
        return Y if out_final is None else out_final
    H, W = tile_shape
    X = cp.ascontiguousarray(X, dtype=dtype)
    values = _values_as(tiles, dtype, casts)
    if mode == "tf32":
        chunks = 1 if D <= 32 else 2 if D <= 64 else 4
        nwarps = 8 if chunks <= 2 else 4
        cols_per_cta = 32 * chunks
        vec = _aligned16(D, X, Y)
        name = kp.spmm_tf32_name(chunks, vec)
        smem = nwarps * (128 * 4 + chunks * 4 * 32 * 16)
        family = "tf32"
    else:
        nwarps = 4
        cols_per_cta = 32
        name = kp.spmm_core_name(dtype.name, H, tiles["tile_pos"].dtype.name)
        smem = nwarps * H * 32 * dtype.itemsize
        family = "core"
    units, splits, n_slots = _spmm_plan(cp, tiles["win_ptr"], nwarps * 4, plans)
    partial = cp.empty((max(n_slots, 1), H, D), dtype=dtype) if n_slots else Y
    grid = (units.shape[0], -(-D // cols_per_cta))
    args = [units, tiles["block_ptr"], tiles["block_cols"], tiles["tile_pos"], values, X, Y, partial,
            np.int32(M), np.int32(D)]
    if family == "core":
        args += [np.int32(W), np.int32(W.bit_length() - 1)]
    kp.get_kernel(family, name)(grid, (32 * nwarps,), tuple(args), shared_mem=smem)
    if n_slots:
        threads = 256
        per_window = H * D
        kp.get_kernel(family, kp.fixup_name(dtype.name))(
            (splits.shape[0], min(-(-per_window // threads), 1024)), (threads,),
            (splits, partial, Y, np.int32(M), np.int32(D), np.int32(H)),
        )
    if out_final is not None:
        out_final[...] = Y
        return out_final
    return Y


def _aligned16(D, *arrays):
    """16-byte loads/stores need rows of a multiple of 4 floats and 16-byte aligned bases."""
    return D % 4 == 0 and all(a.data.ptr % 16 == 0 for a in arrays)


def _values_as(tiles, dtype, cache):
    values = tiles["values"]
    if values.dtype == dtype:
        return values
    key = ("values", dtype.str)
    if key not in cache:
        cache[key] = values.astype(dtype)
    return cache[key]


def _spmm_plan(cp, win_ptr, blocks_per_unit, cache):
    """Units ``(window, first block, end block, slot)`` and split windows, cached per unit size.

    A window of ``nb`` blocks becomes ``k = ceil(nb / blocks_per_unit)`` units
    (at most ``_UNITS_PER_WINDOW_MAX``; an empty window keeps one unit, which
    writes its zero rows).  Units of a split window (``k > 1``) write partial
    tiles to consecutive slots; ``splits`` rows are ``(window, first slot, k, 0)``.
    """
    key = ("plan", blocks_per_unit)
    if key in cache:
        return cache[key]
    nb = cp.diff(win_ptr).astype(np.int64)
    k = cp.clip(-(-nb // blocks_per_unit), 1, _UNITS_PER_WINDOW_MAX)
    unit_ptr = cp.concatenate((cp.zeros(1, np.int64), cp.cumsum(k)))
    n_units = int(unit_ptr[-1])  # synchronize!
    uid = cp.arange(n_units, dtype=np.int64)
    uw = cp.searchsorted(unit_ptr, uid, side="right") - 1
    j = uid - unit_ptr[uw]
    kw, nbw, start = k[uw], nb[uw], win_ptr[uw].astype(np.int64)
    split = kw > 1
    slot = cp.where(split, cp.cumsum(split) - 1, -1)
    units = cp.stack([uw, start + j * nbw // kw, start + (j + 1) * nbw // kw, slot], axis=1)
    sw = cp.flatnonzero(k > 1)
    splits = cp.stack([sw, slot[unit_ptr[sw]], k[sw], cp.zeros_like(sw)], axis=1)
    n_slots = int(split.sum())  # synchronize!
    plan = (cp.ascontiguousarray(units.astype(np.int32)), cp.ascontiguousarray(splits.astype(np.int32)), n_slots)
    cache[key] = plan
    return plan


# --- SDDMM -----------------------------------------------------------------


def sddmm_raw(tiles, shape, tile_shape, Xa, Xb, dtype, multiply_values=False, precision=None, casts=None,
              out=None):
    """Values ``<Xa[i], Xb[j]>`` (times the entry's value if ``multiply_values``) in tiled order.

    ``Xa`` is ``(shape[0], D)`` and ``Xb`` ``(shape[1], D)``, on the tiles' device;
    ``out`` (device only) is a C-contiguous ``(nnz,)`` array of ``dtype`` to write.
    """
    mode = resolve_precision(precision, dtype, tile_shape)
    if isinstance(Xa, np.ndarray):
        return ref.sddmm(tiles, shape, tile_shape[0], Xa, Xb, dtype, multiply_values)
    from .kernels import products as kp

    cp = get_cupy()
    dtype = np.dtype(dtype)
    nnz = tiles["values"].shape[0]
    if out is None:
        out = cp.empty(nnz, dtype=dtype)
    n_blocks = tiles["block_cols"].shape[0]
    D = Xa.shape[1]
    if nnz == 0:
        return out
    if D == 0:
        out.fill(0)
        return out
    H, W = tile_shape
    Xa = cp.ascontiguousarray(Xa, dtype=dtype)
    Xb = cp.ascontiguousarray(Xb, dtype=dtype)
    values = _values_as(tiles, dtype, {} if casts is None else casts)
    n_windows = tiles["win_ptr"].shape[0] - 1
    bpw = _SDDMM_BLOCKS_PER_WARP
    warps_per_cta = 4
    grid = (-(-n_blocks // (bpw * warps_per_cta)),)
    common = (tiles["win_ptr"], np.int32(n_windows), tiles["block_ptr"], tiles["block_cols"], tiles["tile_pos"],
              values, Xa, Xb, out)
    if mode == "tf32":
        kernel = kp.get_kernel("tf32", kp.sddmm_tf32_name(_aligned16(D, Xa, Xb)))
        args = common + (np.int32(shape[0]), np.int32(n_blocks), np.int32(D), np.int32(multiply_values),
                         np.int32(bpw))
        kernel(grid, (32 * warps_per_cta,), args, shared_mem=warps_per_cta * 128 * 4)
    else:
        kernel = kp.get_kernel("core", kp.sddmm_core_name(dtype.name, tiles["tile_pos"].dtype.name))
        args = common + (np.int32(n_blocks), np.int32(D), np.int32(H), np.int32(W), np.int32(W.bit_length() - 1),
                         np.int32(multiply_values), np.int32(bpw))
        kernel(grid, (32 * warps_per_cta,), args)
    return out
