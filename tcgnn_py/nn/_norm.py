"""Layer 4: adjacency preprocessing for GNN layers (self loops, GCN normalisation)."""

import numpy as np

from .._device import array_module, get_cupy, use_gpu
from .._tuning import options
from ..tiles import host_limit
from .._tiled import TiledMatrix
from .._validation import check_real_dtype, coerce_graph
from ._edges import RowEdges

__all__ = ["add_self_loops", "gcn_norm"]


def _square_csr(A, device=None):
    """``(data, indices, indptr, n, xp)``: A's CSR arrays, moved to the GPU for ``device`` when large.

    A host input of up to ``norm_host_max`` entries, or small enough for the host translation
    (:func:`tcgnn_py.tiles.host_limit`), is normalised on the host: one upload, no kernel compile, and a
    symmetric graph is recognised there (its tiling is its own transpose).
    """
    data, indices, indptr, n = coerce_graph(A, "a graph's adjacency matrix")
    if data.dtype.kind not in "biuf":
        raise TypeError(f"adjacency values must be real, got {data.dtype}")
    xp = array_module(indices)
    if xp is np and data.shape[0] > max(host_limit(), options()["norm_host_max"]) and use_gpu(device):
        xp = get_cupy()
        data, indices, indptr = (xp.asarray(v) for v in (data, indices, indptr))
    return data, indices, indptr, n, xp


def _plus_identity(data, indices, indptr, n, xp, fill_value):
    """Canonical CSR of ``A + fill_value * I`` in float64 (stored zeros kept)."""
    if xp is np:
        import scipy.sparse as sparse

        if fill_value is not None and _canonical(data, indices, indptr, n):
            return _plus_diagonal(data, indices, indptr, n, fill_value)
    else:
        import cupyx.scipy.sparse as sparse
    nnz = indices.shape[0]
    rows = xp.searchsorted(indptr, xp.arange(nnz), side="right") - 1
    vals = data.astype(np.float64)
    if fill_value is not None:
        diag = xp.arange(n)
        rows = xp.concatenate((rows, diag))
        indices = xp.concatenate((indices.astype(diag.dtype), diag))
        vals = xp.concatenate((vals, xp.full(n, fill_value, np.float64)))
    S = sparse.coo_matrix((vals, (rows, indices)), shape=(n, n)).tocsr()
    S.sum_duplicates()
    return S


def _canonical(data, indices, indptr, n):
    """Whether host CSR arrays are canonical (each row's columns ascending, none twice): scipy's check, in C."""
    import scipy.sparse as sparse

    return sparse.csr_array((data, indices, indptr), shape=(n, n), copy=False).has_canonical_format


def _plus_diagonal(data, indices, indptr, n, fill_value):
    """:func:`_plus_identity` of a canonical host CSR matrix without a sort: ``fill_value`` added to the diagonal
    entries there are, and those missing inserted in their rows' column order -- the same matrix and values as
    scipy's sum of duplicates (a stored value plus the fill, in that order), at a few NumPy passes (a batch of small
    graphs is normalised every step)."""
    import scipy.sparse as sparse

    indptr = indptr.astype(np.int64)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    cols = indices.astype(np.int64)
    vals = data.astype(np.float64)
    diagonal = cols == rows
    vals[diagonal] += fill_value
    missing = np.ones(n, bool)
    missing[rows[diagonal]] = False
    added = np.zeros(n + 1, np.int64)
    np.cumsum(missing, out=added[1:])  # (the diagonals inserted before each row, and in all)
    # each entry moves past the diagonals inserted before its row, and one more past its own row's where it
    # lies right of it: one scatter for both arrays, where an insert into each costs a pass and a copy of its own
    at = np.arange(cols.shape[0]) + added[:-1][rows] + ((cols > rows) & missing[rows])
    out_cols, out_vals = np.empty(cols.shape[0] + int(added[-1]), np.int64), np.empty(cols.shape[0] + int(added[-1]))
    out_cols[at], out_vals[at] = cols, vals
    new = np.flatnonzero(missing)
    below = np.bincount(rows[cols < rows], minlength=n)  # (each row's columns before its diagonal)
    where = (indptr[:-1] + added[:-1] + below)[new]
    out_cols[where], out_vals[where] = new, fill_value
    S = sparse.csr_array((out_vals, out_cols, indptr + added), shape=(n, n), copy=False)
    S.has_canonical_format = True
    return S


def _tiled(S, dtype, layout, tile_shape, device):
    return TiledMatrix((S.data, S.indices, S.indptr), S.shape, dtype=dtype, layout=layout, tile_shape=tile_shape,
                       device=device)


def add_self_loops(A, *, fill_value=1.0, dtype=np.float32, layout=None, tile_shape=None, device=None):
    """``A + fill_value * I`` as a :class:`~tcgnn_py.TiledMatrix` (the graph AGNN attends over).

    Parameters
    ----------
    A : sparse array or matrix, TiledMatrix, or ``(data, indices, indptr)``
        Square adjacency; its values are kept (edge weights).
    fill_value : float, default 1.0
        Added to every diagonal entry (existing self loops included).
    dtype : dtype, default float32
        float32 for the tensor cores, float64 for exact checks.
    layout, tile_shape, device : optional
        As for :class:`~tcgnn_py.TiledMatrix`.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = sp.csr_array(np.array([[0, 1], [1, 0]], dtype=np.float32))
    >>> print(tg.nn.add_self_loops(A).toarray().tolist())
    [[1.0, 1.0], [1.0, 1.0]]
    """
    data, indices, indptr, n, xp = _square_csr(A, device)
    if isinstance(fill_value, (bool, str, bytes)) or not np.isscalar(fill_value) and np.ndim(fill_value) != 0:
        raise TypeError(f"fill_value must be a real number, got {type(fill_value).__name__}")
    try:
        fill_value = float(fill_value)
    except (TypeError, ValueError):
        raise TypeError(f"fill_value must be a real number, got {type(fill_value).__name__}") from None
    return _tiled(_plus_identity(data, indices, indptr, n, xp, fill_value), dtype, layout, tile_shape, device)


