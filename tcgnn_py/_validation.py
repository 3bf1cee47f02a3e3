"""Layer 0: turning user input into validated CSR arrays, with scipy's wording.

O(1) checks (shapes, lengths, dtypes) run first, as in scipy's constructor.
The O(nnz) checks (monotone ``indptr``, column ids in range) run before every
translation too, unlike scipy: the GPU kernels index with these arrays, and an
out-of-range id would write out of bounds instead of raising.
"""

import functools
import operator

import numpy as np

from ._device import array_module, is_device_array
from ._reference import edge_rows

__all__ = [
    "INDEX_MAX",
    "coerce_csr",
    "coerce_graph",
    "check_csr_arrays",
    "value_dtype",
    "check_real_dtype",
    "as_dtype",
    "bfloat16",
    "is_half",
    "promote",
    "BF16_EXTRA",
    "check_count",
    "check_bool",
    "check_tile_shape",
    "isscalarlike",
    "Pattern",
    "check_pattern",
    "check_exact",
    "check_fits",
    "cast_values",
    "distinct_entries",
]

#: Largest index the int32 tiled format can hold.
INDEX_MAX = np.iinfo(np.int32).max


def isscalarlike(x):
    """scipy's test: a Python/NumPy scalar or a 0-d array."""
    return np.isscalar(x) or (getattr(x, "ndim", None) == 0 and getattr(x, "shape", None) == ())


def check_bool(name, value):
    """A bool argument (``numpy.bool_`` too), with its name in the error."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_count(name, value, minimum=0):
    """An int argument ``>= minimum`` (None: any int), with its name in the error (bools refused, and floats,
    which ``int()`` would truncate)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


#: How to get bfloat16: NumPy has no such type, the ml_dtypes package adds it.
BF16_EXTRA = "bfloat16 needs the optional ml_dtypes package: pip install 'tcgnn_py[bf16]' (or ml_dtypes)"


def bfloat16():
    """NumPy's ``bfloat16`` dtype from ``ml_dtypes``; ``ImportError`` naming the extra without it."""
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(BF16_EXTRA) from None
    return np.dtype(ml_dtypes.bfloat16)


def as_dtype(dtype, what="dtype"):
    """``np.dtype(dtype)``, with the name ``"bfloat16"`` resolved through ml_dtypes.

    Anything NumPy cannot read as a dtype raises ``TypeError`` naming ``what``.
    """
    if isinstance(dtype, str) and dtype == "bfloat16":
        return bfloat16()
    if dtype is None or isinstance(dtype, (bool, int, float, np.ndarray)):
        raise TypeError(f"{what} must be a dtype or its name (numpy.float32, 'float16', 'bfloat16', ...), "
                        f"got {dtype!r:.60}")
    try:
        return np.dtype(dtype)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a dtype or its name (numpy.float32, 'float16', 'bfloat16', ...), "
                        f"got {dtype!r:.60}") from None


def is_half(dtype):
    """float16 or bfloat16 (the 16-bit floats the tensor-core kernels take)."""
    try:
        return _is_half(dtype)
    except TypeError:  # unhashable dtype-like
        return _is_half.__wrapped__(dtype)


@functools.lru_cache(maxsize=64)
def _is_half(dtype):
    # Cached: dtype.name costs microseconds, and this runs on every product.
    return np.dtype(dtype).name in ("float16", "bfloat16")


def check_real_dtype(dtype, what="value"):
    """Raise ``TypeError`` unless ``dtype`` is boolean, integer, floating or bfloat16 (the one real-dtype check)."""
    dtype = dtype if isinstance(dtype, np.dtype) else as_dtype(dtype)
    if not _real_ok(dtype):  # cached: this runs on every product
        raise TypeError(f"{what} dtype {dtype} is not supported (tcgnn_py supports real numbers only)")
    return dtype


@functools.lru_cache(maxsize=64)
def _real_ok(dtype):
    return dtype.kind in "biuf" or dtype.name == "bfloat16"


