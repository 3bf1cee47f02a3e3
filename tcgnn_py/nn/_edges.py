"""Layer 4: the sparse operations a GNN layer needs, over one adjacency matrix.

Layers see a matrix through an *edge view*: its stored values and their rows in
the view's own order (the tiled order for a :class:`~tcgnn_py.TiledMatrix`),
``A_v @ X`` and ``A_vᵀ @ X`` for new values ``v`` in that order, and SDDMM.
Edge arrays never change order between operations, so no permutation runs per
step.  ``TiledEdges`` is the library's path; ``RowEdges`` multiplies a CSR
matrix by the library's CSR kernel, for a matrix used a few times (a batch's, made
every step), whose translation into tiles would cost more than its products;
``CSREdges`` runs the same layers on scipy or cupyx CSR matrices (the reference
for tests and the baseline for benchmarks).
"""

import numpy as np

from .._device import DeviceMismatchError, array_module, get_cupy
from ..products import as_operand, pointwise
from ..tiles import csr_transpose
from .._tiled import TiledMatrix, sddmm, spmm
from .._validation import check_csr_arrays, check_real_dtype, is_half, value_dtype

__all__ = ["EdgeView", "TiledEdges", "RowEdges", "CSREdges", "edges_of", "array_on", "features_on", "floats"]


class EdgeView:
    """What every edge view has (the layers use nothing else): ``shape``, ``xp``, ``values``, ``rows``, ``cols``
    (the entries' rows and columns, in the view's order), ``entry_ids``, ``cached(key, build)``,
    ``columns(x)`` (a per-node array indexed by ``cols``), ``spmm``, ``spmm_t``, ``sddmm``, ``row_sums``,
    ``col_sums``.  Subclassed by :class:`TiledEdges`, :class:`RowEdges`, :class:`CSREdges` and the distributed
    view."""

    def cached(self, key, build):
        """``build()`` once per key, kept with this view (in its ``_cache``, which a subclass makes)."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]


class TiledEdges(EdgeView):
    """Edge view of a :class:`~tcgnn_py.TiledMatrix` (values in tiled order)."""

    def __init__(self, T, precision=None):
        self.matrix = T
        self.shape = T.shape
        self.precision = precision
        self.xp = np if T.device == "cpu" else get_cupy()

    @property
    def values(self):
        return self.matrix.values

    @property
    def rows(self):
        return self.matrix.tiling.entry_rows()

    @property
    def cols(self):
        """Column of every stored entry, in the view's order (int32; computed once per tiling)."""
        tiling = self.matrix.tiling
        return tiling.cached("entry_cols", lambda: tiling.rows_cols()[1].astype(np.int32))

    @property
    def entry_ids(self):
        """Each stored entry's position in the canonical CSR order (what the attention dropout hashes)."""
        return self.matrix.tiling.perm

    def cached(self, key, build):
        """``build()`` once per key, kept with the structure (shared by the matrices of one tiling)."""
        return self.matrix.tiling.cached(key, build)

    def columns(self, x):
        """``x`` (one row per column of the graph) as the view's stored entries index it: as is here; a
        distributed view appends the halo rows."""
        return x

    def _with(self, values):
        return self.matrix if values is None else self.matrix._with_data(values)

    def _out(self, X, rows):
        # 16-bit activations stay 16-bit (mixed precision): the product is rounded once into X's type.
        if not is_half(X.dtype) or X.ndim != 2:
            return None
        return self.xp.empty((rows, X.shape[1]), dtype=X.dtype)

    def spmm(self, X, values=None):
        """``A_v @ X`` (of X's dtype when X is 16-bit)."""
        return spmm(self._with(values), X, self._out(X, self.shape[0]), precision=self.precision)

    def spmm_t(self, X, values=None):
        """``A_vᵀ @ X`` (Aᵀ translated once per tiling; new values are gathered)."""
        return spmm(self._with(values).T, X, self._out(X, self.shape[1]), precision=self.precision)

    def sddmm(self, Xa, Xb):
        """``<Xa[i], Xb[j]>`` on every stored ``(i, j)``, in the view's order."""
        return sddmm(self.matrix, Xa, Xb, precision=self.precision).values

    def row_sums(self, v):
        """``sum_j v_ij`` per row: an exact (CUDA-core) product with a column of ones.

        Deterministic, unlike a scatter-add with float atomics, so training
        steps repeat bit for bit (a replayed CUDA graph equals the eager step).
        """
        return self._sums(v, 1)

    def col_sums(self, v):
        """``sum_i v_ij`` per column: an exact product of ``A_vᵀ`` with a column of ones (deterministic)."""
        return self._sums(v, 0)

    def _sums(self, v, axis):
        """Sums of ``A_v`` along ``axis`` (1: per row, 0: per column) as a product with a cached column of ones."""
        T = self.matrix
        k = T.shape[axis]
        ones = T.tiling.cached(("ones", axis, v.dtype.str), lambda: self.xp.ones((k, 1), dtype=v.dtype))
        M = self._with(v)
        return spmm(M if axis == 1 else M.T, ones, precision="fp32")[:, 0]


