"""Layer 4: one rank's rows of a graph matrix, and the products that exchange halo rows with NCCL."""

import numpy as np

from .._partition import balanced_bounds, compact_columns
from .._tiled import TiledMatrix, sddmm, spmm
from .._validation import coerce_csr, is_half

__all__ = ["DistributedMatrix", "HALO_MODES", "host_array"]

#: How halo rows of X travel: grouped point-to-point, or one all-gather of every rank's boundary rows.
HALO_MODES = ("sendrecv", "allgather")


def host_array(x):
    """``x`` as a NumPy array (a device array is copied to the host)."""
    return x.get() if hasattr(x, "get") else np.asarray(x)  # synchronize! (device arrays)


def _to(xp, a):
    """``a`` on this rank's device (NumPy for the reference backend), copied peer to peer if elsewhere."""
    if xp is np:
        return host_array(a)
    if isinstance(a, xp.ndarray) and a.device.id != xp.cuda.Device().id:
        out = xp.empty(a.shape, a.dtype)
        out.data.copy_from_device(xp.ascontiguousarray(a).data, a.nbytes)
        return out
    return xp.asarray(a)


class DistributedMatrix:
    """This rank's rows of a square sparse matrix partitioned by rows over a group.

    Rank ``r`` owns rows ``bounds[r]:bounds[r + 1]`` of ``A``, of ``X`` and of
    ``Y = A @ X``.  Its rows are a :class:`~tcgnn_py.TiledMatrix` whose columns
    are compacted to ``[own rows | halo rows]`` (the halo: rows of ``X`` other
    ranks own, grouped by owner), built on the rank's GPU.  Products move only
    halo rows, with NCCL.

    Parameters
    ----------
    A : sparse array or matrix, or ``(data, indices, indptr)``
        The whole matrix, or at least its CSR arrays, on every rank (NumPy, or CuPy on
        any device): each rank slices its own rows.
    ctx : Context
        From :func:`~tcgnn_py.distributed.spmd` or :func:`~tcgnn_py.distributed.init`.
    bounds : array of int, optional
        Row bounds (``world_size + 1``); balanced by nonzeros by default.
    dtype, layout : optional
        As for :class:`~tcgnn_py.TiledMatrix`.
    halo : {"sendrecv", "allgather"}, default "sendrecv"
        Halo exchange: grouped NCCL send/recv of exactly the rows each peer needs, or one
        all-gather of each rank's boundary rows (padded to the largest) and a local gather.

    Notes
    -----
    Building exchanges each rank's halo requests (an all-gather of counts and one
    send/recv of row lists) and reads the halo's size to the host.  Every rank must
    build the same matrices in the same order, since building is collective.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> from tcgnn_py import distributed as dist
    >>> A = sp.csr_array(np.array([[0, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=np.float32))
    >>> X = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    >>> def rank(ctx):
    ...     D = dist.DistributedMatrix(A, ctx)
    ...     return D.matmul(X[D.row_slice])
    >>> np.concatenate(dist.spmd(rank, 2, backend="reference")).ravel().tolist()
    [5.0, 1.0, 3.0]
    """

    def __init__(self, A, ctx, *, bounds=None, dtype=None, layout=None, halo="sendrecv"):
        if halo not in HALO_MODES:
            raise ValueError(f"halo must be one of {HALO_MODES}, got {halo!r}")
        n = len(A[2]) - 1 if isinstance(A, tuple) and len(A) == 3 else None  # a graph is square
        data, indices, indptr, shape = coerce_csr(A, None if n is None else (n, n))
        if shape[0] != shape[1]:
            raise ValueError(f"a row-partitioned graph needs a square matrix, got shape {shape}")
        P, r, xp = ctx.world_size, ctx.rank, ctx.xp
        host_indptr = host_array(indptr).astype(np.int64)
        bounds = balanced_bounds(host_indptr, P) if bounds is None else np.asarray(bounds, np.int64)
        if bounds.shape != (P + 1,) or bounds[0] != 0 or bounds[-1] != shape[0] or np.any(np.diff(bounds) < 0):
            raise ValueError(f"bounds must rise from 0 to {shape[0]} in {P + 1} steps, got {bounds.tolist()}")
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        a, b = int(host_indptr[lo]), int(host_indptr[hi])
        cols = _to(xp, indices[a:b]).astype(np.int64)
        vals = _to(xp, data[a:b])
        rptr = xp.asarray(host_indptr[lo:hi + 1] - a)
        mapped, halo_rows, halo_ptr = compact_columns(cols, lo, hi, bounds, xp)
        if halo_rows.shape[0] and not (0 <= int(halo_rows[0]) and int(halo_rows[-1]) < shape[1]):  # synchronize!
            raise ValueError(f"column index out of bounds for {shape[1]} columns (rank {r}'s rows)")
        self.ctx, self.bounds, self.shape, self.halo_mode = ctx, bounds, shape, halo
        self.n_own, self.n_halo = hi - lo, int(halo_rows.shape[0])
        self.halo_ptr = host_array(halo_ptr)
        self.local = TiledMatrix((vals, mapped.astype(np.int32), rptr.astype(np.int32)),
                                 (self.n_own, self.n_own + self.n_halo), dtype=dtype, layout=layout,
                                 device="cpu" if xp is np else "cuda")
        # Requests: rank p tells each owner q which of q's rows it needs (q's local numbering).
        self.recv_counts = np.diff(self.halo_ptr)  # rows this rank receives from each q
        self.send_counts = host_array(ctx.allgather(xp.asarray(self.recv_counts)))[:, r]  # rows each p asks of this rank
        asks = {q: xp.ascontiguousarray(halo_rows[self.halo_ptr[q]:self.halo_ptr[q + 1]] - int(bounds[q]))
                for q in range(P) if q != r and self.recv_counts[q]}
        self.sends = {p: xp.empty(int(self.send_counts[p]), np.int64) for p in range(P)
                      if p != r and self.send_counts[p]}
        ctx.sendrecv(asks, self.sends)
        if halo == "allgather":
            self._plan_allgather(asks)
        self._buffers = {}

    @property
    def row_slice(self):
        """``slice(bounds[rank], bounds[rank + 1])``: this rank's rows of the whole matrix."""
        r = self.ctx.rank
        return slice(int(self.bounds[r]), int(self.bounds[r + 1]))

    # --- the halo exchange -------------------------------------------------------------
    def _plan_allgather(self, asks):
        """Boundary rows (sent once to all) and where this rank's halo sits in the gathered block."""
        ctx, xp, P = self.ctx, self.ctx.xp, self.ctx.world_size
        parts = [self.sends[p] for p in sorted(self.sends)]
        self.boundary = xp.unique(xp.concatenate(parts)) if parts else xp.zeros(0, np.int64)
        sizes = host_array(ctx.allgather(xp.asarray([self.boundary.shape[0]], np.int64)))[:, 0]
        self.boundary_max = int(sizes.max())
        # Where each requested row sits in its owner's boundary: owners answer the askers.
        pos = {p: xp.searchsorted(self.boundary, self.sends[p]) for p in self.sends}
        got = {q: xp.empty(a.shape[0], np.int64) for q, a in asks.items()}
        ctx.sendrecv(pos, got)
        idx = [q * self.boundary_max + got[q] for q in range(P) if q in got]
        self.gather_index = xp.concatenate(idx) if idx else xp.zeros(0, np.int64)

    def _halo_blocks(self, Z):
        """``{q: rows of Z holding the halo rows q owns}`` (views), for each peer with any."""
        own = self.n_own
        return {q: Z[own + int(self.halo_ptr[q]):own + int(self.halo_ptr[q + 1])]
                for q in range(self.ctx.world_size) if q != self.ctx.rank and self.recv_counts[q]}

    def _exchange(self, buf):
        """Fill ``buf[n_own:]`` (the halo rows) from the owners of those rows."""
        ctx, own = self.ctx, self.n_own
        if ctx.world_size == 1:
            return
        if self.halo_mode == "sendrecv":
            ctx.sendrecv({p: buf[idx] for p, idx in self.sends.items()}, self._halo_blocks(buf))
            return
        xp = ctx.xp
        block = xp.zeros((self.boundary_max,) + buf.shape[1:], dtype=buf.dtype)
        block[:self.boundary.shape[0]] = buf[self.boundary]
        gathered = ctx.allgather(block).reshape((-1,) + buf.shape[1:])
        buf[own:] = gathered[self.gather_index]

    def operand(self, X):
        """``[X | halo rows]`` for a product: X's rows copied into this rank's buffer, the halo exchanged.

        A buffer per (width, dtype) is kept and reused: the result is valid until the next product
        of the same kind.
        """
        xp = self.ctx.xp
        X = xp.asarray(X)
        vec = X.ndim == 1
        X2 = X.reshape(-1, 1) if vec else X
        if X2.ndim != 2 or X2.shape[0] != self.n_own:
            sig = "1?)->(n,1?)" if vec else "m)->(n,m)"
            raise ValueError(f"matmul: dimension mismatch with signature (n,k={self.n_own}),"
                             f"(k={X2.shape[0]},{sig} (this rank's rows of X)")
        key = (X2.shape[1], X2.dtype.str)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = xp.empty((self.n_own + self.n_halo, X2.shape[1]), X2.dtype)
        buf[:self.n_own] = X2
        self._exchange(buf)
        return buf

    # --- products ---------------------------------------------------------------------------
    def matmul(self, X, *, precision=None, values=None, out=None):
        """This rank's rows of ``A @ X``, from this rank's rows of X (shape ``(n_own, d)`` or ``(n_own,)``).

        ``values``: new values in the local matrix's tiled order (edge weights), as the GNN layers pass.
        """
        buf = self.operand(X)
        T = self.local if values is None else self.local.with_values(values, order="tiled", dtype=getattr(values, "dtype", None))
        Y = spmm(T, buf, out, precision=precision)
        return Y.reshape(-1) if np.ndim(X) == 1 and out is None else Y

    __matmul__ = matmul

    def rmatmul_t(self, G, *, precision=None, values=None):
        """This rank's rows of ``Aᵀ @ G`` (backward passes), from this rank's rows of G.

        The local ``Tᵀ @ G`` gives rows for own and halo columns; the halo rows go back to their
        owners, which add them in rank order (deterministic: two runs are bit-identical).
        """
        ctx, xp = self.ctx, self.ctx.xp
        G = xp.asarray(G)
        vec = G.ndim == 1
        G2 = G.reshape(-1, 1) if vec else G
        if G2.ndim != 2 or G2.shape[0] != self.n_own:
            raise ValueError(f"rmatmul_t: G has {G2.shape[0]} rows, this rank owns {self.n_own}")
        T = self.local if values is None else self.local.with_values(values, order="tiled", dtype=getattr(values, "dtype", None))
        out = xp.empty((self.shape_local[1], G2.shape[1]), G2.dtype) if is_half(G2.dtype) else None
        Z = spmm(T.T, G2, out, precision=precision)
        Y = Z[:self.n_own]
        if ctx.world_size > 1:
            recv = {p: xp.empty((idx.shape[0], Z.shape[1]), Z.dtype) for p, idx in self.sends.items()}
            ctx.sendrecv(self._halo_blocks(Z), recv)
            for p in sorted(recv):  # rows are distinct within one peer's block: no collisions
                Y[self.sends[p]] += recv[p]
        return Y.reshape(-1) if vec else Y

    @property
    def shape_local(self):
        """The local matrix's shape: ``(n_own, n_own + n_halo)``."""
        return self.local.shape

    def sddmm(self, Xa, Xb=None, *, precision=None):
        """``<Xa[i], Xb[j]>`` on this rank's stored ``(i, j)``, as local values in tiled order.

        ``Xa`` and ``Xb`` are this rank's rows; the halo rows of ``Xb`` (default ``Xa``) are exchanged.
        """
        xp = self.ctx.xp
        Xa = xp.asarray(Xa)
        buf = self.operand(Xa if Xb is None else Xb)
        return sddmm(self.local, Xa, buf, precision=precision).values
