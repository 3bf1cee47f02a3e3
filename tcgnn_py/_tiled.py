"""Layer 3: :class:`TiledMatrix`, a sparse array in TC-GNN's tiled format."""

import dataclasses

import numpy as np

from . import _reference as ref
from . import _sgt
from ._device import array_module, get_cupy, gpu_available, is_cupy_array, to_host, warn_no_gpu
from ._ops import MISMATCH, as_operand, check_out, result_dtype, sddmm_raw, spmm_raw
from ._validation import (
    check_csr_arrays,
    check_tile_shape,
    coerce_csr,
    isscalarlike,
    value_dtype,
)

__all__ = ["TiledMatrix", "TileStats", "spmm", "sddmm"]

_ARRAYS = ("win_ptr", "block_cols", "block_ptr", "tile_pos", "values", "perm")


@dataclasses.dataclass(frozen=True)
class TileStats:
    """How well Sparse Graph Translation condensed a matrix (TC-GNN, Fig. 7a).

    ``blocks_before`` counts the ``H x W`` tiles of the original matrix that hold
    an entry; ``blocks`` counts them after condensing each window's columns.
    """

    shape: tuple
    nnz: int
    tile_shape: tuple
    windows: int
    nonempty_windows: int
    blocks: int
    blocks_before: int
    max_blocks_per_window: int

    @property
    def block_reduction(self):
        """Fraction of tensor-core blocks removed by condensing."""
        return 1.0 - self.blocks / self.blocks_before if self.blocks_before else 0.0

    @property
    def density(self):
        """Stored entries per tile slot after condensing."""
        H, W = self.tile_shape
        return self.nnz / (self.blocks * H * W) if self.blocks else 0.0

    @property
    def density_before(self):
        """Stored entries per tile slot without condensing."""
        H, W = self.tile_shape
        return self.nnz / (self.blocks_before * H * W) if self.blocks_before else 0.0

    def __str__(self):
        H, W = self.tile_shape
        return (
            f"{self.shape[0]}x{self.shape[1]}, nnz={self.nnz}, {H}x{W} tiles: "
            f"{self.windows} windows ({self.nonempty_windows} non-empty), "
            f"blocks {self.blocks_before} -> {self.blocks} "
            f"({100 * self.block_reduction:.1f}% fewer), "
            f"density {100 * self.density_before:.2f}% -> {100 * self.density:.2f}%, "
            f"max {self.max_blocks_per_window} blocks/window"
        )