def gcn_norm(A, *, add_self_loops=True, dtype=np.float32, layout=None, tile_shape=None, device=None,
             format="tiled"):
    """Kipf & Welling's propagation matrix ``Â = D^-1/2 (A + I) D^-1/2`` as a TiledMatrix (or a CSR edge view).

    ``D`` holds the row sums of ``A + I``, edge weights included (for a
    directed graph, where row ``i`` gathers from its in-neighbours, the
    weighted in-degree).  Rows that sum to zero get a zero scale, as in PyTorch
    Geometric; negative row sums have no square root and raise ``ValueError``.

    Parameters
    ----------
    A : sparse array or matrix, TiledMatrix, or ``(data, indices, indptr)``
        Square adjacency (any real values: booleans and weights alike).
    add_self_loops : bool, default True
        Use ``A + I`` (the renormalisation trick); False normalises A itself.
    dtype : dtype, default float32
        float32 for the tensor cores, float64 for exact checks.
    layout, tile_shape, device : optional
        As for :class:`~tcgnn_py.TiledMatrix`.
    format : {"tiled", "csr"}
        ``"csr"``: a :class:`RowEdges` over the matrix's CSR, which the layers take as they take a TiledMatrix and
        multiply by the library's CSR kernel -- for a matrix used a few times (a batch of graphs joined every
        step), whose translation into tiles and first products' plans would cost more than its products.

    Returns
    -------
    TiledMatrix or RowEdges
        On the GPU when one is usable (``device=None``).  The normalisation runs in float64.  Where it ran on the
        host (a small host graph, or ``device="cpu"``) and the result is exactly symmetric (an undirected graph),
        the matrix is its own transpose: ``T.T is T`` (a :class:`RowEdges` multiplies by it both ways).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = sp.csr_array(np.array([[0, 1], [1, 0]], dtype=np.float32))
    >>> print(tg.nn.gcn_norm(A).toarray().round(6).tolist())
    [[0.5, 0.5], [0.5, 0.5]]
    """
    if format not in ("tiled", "csr"):
        raise ValueError(f"format must be 'tiled' or 'csr', got {format!r}")
    if format == "csr" and (layout is not None or tile_shape is not None):
        raise TypeError("gcn_norm: layout and tile_shape are a TiledMatrix's (format='tiled'), not a CSR view's")
    data, indices, indptr, n, xp = _square_csr(A, device)
    S = _plus_identity(data, indices, indptr, n, xp, 1.0 if add_self_loops else None)
    if xp is np:  # (each entry's row by a repeat, and the row sums by one pass over the entries in their order: a
        # batch is normalised every step, where a search per entry or scipy's sum costs several times more)
        rows = np.repeat(np.arange(n), np.diff(S.indptr))
        deg = np.bincount(rows, weights=S.data, minlength=n)
    else:
        rows = xp.searchsorted(S.indptr, xp.arange(S.nnz), side="right") - 1
        deg = xp.asarray(S.sum(axis=1)).reshape(-1)
    if bool((deg < 0).any()):  # synchronize!
        raise ValueError("gcn_norm: a row of A (+ I) sums to a negative value; D^-1/2 is undefined")
    dinv = xp.where(deg > 0, 1.0 / xp.sqrt(xp.where(deg > 0, deg, 1.0)), 0.0)
    S.data = S.data * (dinv[rows] * dinv[S.indices])  # (one scale d_i d_j for (i, j) and (j, i): symmetry is kept)
    if format == "csr":
        return _row_edges(S, dtype, xp, device)
    T = _tiled(S, dtype, layout, tile_shape, device)
    # A symmetric graph's matrix, checked exactly on the host (where it was normalised), is its own transpose: a
    # layer's backward multiplies by it again instead of translating Aᵀ.
    if xp is np and _symmetric(S):
        T._own_transpose()
    return T


def _row_edges(S, dtype, xp, device):
    """:class:`RowEdges` of a normalised CSR ``S`` in ``dtype``, moved to the GPU where ``device`` asks (a host
    graph normalised on the host: one upload of its three arrays), symmetric where checked on the host."""
    check_real_dtype(np.dtype(dtype), "dtype")
    symmetric = xp is np and _symmetric(S)
    arrays = (S.data.astype(dtype), S.indices.astype(np.int32), S.indptr.astype(np.int32))
    if xp is np and use_gpu(device):
        arrays = tuple(get_cupy().asarray(a) for a in arrays)
    return RowEdges(arrays, S.shape, symmetric=symmetric, check=False)  # (a canonical CSR made here)


def _symmetric(S):
    """Whether a canonical scipy CSR matrix equals its transpose exactly: the same stored entries (explicit zeros
    included, which a product by inf or nan can tell apart) and the same values."""
    St = S.T.tocsr()
    St.sort_indices()
    return (S.shape[0] == S.shape[1] and np.array_equal(S.indptr, St.indptr) and np.array_equal(S.indices, St.indices)
            and np.array_equal(S.data, St.data))