def value_dtype(dtype):
    """The stored value dtype for input values of ``dtype``.

    Floating types are kept (float16 and bfloat16 included); booleans and
    integers are promoted to the smallest float type that holds them exactly
    (NumPy's promotion with float32).  Complex values are refused.
    """
    dtype = check_real_dtype(dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return dtype
    return np.result_type(dtype, np.float32)


def promote(a, b):
    """Result dtype of two value dtypes: NumPy promotion, and float16 with bfloat16 gives float32 (as in JAX).

    >>> import numpy as np
    >>> promote(np.float16, np.float32), promote(np.float16, np.float16)
    (dtype('float32'), dtype('float16'))
    """
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    if is_half(a) and is_half(b):
        return np.dtype(np.float32)
    return np.result_type(a, b)


def check_tile_shape(tile_shape):
    """Validate ``(window, block)``; the kernels need powers of two up to 32."""
    try:
        window, block = (operator.index(v) for v in tile_shape)
    except (TypeError, ValueError):
        raise TypeError(f"tile_shape must be a pair of ints (window, block), got {tile_shape!r}") from None
    for name, v in (("window height", window), ("block width", block)):
        if v < 1 or v > 32 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two in [1, 32], got {v}")
    return window, block


class Pattern(tuple):
    """A ``V:N:M`` sparsity pattern (``V = 1`` is plain ``N:M``): ``(V, N, M)``."""

    __slots__ = ()

    def __new__(cls, V, N, M):
        return super().__new__(cls, (V, N, M))

    V = property(lambda self: self[0])
    N = property(lambda self: self[1])
    M = property(lambda self: self[2])

    def __repr__(self):
        return f"Pattern({self})"

    def __str__(self):
        return f"{self.N}:{self.M}" if self.V == 1 else f"{self.V}:{self.N}:{self.M}"


def check_pattern(pattern):
    """``"N:M"``, ``"V:N:M"``, ``(N, M)`` or ``(V, N, M)`` as a :class:`Pattern`.

    Segment vectors are M-bit words, so ``2 <= M <= 32``; ``1 <= N < M``;
    ``1 <= V <= 1024``.
    """
    if isinstance(pattern, Pattern):
        return pattern
    parts = pattern.split(":") if isinstance(pattern, str) else pattern
    try:
        vals = [operator.index(int(p)) if isinstance(p, str) else operator.index(p) for p in parts]
    except (TypeError, ValueError):
        raise TypeError(
            f"pattern must be 'N:M', 'V:N:M' or a tuple of ints, got {pattern!r}"
        ) from None
    if len(vals) not in (2, 3):
        raise ValueError(f"pattern must have 2 (N:M) or 3 (V:N:M) parts, got {pattern!r}")
    V, N, M = ([1] + vals)[-3:]
    if not 2 <= M <= 32:
        raise ValueError(f"M must be in [2, 32] (a segment vector is one 32-bit word), got {M}")
    if not 1 <= N < M:
        raise ValueError(f"N must be in [1, M) = [1, {M}), got {N}")
    if not 1 <= V <= 1024:
        raise ValueError(f"V must be in [1, 1024], got {V}")
    return Pattern(V, N, M)


def _is_cupyx_sparse(A):
    return type(A).__module__.startswith("cupyx.scipy.sparse")


def _shape2(shape):
    if isinstance(shape, (str, bytes)):
        raise TypeError(f"shape must be a pair of ints (n_rows, n_cols), got {shape!r}")
    try:
        m, n = (operator.index(v) for v in shape)
    except (TypeError, ValueError):
        raise TypeError(f"shape must be a pair of ints (n_rows, n_cols), got {shape!r}") from None
    if m < 0 or n < 0:
        raise ValueError("'shape' elements cannot be negative")
    return m, n


def _check_index_range(shape):
    """The int32 limit, checked from the shape alone (before any conversion allocates per row)."""
    if max(shape) > INDEX_MAX:
        raise ValueError(
            f"shape {tuple(shape)} does not fit the int32 indices of the tiled format (max {INDEX_MAX})"
        )


#: Largest integer magnitude float64 holds exactly.
EXACT_INT_MAX = 2**53
#: Bits of each float type's significand (with the implicit one): it holds every integer up to ``2**bits``.
_SIGNIFICAND_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


def check_exact(arr, what, target=None):
    """Refuse integers that the float type they are stored in would round (``|v| > 2**bits`` of ``target``).

    Integers become floats in every product and every stored value; a float type holds integers exactly only
    up to ``2**53`` (float64), ``2**24`` (float32), ``2**11`` (float16), ``2**8`` (bfloat16), and rounding them
    silently would be a wrong answer.  ``target`` is the float type (float64 by default: what integer values
    become when the library picks the type).  Integer types whose every value fits are not scanned; others are
    (a device read for CuPy).
    """
    dt = arr.dtype
    if dt.kind not in "iu" or arr.size == 0:
        return arr
    target = np.dtype(np.float64) if target is None else np.dtype(target)
    bits = _SIGNIFICAND_BITS.get(target.name)
    if bits is None:  # not a float type: nothing to round
        return arr
    info = np.iinfo(dt)
    if max(info.max, -info.min) <= 2**bits:
        return arr
    xp = array_module(arr)
    hi = arr.max()
    lo = arr.min() if dt.kind == "i" else hi
    hi, lo = _read_ints(xp, hi, lo)  # synchronize!
    if hi > 2**bits or lo < -(2**bits):
        bad = hi if hi > 2**bits else lo
        raise ValueError(
            f"{what} holds the {dt.name} value {bad}, which {target.name} cannot hold exactly (|v| > 2**{bits}); "
            f"tcgnn_py computes in floating point: pass float values (or another dtype) if rounding them is "
            "acceptable"
        )
    return arr


def _is_float(dtype):
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _float_max(dtype):
    if dtype.name == "bfloat16":
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).max)
    return float(np.finfo(dtype).max)