class TiledMatrix:
    """A sparse matrix translated into dense ``H x W`` tensor-core tiles.

    Follows scipy's sparse-array semantics: ``@`` is matrix multiplication.
    On a machine with a usable GPU (CuPy and Numba CUDA), the translation runs
    there and the arrays stay on the device; otherwise the NumPy reference path
    is used, with one :class:`~tcgnn_py.NoGPUWarning` per process.

    Parameters
    ----------
    A : sparse array or matrix, or tuple
        A ``scipy.sparse`` array/matrix (any format), a ``cupyx.scipy.sparse``
        matrix, a ``TiledMatrix``, or ``(data, indices, indptr)`` CSR arrays.
        Duplicates are summed, indices need not be sorted, explicit zeros are
        kept as stored entries.
    shape : tuple of int, optional
        Needed for ``(data, indices, indptr)`` (inferred like scipy otherwise).
    dtype : dtype, optional
        Value dtype.  Booleans and integers become the float type that holds
        them exactly; float16 becomes float32.
    tile_shape : (int, int), default (16, 8)
        Row-window height and block width (powers of two up to 32): 16x8 is the
        TF32 ``m16n8k8`` tile.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = sp.csr_array(np.array([[0, 2, 0], [1, 0, 3]], dtype=np.float32))
    >>> T = tg.TiledMatrix(A)
    >>> T.shape, T.nnz, T.format
    ((2, 3), 3, 'tiled')
    >>> y = T @ np.array([1.0, 1.0, 1.0], dtype=np.float32)
    >>> print(np.asarray(y).tolist())
    [2.0, 4.0]
    """

    format = "tiled"
    ndim = 2
    # Make NumPy and CuPy defer ``X @ T`` to ``T.__rmatmul__``.
    __array_priority__ = 10.1
    __array_ufunc__ = None

    def __init__(self, A, shape=None, *, dtype=None, tile_shape=(16, 8)):
        window, block = check_tile_shape(tile_shape)
        if isinstance(A, TiledMatrix):
            data, indices, indptr = A._csr_arrays()
            shape = A.shape
        else:
            data, indices, indptr, shape = coerce_csr(A, shape)
        vdtype = value_dtype(data.dtype if dtype is None else dtype)
        on_device = gpu_available()
        if on_device:
            cp = get_cupy()
            data, indices, indptr = (cp.asarray(v) for v in (data, indices, indptr))
        else:
            if array_module(indices) is not np:
                raise RuntimeError("device arrays given, but the GPU path is not usable")
            warn_no_gpu()
        data, indices, indptr = check_csr_arrays(data, indices, indptr, shape, full_check=True)
        data = data.astype(vdtype, copy=False)
        tiles = _sgt.tile(data, indices, indptr, shape, window, block)
        self._init_parts(tiles, shape, (window, block))

    @classmethod
    def _from_parts(cls, tiles, shape, tile_shape):
        """Build from trusted tiled arrays (no checks, no copies)."""
        self = cls.__new__(cls)
        self._init_parts(tiles, shape, tile_shape)
        return self

    def _init_parts(self, tiles, shape, tile_shape):
        self._tiles = dict(tiles)
        self._shape = (int(shape[0]), int(shape[1]))
        self._tile_shape = tuple(tile_shape)
        self._transpose = None
        self._stats = None
        self._plans = {}  # SpMM work plans: depend on the tiling only
        self._casts = {}  # values cast to a product's dtype
        self._root = None  # the matrix whose tiling this one shares (with_values, sddmm)
        self._transpose_src = None  # Aᵀ's tiled values are values[_transpose_src]
        self._rows = None  # row of every tiled entry

    # --- array protocol -------------------------------------------------
    @property
    def shape(self):
        return self._shape

    @property
    def nnz(self):
        """Number of stored entries (explicit zeros included)."""
        return int(self._tiles["values"].shape[0])

    @property
    def dtype(self):
        return self._tiles["values"].dtype

    @property
    def tile_shape(self):
        """``(window height, block width)``."""
        return self._tile_shape

    @property
    def device(self):
        """``"cuda"`` when the arrays live on the GPU, else ``"cpu"``."""
        return "cpu" if isinstance(self._tiles["values"], np.ndarray) else "cuda"

    def __getattr__(self, name):
        # The tiled arrays, read-only by convention: win_ptr, block_cols, ...
        if name in _ARRAYS and "_tiles" in self.__dict__:
            return self.__dict__["_tiles"][name]
        raise AttributeError(f"'TiledMatrix' object has no attribute '{name}'")

    def __repr__(self):
        H, W = self._tile_shape
        n_blocks = self._tiles["block_cols"].shape[0]
        return (
            f"<TiledMatrix of dtype '{self.dtype}'\n\twith {self.nnz} stored elements and shape "
            f"{self._shape}, {H}x{W} tiles: {n_blocks} blocks in "
            f"{self._tiles['win_ptr'].shape[0] - 1} windows, on {self.device}>"
        )

    def __len__(self):
        raise TypeError("sparse array length is ambiguous; use getnnz() or shape[0]")

    def __bool__(self):
        if self._shape == (1, 1):
            return self.nnz != 0 and bool(to_host(self._tiles["values"])[0] != 0)
        raise ValueError(
            "The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()."
        )

    # --- conversions -----------------------------------------------------
    def _csr_arrays(self):
        """Canonical CSR arrays on the matrix's device."""
        return ref.tiled_to_csr(self._tiles, self._shape, self._tile_shape[0])

    def tocsr(self, copy=False):
        """The canonical CSR matrix as a ``scipy.sparse.csr_array`` (exact round trip)."""
        import scipy.sparse as sp

        data, indices, indptr = (to_host(v) for v in self._csr_arrays())
        return sp.csr_array((data, indices, indptr), shape=self._shape)

    def toarray(self):
        """Dense NumPy array."""
        return self.tocsr().toarray()

    def copy(self):
        """Deep copy (arrays copied on their device)."""
        return TiledMatrix._from_parts(
            {k: v.copy() for k, v in self._tiles.items()}, self._shape, self._tile_shape
        )

    def astype(self, dtype, copy=True):
        """Same tiling, values cast to ``dtype`` (see the class's dtype rule)."""
        dtype = value_dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        return self._with_tiled_values(self._tiles["values"].astype(dtype))

    def with_values(self, values):
        """Same tiling with new entry values, given in ``tocsr()`` order.

        ``values[i]`` replaces ``T.tocsr().data[i]``.  No re-translation.

        Examples
        --------
        >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
        >>> T = tg.TiledMatrix(sp.csr_array(np.eye(3, dtype=np.float32)))
        >>> print(T.with_values(np.array([1.0, 2.0, 3.0])).toarray().diagonal().tolist())
        [1.0, 2.0, 3.0]
        """
        xp = array_module(self._tiles["perm"])
        if xp is np and array_module(values) is not np:
            raise TypeError("device values given for a matrix on the CPU")
        values = xp.asarray(values)
        if values.shape != (self.nnz,):
            raise ValueError(f"values must have shape ({self.nnz},), got {values.shape}")
        return self._with_tiled_values(values.astype(value_dtype(values.dtype), copy=False)[self._tiles["perm"]])

    def _with_tiled_values(self, tiled_values):
        tiles = dict(self._tiles, values=tiled_values)
        new = TiledMatrix._from_parts(tiles, self._shape, self._tile_shape)
        new._root = self if self._root is None else self._root
        new._plans = new._root._plans  # same tiling, same work plans
        return new

    def _entry_rows(self):
        """Row of every stored entry, in tiled order (int32; computed once per tiling)."""
        root = self if self._root is None else self._root
        if root._rows is None:
            t = root._tiles
            rows, _ = ref.tiled_rows_cols(
                t["win_ptr"], t["block_cols"], t["block_ptr"], t["tile_pos"], root._tile_shape[0]
            )
            root._rows = rows.astype(np.int32)
        return root._rows

    # --- transpose -----------------------------------------------------------
    def transpose(self, axes=None, copy=False):
        """Aᵀ, re-translated with the same tile shape (cached).

        Matrices that share a tiling (from :meth:`with_values` or :func:`sddmm`)
        share the translation of Aᵀ too: theirs costs one gather of the values.
        """
        if axes is not None and tuple(axes) != (1, 0):
            raise ValueError("Sparse arrays do not support an 'axes' parameter other than (1, 0)")
        if self._transpose is not None:
            return self._transpose
        root = self._root
        if root is not None:
            # Not cached: a sibling <-> transpose cycle would hold device memory until a GC pass.
            root_t = root.transpose()
            return root_t._with_tiled_values(self._tiles["values"][root._transpose_src])
        rows, cols = ref.tiled_rows_cols(
            self._tiles["win_ptr"], self._tiles["block_cols"], self._tiles["block_ptr"],
            self._tiles["tile_pos"], self._tile_shape[0],
        )
        shape_t = self._shape[::-1]
        order, indices, indptr = _sgt.coo_to_csr_order(cols, rows, shape_t)
        tiles_t = _sgt.translate(self._tiles["values"][order], indices, indptr, shape_t, *self._tile_shape)
        t = TiledMatrix._from_parts(tiles_t, shape_t, self._tile_shape)
        xp = array_module(order)
        src = order[tiles_t["perm"]].astype(np.int32)  # tiled entry of Aᵀ -> tiled entry of A
        inv = xp.empty_like(src)
        inv[src] = xp.arange(src.shape[0], dtype=np.int32)
        self._transpose_src, t._transpose_src = src, inv
        t._transpose = self
        self._transpose = t
        return t

    @property
    def T(self):
        return self.transpose()

    # --- statistics and checks ------------------------------------------
    def tile_stats(self):
        """:class:`TileStats` of the translation (computed once)."""
        if self._stats is None:
            self._stats = _tile_stats(self)
        return self._stats

    def check_format(self, full_check=False):
        """Check the tiled arrays' invariants; ``full_check`` scans every entry.

        Raises ``ValueError`` with what is wrong.
        """
        _check_format(self, full_check)

    # --- matmul ---------------------------------------------------------
    def __matmul__(self, other):
        if not is_cupy_array(other) and isscalarlike(other):
            raise ValueError("Scalar operands are not allowed, use '*' instead")
        return self._matmul_dispatch(other)

    def __rmatmul__(self, other):
        if isscalarlike(other):
            raise ValueError("Scalar operands are not allowed, use '*' instead")
        return self._rmatmul_dispatch(other)

    def dot(self, other):
        """Ordinary dot product (as ``self @ other``)."""
        return self @ other

    def _matmul_dispatch(self, other, out=None, precision=None):
        M, N = self._shape
        if not is_cupy_array(other) and _is_sparse(other):
            if other.shape[0] != N:
                raise ValueError(f"{MISMATCH} (n,k={N}),(k={other.shape[0]},m)->(n,m)")
            return self.tocsr() @ (other.tocsr() if isinstance(other, TiledMatrix) else other)
        X, kind = as_operand(other, self.device == "cuda")
        if X.ndim == 1 or (X.ndim == 2 and X.shape[1] == 1):
            if X.shape[0] != N:
                raise ValueError(f"{MISMATCH} (n,k={N}),(k={X.shape[0]},1?)->(n,1?)")
            out_shape = (M,) if X.ndim == 1 else (M, 1)
        elif X.ndim == 2:
            if X.shape[0] != N:
                raise ValueError(f"{MISMATCH} (n,k={N}),(k={X.shape[0]},m)->(n,m)")
            out_shape = (M, X.shape[1])
        else:
            raise ValueError("could not interpret dimensions")
        dtype = result_dtype(self.dtype, X.dtype)
        xp = np if kind == "numpy" else get_cupy()
        if out is not None:
            check_out(out, out_shape, dtype, xp)
        X2 = X.reshape(N, 1) if X.ndim == 1 else X
        # Device results go straight into a device ``out``; host ones are copied.
        direct = out is not None and kind == "cupy"
        Y = spmm_raw(
            self._tiles, self._shape, self._tile_shape, X2, dtype, precision,
            out=(out if out.ndim == 2 else out.reshape(M, 1)) if direct else None, plans=self._plans, casts=self._casts,
        )
        if direct:
            return out
        if Y.shape != out_shape:
            Y = Y.reshape(out_shape)
        if kind == "numpy":
            Y = to_host(Y)
        if out is None:
            return Y
        out[...] = Y
        return out

    def _rmatmul_dispatch(self, other):
        import scipy.sparse as sp

        if sp.issparse(other):
            return other @ self.tocsr()
        tr = other.transpose() if hasattr(other, "transpose") else np.asarray(other).transpose()
        # Check before translating Aᵀ, with the message scipy gives for (Aᵀ @ Xᵀ)ᵀ.
        M = self._shape[0]
        k = tr.shape[0] if tr.ndim >= 1 else None
        if tr.ndim in (1, 2) and k != M:
            sig = "1?)->(n,1?)" if tr.ndim == 1 or tr.shape[1] == 1 else "m)->(n,m)"
            raise ValueError(f"{MISMATCH} (n,k={M}),(k={k},{sig}")
        return self.transpose()._matmul_dispatch(tr).transpose()


