"""Layer 2: operands and the one precision vocabulary (:class:`Mode`) of the products.

:func:`as_operand` decides an operand's kind once; :func:`resolve_precision` maps the user's precision
words to one :class:`Mode` in one place, and the engine compares modes, never strings.

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

import enum
import functools

import numpy as np

from .._device import DeviceMismatchError, get_cupy, is_cupy_array, is_device_array
from .._validation import check_exact, check_real_dtype, is_half, promote, value_dtype

__all__ = [
    "F32",
    "HALF_MODES",
    "HALF_PRECISIONS",
    "MISMATCH",
    "Mode",
    "PRECISIONS",
    "TC_TILES",
    "VEC_TILE",
    "as_operand",
    "check_out",
    "compute_dtype",
    "resolve_precision",
    "result_dtype",
]


MISMATCH = "matmul: dimension mismatch with signature"
PRECISIONS = (None, "tf32", "fp32", "fp16", "bf16")


class Mode(str, enum.Enum):
    """How a product runs, as :func:`resolve_precision` decides it: the one vocabulary the engine compares.

    A ``str`` whose value is its name, so that a mode in a cache key or a record reads (and hashes) as the
    word it stands for.
    """

    tf32 = "tf32"  # TF32 tensor cores, float32 accumulation
    exact = "exact"  # CUDA cores in the data's own precision
    float16 = "float16"  # 16-bit MMAs on float16 X
    bfloat16 = "bfloat16"  # ... on bfloat16 X

    __str__ = str.__str__  # printed as the word (records, messages)
    __format__ = str.__format__

    @property
    def half(self):
        """Whether this mode runs 16-bit MMAs on a 16-bit X."""
        return self in HALF_MODES


#: The 16-bit precisions and the operand dtype each needs.
HALF_PRECISIONS = {"fp16": "float16", "bf16": "bfloat16"}
HALF_MODES = frozenset((Mode.float16, Mode.bfloat16))
F32 = np.dtype(np.float32)
#: Tile shapes with TF32 tensor-core kernels: TC-GNN's 16x8 tiles and the vector layout's 8x4 blocks.
TC_TILES = ((16, 8), (8, 4))
VEC_TILE = (8, 4)


def as_operand(X, on_device, what="operand"):
    """Return ``(array, kind)``: X as an array on the matrix's device, and what to return.

    ``kind`` is ``"numpy"`` (hand back a NumPy array) or ``"cupy"``.  Device
    producers (``__cuda_array_interface__`` or ``__dlpack__`` with a CUDA
    device) are wrapped without a copy and answered with CuPy arrays; their
    dtype is read from the wrapped array (a producer need not have a ``dtype``).
    ``what`` names the argument in errors.
    """
    if isinstance(X, np.ndarray):
        kind = "numpy"
    elif is_cupy_array(X):
        if on_device:
            check_real_dtype(X.dtype, what)
            return check_exact(X, "X"), "cupy"
        raise DeviceMismatchError("a device operand needs a matrix on the GPU, but this one lives on the CPU")
    elif is_device_array(X) or _is_cuda_dlpack(X):
        if not on_device:
            raise DeviceMismatchError("a device operand needs a matrix on the GPU, but this one lives on the CPU")
        cp = get_cupy()
        X = cp.asarray(X) if hasattr(X, "__cuda_array_interface__") else cp.from_dlpack(X)
        check_real_dtype(X.dtype, what)
        return check_exact(X, "X"), "cupy"
    else:
        X = np.asarray(X)
        kind = "numpy"
    check_real_dtype(X.dtype, what)
    if on_device:
        X = get_cupy().asarray(X)
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
    """How a product runs: a :class:`Mode` (TF32, CUDA cores, or the 16-bit MMA of X's type).

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
        return Mode(want)
    if precision == "tf32" and not tc_ok:
        if cdt != np.float32:
            raise TypeError(
                f"precision='tf32' needs a float32 product, this one is {dtype}: "
                "cast the matrix and the operands with .astype(numpy.float32), or leave precision=None"
            )
        raise ValueError(f"precision='tf32' needs tile_shape=(16, 8) or (8, 4), got {tile_shape}")
    if precision is None and half_op and half_tile:
        return Mode(operand.name)
    if precision == "fp32" or not tc_ok:
        return Mode.exact
    return Mode.tf32