class RowEdges(EdgeView):
    """Edge view of a canonical CSR matrix multiplied by this library's CSR kernel on the GPU (each output row
    summed over its entries in their order, in float32 or float64: deterministic, no tensor cores) and by scipy's
    product on the host: the view of a matrix used a few times and dropped (a batch of graphs joined every
    step), where a translation into tiles and a first product's plan would cost several times its products.

    ``A``: a scipy or cupyx CSR matrix, or ``(data, indices, indptr)`` with ``shape``.  ``check``: the arrays are
    checked as scipy's ``check_format(full_check=True)`` does, with its messages (an index out of range would be
    read past by the kernel); False checks their sizes alone, for arrays their maker vouches for.  ``symmetric``:
    A equals its transpose exactly, so ``Aᵀ @ X`` is ``A @ X``; otherwise the transpose's CSR is made at its first
    product and kept (:meth:`transpose`).  ``rows``:
    each entry's row, where the caller has them (else found at first use).  Products of X the kernel does not
    take (16-bit, or 1-D) go through scipy or cupyx.
    """

    def __init__(self, A, shape=None, symmetric=False, rows=None, check=True):
        if isinstance(A, tuple):
            if shape is None:
                raise TypeError("RowEdges of (data, indices, indptr) arrays needs their shape")
            data, indices, indptr = A
        else:
            data, indices, indptr, shape = A.data, A.indices, A.indptr, A.shape
        self.shape = tuple(int(s) for s in shape)
        check_real_dtype(data.dtype, "RowEdges data")
        self.values, self.cols, self.indptr = check_csr_arrays(data, indices, indptr, self.shape, full_check=check,
                                                               read_sizes=False)
        self.xp = array_module(self.cols)
        self.symmetric = bool(symmetric)
        self._cache = {} if rows is None else {"rows": rows}

    def __repr__(self):
        kind = ", symmetric" if self.symmetric else ""
        device = "cpu" if self.xp is np else "cuda"
        return (f"<RowEdges of dtype '{self.values.dtype}' with {self.cols.shape[0]} stored elements and shape "
                f"{self.shape}{kind}, on {device}>")

    @property
    def rows(self):
        """Row of every stored entry (int32; computed once)."""
        xp = self.xp
        return self.cached("rows", lambda: (xp.searchsorted(self.indptr, xp.arange(self.cols.shape[0]),
                                                              side="right") - 1).astype(np.int32))

    @property
    def entry_ids(self):
        return self.cached("entry_ids", lambda: self.xp.arange(self.cols.shape[0], dtype=np.int64))

    @property
    def matrix(self):
        """The matrix as scipy's or cupyx's ``csr_matrix`` (the products of X the kernel does not take)."""
        return self.cached("matrix", lambda: self._sparse().csr_matrix((self.values, self.cols, self.indptr),
                                                                     shape=self.shape))

    def _sparse(self):
        if self.xp is np:
            import scipy.sparse as sp

            return sp
        import cupyx.scipy.sparse as csp

        return csp

    def columns(self, x):
        return x

    def _product(self, values, indices, indptr, shape, X):
        if X.ndim not in (1, 2) or X.shape[0] != shape[1]:
            raise ValueError(f"X must have {shape[1]} rows (one per column of the matrix), got shape {X.shape}")
        if self.xp is np or X.dtype not in (np.float32, np.float64) or X.ndim != 2:
            return self._sparse().csr_matrix((values, indices, indptr), shape=shape) @ X
        return pointwise.csr_mm(values.astype(X.dtype, copy=False), indices, indptr, self.xp.ascontiguousarray(X))

    def spmm(self, X, values=None):
        """``A_v @ X``."""
        return self._product(self.values if values is None else values, self.cols, self.indptr, self.shape, X)

    def spmm_t(self, X, values=None):
        """``A_vᵀ @ X``: ``A_v @ X`` where A is symmetric and keeps its values, else by the transpose's CSR (new
        values gathered into its order)."""
        if self.symmetric and values is None:
            return self.spmm(X)
        if values is None:
            values, indices, indptr = self.transpose()
        else:
            order, indices, indptr = self._transpose_order()
            values = values[order]
        return self._product(values, indices, indptr, self.shape[::-1], X)

    def _transpose_order(self):
        """``(order, indices, indptr)``: the transpose's CSR, and the position of each of its entries in this view's
        order (``values[order]`` are its values)."""
        return self._transposed()[:3]

    def transpose(self):
        """The transpose's CSR ``(values, indices, indptr)``."""
        _, indices, indptr, values = self._transposed()
        return values, indices, indptr

    def _transposed(self):
        # made once, with the values (tiles.csr_transpose: on the GPU a few launches, no sort, no read back)
        return self.cached("transpose", lambda: csr_transpose(self.rows, self.cols, self.shape, self.values))

    def sddmm(self, Xa, Xb):
        return (Xa[self.rows] * Xb[self.cols]).sum(axis=1)

    def row_sums(self, v):
        """``sum_j v_ij`` per row, as a product with a column of ones: in entry order (deterministic)."""
        return self.spmm(self.xp.ones((self.shape[1], 1), v.dtype), v)[:, 0]

    def col_sums(self, v):
        """``sum_i v_ij`` per column, through the transpose's CSR (deterministic)."""
        return self.spmm_t(self.xp.ones((self.shape[0], 1), v.dtype), v)[:, 0]