def _is_sparse(x):
    import scipy.sparse as sp

    return sp.issparse(x) or isinstance(x, TiledMatrix)


def spmm(T, X, out=None, *, precision=None):
    """``T @ X`` with an optional preallocated output and a choice of precision.

    Parameters
    ----------
    T : TiledMatrix
    X : array_like, shape (n_cols,) or (n_cols, D)
        NumPy (NumPy result) or CuPy / any CUDA array producer (CuPy result).
        Any ``D >= 1``; X need not be contiguous (it is copied if not).
    out : ndarray, optional
        C-contiguous, of the result's shape and dtype, on the result's device.
        It may alias X (the product then goes through a temporary).
    precision : {None, "tf32", "fp32"}, optional
        ``None``: TF32 tensor cores for float32 products on 16x8 tiles, CUDA
        cores in the data's precision otherwise.  ``"tf32"``: tensor cores or an
        error.  ``"fp32"``: CUDA cores, no rounding of the operands.  float64
        products always run in float64.  See Notes.

    Notes
    -----
    TF32 keeps 10 of float32's 23 mantissa bits of every input (round to
    nearest) and accumulates in float32: each product term carries a relative
    error of at most about ``2**-10``, so ``|Y - A @ X|`` stays below about
    ``1e-3 * (|A| @ |X|)`` elementwise, typically ``3e-4`` in relative
    Frobenius norm.  Integers up to ``2**11`` in magnitude are exact.
    On tensor cores each 16x8 tile multiplies as a dense block, so an Inf or
    NaN in a row of X reaches every row of the window whose tile covers that
    column, also rows with no entry there (scipy would leave them finite);
    ``precision="fp32"`` touches stored entries only and matches scipy.
    On the host (no GPU) every product is exact in its dtype.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> T = tg.TiledMatrix(sp.csr_array(np.eye(2, dtype=np.float32)))
    >>> out = np.empty((2, 3), dtype=np.float32)
    >>> _ = tg.spmm(T, np.ones((2, 3), dtype=np.float32), out=out)
    >>> print(out.tolist())
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    """
    if not isinstance(T, TiledMatrix):
        raise TypeError(f"spmm expects a TiledMatrix, got {type(T).__name__}")
    if not is_cupy_array(X) and isscalarlike(X):
        raise ValueError("Scalar operands are not allowed, use '*' instead")
    return T._matmul_dispatch(X, out=out, precision=precision)


