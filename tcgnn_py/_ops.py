"""Layer 2: products over the tiled format -- operand handling and dispatch.

``spmm(tiles, X)`` is the private raw-buffer entry point: the public
:func:`tcgnn_py.spmm` and ``TiledMatrix.__matmul__`` check shapes with scipy's
wording, then land here.  Until the tensor-core kernels exist, a device matrix
multiplies through cupyx over the tiled entries and a host matrix through the
NumPy/SciPy reference; both compute exactly the tiled matrix's product.
"""

import numpy as np

from . import _reference as ref
from ._device import get_cupy, is_device_array
from ._validation import value_dtype

__all__ = ["as_operand", "result_dtype", "spmm_raw", "check_out", "MISMATCH"]

MISMATCH = "matmul: dimension mismatch with signature"


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


def spmm_raw(tiles, shape, window, X, dtype):
    """``A @ X`` for a 2-D X of shape ``(shape[1], D)`` already on the tiles' device."""
    if isinstance(X, np.ndarray):
        return ref.spmm(tiles, shape, window, X, dtype)
    return _spmm_cupyx(tiles, shape, window, X, dtype)


def _spmm_cupyx(tiles, shape, window, X, dtype):
    import cupyx.scipy.sparse as csp

    cp = get_cupy()
    if shape[0] == 0 or X.shape[1] == 0 or tiles["values"].shape[0] == 0:
        return cp.zeros((shape[0], X.shape[1]), dtype=dtype)
    rows, cols = ref.tiled_rows_cols(
        tiles["win_ptr"], tiles["block_cols"], tiles["block_ptr"], tiles["tile_pos"], window
    )
    A = csp.coo_matrix(
        (tiles["values"].astype(dtype), (rows.astype(np.int32), cols.astype(np.int32))), shape=shape
    ).tocsr()
    return cp.ascontiguousarray(A @ X.astype(dtype, copy=False))