class CSREdges(EdgeView):
    """Edge view of a scipy or cupyx CSR matrix: the same layers on plain sparse ops.

    ``A @ X``, ``A.T @ X`` and a gather-and-dot SDDMM, written as a user of
    ``scipy.sparse`` / ``cupyx.scipy.sparse`` would.
    """

    def __init__(self, A):
        import scipy.sparse as sp

        if sp.issparse(A):
            self.xp, self._sp = np, sp
        else:
            import cupyx.scipy.sparse as csp

            self.xp, self._sp = get_cupy(), csp
        A = self._sp.csr_matrix(A, copy=True)
        A.sum_duplicates()  # canonical: sorted indices, no duplicates
        self.matrix = A
        self.shape = A.shape
        self.values = A.data
        xp = self.xp
        self.rows = (xp.searchsorted(A.indptr, xp.arange(A.nnz), side="right") - 1).astype(np.int32)
        self.cols = A.indices
        self.entry_ids = xp.arange(A.nnz, dtype=np.int64)
        self._cache = {}

    def _with(self, values):
        A = self.matrix
        if values is None:
            return A
        return self._sp.csr_matrix((values, A.indices, A.indptr), shape=A.shape)

    def spmm(self, X, values=None):
        return self._with(values) @ X

    def spmm_t(self, X, values=None):
        return self._with(values).T @ X

    def sddmm(self, Xa, Xb):
        return (Xa[self.rows] * Xb[self.cols]).sum(axis=1)

    def columns(self, x):
        return x

    def row_sums(self, v):
        s = self.xp.zeros(self.shape[0], dtype=v.dtype)
        self.xp.add.at(s, self.rows, v)  # unlike CuPy's bincount, no device-to-host sync
        return s

    def col_sums(self, v):
        s = self.xp.zeros(self.shape[1], dtype=v.dtype)
        self.xp.add.at(s, self.cols, v)
        return s


def edges_of(A, precision=None):
    """The edge view of ``A``: a TiledMatrix, or an edge view already (returned as is).

    scipy and cupyx matrices are refused with a ``TypeError``: wrap them in
    :class:`CSREdges` explicitly (the benchmarks' baseline does), or build a
    TiledMatrix (:func:`tcgnn_py.nn.gcn_norm`).
    """
    if isinstance(A, EdgeView):
        return A
    if isinstance(A, TiledMatrix):
        return TiledEdges(A, precision)
    raise TypeError(
        f"expected a TiledMatrix (e.g. from tcgnn_py.nn.gcn_norm), got {type(A).__name__}"
    )


def array_on(edges, x, what="operand"):
    """``x`` on the edge view's device: NumPy, CuPy, or any DLPack / CUDA-array-interface producer.

    A no-op for arrays already there; device producers (JAX, PyTorch, ...) are wrapped without a copy.
    ``what`` names the argument in errors.
    """
    if isinstance(x, edges.xp.ndarray):
        return x
    on_device = edges.xp is not np
    try:
        return as_operand(x, on_device, what)[0]
    except DeviceMismatchError:
        raise DeviceMismatchError(f"{what}: device arrays given, but the graph lives on the CPU") from None


def floats(x, name):
    """``x`` as a float array where it is (NumPy or CuPy): array-likes (lists) become NumPy arrays, booleans and
    integers the float type that holds them (as ``T @ X``); complex values are refused, naming ``name``."""
    if x is None or isinstance(x, (str, bytes, dict, set)):
        raise TypeError(f"{name} must be an array of real numbers, got {type(x).__name__}")
    if not (hasattr(x, "dtype") and hasattr(x, "shape")):
        x = np.asarray(x)
    dt = value_dtype(check_real_dtype(x.dtype, name))
    return x if dt == x.dtype else x.astype(dt)


def features_on(edges, x, name):
    """``x`` on the view's device (``array_on``) as a float array (:func:`floats`), so a layer never computes in
    an integer type."""
    if isinstance(x, edges.xp.ndarray) and x.dtype.kind == "f":
        return x  # (the common case, answered first: a layer checks several arrays per call)
    if x is None or isinstance(x, (str, bytes, dict, set)):
        raise TypeError(f"{name} must be an array of real numbers, got {type(x).__name__}")
    return floats(array_on(edges, x, name), name)
