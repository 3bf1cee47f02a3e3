"""Layer 4: one rank's rows of a graph matrix, and the products that exchange halo rows while they compute.

A rank's rows are two :class:`~tcgnn_py.TiledMatrix` parts: ``own`` (its rows x its own columns) and ``halo``
(the rows that have entries in other ranks' columns x those columns, the *halo*, grouped by owner).  A product
``A @ X`` packs the rows other ranks asked for into one send buffer (optionally in 16 bits), starts the NCCL
exchange on the rank's communication stream, multiplies ``own @ X`` on the compute stream meanwhile -- straight
from X: no copy into an operand buffer -- and then adds ``halo @ H`` into the rows that have halo entries.
``Aᵀ @ G`` runs the other way round: the halo columns' partial sums are computed first and travel back to their
owners while the own part computes, and each owner adds them in rank order (bit-identical runs).
"""

import hashlib

import numpy as np

from .._device import array_module
from ..products import result_dtype
from ..orders import Permutation
from .._tiled import TiledMatrix, sddmm, spmm
from .._validation import as_dtype, coerce_graph, is_half
from ._partition import Partition, balanced_bounds, compact_columns, partition as find_partition

__all__ = ["DistributedMatrix", "HALO_DTYPES", "host_array", "take_rows", "entry_rows", "digest"]

#: The largest finite float16: a float32 (or bfloat16) value beyond it would travel as an infinity.
HALF_MAX = 65504.0
#: The types halo rows may travel in (``halo_dtype=``): the operand's own, or 16 bits.
HALO_DTYPES = (None, "float32", "float16", "bfloat16")


def host_array(x):
    """``x`` as a NumPy array (a device array is copied to the host)."""
    return x.get() if hasattr(x, "get") else np.asarray(x)  # synchronize! (device arrays)


def take_rows(data, indices, indptr, rows):
    """CSR arrays of the listed rows (any order), on the arrays' module: ``(data, indices, indptr)``."""
    xp = array_module(indptr)
    rows = xp.asarray(rows, dtype=np.int64)
    start, stop = indptr[rows].astype(np.int64), indptr[rows + 1].astype(np.int64)
    ptr = xp.zeros(rows.shape[0] + 1, np.int64)
    xp.cumsum(stop - start, out=ptr[1:])
    total = int(ptr[-1])  # synchronize! (device arrays)
    row = entry_rows(xp, ptr, total)
    pos = xp.arange(total, dtype=np.int64) - ptr[row] + start[row]
    return data[pos], indices[pos], ptr


def entry_rows(xp, indptr, nnz):
    """Row of each of the ``nnz`` entries of a CSR matrix (int64; a search, not a repeat: CuPy's repeat takes
    its counts from the host)."""
    return xp.searchsorted(indptr, xp.arange(nnz, dtype=np.int64), side="right") - 1


def _to(xp, a):
    """``a`` on this rank's device (NumPy for host ranks), copied peer to peer if it lives on another GPU."""
    if xp is np:
        return host_array(a)
    if isinstance(a, xp.ndarray) and a.device.id != xp.cuda.Device().id:
        out = xp.empty(a.shape, a.dtype)
        out.data.copy_from_device(xp.ascontiguousarray(a).data, a.nbytes)
        return out
    return xp.asarray(a)