def sddmm(T, Xa, Xb=None, *, multiply_values=False, precision=None):
    """Sampled dense-dense product: ``e_ij = <Xa[i], Xb[j]>`` for every stored ``(i, j)`` of T.

    TC-GNN's edge-feature operation (AGNN attention).  Returns a
    :class:`TiledMatrix` with T's tiling (no re-translation) whose values are
    the ``e_ij``, times T's values if ``multiply_values`` (``T * (Xa @ Xb.T)``).

    Parameters
    ----------
    T : TiledMatrix, shape (n, k)
    Xa : array_like, shape (n, d) or (n,)
    Xb : array_like, shape (k, d) or (k,), optional
        Defaults to ``Xa`` (T must then be square).
    multiply_values : bool, default False
    precision : {None, "tf32", "fp32"}, optional
        As in :func:`spmm`: TF32 tensor cores by default for float32.

    Returns
    -------
    TiledMatrix
        On T's device, of dtype ``result_type(Xa, Xb[, T])`` made float.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> T = tg.TiledMatrix(sp.csr_array(np.array([[0, 1], [1, 1]], dtype=np.float32)))
    >>> X = np.array([[1, 2], [3, 4]], dtype=np.float32)
    >>> print(tg.sddmm(T, X).toarray().tolist())
    [[0.0, 11.0], [11.0, 25.0]]
    """
    if not isinstance(T, TiledMatrix):
        raise TypeError(f"sddmm expects a TiledMatrix, got {type(T).__name__}")
    on_device = T.device == "cuda"
    a, _ = as_operand(Xa, on_device)
    b = a if Xb is None else as_operand(Xb, on_device)[0]
    a = a.reshape(-1, 1) if a.ndim == 1 else a
    b = b.reshape(-1, 1) if b.ndim == 1 else b
    M, N = T.shape
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError("could not interpret dimensions")
    if a.shape[0] != M or b.shape[0] != N or a.shape[1] != b.shape[1]:
        raise ValueError(
            f"sddmm: dimension mismatch with signature (n={M},k={N}),(n={a.shape[0]},d={a.shape[1]}),"
            f"(k={b.shape[0]},d={b.shape[1]})->(n,k)"
        )
    dtype = np.result_type(value_dtype(a.dtype), value_dtype(b.dtype))
    if multiply_values:
        dtype = np.result_type(dtype, T.dtype)
    values = sddmm_raw(
        T._tiles, T.shape, T.tile_shape, a, b, dtype, bool(multiply_values), precision, casts=T._casts
    )
    return T._with_tiled_values(values)