def check_fits(arr, what, target):
    """``arr`` unchanged, or ``ValueError`` where a finite float value would become an infinity in ``target``.

    For a float type the library picks (a matrix's own): rounding to it is expected, an overflow is not (as
    :func:`check_exact` refuses integers it would round).  Only a narrowing cast is checked: one host read then.
    """
    target = as_dtype(target)
    if not (_is_float(arr.dtype) and _is_float(target)) or _float_max(arr.dtype) <= _float_max(target) or not arr.size:
        return arr
    xp = array_module(arr)
    with np.errstate(over="ignore"):
        cast = arr.astype(target)
    bad = xp.isfinite(arr) & ~xp.isfinite(cast)
    if bool(bad.any()):  # synchronize!
        v = float(arr[bad][0])  # synchronize!
        raise ValueError(f"{what} holds {v!r}, beyond {target.name}'s range (largest {_float_max(target):.4g}): "
                         f"pass dtype= a wider float type, or values within range")
    return arr


def cast_values(values, dtype, what="values"):
    """``values`` cast to ``dtype`` as NumPy casts them, then stored in the float type :func:`value_dtype` picks.

    A boolean or integer ``dtype`` takes its values first (nonzero to True; truncation toward zero and wrap-around
    for integers, as ``numpy.ndarray.astype``), so ``astype(bool)`` gives ones where scipy's would; the float type
    the library then stores them in must hold them exactly (:func:`check_exact`: int64 beyond ``2**53``
    raises).  A float ``dtype`` is the caller's cast, rounded as NumPy rounds.  Any device.
    """
    dtype = as_dtype(dtype, "dtype")
    target = value_dtype(dtype)
    if target != dtype:  # a boolean or integer type: NumPy's cast first, then the float type holding it exactly
        with np.errstate(invalid="ignore", over="ignore"):  # NaN / inf to an integer: NumPy's (undefined) value
            if dtype.kind in "iu" and (values.dtype.kind == "f" or values.dtype.name == "bfloat16"):
                # floats truncate to int64 first, then wrap: what NumPy gives on x86 (-1.0 -> 255 as uint8), and
                # the same on the GPU, where a direct float -> unsigned cast clamps
                values = values.astype(np.int64)
            values = check_exact(values.astype(dtype), what, target)
    return values.astype(target, copy=False)