def digest(*arrays):
    """62 bits of a hash of the arrays' shapes, types and values (the same arrays: the same number), which ranks
    compare to find out whether they were given the same ones.  Device arrays are read once."""
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        a = np.ascontiguousarray(host_array(a))  # synchronize! (device arrays)
        h.update(repr((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    return int.from_bytes(h.digest(), "little") >> 2


def _fingerprint(bounds, perm):
    """The :func:`digest` of the row bounds and the permutation (the same partition: the same number)."""
    return digest(np.asarray(bounds, np.int64), *(() if perm is None else (perm.perm,)))


#: How a partition's method travels from rank 0 (:func:`_shared_partition`).
_METHODS = ("none", "metis", "lp", "auto")


def _shared_partition(ctx, csr, n, method):
    """:func:`~tcgnn_py.distributed.partition` run on rank 0 and sent to every rank (one sum over the ranks): a
    partitioner need not give the same answer on every rank, and every rank must use the same one."""
    P = ctx.world_size
    if P == 1:
        return find_partition(csr, 1, method)
    msg = np.zeros(n + P + 3, np.int64)  # permutation, bounds, method, microseconds taken
    if ctx.rank == 0:
        part = find_partition(csr, P, method)
        msg[:n], msg[n:n + P + 1] = part.permutation.perm, part.bounds
        msg[-2], msg[-1] = _METHODS.index(part.method), int(part.seconds * 1e6)
    got = host_array(ctx.allreduce(ctx.xp.asarray(msg)))  # synchronize!
    return Partition(Permutation(got[:n].copy()), got[n:n + P + 1].copy(), _METHODS[int(got[-2])],
                     float(got[-1]) / 1e6)


def _halo_dtype(halo_dtype):
    if halo_dtype is None:
        return None
    if isinstance(halo_dtype, str) and halo_dtype not in HALO_DTYPES:
        raise ValueError(f"halo_dtype must be one of {HALO_DTYPES}, got {halo_dtype!r:.60}")
    dt = as_dtype(halo_dtype, "halo_dtype")
    if dt.name not in HALO_DTYPES:
        raise ValueError(f"halo_dtype must be one of {HALO_DTYPES}, got {dt.name}")
    return dt


class DistributedMatrix:
    """This rank's rows of a square sparse matrix partitioned by rows over a group.

    Rank ``r`` owns rows ``bounds[r]:bounds[r + 1]`` of the (partitioned) matrix, of ``X`` and of
    ``Y = A @ X``: the original vertices :attr:`global_rows`.  Products move only halo rows, with NCCL,
    while the own part computes.

    Parameters
    ----------
    A : sparse array or matrix, TiledMatrix, or ``(data, indices, indptr)``
        The whole matrix, or at least its CSR arrays (``n x n`` with ``n = len(indptr) - 1``), on every rank
        (NumPy, or CuPy on any device): each rank takes its own rows.  A graph larger than one host's memory is loaded rank by rank instead
        (:func:`tcgnn_py.distributed.save_rows` and :func:`~tcgnn_py.distributed.load_rows`).
    ctx : Context
        From :func:`~tcgnn_py.distributed.init` or :func:`~tcgnn_py.distributed.spmd`.
    partition : {None, "auto", "metis", "lp"} or Partition, optional
        Renumber the vertices for locality before the row split (:func:`~tcgnn_py.distributed.partition`;
        each rank computes the same one: pass a :class:`Partition` computed once where the graph is large).
        None keeps the graph's order.
    bounds : array of int, optional
        Row bounds (``world_size + 1``) in the graph's order, without ``partition``; balanced by nonzeros by
        default.
    dtype, layout : optional
        As for :class:`~tcgnn_py.TiledMatrix`.
    halo_dtype : {None, "float32", "float16", "bfloat16"}, optional
        The type halo rows travel in: None keeps the operand's.  16 bits halve the bytes exchanged; each
        value is rounded once (exact on integers up to 2**11 in float16, 2**8 in bfloat16), and a finite
        float32 value beyond float16's range raises ``ValueError`` instead of arriving as infinity.

    Notes
    -----
    Building is collective (the ranks exchange which rows each needs): every rank must build the same
    matrices in the same order.  The same holds for every product.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> from tcgnn_py import distributed as dist
    >>> A = sp.csr_array(np.array([[0, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=np.float32))
    >>> X = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    >>> def rank(ctx):
    ...     D = dist.DistributedMatrix(A, ctx)
    ...     return D.matmul(X[D.global_rows])
    >>> np.concatenate(dist.spmd(rank, 2, backend="reference")).ravel().tolist()
    [5.0, 1.0, 3.0]
    """

    def __init__(self, A, ctx, *, partition=None, bounds=None, dtype=None, layout=None, halo_dtype=None):
        data, indices, indptr, n = coerce_graph(A, "a row-partitioned graph")
        P, r = ctx.world_size, ctx.rank
        perm = None
        if partition is not None:
            if bounds is not None:
                raise TypeError("bounds and partition both given: a partition sets its own bounds")
            if not isinstance(partition, Partition):
                partition = _shared_partition(ctx, (data, indices, indptr), n, partition)
            if partition.parts != P or len(partition.permutation) != n:
                raise ValueError(f"the partition is of {len(partition.permutation)} vertices into {partition.parts} "
                                 f"parts; this group has {P} ranks and the graph {n} vertices")
            bounds, perm = partition.bounds, partition.permutation
        host_indptr = host_array(indptr).astype(np.int64)
        if bounds is not None:
            given = np.asarray(bounds)
            if given.dtype.kind not in "iu":
                raise TypeError(f"bounds must be integers (row numbers), got {given.tolist()!r:.80}")
        bounds = balanced_bounds(host_indptr, P) if bounds is None else np.asarray(bounds, np.int64)
        if bounds.shape != (P + 1,) or bounds[0] != 0 or bounds[-1] != n or np.any(np.diff(bounds) < 0):
            raise ValueError(f"bounds must rise from 0 to {n} in {P + 1} steps, got {bounds.tolist()}")
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        if perm is None:
            a, b = int(host_indptr[lo]), int(host_indptr[hi])
            rows = (data[a:b], indices[a:b], host_indptr[lo:hi + 1] - a)
            global_rows = np.arange(lo, hi, dtype=np.int64)
        else:
            global_rows = perm.perm[lo:hi]
            d, c, p = take_rows(data, indices, host_indptr if array_module(indices) is np else indptr, global_rows)
            inv = array_module(c).asarray(perm.inverse_perm)
            rows = (d, inv[c.astype(np.int64)], p)
        self._build(ctx, rows, n, bounds, global_rows, perm, dtype, layout, halo_dtype)

    @classmethod
    def from_rows(cls, rows, ctx, bounds, *, global_rows=None, permutation=None, dtype=None, layout=None,
                  halo_dtype=None):
        """This rank's rows only: ``rows = (data, indices, indptr)`` of rows ``bounds[rank]:bounds[rank + 1]``
        (columns in the same numbering as the rows), e.g. read by :func:`~tcgnn_py.distributed.load_rows`."""
        self = cls.__new__(cls)
        bounds = np.asarray(bounds, np.int64)
        n = int(bounds[-1])
        lo, hi = int(bounds[ctx.rank]), int(bounds[ctx.rank + 1])
        if global_rows is None:
            global_rows = np.arange(lo, hi, dtype=np.int64)
        self._build(ctx, rows, n, bounds, np.asarray(global_rows, np.int64), permutation, dtype, layout, halo_dtype)
        return self

    def _build(self, ctx, rows, n, bounds, global_rows, perm, dtype, layout, halo_dtype):
        P, r, xp = ctx.world_size, ctx.rank, ctx.xp
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        data, indices, indptr = rows
        if xp is not np and P > 1:  # compiled before the first collective: no module loads while peers wait
            from ..kernels import dist as kd
            from ..kernels.registry import get_kernel

            h = (_halo_dtype(halo_dtype) or np.dtype(np.float32)).name
            for name in {kd.pack_name("float32", "float32"), kd.pack_name("float32", h), kd.add_name("float32"),
                         kd.add_name(h)}:
                get_kernel("dist", name)
        if indptr.shape[0] != hi - lo + 1:
            raise ValueError(f"rank {r} owns rows {lo}:{hi}, got {indptr.shape[0] - 1} rows")
        cols = _to(xp, indices).astype(np.int64)
        vals = _to(xp, data)
        rptr = _to(xp, indptr).astype(np.int64)
        mapped, halo_rows, halo_ptr = compact_columns(cols, lo, hi, bounds, xp)
        if halo_rows.shape[0] and not (0 <= int(halo_rows[0]) and int(halo_rows[-1]) < n):  # synchronize!
            raise ValueError(f"column index out of bounds for {n} columns (rank {r}'s rows)")
        self.ctx, self.bounds, self.shape = ctx, bounds, (n, n)
        self.global_rows = global_rows
        self.permutation = perm
        self.halo_dtype = _halo_dtype(halo_dtype)
        self.n_own, self.n_halo = hi - lo, int(halo_rows.shape[0])
        self.halo_ptr = host_array(halo_ptr)
        device = "cpu" if xp is np else "cuda"
        # The own part (own columns) and the halo part (rows with entries in halo columns x those columns).
        erow = entry_rows(xp, rptr, int(cols.shape[0]))
        own = mapped < self.n_own
        o_ptr = xp.zeros(self.n_own + 1, np.int64)
        xp.cumsum(xp.bincount(erow[own], minlength=self.n_own), out=o_ptr[1:])
        self.own = TiledMatrix((vals[own], mapped[own].astype(np.int32), o_ptr), (self.n_own, self.n_own),
                               dtype=dtype, layout=layout, device=device)
        hrow = erow[~own]
        self.boundary_rows = xp.unique(hrow)  # rows of this rank with entries in halo columns, ascending
        n_b = int(self.boundary_rows.shape[0])
        h_ptr = xp.zeros(n_b + 1, np.int64)
        xp.cumsum(xp.bincount(xp.searchsorted(self.boundary_rows, hrow), minlength=n_b), out=h_ptr[1:])
        self.halo = TiledMatrix((vals[~own], (mapped[~own] - self.n_own).astype(np.int32), h_ptr),
                                (n_b, self.n_halo), dtype=dtype, layout=layout, device=device)
        # Requests: rank p tells each owner q which of q's rows it needs (q's local numbering).
        self.recv_counts = np.diff(self.halo_ptr)  # rows this rank receives from each q
        # With the requests goes each rank's fingerprint of the partition: ranks given different ones (a
        # partitioner run on each rank need not agree) would ask each other for rows that do not exist.
        mine = np.append(self.recv_counts, _fingerprint(bounds, perm)).astype(np.int64)
        every = host_array(ctx.allgather(xp.asarray(mine)))  # synchronize!
        differ = [q for q in range(P) if every[q, -1] != every[0, -1]]
        if differ:
            raise ValueError(f"rank {r}: the ranks were given different row partitions (ranks {differ} differ from "
                             "rank 0 in bounds or permutation); build every rank's matrix from the same Partition, "
                             "or pass the method and let rank 0 partition for all")
        self.send_counts = every[:, r]  # rows each p asks of us
        asks = {q: xp.ascontiguousarray(halo_rows[self.halo_ptr[q]:self.halo_ptr[q + 1]] - int(bounds[q]))
                for q in range(P) if q != r and self.recv_counts[q]}
        self.sends = {p: xp.empty(int(self.send_counts[p]), np.int64) for p in range(P)
                      if p != r and self.send_counts[p]}
        ctx.sendrecv(asks, self.sends)
        self.send_ptr = np.concatenate([[0], np.cumsum([self.send_counts[p] if p in self.sends else 0
                                                         for p in range(P)])]).astype(np.int64)
        parts = [self.sends[p] for p in sorted(self.sends)]
        self.send_index = xp.concatenate(parts) if parts else xp.zeros(0, np.int64)
        self._send_peers = sorted(self.sends)  # the peers this rank sends rows to, and receives from
        self._recv_peers = [q for q in range(P) if q != r and self.recv_counts[q]]
        self._buffers = {}

    # --- what the rank holds -------------------------------------------------------------------
    @property
    def row_slice(self):
        """``slice(bounds[rank], bounds[rank + 1])``: this rank's rows in the partitioned numbering."""
        r = self.ctx.rank
        return slice(int(self.bounds[r]), int(self.bounds[r + 1]))

    @property
    def nnz(self):
        """Entries this rank stores (own and halo parts)."""
        return self.own.nnz + self.halo.nnz

    def __repr__(self):
        return (f"<DistributedMatrix rank {self.ctx.rank} of {self.ctx.world_size}: {self.n_own} of {self.shape[0]} "
                f"rows, {self.nnz} entries ({self.halo.nnz} in {self.n_halo} halo columns)>")

    def memory(self):
        """Bytes this rank holds, by structure: ``{"own": ..., "halo": ..., "transposes": ..., "plans": ...,
        "exchange": ..., "entries": nnz}`` (tilings with their values; the transposes built by
        :meth:`rmatmul_t`; cached plans; the exchange's index and buffers)."""
        def tiling_bytes(T):
            return sum(int(a.nbytes) for a in T.tiling.arrays(T.values).values())

        out = {"own": tiling_bytes(self.own), "halo": tiling_bytes(self.halo), "transposes": 0, "plans": 0}
        for T in (self.own, self.halo):
            out["plans"] += T.tiling.cache_nbytes()
            if T._transpose is not None:
                out["transposes"] += tiling_bytes(T._transpose) + T._transpose.tiling.cache_nbytes()
        out["exchange"] = int(self.send_index.nbytes) + sum(int(b.nbytes) for b in self._buffers.values())
        out["entries"] = self.nnz
        return out

    def local_csr(self, values=None):
        """This rank's rows as a scipy ``csr_array`` over ``[own columns | halo columns]`` (``values``: in the
        entries' order, see :attr:`values`)."""
        import scipy.sparse as sp

        no = self.own.nnz
        own = self.own if values is None else self.own.with_values(values[:no], order="tiled")
        halo = self.halo if values is None else self.halo.with_values(values[no:], order="tiled")
        a = own.tocsr()
        h = sp.coo_array(halo.tocsr())
        rows = host_array(self.boundary_rows)[h.row]
        hb = sp.csr_array((h.data, (rows, h.col + self.n_own)), shape=(self.n_own, self.n_own + self.n_halo))
        return sp.csr_array(sp.hstack([a, sp.csr_array((self.n_own, self.n_halo), dtype=a.dtype)]) + hb)

    # --- entries, in one order: the own part's tiled order, then the halo part's -----------------------
    @property
    def values(self):
        return self.ctx.xp.concatenate([self.own.values, self.halo.values])

    def entry_rows(self):
        """Local row of every entry (int32), in the entries' order."""
        xp = self.ctx.xp
        hr = self.boundary_rows[self.halo.tiling.entry_rows()]
        return xp.concatenate([self.own.tiling.entry_rows(), hr.astype(np.int32)])

    def entry_cols(self):
        """Local column of every entry (own columns, then ``n_own +`` halo columns; int32)."""
        xp = self.ctx.xp
        oc = self.own.tiling.rows_cols()[1]
        hc = self.halo.tiling.rows_cols()[1] + self.n_own
        return xp.concatenate([oc, hc]).astype(np.int32)

    def entry_ids(self):
        """A distinct id per entry (its position in the own part's CSR order, then the halo part's)."""
        xp = self.ctx.xp
        return xp.concatenate([self.own.tiling.perm.astype(np.int64),
                               self.own.nnz + self.halo.tiling.perm.astype(np.int64)])

    def _parts(self, values):
        if values is None:
            return self.own, self.halo
        no = self.own.nnz
        return self.own._with_data(values[:no]), self.halo._with_data(values[no:])

    # --- the halo exchange ----------------------------------------------------------------------
    def _buffer(self, key, shape, dtype):
        buf = self._buffers.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self._buffers[key] = self.ctx.xp.empty(shape, dtype)
        return buf

    def _pack(self, X, index, out, halo):
        """``out[:] = X[index]`` cast to ``halo``'s type; float16 values out of its range raise."""
        xp = self.ctx.xp
        limit = HALF_MAX if halo.name == "float16" and X.dtype.name != "float16" else 0.0  # float16 X always fits
        if xp is not np and X.dtype.name in ("float32", "float16", "bfloat16") and out.shape[0]:
            from ..kernels import dist as kd
            from ..kernels.launches import make

            flag = self._buffer(("overflow",), (1,), np.uint32)
            if limit:
                flag.fill(0)
            make("dist", kd.pack_name(X.dtype.name, halo.name), min(out.shape[0], 65535 * 8), kd.ROW_THREADS, (),
                 dict(X=X, idx=index, n_rows=out.shape[0], D=X.shape[1], out=out, overflow=flag, limit=limit)).run()
            return flag if limit else None
        if out.shape[0]:
            rows = X[index]
            if limit and bool(((xp.abs(rows) > limit) & xp.isfinite(rows)).any()):  # synchronize!
                raise ValueError(self._overflow_message(halo))
            out[...] = rows.astype(halo, copy=False)
        return None

    def _arange(self, n):
        key = ("arange", n)
        if key not in self._buffers:
            self._buffers[key] = self.ctx.xp.arange(n, dtype=np.int64)
        return self._buffers[key]

    def _overflow_message(self, halo):
        return (f"rank {self.ctx.rank}: a halo row holds a finite value beyond {halo.name}'s range (|v| > {HALF_MAX:g}); "
                f"halo_dtype={halo.name!r} cannot carry it: use halo_dtype='bfloat16' or None")

    def _check_flag(self, flag, halo):
        if flag is not None and int(flag.get(stream=self.ctx.comm_stream)[0]):  # synchronize! (the pack only)
            raise ValueError(self._overflow_message(halo))

    def _peer_blocks(self, Z, ptr, ranks):
        """``{q: Z[ptr[q]:ptr[q + 1]]}`` for the peers in ``ranks`` (contiguous views)."""
        return {q: Z[int(ptr[q]):int(ptr[q + 1])] for q in ranks}

    def exchange(self, X, halo_dtype=None):
        """The halo rows of ``X`` (``n_halo x d``): the rows of other ranks' X this rank's entries read, grouped by
        owner; ``X`` is this rank's rows.  In ``halo_dtype`` (default the operand's)."""
        X2 = self._rows_operand(X, "exchange")
        halo = _halo_dtype(halo_dtype) or X2.dtype
        H = self.ctx.xp.empty((self.n_halo, X2.shape[1]), halo)
        done = self._finish(*self._start(X2, H, halo))
        if done is not None:
            self.ctx.xp.cuda.get_current_stream().wait_event(done)
        return H.reshape(-1) if np.ndim(X) == 1 else H

    def _start(self, X2, H, halo):
        """Pack the rows peers asked for (queued on the communication stream after X is ready, on the GPU)."""
        ctx, xp = self.ctx, self.ctx.xp
        S = self._buffer(("send", X2.shape[1], halo.str), (int(self.send_ptr[-1]), X2.shape[1]), halo)
        send = self._peer_blocks(S, self.send_ptr, self._send_peers)
        recv = self._peer_blocks(H, self.halo_ptr, self._recv_peers)
        if xp is np:
            return self._pack(X2, self.send_index, S, halo), send, recv, halo
        ctx.comm_stream.wait_event(xp.cuda.get_current_stream().record())
        with ctx.comm_stream:
            flag = self._pack(X2, self.send_index, S, halo)
        return flag, send, recv, halo

    def _finish(self, flag, send, recv, halo):
        """Check the pack's range, then exchange; on the GPU returns the event that marks the halo's arrival."""
        ctx = self.ctx
        self._check_flag(flag, halo)
        if ctx.xp is np:
            ctx.sendrecv(send, recv)
            return None
        ctx.sendrecv(send, recv, stream=ctx.comm_stream)
        return ctx.comm_stream.record()

    def _rows_operand(self, X, what):
        xp = self.ctx.xp
        X = xp.asarray(X)
        X2 = X.reshape(-1, 1) if X.ndim == 1 else X
        if X2.ndim != 2 or X2.shape[0] != self.n_own:
            sig = "1?)->(n,1?)" if X.ndim == 1 else "m)->(n,m)"
            raise ValueError(f"{what}: dimension mismatch with signature (n,k={self.n_own}),(k={X2.shape[0]},{sig} "
                             "(this rank's rows of X)")
        return xp.ascontiguousarray(X2)

    # --- products ---------------------------------------------------------------------------
    def matmul(self, X, *, precision=None, values=None, out=None):
        """This rank's rows of ``A @ X``, from this rank's rows of X (shape ``(n_own, d)`` or ``(n_own,)``).

        ``values``: new values in the entries' order (:attr:`values`: the layers' edge weights).  ``out``: as
        :func:`tcgnn_py.spmm`'s (this rank's rows).
        """
        ctx, xp = self.ctx, self.ctx.xp
        vec = np.ndim(X) == 1
        X2 = self._rows_operand(X, "matmul")
        own, halo_m = self._parts(values)
        if ctx.world_size == 1:  # one rank: the plain product, straight from X
            Y = spmm(own, X2, None if out is None else (out.reshape(-1, 1) if vec else out), precision=precision)
            return Y.reshape(-1) if vec and out is None else Y
        want = out.dtype if out is not None else result_dtype(own.dtype, X2.dtype)
        acc = np.dtype(np.float32) if is_half(want) else want  # 16-bit results: own + halo summed, rounded once
        direct = out is not None and out.dtype == acc and not vec
        halo = self.halo_dtype or X2.dtype
        H = self._buffer(("halo", X2.shape[1], halo.str), (self.n_halo, X2.shape[1]), halo)
        started = self._start(X2, H, halo)  # packed on the communication stream
        Y = spmm(own, X2, out if direct else xp.empty((self.n_own, X2.shape[1]), acc), precision=precision)
        done = self._finish(*started)  # the exchange runs while the own part computes
        if done is not None:
            xp.cuda.get_current_stream().wait_event(done)
        if self.halo.nnz:
            self._add_rows(Y, self.boundary_rows, spmm(halo_m, H, precision=precision))
        if direct:
            return out
        Y = Y.reshape(-1) if vec else Y
        if out is not None:
            out[...] = Y.astype(out.dtype, copy=False)
            return out
        return Y.astype(want, copy=False)

    __matmul__ = matmul

    def _add_rows(self, Y, rows, Z):
        """``Y[rows] += Z`` (rows distinct), in float32 on the GPU."""
        xp = self.ctx.xp
        if not rows.shape[0]:
            return
        if xp is not np and Y.dtype == np.float32 and Z.dtype.name in ("float32", "float16", "bfloat16"):
            from ..kernels import dist as kd
            from ..kernels.launches import make

            Z = xp.ascontiguousarray(Z)
            make("dist", kd.add_name(Z.dtype.name), min(rows.shape[0], 65535 * 8), kd.ROW_THREADS, (),
                 dict(Y=Y, rows=rows, n_rows=rows.shape[0], D=Y.shape[1], Z=Z)).run()
        else:
            Y[rows] += Z.astype(Y.dtype, copy=False)

    def rmatmul_t(self, G, *, precision=None, values=None):
        """This rank's rows of ``Aᵀ @ G`` (backward passes), from this rank's rows of G.

        The halo columns' partial sums are computed first and sent to their owners while the own part
        computes; each owner adds what it receives in rank order (deterministic: two runs are bit-identical).
        """
        ctx, xp = self.ctx, self.ctx.xp
        vec = np.ndim(G) == 1
        G2 = self._rows_operand(G, "rmatmul_t")
        own, halo_m = self._parts(values)
        f32 = is_half(G2.dtype)
        if ctx.world_size == 1:
            out = xp.empty((self.n_own, G2.shape[1]), G2.dtype) if f32 else None
            Y = spmm(own.T, G2, out, precision=precision)
            return Y.reshape(-1) if vec else Y
        halo = self.halo_dtype or G2.dtype
        D = G2.shape[1]
        Zh = spmm(halo_m.T, G2[self.boundary_rows], precision=precision) if self.halo.nnz else \
            xp.zeros((self.n_halo, D), np.float32 if f32 else G2.dtype)
        R = self._buffer(("back", D, halo.str), (int(self.send_ptr[-1]), D), halo)
        recv = self._peer_blocks(R, self.send_ptr, self._send_peers)
        if xp is np:
            S = Zh.astype(halo, copy=False)
            ctx.sendrecv(self._peer_blocks(S, self.halo_ptr, self._recv_peers), recv)
            done = None
        else:
            comm = ctx.comm_stream
            comm.wait_event(xp.cuda.get_current_stream().record())
            flag, S = None, Zh  # Zh lives until this call returns, and the stream waits for the send by then
            if halo != Zh.dtype:
                S = self._buffer(("backsend", D, halo.str), Zh.shape, halo)
                with comm:
                    flag = self._pack(Zh, self._arange(Zh.shape[0]), S, halo)
            self._check_flag(flag, halo)
            ctx.sendrecv(self._peer_blocks(S, self.halo_ptr, self._recv_peers), recv,
                         stream=comm)
            done = comm.record()
        Y = spmm(own.T, G2, xp.empty((self.n_own, D), np.float32) if f32 else None, precision=precision)
        if done is not None:
            xp.cuda.get_current_stream().wait_event(done)
        for p in sorted(recv):  # rows are distinct within one peer's block; peers in rank order
            self._add_rows(Y, self.sends[p], recv[p])
        if f32:
            Y = Y.astype(G2.dtype)
        return Y.reshape(-1) if vec else Y

    def sddmm(self, Xa, Xb=None, *, precision=None):
        """``<Xa[i], Xb[j]>`` on this rank's stored ``(i, j)``, as values in the entries' order (:attr:`values`).

        ``Xa`` and ``Xb`` are this rank's rows; the halo rows of ``Xb`` (default ``Xa``) are exchanged.
        """
        xp = self.ctx.xp
        Xa2 = self._rows_operand(Xa, "sddmm")
        Xb2 = Xa2 if Xb is None else self._rows_operand(Xb, "sddmm")
        H = self.exchange(Xb2, self.halo_dtype)
        e_own = sddmm(self.own, Xa2, Xb2, precision=precision).values
        if not self.halo.nnz:
            return e_own
        e_halo = sddmm(self.halo, Xa2[self.boundary_rows], H, precision=precision).values
        return xp.concatenate([e_own, e_halo.astype(e_own.dtype, copy=False)])
