"""Layer 3: :class:`TiledMatrix`, a sparse array in TC-GNN's tiled format."""

import operator
import sys
import weakref

import numpy as np

from . import tiles
from . import _reference as ref
from ._device import DeviceMismatchError, array_module, get_cupy, is_cupy_array, to_host, use_gpu
from .products import DEVICE_VALUES, MISMATCH, as_operand, check_out, recycled, result_dtype, sddmm_raw, signature, \
    spmm_raw, timed_choices
from .tiles import STRUCTURE, Tiling, TileStats, resolve_layout
from ._tuning import options
from ._validation import (
    as_dtype,
    cast_values,
    check_csr_arrays,
    check_bool,
    check_exact,
    check_fits,
    check_real_dtype,
    coerce_csr,
    isscalarlike,
    value_dtype,
    is_half,
    promote,
)

__all__ = ["TiledMatrix", "TileStats", "Tiling", "spmm", "sddmm", "bound_spmm", "issparse"]


class TiledMatrix:
    """A sparse matrix translated into dense ``H x W`` tensor-core tiles.

    Follows scipy's sparse-array semantics: ``@`` is matrix multiplication.
    On a machine with a usable GPU (CuPy and Numba CUDA), the translation runs
    there and the arrays stay on the device; otherwise the NumPy reference path
    is used, with one :class:`~tcgnn_py.NoGPUWarning` per process.

    A ``TiledMatrix`` is a :class:`Tiling` (the structure, shared by every matrix
    with the same sparsity: ``with_values``, ``sddmm``, ``astype``) plus its
    ``values`` in tiled order.

    Parameters
    ----------
    A : sparse array or matrix, or tuple
        A ``scipy.sparse`` array/matrix (any format), a ``cupyx.scipy.sparse``
        matrix, a ``TiledMatrix``, or ``(data, indices, indptr)`` CSR arrays.
        Duplicates are summed after the values are cast to the value dtype
        (below; float32 for 16-bit value dtypes, rounded once after the sum),
        for every input format; indices need not be sorted, explicit zeros are
        kept as stored entries.
    shape : tuple of int, optional
        Needed for ``(data, indices, indptr)`` (inferred like scipy otherwise).
    dtype : dtype, optional
        Value dtype.  A boolean or integer dtype casts each value as NumPy does
        (nonzero to 1 for bool; truncation and wrap-around for integers), and
        the values are then stored in the float type that holds that dtype
        exactly (float32 for bool and up to 16-bit integers, float64 for wider
        ones); float16 and bfloat16 (``"bfloat16"`` needs ml_dtypes) are kept:
        16-bit values halve the value bytes the products read.  Integer values
        the float type the library picks would round (int64 beyond ``2**53``)
        raise ``ValueError``; a float dtype you name is your cast, rounded as
        NumPy rounds.  scipy has no 16-bit floats, so :meth:`tocsr` of such a
        matrix is float32 (exact).
    layout : {"tcgnn", "vector"} or Layout, optional
        How the matrix is tiled (see :class:`Layout`): ``"vector"`` (the
        default), 8-row windows of condensed column vectors with the
        swapped-operand tensor-core kernels (TF32 and 16-bit), or ``"tcgnn"``,
        TC-GNN's 16 x 8 tiles (the paper's format).
    tile_shape : (int, int), optional
        Any row-window height and block width (powers of two up to 32); shapes
        other than the two layouts' run on CUDA cores.  Must agree with
        ``layout`` when both are given.
    device : {None, "cuda", "cpu"}, optional
        Where the matrix lives: ``None`` picks the GPU when it is usable,
        ``"cpu"`` keeps it on the host (the reference path) even then.

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

    def __init__(self, A, shape=None, *, dtype=None, layout=None, tile_shape=None, device=None):
        layout = resolve_layout(layout, tile_shape)
        window, block = layout.tile_shape
        on_device = use_gpu(device)
        if isinstance(A, TiledMatrix):
            data, indices, indptr = A.csr_arrays()
            shape = A.shape
        else:
            data, indices, indptr, shape = coerce_csr(A, shape)
        vdtype = value_dtype(data.dtype if dtype is None else dtype)
        opts = options()
        # A small host input is translated on the host and uploaded once: the same arrays as the kernels'
        # (tests compare them), without their first compile in this process.
        host_build = on_device and array_module(indices) is np and tiles.on_host(data.shape[0])
        if on_device and not host_build:
            # O(1) checks where the arrays are (free on the host); SGT's first kernel makes the O(nnz) ones, and
            # those of int32 device arrays' first and last index pointers (no read back before the translation's;
            # integer values are cut to indptr[-1] first, as their range is checked).
            # Indices of another type are scanned before the int32 cast, which could wrap them into range.
            data, indices, indptr = check_csr_arrays(data, indices, indptr, shape,
                                                     full_check=indices.dtype != np.int32,
                                                     read_sizes=data.dtype.kind in "iub")
            cp = get_cupy()
            data, indices, indptr = (cp.asarray(v) for v in (data, indices, indptr))
        else:
            if array_module(indices) is not np:
                if device == "cpu":
                    data, indices, indptr = (to_host(v) for v in (data, indices, indptr))
                else:
                    raise DeviceMismatchError("device arrays given, but the GPU path is not usable")
            data, indices, indptr = check_csr_arrays(data, indices, indptr, shape, full_check=True)
        if dtype is None:  # the library picks the float type, and promises it holds the values exactly
            check_exact(data, "A", vdtype)
        elif as_dtype(dtype) != vdtype:  # a bool / integer dtype: each value cast as NumPy does, then stored exactly
            data = cast_values(data, dtype, "A")
        # Duplicates are summed in the build dtype (float32 for 16-bit values), then rounded once.
        data = data.astype(_build_dtype(vdtype), copy=False)
        arrays = tiles.tile(data, indices, indptr, shape, window, block)
        if host_build and (layout.pattern is None or data.shape[0] > opts["nm_group_host_max"]):
            # the N:M grouping of a larger matrix runs on the GPU (and makes new arrays: derived data of its own)
            arrays = tiles.upload(arrays, (window, block), derived=layout.pattern is None)
        if layout.pattern is not None:
            arrays = tiles.regroup(arrays, shape, layout)
        if host_build and array_module(arrays["tile_pos"]) is np:
            arrays = tiles.upload(arrays, layout.tile_shape)
        tiling, values = Tiling.from_arrays(arrays, shape, (window, block), layout)
        self._init(tiling, values.astype(vdtype, copy=False))

    @classmethod
    def _from_parts(cls, tiling, values):
        """Build from a trusted tiling and values in its tiled order (no checks, no copies)."""
        self = cls.__new__(cls)
        self._init(tiling, values)
        return self

    def _init(self, tiling, values):
        self._tiling = tiling
        self._values = values
        self._read_only = None  # the host values' read-only view (:attr:`values`), made once asked for
        self._casts = {}  # values cast to a product's dtype
        self._transpose = None  # Aᵀ, once built (strong: A keeps its transpose)
        self._transpose_of = None  # weak reference back: no A <-> Aᵀ cycle holding device memory
        self._plans = tiling.bound()  # products' plans by operand signature, shared with the tiling's matrices

    def __getstate__(self):
        # A copy is its tiling and values (pickle, copy.deepcopy, multiprocessing); casts, plans and the transpose
        # are caches that rebuild on first use, and the transpose's weak reference back could not be pickled.
        return {"tiling": self._tiling, "values": self._values,
                "device_values": bool(self._casts.get(DEVICE_VALUES))}

    def __setstate__(self, state):
        self._init(state["tiling"], state["values"])
        if state["device_values"]:
            self._casts[DEVICE_VALUES] = True

    # --- array protocol -------------------------------------------------
    @property
    def shape(self):
        return self._tiling.shape

    @property
    def nnz(self):
        """Number of stored entries (explicit zeros included)."""
        return int(self._values.shape[0])

    @property
    def dtype(self):
        return self._values.dtype

    @property
    def tiling(self):
        """The :class:`Tiling`: structure arrays, layout and cached derived data (shared, read-only)."""
        return self._tiling

    @property
    def values(self):
        """Stored values in tiled order (``tocsr().data`` is CSR order); new values go through :meth:`with_values`.

        Read-only: on the host a read-only view (a write raises ``ValueError``).  CuPy has no read-only arrays, so
        on the GPU a write would change this matrix's values for some products and not others (casts made before
        keep the old ones): never write into it.
        """
        v = self._values
        if isinstance(v, np.ndarray):
            if self._read_only is None:  # one view per matrix: its id is stable, as the bound calls' keys need
                self._read_only = v.view()
                self._read_only.flags.writeable = False
            v = self._read_only
        return v

    @property
    def tile_shape(self):
        """``(window height, block width)``."""
        return self._tiling.tile_shape

    @property
    def layout(self):
        """The :class:`Layout` of the tiling (``.name`` is ``"tcgnn"``, ``"vector"`` or ``None``)."""
        return self._tiling.layout

    @property
    def device(self):
        """``"cuda"`` when the arrays live on the GPU, else ``"cpu"``."""
        return self._tiling.device

    def __getattr__(self, name):
        # The structure arrays, read-only by convention: win_ptr, block_cols, ...
        if name in STRUCTURE and "_tiling" in self.__dict__:
            return getattr(self.__dict__["_tiling"], name)
        raise AttributeError(f"'TiledMatrix' object has no attribute '{name}'")

    def __repr__(self):
        H, W = self.tile_shape
        t = self._tiling
        return (
            f"<TiledMatrix of dtype '{self.dtype}'\n\twith {self.nnz} stored elements and shape "
            f"{self.shape}, {H}x{W} tiles: {t.n_blocks} blocks in {t.n_windows} windows, on {self.device}>"
        )

    def __len__(self):
        raise TypeError("sparse array length is ambiguous; use .nnz or .shape[0]")

    def __bool__(self):
        if self.shape == (1, 1):
            return self.nnz != 0 and bool(to_host(self._values)[0] != 0)
        raise ValueError(
            "The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()."
        )

    # --- conversions -----------------------------------------------------
    def csr_arrays(self):
        """Canonical CSR ``(data, indices, indptr)`` on the matrix's device (NumPy or CuPy)."""
        return ref.tiled_to_csr(self._tiling.arrays(self._values), self.shape, self.tile_shape[0])

    def tocsr(self, copy=False):
        """The canonical CSR matrix as a ``scipy.sparse.csr_array`` (exact round trip)."""
        import scipy.sparse as sp

        data, indices, indptr = (to_host(v) for v in self.csr_arrays())
        if is_half(data.dtype):
            data = data.astype(np.float32)  # scipy.sparse has no 16-bit floats; widening is exact
        return sp.csr_array((data, indices, indptr), shape=self.shape)

    def toarray(self):
        """Dense NumPy array of the matrix's dtype."""
        return self.tocsr().toarray().astype(self.dtype, copy=False)

    def todense(self, order=None, out=None):
        """Dense NumPy array (as scipy's sparse arrays' ``todense``): :meth:`toarray`."""
        if out is not None or order not in (None, "C"):
            return self.tocsr().todense(order=order, out=out)
        return self.toarray()

    def tocoo(self, copy=False):
        """The canonical matrix as a ``scipy.sparse.coo_array`` (through :meth:`tocsr`: exact)."""
        return self.tocsr().tocoo()

    def tocsc(self, copy=False):
        """The canonical matrix as a ``scipy.sparse.csc_array`` (through :meth:`tocsr`: exact)."""
        return self.tocsr().tocsc()

    def sum(self, axis=None, dtype=None, out=None):
        """Sum of the entries, or along ``axis``: scipy's ``sum`` of :meth:`tocsr` (exact in its dtype)."""
        return self.tocsr().sum(axis=axis, dtype=dtype, out=out)

    def diagonal(self, k=0):
        """The ``k``-th diagonal: scipy's ``diagonal`` of :meth:`tocsr`."""
        return self.tocsr().diagonal(k)

    def copy(self):
        """Deep copy (arrays copied on their device)."""
        return TiledMatrix._from_parts(self._tiling.copy(), self._values.copy())

    def astype(self, dtype, copy=True):
        """Same tiling, values cast to ``dtype`` as NumPy casts them, stored in the float type that holds them.

        ``T.astype(bool)`` gives ones at the nonzero entries (an unweighted graph) and zeros at stored zeros,
        as scipy's; an integer dtype truncates and wraps as ``numpy.ndarray.astype``.  See the class's
        ``dtype`` rule.

        Examples
        --------
        >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
        >>> T = tg.TiledMatrix(sp.csr_array(np.array([[-1.0, 2.5], [0.0, -0.5]], np.float32)))
        >>> print(T.astype(bool).toarray().tolist(), T.astype(np.int8).toarray().tolist())
        [[1.0, 1.0], [0.0, 1.0]] [[-1.0, 2.0], [0.0, 0.0]]
        """
        target = value_dtype(dtype)
        if target == self.dtype and as_dtype(dtype) == target and not copy:
            return self
        return TiledMatrix._from_parts(self._tiling, cast_values(self._values, dtype))

    def with_values(self, values, *, order="csr", dtype=None):
        """Same tiling with new entry values.  No re-translation.

        Parameters
        ----------
        values : array_like, shape (nnz,)
            On the matrix's device (NumPy on the host; CuPy or NumPy on the GPU).
            Copied: the new matrix owns its values, whatever ``order``.
        order : {"csr", "tiled"}, default "csr"
            ``"csr"``: ``values[i]`` replaces ``T.tocsr().data[i]``.
            ``"tiled"``: ``values[i]`` replaces ``T.values[i]`` (no gather: what
            edge-wise code that keeps the tiled order wants).
        dtype : dtype, optional
            The new matrix's value dtype, with the class's ``dtype`` rule (a
            boolean or integer dtype casts each value as NumPy does, then stores
            it in the float type that holds it).  By default the matrix's own
            (scipy's ``_with_data`` takes the new data's dtype instead): a float32
            matrix stays on the TF32 tensor cores whatever type the new values
            come in.  The rule: the float type the library stores the values in
            without being told (the matrix's own, or the one a boolean or integer
            ``dtype`` becomes) must hold integer values exactly (``|v| <= 2**24``
            for float32, ``2**53`` for float64, ``2**11`` for float16, ``2**8``
            for bfloat16), else ``ValueError`` naming that type; a float ``dtype``
            you name is your cast, rounded as NumPy rounds, and float values are
            rounded to the stored type, a finite value beyond its range
            (``1e300`` into float32) raising ``ValueError`` rather than becoming
            an infinity.

        Examples
        --------
        >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
        >>> T = tg.TiledMatrix(sp.csr_array(np.eye(3, dtype=np.float32)))
        >>> V = T.with_values(np.array([1.0, 2.0, 3.0]))
        >>> print(V.dtype, V.toarray().diagonal().tolist())
        float32 [1.0, 2.0, 3.0]
        """
        if not isinstance(order, str) or order not in ("csr", "tiled"):
            raise ValueError(f"order must be 'csr' or 'tiled', got {order!r:.60}")
        xp = self._tiling.xp
        if xp is np and array_module(values) is not np:
            raise DeviceMismatchError("device values given for a matrix on the CPU")
        made_on_device = array_module(values) is not np  # (device values for a host matrix raised above)
        if not (hasattr(values, "shape") and hasattr(values, "dtype")):
            values = np.asarray(values)
        check_real_dtype(values.dtype, "values")
        if values.shape != (self.nnz,):
            raise ValueError(f"values must have shape ({self.nnz},), got {values.shape}")
        if dtype is None:  # the matrix's own type must hold the values: integers exactly, floats within range
            dtype = self.dtype
            check_fits(check_exact(values, "values", dtype), "values", dtype)
        value_dtype(dtype)  # refuses what is not a real dtype before the values move
        given = values
        values = xp.asarray(values)
        if order == "csr":
            values = values[self._tiling.perm]  # a gather: a new array
        values = cast_values(values, dtype)
        # Never the caller's array (an upload, a gather or a cast is a new one already).
        t = TiledMatrix._from_parts(self._tiling, values.copy() if values is given else values)
        if made_on_device:  # e.g. a training step's: the 16-bit products take them without a host read
            t._casts[DEVICE_VALUES] = True
        return t

    def _with_data(self, values):
        """Same tiling with trusted values in tiled order, their dtype kept (no checks, no copy).

        The edge-wise code of the layers uses it: its values are made on the device in tiled order.
        """
        t = TiledMatrix._from_parts(self._tiling, values)
        if array_module(values) is not np:
            t._casts[DEVICE_VALUES] = True
        return t

    def softmax(self):
        """The edge softmax: each row's stored values replaced by their softmax over the row's stored entries.

        ``P_ij = exp(v_ij - m_i) / sum_k exp(v_ik - m_i)`` with ``m_i`` the row's largest value, over stored
        entries only (an implicit zero takes no part), as DGL's ``SparseMatrix.softmax``.  With
        :meth:`with_values` (scores in ``order="tiled"``) and ``@`` it writes attention as matrix operations,
        ``T.with_values(z, order="tiled").softmax() @ V``, the composition that
        :func:`tcgnn_py.nn.graph_attention` runs fused.  Same tiling and dtype; computed in the values' float type
        (float32 for 16-bit values, rounded once), each row's sum an exact product, so the result repeats bit
        for bit.  A row holding NaN is NaN, and so is a row whose values are all ``-inf`` (0 / 0), as NumPy's.

        Examples
        --------
        >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
        >>> A = sp.csr_array(np.array([[1.0, 1.0 + np.log(3.0)], [0.0, 5.0]], np.float32))
        >>> print(np.round(tg.TiledMatrix(A, device="cpu").softmax().toarray(), 4).tolist())
        [[0.25, 0.75], [0.0, 1.0]]
        """
        xp = self._tiling.xp
        fd = np.dtype(np.float32) if is_half(self.dtype) else self.dtype
        z = self._values.astype(fd, copy=False)
        rows = self._tiling.entry_rows()
        m = xp.full(self.shape[0], -np.inf, dtype=fd)
        with np.errstate(invalid="ignore"):
            xp.maximum.at(m, rows, z)  # order-independent: deterministic
            e = xp.exp(z - m[rows])
        ones = self._tiling.cached(("ones", 1, np.dtype(fd).str), lambda: xp.ones((self.shape[1], 1), dtype=fd))
        s = spmm(self._with_data(e), ones, precision="fp32")[:, 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            P = e / s[rows]
        return self._with_data(P.astype(self.dtype, copy=False))

    # --- transpose -----------------------------------------------------------
    def transpose(self, axes=None, copy=False):
        """Aᵀ, re-translated with the same tile shape (cached).

        Matrices that share a tiling (from :meth:`with_values` or :func:`sddmm`)
        share the translation of Aᵀ too: theirs costs one gather of the values.
        """
        if axes is not None and (not isinstance(axes, (tuple, list)) or tuple(axes) != (1, 0)):
            raise ValueError("Sparse arrays do not support an 'axes' parameter other than (1, 0)")
        if self._transpose is not None:
            return self._transpose
        back = self._transpose_of() if self._transpose_of is not None else None
        if back is not None:
            return back
        tiling_t, src = self._tiling.transpose()
        t = TiledMatrix._from_parts(tiling_t, self._values[src])
        if self._casts.get(DEVICE_VALUES):
            t._casts[DEVICE_VALUES] = True
        t._transpose_of = weakref.ref(self)
        self._transpose = t
        return t

    @property
    def T(self):
        return self.transpose()

    def _own_transpose(self):
        """Make this matrix its own transpose (``T.T is T``), for a builder that has checked its values are exactly
        symmetric: its products by Aᵀ then need no second translation and no second plan."""
        self._transpose = self
        return self

    # --- statistics and checks ------------------------------------------
    def tile_stats(self):
        """:class:`TileStats` of the translation (computed once per tiling)."""
        return self._tiling.stats()

    def launch_choices(self):
        """What the timed launch choices measured on this matrix's tiling (shared with ``with_values`` copies).

        A list with one dict per product signature whose launch was chosen by timing: ``x_dtype``,
        ``D``, ``aligned``, ``tuning`` (the :func:`tcgnn_py.tuning` overrides in effect), ``ms`` (each
        candidate's configuration and its milliseconds, the statistics' default first) and ``kept``
        (the index in ``ms`` of the launch used from then on).  Empty until a product is timed.
        """
        return timed_choices(self._tiling)

    def check_format(self, full_check=False):
        """Check the tiled arrays' invariants; ``full_check`` scans every entry.

        Raises ``ValueError`` with what is wrong.
        """
        full_check = check_bool("full_check", full_check)
        if self._values.shape != (self._tiling.nnz,):
            raise ValueError("tile_pos and values should have the same size")
        self._tiling.check(full_check)

    # --- matmul ---------------------------------------------------------
    def __matmul__(self, other):
        if not _operand_like(other):
            return NotImplemented  # Python then raises "unsupported operand type(s) for @", as scipy's
        if is_cupy_array(other):
            plan = self._plans.get(signature(self._values, other))
            if plan is not None and plan.bound is not None:  # a signature seen before: allocate and launch
                return plan.bound(self._values, self._casts, other, None)
        elif isinstance(other, (str, bytes)):
            return NotImplemented  # Python then raises "unsupported operand type(s) for @"
        elif isscalarlike(other):
            raise ValueError("Scalar operands are not allowed, use '*' instead")
        return self._matmul_dispatch(other)

    def __rmatmul__(self, other):
        if isinstance(other, (str, bytes)) or not _operand_like(other):
            return NotImplemented
        if isscalarlike(other):
            raise ValueError("Scalar operands are not allowed, use '*' instead")
        return self._rmatmul_dispatch(other)

    def dot(self, other):
        """Ordinary dot product (as ``self @ other``)."""
        return self @ other

    # --- arithmetic with scalars (scipy's sparse-array semantics) --------------
    def _scaled(self, scalar, op):
        if not isscalarlike(scalar) or isinstance(scalar, (str, bytes)):
            return NotImplemented
        if array_module(scalar) is not np:  # a 0-d device array
            if self._tiling.xp is np:
                raise DeviceMismatchError("a device scalar given for a matrix on the CPU")
            check_real_dtype(scalar.dtype, "scalar")
        else:
            check_real_dtype(np.asarray(scalar).dtype, "scalar")
        with np.errstate(over="ignore", invalid="ignore"):
            values = op(self._values, scalar)  # NumPy's promotion: a Python float keeps float32 (and 16-bit) values
        vdtype = value_dtype(values.dtype)
        return TiledMatrix._from_parts(self._tiling, values.astype(vdtype, copy=False))

    def __mul__(self, other):
        """``T * other``: the elementwise product, as scipy's sparse arrays (:meth:`multiply`); the matrix product
        is ``T @ X``."""
        if isinstance(other, (str, bytes)) or not _operand_like(other):
            return NotImplemented
        return self.multiply(other)

    def __rmul__(self, other):
        import scipy.sparse as sp

        if isinstance(other, sp.spmatrix):  # scipy's matrices (not arrays) multiply matrices with `*`
            return self.__rmatmul__(other)
        return self.__mul__(other)

    def __truediv__(self, other):
        """``T / scalar``: every stored value divided (same tiling)."""
        if isscalarlike(other):
            return self._scaled(other, lambda v, s: v / s)
        if isinstance(other, (str, bytes)):
            return NotImplemented
        raise TypeError("TiledMatrix / array: elementwise division is scipy's (T.tocsr() / X)")

    def __neg__(self):
        return TiledMatrix._from_parts(self._tiling, -self._values)

    def __array__(self, dtype=None, copy=None):
        if dtype is None and _asked_by_scipy_matmul(sys._getframe(1)):
            # scipy.sparse's `B @ T` defers to T.__rmatmul__ when NumPy makes a 0-d object array of T (its rule for
            # operands it does not know); only scipy's product is given one, every other caller the error below.
            wrapped = np.empty((), dtype=object)
            wrapped[()] = self
            return wrapped
        raise TypeError("a TiledMatrix is sparse and does not convert to a dense array implicitly: use T.toarray() "
                        "for a dense NumPy array, or T.tocsr() for a scipy.sparse csr_array "
                        "(scipy.sparse.csr_array(T.tocsr()))")

    # --- elementwise operations (scipy's sparse-array semantics) ----------------
    def multiply(self, other):
        """The elementwise product with a scalar, a dense array broadcast to ``T.shape``, or a sparse matrix.

        A scalar or a dense array (NumPy, or CuPy for a matrix on the GPU) keeps the tiling: each stored value is
        multiplied by the array's element at its place, so the result stores the same entries, as scipy's
        ``multiply`` does.  A sparse ``other`` (a TiledMatrix or scipy's) gives the product of the two matrices'
        entries, re-translated with this matrix's layout on its device.  The dtype is NumPy's promotion of both.

        Examples
        --------
        >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
        >>> T = tg.TiledMatrix(sp.csr_array(np.array([[1.0, 0.0], [2.0, 3.0]], np.float32)))
        >>> print(T.multiply(np.array([[10.0, 100.0]], np.float32)).toarray().tolist())
        [[10.0, 0.0], [20.0, 300.0]]
        """
        if isscalarlike(other) and not isinstance(other, (str, bytes)):
            return self._scaled(other, lambda v, s: v * s)
        if _is_sparse(other):
            return self._sparse_result(lambda a, b: a.multiply(b), other)
        xp = self._tiling.xp
        if xp is np and array_module(other) is not np:
            raise DeviceMismatchError("a device array given for a matrix on the CPU")
        X = xp.asarray(other)
        check_real_dtype(X.dtype, "other")
        try:
            X = xp.broadcast_to(X, self.shape)
        except ValueError:
            raise ValueError(f"multiply: other of shape {X.shape} does not broadcast to the matrix's {self.shape}") \
                from None
        rows, cols = self._tiling.rows_cols()
        dtype = value_dtype(promote(value_dtype(self.dtype), value_dtype(X.dtype)))
        with np.errstate(over="ignore", invalid="ignore"):
            values = self._values.astype(dtype, copy=False) * X[rows, cols].astype(dtype, copy=False)
        return TiledMatrix._from_parts(self._tiling, values)

    def _sparse_result(self, op, other, *, reflected=False):
        """``op(a, b)`` of the canonical CSR forms (scipy's arithmetic, exact), re-translated as a TiledMatrix
        with this matrix's layout, on its device, of NumPy's promotion of both dtypes."""
        import scipy.sparse as sp

        b = other if sp.issparse(other) else other.tocsr()
        a = self.tocsr()
        dtype = promote(value_dtype(self.dtype), value_dtype(other.dtype))
        result = op(b, a) if reflected else op(a, b)
        return TiledMatrix(sp.csr_array(result), layout=self.layout, device=self.device, dtype=dtype)

    def _sum_with(self, other, sign, reflected=False):
        if isinstance(other, (str, bytes)) or not _operand_like(other):
            return NotImplemented
        if isscalarlike(other):
            if other == 0:
                return -self if reflected and sign < 0 else self.copy()
            raise NotImplementedError("adding a nonzero scalar to a sparse array is not supported")
        if _is_sparse(other):
            if other.shape != self.shape:
                raise ValueError("inconsistent shapes")
            return self._sparse_result(operator.add if sign > 0 else operator.sub, other, reflected=reflected)
        raise TypeError("a TiledMatrix plus or minus a dense array is a dense array: write it densely, e.g. "
                        "T.toarray() + X (or T.tocsr() + X, scipy's dense result)")

    def __add__(self, other):
        """``T + S`` with a sparse S (a TiledMatrix or scipy's): the sum, re-translated; ``T + 0`` is a copy."""
        return self._sum_with(other, 1)

    def __radd__(self, other):
        return self._sum_with(other, 1, reflected=True)

    def __sub__(self, other):
        """``T - S`` with a sparse S (a TiledMatrix or scipy's): the difference, re-translated."""
        return self._sum_with(other, -1)

    def __rsub__(self, other):
        return self._sum_with(other, -1, reflected=True)

    def __abs__(self):
        return TiledMatrix._from_parts(self._tiling, abs(self._values))

    def power(self, n, dtype=None):
        """Each stored value to the power ``n`` (a nonzero scalar), as scipy's ``power``: same tiling.

        ``n = 0`` would make every implicit zero a one (a dense matrix): ``NotImplementedError``, as scipy's.
        """
        if not isscalarlike(n) or isinstance(n, (str, bytes)):
            raise NotImplementedError("input is not scalar")
        if not n:
            raise NotImplementedError("zero power is not supported as it would densify the matrix.\n"
                                      "Use `np.ones(A.shape, dtype=A.dtype)` for this case.")
        values = self._values if dtype is None else cast_values(self._values, dtype)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            values = values ** n
        return TiledMatrix._from_parts(self._tiling, values.astype(value_dtype(values.dtype), copy=False))

    def __pow__(self, n):
        return self.power(n)

    def count_nonzero(self, axis=None):
        """Entries that are not zero (stored zeros excluded), as scipy's: in all, or per row / column."""
        if axis is None:
            return int(self._tiling.xp.count_nonzero(self._values))  # synchronize!
        return self.tocsr().count_nonzero(axis=axis)

    def max(self, axis=None):
        """The largest element, implicit zeros included: scipy's ``max`` of :meth:`tocsr`."""
        return self.tocsr().max(axis=axis)

    def min(self, axis=None):
        """The smallest element, implicit zeros included: scipy's ``min`` of :meth:`tocsr`."""
        return self.tocsr().min(axis=axis)

    def mean(self, axis=None, dtype=None):
        """The mean over all elements, implicit zeros included: scipy's ``mean`` of :meth:`tocsr`."""
        return self.tocsr().mean(axis=axis, dtype=dtype)

    def eliminate_zeros(self):
        """Drop the stored zeros, in place (as scipy's): the matrix is re-translated without them, if it has any.

        Matrices that shared this one's tiling keep theirs.
        """
        xp = self._tiling.xp
        if not bool((self._values == 0).any()):  # synchronize!
            return
        data, indices, indptr = self.csr_arrays()
        keep = data != 0
        counts = xp.bincount(ref.edge_rows(indptr, data.shape[0])[keep], minlength=self.shape[0])
        ptr = xp.zeros(self.shape[0] + 1, dtype=np.int64)
        xp.cumsum(counts, out=ptr[1:])
        if is_half(data.dtype):
            data = data.astype(np.float32)  # exact; the build rounds back to the stored type, which holds them
        T = TiledMatrix((data[keep], indices[keep], ptr), self.shape, dtype=self.dtype, layout=self.layout,
                        device=self.device)
        self._init(T._tiling, T._values)

    def __getitem__(self, key):
        """``T[i:j]`` (or ``T[i:j, :]``): those rows, as a new TiledMatrix on the same device and layout."""
        if isinstance(key, tuple) and len(key) == 2 and key[1] == slice(None):
            key = key[0]
        if not isinstance(key, slice):
            raise TypeError("a TiledMatrix takes row slices only, T[i:j] (a new TiledMatrix of those rows); for "
                            f"other indexing use scipy's: T.tocsr()[...] (got {key!r:.60})")
        start, stop, step = key.indices(self.shape[0])
        if step != 1:  # scipy's fancy row indexing, on the host
            rows = self.tocsr()[np.arange(start, stop, step)]
            return TiledMatrix(rows, layout=self.layout, device=self.device, dtype=self.dtype)
        data, indices, indptr = self.csr_arrays()
        stop = max(stop, start)
        a, b = (int(v) for v in to_host(indptr[[start, stop]]))  # synchronize!
        if is_half(data.dtype):
            data = data.astype(np.float32)
        return TiledMatrix((data[a:b], indices[a:b], indptr[start:stop + 1] - a), (stop - start, self.shape[1]),
                           dtype=self.dtype, layout=self.layout, device=self.device)

    def _matmul_dispatch(self, other, out=None, precision=None):
        M, N = self.shape
        if not is_cupy_array(other) and _is_sparse(other):
            if out is not None:
                raise TypeError(
                    f"out= needs a dense operand: a sparse X ({type(other).__name__}) gives a sparse product"
                )
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
            raise ValueError(f"matmul: X must be 1-D or 2-D, got {X.ndim}-D with shape {X.shape}")
        dtype = result_dtype(self.dtype, X.dtype)
        xp = np if kind == "numpy" else get_cupy()
        if out is not None:
            check_out(out, out_shape, dtype, xp, half_ok=True)
            dtype = out.dtype  # float32 / 16-bit: the float32-computed product is rounded once into it
        X2 = X.reshape(N, 1) if X.ndim == 1 else X
        # Device results go straight into a device ``out``; host ones are copied.
        direct = out is not None and kind == "cupy"
        Y = spmm_raw(
            self._tiling, self._values, X2, dtype, precision,
            out=(out if out.ndim == 2 else out.reshape(M, 1)) if direct else None, casts=self._casts,
        )  # fmt: skip
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
        M = self.shape[0]
        if tr.ndim not in (1, 2):
            raise ValueError(f"matmul: the left operand must be 1-D or 2-D, got {tr.ndim}-D with shape "
                             f"{tuple(reversed(tr.shape))}")
        k = tr.shape[0]
        if tr.ndim in (1, 2) and k != M:
            sig = "1?)->(n,1?)" if tr.ndim == 1 or tr.shape[1] == 1 else "m)->(n,m)"
            raise ValueError(f"{MISMATCH} (n,k={M}),(k={k},{sig}")
        return self.transpose()._matmul_dispatch(tr).transpose()


def _build_dtype(dtype):
    """Value dtype that SGT and scipy handle: 16-bit floats are built in float32 and rounded once."""
    dtype = value_dtype(dtype)
    return np.dtype(np.float32) if is_half(dtype) else dtype


def _operand_like(x):
    """Whether ``x`` can be a product's operand at all: an array, an array producer, a nested sequence, a
    scalar or a sparse matrix (``None``, a dict, ... cannot: ``@`` then defers to Python's error)."""
    if isinstance(x, (np.ndarray, list, tuple)) or is_cupy_array(x) or isscalarlike(x):
        return True
    return any(hasattr(x, attr) for attr in ("__array__", "__array_interface__", "__cuda_array_interface__",
                                            "__dlpack__", "tocsr", "shape"))


def _is_sparse(x):
    import scipy.sparse as sp

    return sp.issparse(x) or isinstance(x, TiledMatrix)


def _asked_by_scipy_matmul(frame):
    """Whether NumPy's conversion was called from scipy.sparse's matmul dispatch (the caller's ``frame``)."""
    return frame.f_code.co_name == "_matmul_dispatch" and frame.f_globals.get("__name__", "").startswith("scipy.sparse")


def issparse(x):
    """Whether ``x`` is a sparse matrix this library takes: a :class:`TiledMatrix`, or a ``scipy.sparse`` or
    ``cupyx.scipy.sparse`` array or matrix (``scipy.sparse.issparse`` knows scipy's own types only).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = sp.csr_array(np.eye(2, dtype=np.float32))
    >>> tg.issparse(tg.TiledMatrix(A)), tg.issparse(A), tg.issparse(np.eye(2)), sp.issparse(tg.TiledMatrix(A))
    (True, True, False, False)
    """
    return _is_sparse(x) or type(x).__module__.startswith("cupyx.scipy.sparse")


def spmm(T, X, out=None, *, precision=None):
    """``T @ X`` with an optional preallocated output and a choice of precision.

    Parameters
    ----------
    T : TiledMatrix
    X : array_like, shape (n_cols,) or (n_cols, D)
        NumPy (NumPy result) or CuPy / any CUDA array producer (CuPy result).
        Any ``D >= 1``; X need not be contiguous (it is copied if not).
    out : ndarray, optional
        C-contiguous, of the result's shape and dtype, on the result's device;
        a float32 or 16-bit result may go to any of float32, float16 and
        bfloat16 (computed in float32, rounded once).  It may alias X (the
        product then goes through a temporary).
    precision : {None, "tf32", "fp32", "fp16", "bf16"}, optional
        ``None``: tensor cores where the tiles have kernels -- TF32 for float32
        data, float16 / bfloat16 MMAs for a 16-bit X on the vector layout --
        and CUDA cores in the data's precision otherwise.  ``"tf32"``: TF32
        tensor cores or an error.  ``"fp32"``: CUDA cores, no rounding of the
        operands.  ``"fp16"`` / ``"bf16"``: the 16-bit MMA or an error (X of
        that type, ``layout="vector"``).  float64 products always run in
        float64.  See Notes.

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

    16-bit operands: the result's dtype is the promotion of the matrix's and
    X's dtypes (float32 matrix with float16 X gives float32, as NumPy would;
    float16 with bfloat16 gives float32, as JAX would); ``out=`` may ask for a
    16-bit result instead.  On the vector layout the product runs on float16 /
    bfloat16 tensor cores with float32 accumulation and is rounded once: X
    is used exactly as given, and a float32 matrix's values are split into two
    16-bit parts (about 22 significant bits for float16, 16 for bfloat16), so
    the error is that of float32 accumulation (measured relative Frobenius
    error about 1e-7 to 2e-6).  A matrix stored in 16 bits
    (``TiledMatrix(A, dtype=...)``) reads half the value bytes; its values are
    already rounded (about 3e-4 relative error for float16, 2e-3 for
    bfloat16).  On the 16 x 8 layout 16-bit X is widened to float32 (exactly)
    and runs the TF32 kernel.  Integers up to 2**11 (float16) and 2**8
    (bfloat16) are exact in X.

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
    if isinstance(X, (str, bytes)):
        raise TypeError(f"spmm: X must be an array of numbers, got {type(X).__name__}")
    if is_cupy_array(X):
        if (precision is None or type(precision) is str) and (out is None or is_cupy_array(out)):
            plan = T._plans.get(signature(T._values, X, out, precision))
            if plan is not None and plan.bound is not None:  # a signature seen before: allocate (or take out), launch
                return plan.bound(T._values, T._casts, X, out)
    elif isscalarlike(X):
        raise ValueError("Scalar operands are not allowed, use '*' instead")
    return T._matmul_dispatch(X, out=out, precision=precision)


def bound_spmm(T, X, precision=None, keep=False):
    """``f(X) -> T @ X`` for a CuPy X of this X's signature (a new result, ``precision`` a name or None): the
    product's bound plan with T's values, without the lookup of :func:`spmm` (a bound layer call's, whose key
    proves the signature).  Until the signature's plan has bound (its launch is final only once the timed choice's
    candidates have compiled, seconds after a layer's second call), ``f`` runs :func:`spmm` and looks again.

    ``keep``: once bound, every call writes and returns one array, its first bound result, for a caller that reads
    it before its next call on the stream (a bound layer call's intermediate); else the results are
    :func:`~tcgnn_py.products._launch.recycled`."""
    key = signature(T._values, X, None, precision)
    plans, values, casts = T._plans, T._values, T._casts
    bound = out = make = None

    def f(X):
        nonlocal bound, out, make
        if bound is None:
            plan = plans.get(key)
            bound = None if plan is None else plan.bound
            if bound is None:
                return spmm(T, X, precision=precision)
            Y = bound(values, casts, X, None)  # (the plan's own result: its shape and type)
            if keep:
                out = Y
            else:
                make = recycled(Y.shape, Y.dtype)
            return Y
        return bound(values, casts, X, out if make is None else make(None, None))

    return f


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
    precision : {None, "tf32", "fp32", "fp16", "bf16"}, optional
        As in :func:`spmm`: TF32 tensor cores by default for float32.
        16-bit inputs are widened to float32 exactly (the same products a
        16-bit MMA forms) and accumulated in float32, then rounded once.

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
    multiply_values = check_bool("multiply_values", multiply_values)
    for name, x in (("Xa", Xa), ("Xb", Xb)):
        if isinstance(x, (str, bytes)) or (x is not None and _is_sparse(x)):
            raise TypeError(f"sddmm: {name} must be a dense array of numbers, got {type(x).__name__}")
    if (precision is None or type(precision) is str) and is_cupy_array(Xa) and (Xb is None or is_cupy_array(Xb)):
        Xb_ = Xa if Xb is None else Xb
        plan = T._plans.get(signature(T._values, Xa, Xb_, precision, ("sddmm", multiply_values, False)))
        if plan is not None and plan.bound is not None:  # a signature seen before: allocate and launch
            return TiledMatrix._from_parts(T.tiling, plan.bound(T._values, T._casts, Xa, Xb_, None))
    on_device = T.device == "cuda"
    a, _ = as_operand(Xa, on_device)
    b = a if Xb is None else as_operand(Xb, on_device)[0]
    a = a.reshape(-1, 1) if a.ndim == 1 else a
    b = b.reshape(-1, 1) if b.ndim == 1 else b
    M, N = T.shape
    for name, x in (("Xa", a), ("Xb", b)):
        if x.ndim != 2:
            raise ValueError(f"sddmm: {name} must be 1-D or 2-D, got {x.ndim}-D with shape {x.shape}")
    if a.shape[0] != M or b.shape[0] != N or a.shape[1] != b.shape[1]:
        raise ValueError(
            f"sddmm: dimension mismatch with signature (n={M},k={N}),(n={a.shape[0]},d={a.shape[1]}),"
            f"(k={b.shape[0]},d={b.shape[1]})->(n,k)"
        )
    dtype = promote(value_dtype(a.dtype), value_dtype(b.dtype))
    if multiply_values:
        dtype = promote(dtype, T.dtype)
    values = sddmm_raw(T.tiling, T.values, a, b, dtype, multiply_values, precision, casts=T._casts)
    return TiledMatrix._from_parts(T.tiling, values)