def _csr_keeping_duplicates(A, xp):
    """CSR arrays of a sparse input with every stored entry kept (duplicates are not summed here).

    scipy's ``tocsr()`` sums duplicates in the input dtype (an int8 or bool sum
    overflows or saturates); the library sums them once, after the values are
    cast to the value dtype, whatever the input format.
    """
    if A.format == "csr":
        return A.data, A.indices, A.indptr
    coo = A.tocoo()
    row, col, data = coo.row, coo.col, coo.data
    n_rows = A.shape[0]
    if row.shape[0] > 1 and not bool(xp.all(row[1:] >= row[:-1])):  # synchronize!
        order = xp.argsort(row, kind="stable") if xp is np else xp.argsort(row)  # CuPy's sort is stable
        row, col, data = row[order], col[order], data[order]
    indptr = xp.zeros(n_rows + 1, dtype=np.int64)
    if row.shape[0]:
        xp.cumsum(xp.bincount(row, minlength=n_rows), out=indptr[1:])
    return data, col, indptr


def distinct_entries(indices, indptr, n_cols):
    """``(indices, indptr)`` with each (row, column) position once: the pattern a matrix's entries form.

    Structure-only consumers (the reorders, :func:`~tcgnn_py.locality_report`)
    count positions, as ``TiledMatrix`` (which sums duplicates) does.  Returns
    the arrays unchanged when every row's columns strictly increase already.
    """
    xp = array_module(indices)
    nnz = int(indices.shape[0])
    if nnz < 2:
        return indices, indptr
    n_rows, width = indptr.shape[0] - 1, max(int(n_cols), 1)
    rows = edge_rows(indptr, nnz).astype(np.int64)
    if bool(xp.all((indices[1:] > indices[:-1]) | (rows[1:] != rows[:-1]))):  # synchronize!
        return indices, indptr
    key = xp.unique(rows * width + indices.astype(np.int64))
    rows_u = key // width
    new_ptr = xp.zeros(n_rows + 1, dtype=indptr.dtype)
    xp.cumsum(xp.bincount(rows_u, minlength=n_rows), out=new_ptr[1:])
    return (key - rows_u * width).astype(indices.dtype), new_ptr


def coerce_csr(A, shape=None):
    """Return ``(data, indices, indptr, shape)`` from any supported sparse input.

    Arrays stay where they are: NumPy for scipy input, CuPy for cupyx input or a
    tuple of device arrays.  Every stored entry is kept, duplicates included,
    whatever the input format: the one rule is that duplicates are summed after
    the values are cast to the value dtype (``TiledMatrix``), and a renumbering
    keeps them as they are (``Permutation.apply``).  Values keep their dtype.
    """
    import scipy.sparse as sp

    if sp.issparse(A):
        if A.ndim != 2:
            raise ValueError(f"expected a 2-D sparse array, got {A.ndim}-D")
        out_shape = tuple(A.shape) if shape is None else _shape2(shape)
        if out_shape != tuple(A.shape):
            raise ValueError(f"shape {out_shape} does not match the sparse input's {tuple(A.shape)}")
        _check_index_range(out_shape)
        data, indices, indptr = _csr_keeping_duplicates(A, np)
        return data, indices, indptr, out_shape
    if _is_cupyx_sparse(A):
        _check_index_range(tuple(A.shape))
        data, indices, indptr = _csr_keeping_duplicates(A, array_module(A.data))
        return data, indices, indptr, tuple(A.shape)
    if isinstance(A, tuple) and len(A) == 3:
        data, indices, indptr = A
        xp = array_module(indices)
        data, indices, indptr = (xp.asarray(v) for v in (data, indices, indptr))
        if indptr.ndim != 1 or indices.ndim != 1 or data.ndim != 1:
            raise ValueError("data, indices and indptr should be 1-D")
        if shape is None:
            if indices.shape[0] == 0:
                raise ValueError("unable to infer matrix dimensions")
            n_cols = int(indices.max()) + 1  # synchronize!
            shape = (indptr.shape[0] - 1, n_cols)
        return data, indices, indptr, _shape2(shape)
    if isinstance(A, (np.ndarray, list)) or is_device_array(A):
        raise TypeError(
            "A must be a sparse matrix (scipy.sparse, cupyx.scipy.sparse or (data, indices, indptr)); "
            "for a dense array use scipy.sparse.csr_array(A) first"
        )
    raise TypeError(
        "A must be a sparse matrix (scipy.sparse, cupyx.scipy.sparse or (data, indices, indptr)), "
        f"got {type(A).__name__}"
    )