def _tile_stats(T):
    xp = array_module(T._tiles["perm"])
    H, W = T.tile_shape
    win_ptr, block_cols = T._tiles["win_ptr"], T._tiles["block_cols"]
    n_windows = win_ptr.shape[0] - 1
    per_win = xp.diff(win_ptr)
    n_blocks = block_cols.shape[0]
    # Tiles of the uncondensed matrix: distinct (window, column // W) pairs.  Each
    # window's condensed columns are ascending, so count where the pair changes.
    flat = block_cols.reshape(-1)
    slot_win = (xp.searchsorted(win_ptr, xp.arange(n_blocks), side="right") - 1).repeat(W)
    keep = flat >= 0
    key = slot_win[keep].astype(np.int64) * (T.shape[1] // W + 1) + flat[keep] // W
    before = int((key[1:] != key[:-1]).sum()) + 1 if key.shape[0] else 0  # synchronize!
    return TileStats(
        shape=T.shape,
        nnz=T.nnz,
        tile_shape=(H, W),
        windows=n_windows,
        nonempty_windows=int((per_win > 0).sum()),  # synchronize!
        blocks=n_blocks,
        blocks_before=before,
        max_blocks_per_window=int(per_win.max()) if n_windows else 0,  # synchronize!
    )


def _check_format(T, full_check):
    t = T._tiles
    H, W = T.tile_shape
    M, N = T.shape
    n_windows = -(-M // H)
    n_blocks = t["block_cols"].shape[0]
    nnz = t["values"].shape[0]
    if t["win_ptr"].shape != (n_windows + 1,):
        raise ValueError(f"win_ptr size {t['win_ptr'].shape[0]} should be {n_windows + 1}")
    if t["block_cols"].ndim != 2 or t["block_cols"].shape[1] != W:
        raise ValueError(f"block_cols should have shape (n_blocks, {W})")
    if t["block_ptr"].shape != (n_blocks + 1,):
        raise ValueError(f"block_ptr size {t['block_ptr'].shape[0]} should be {n_blocks + 1}")
    for name in ("tile_pos", "perm"):
        if t[name].shape != (nnz,):
            raise ValueError(f"{name} and values should have the same size")
    if not full_check:
        return
    h = {k: to_host(v) for k, v in t.items()}
    if h["win_ptr"][0] != 0 or h["win_ptr"][-1] != n_blocks or np.any(np.diff(h["win_ptr"]) < 0):
        raise ValueError("win_ptr must rise from 0 to n_blocks")
    if h["block_ptr"][0] != 0 or h["block_ptr"][-1] != nnz or np.any(np.diff(h["block_ptr"]) <= 0):
        raise ValueError("block_ptr must rise strictly from 0 to nnz (no empty blocks)")
    if np.any(h["block_cols"] < -1) or np.any(h["block_cols"] >= N):
        raise ValueError(f"block_cols must be in [-1, {N})")
    if np.any(h["tile_pos"] >= H * W):
        raise ValueError(f"tile_pos must be < {H * W}")
    if not np.array_equal(np.sort(h["perm"]), np.arange(nnz)):
        raise ValueError("perm must be a permutation of range(nnz)")
    rows, cols = ref.tiled_rows_cols(h["win_ptr"], h["block_cols"], h["block_ptr"], h["tile_pos"], H)
    if np.any(cols < 0):
        raise ValueError("an entry sits in a padding slot")
    if np.any(rows >= M):
        raise ValueError(f"an entry sits in row >= {M}")
    entry_block = ref.entry_blocks(h["block_ptr"], nnz)
    same = entry_block[1:] == entry_block[:-1]
    if np.any(same & (h["tile_pos"][1:] <= h["tile_pos"][:-1])):
        raise ValueError("tile_pos must increase strictly within each block")