def coerce_graph(A, what):
    """``(data, indices, indptr, n)`` of a graph's square adjacency matrix, from any input :func:`coerce_csr` takes
    or a :class:`~tcgnn_py.TiledMatrix` (its canonical CSR arrays, on its device).

    A ``(data, indices, indptr)`` triple is ``n x n`` with ``n = len(indptr) - 1``: a graph's vertices are its rows,
    so columns past the last stored entry (vertices nothing points to) and a graph without entries keep their
    size.  ``what`` names the operation in the error a rectangular matrix raises.
    """
    import scipy.sparse as sp

    if not sp.issparse(A) and callable(getattr(A, "csr_arrays", None)):
        data, indices, indptr = A.csr_arrays()
        shape = tuple(A.shape)
    elif isinstance(A, tuple) and len(A) == 3:
        n = len(A[2]) - 1
        data, indices, indptr, shape = coerce_csr(A, (n, n))
    else:
        data, indices, indptr, shape = coerce_csr(A)
    if shape[0] != shape[1]:
        raise ValueError(f"{what} needs a square matrix, got shape {shape}")
    return data, indices, indptr, shape[0]


def check_csr_arrays(data, indices, indptr, shape, full_check=True, read_sizes=True):
    """Validate CSR arrays with scipy's messages; return them as int32 index arrays.

    ``full_check`` scans ``indptr`` and ``indices`` (O(nnz), on the arrays' device).  ``read_sizes=False`` (int32
    device arrays only) leaves ``indptr[0]`` and ``indptr[-1]`` to the translation's check kernel, which reads them
    where they are: the arrays' shapes are checked, nothing is read back, so a build can be queued like a product.
    """
    xp = array_module(indices)
    n_rows, n_cols = shape
    if max(n_rows, n_cols) > INDEX_MAX:
        raise ValueError(
            f"shape {shape} does not fit the int32 indices of the tiled format (max {INDEX_MAX})"
        )
    for name, arr in (("indices", indices), ("indptr", indptr)):
        if arr.dtype.kind not in "iu":
            raise ValueError(f"{name} array has non-integer dtype ({arr.dtype.name})")
    if indptr.shape[0] != n_rows + 1:
        raise ValueError(f"index pointer size {indptr.shape[0]} should be {n_rows + 1}")
    if indices.shape[0] != data.shape[0]:
        raise ValueError("indices and data should have the same size")
    if indptr.shape[0] == 0:
        raise ValueError("index pointer size 0 should be at least 1")
    if not read_sizes and not full_check and xp is not np and indices.shape[0] <= INDEX_MAX \
            and indices.dtype == indptr.dtype == np.int32:
        return data, indices, indptr
    first, last = _read_ints(xp, indptr[0], indptr[-1])
    if first != 0:
        raise ValueError("index pointer should start with 0")
    if last > indices.shape[0]:
        raise ValueError(
            "Last value of index pointer should be less than the size of index and data arrays"
        )
    if last > INDEX_MAX:
        raise ValueError(
            f"{last} stored entries do not fit the int32 tiled format (max {INDEX_MAX})"
        )
    indices, data = indices[:last], data[:last]
    if full_check:
        if n_rows and bool(xp.any(indptr[1:] < indptr[:-1])):  # synchronize!
            raise ValueError("indptr must be a non-decreasing sequence")
        if last:
            lo, hi = _read_ints(xp, indices.min(), indices.max())
            if hi >= n_cols:
                raise ValueError(f"indices must be < {n_cols}")
            if lo < 0:
                raise ValueError("indices must be >= 0")
    return data, indices.astype(np.int32, copy=False), indptr.astype(np.int32, copy=False)


def _read_ints(xp, *scalars):
    """Read device scalars to Python ints in one transfer."""
    vals = xp.stack(scalars)
    return [int(v) for v in (vals.get() if xp is not np else vals)]  # synchronize!
