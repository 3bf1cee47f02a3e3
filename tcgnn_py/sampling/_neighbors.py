"""Layer 2: the neighbor sampler -- at most ``fanout`` neighbors of each node of a batch, uniform without
replacement, seeded: the ``sample_rows`` Numba kernel (:mod:`tcgnn_py.kernels.sample`) on the GPU, its NumPy
reference on the host, the same neighbors for the same key.
"""

import threading

import numpy as np

from .._cache import keep
from .._device import array_module, to_host

__all__ = ["sample_reference", "sample_neighbors", "sample_hops", "hop_kernels", "RecordedHops", "row_entries",
           "Relabel", "splitmix64", "GOLDEN", "NODE_MIX", "SORT_ROWS_MAX", "HOP_BOUND_BYTES", "RECORDED_KEPT"]

_M64 = (1 << 64) - 1
#: splitmix64's increment and the node's multiplier in a draw's counter (as :mod:`tcgnn_py.kernels.sample`: a test
#: checks it).
GOLDEN, NODE_MIX = 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03


def splitmix64(z):
    """splitmix64's output of the counter ``z`` (a Python int, taken mod 2**64)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _draws(key, v, k):
    """The draws ``t = 0 .. k-1`` of node ``v`` (Python ints): :func:`tcgnn_py.kernels.sample.draw`."""
    base = (int(key) ^ (int(v) * NODE_MIX)) & _M64
    return [splitmix64(base + (t + 1) * GOLDEN) for t in range(k)]


def sample_reference(indptr, indices, nodes, fanout, key):
    """``(ptr, cols)``: for each node of ``nodes``, at most ``fanout`` of its neighbors (``cols[ptr[i]:ptr[i+1]]``,
    global ids, int32; ``fanout < 0``: all), uniform without replacement -- every neighbor in CSR order where the
    degree is at most ``fanout``, else Floyd's algorithm over the neighbor positions.  NumPy; the GPU kernel's
    oracle."""
    nodes = np.asarray(nodes, np.int64)
    deg = (indptr[nodes + 1] - indptr[nodes]).astype(np.int64)
    counts = deg if fanout < 0 else np.minimum(deg, fanout)
    ptr = np.zeros(len(nodes) + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    cols = np.empty(int(ptr[-1]), np.int32)
    for i, v in enumerate(nodes.tolist()):
        start, d, o = int(indptr[v]), int(deg[i]), int(ptr[i])
        if fanout < 0 or d <= fanout:
            cols[o:o + d] = indices[start:start + d]
            continue
        picked = []
        for t, z in enumerate(_draws(key, v, fanout)):
            j = d - fanout + t
            r = z % (j + 1)
            picked.append(j if r in picked else r)
        cols[o:o + fanout] = indices[start + np.asarray(picked, np.int64)]
    return ptr, cols


def sample_neighbors(indptr, indices, nodes, fanout, key):
    """:func:`sample_reference` where the arrays are: NumPy on the host, the ``sample_rows`` kernel on the GPU
    (``indptr`` int64, ``indices`` int32, ``nodes`` int64 CuPy arrays)."""
    xp = array_module(indptr)
    if xp is np:
        return sample_reference(indptr, indices, nodes, fanout, key)
    from ..kernels.launch import THREADS_PER_BLOCK, grid, launch_numba
    from ..kernels.sample import sample_rows

    deg = indptr[nodes + 1] - indptr[nodes]
    counts = deg if fanout < 0 else xp.minimum(deg, fanout)
    ptr = xp.zeros(nodes.shape[0] + 1, np.int64)
    xp.cumsum(counts, out=ptr[1:])
    cols = xp.empty(int(ptr[-1]), np.int32)  # synchronize! (the sample's size)
    if nodes.shape[0]:
        launch_numba(sample_rows, grid(nodes.shape[0]), THREADS_PER_BLOCK, indptr, indices, nodes, int(fanout),
                     np.uint64(key), ptr, cols)
    return ptr, cols


#: A hop on the GPU writes its sample into a buffer of the fan-out's bound (``fanout`` entries per destination) while
#: that buffer holds at most this many bytes; past it the hop takes the general path (:func:`sample_neighbors`, which
#: reads the sample's size first, then :class:`Relabel`).
HOP_BOUND_BYTES = 1 << 28

#: The largest fan-out whose hop the kernels make (the ``hop_rows`` kernel sorts a row's columns by insertion,
#: quadratic in its length); larger ones, and every neighbor (-1), take the general path and its sort of all entries.
SORT_ROWS_MAX = 64

#: Recorded batch shapes (:class:`RecordedHops`: size and fan-outs) a graph keeps: a loader's full batch and its
#: last, with room for a second loader's.
RECORDED_KEPT = 4


def sample_hops(indptr, indices, seeds, fanouts, keys, relabel):
    """``[(src, ptr, local, rows, values), ...]``, one per hop from ``seeds`` (distinct, int64) out: hop ``h``
    samples at most ``fanouts[h]`` neighbors of each node the hop before reached (:func:`sample_neighbors` with
    ``keys[h]``), relabelled by ``relabel`` (the graph's :class:`Relabel`, on the arrays' side: the sources are the
    destinations then the other sampled nodes ascending), each row's columns ascending (:func:`row_entries`); the
    next hop's destinations are this hop's sources.

    On the GPU a hop of a fan-out up to :data:`SORT_ROWS_MAX` runs :func:`hop_kernels`: three launches and one scan,
    and one host read for all such hops together; its row pointer is int32 (the CSR kernel's), int64 elsewhere."""
    xp = array_module(indptr)
    if xp is not np:
        return hop_kernels(xp, indptr, indices, seeds, fanouts, keys, relabel)
    hops, nodes = [], seeds
    for fanout, key in zip(fanouts, keys):
        hops.append(_general_hop(indptr, indices, nodes, fanout, key, relabel))
        nodes = hops[-1][0]
    return hops


def _general_hop(indptr, indices, nodes, fanout, key, relabel):
    """``(src, ptr, local, rows, values)`` of one hop by :func:`sample_neighbors`, ``relabel`` and
    :func:`row_entries`: the host's hop, and the GPU's where the kernels do not make it."""
    ptr, cols = sample_neighbors(indptr, indices, nodes, fanout, key)
    src, local = relabel(nodes, cols)
    rows, local, values = row_entries(ptr, local, src.shape[0], fanout)
    return src, ptr, local, rows, values


def _kernel_path(n, n_dst, fanout):
    """Whether the kernels make this hop of at most ``n_dst`` destinations: a fan-out they sort, a bound's buffer of
    at most :data:`HOP_BOUND_BYTES`, and ``n`` nodes plus the bound within the int32 scan."""
    bound = n_dst * fanout
    return 0 <= fanout <= SORT_ROWS_MAX and bound * 4 <= HOP_BOUND_BYTES and n + bound < 2**31


def hop_kernels(xp, indptr, indices, seeds, fanouts, keys, relabel):
    """:func:`sample_hops` through the kernels (``xp`` CuPy, or NumPy in the simulator), with one host read for the
    kernels' hops together.

    Hop after hop, on buffers of the hop's bound (its destinations' bound times the fan-out; the sources' bound the
    destinations' times one more, at most ``n``): the sample with its new nodes marked as drawn
    (``sample_mark_rows``), one scan of the marks and the counts together, then the sources and row pointer
    (``hop_sources``), which write the hop's sizes on the device for the next hop's kernels.  Then one read of every
    hop's sizes, and each hop's sorted rows (``hop_rows``) into arrays of its size: the map gives every node the
    place it took in the first hop it reached, which later hops keep, so the rows of all hops can wait for that
    read.  The graph's map carries the destinations' places from hop to hop (placed before the first, cleared after
    the last); a hop the kernels do not make reads the sizes so far, writes the rows so far, and takes the general
    path between a clear and a placing.  The map is whole again afterwards, whatever happened.

    On the GPU, a batch whose hops the kernels all make, of a size and fan-outs the graph sampled before, replays
    the launches up to the read as one CUDA graph recorded at its second batch (:class:`RecordedHops`)."""
    slot, n = relabel.slot, relabel.slot.shape[0]
    n_hops = len(fanouts)
    if not seeds.shape[0]:  # (an empty batch: empty hops)
        return [(xp.empty(0, np.int64), xp.zeros(1, np.int32), xp.empty(0, np.int32), xp.empty(0, np.int32),
                 xp.empty(0, np.float32)) for _ in fanouts]
    host_keys = np.asarray([int(key) for key in keys], np.uint64)
    with relabel._lock:
        recorded = relabel.recorded(xp, indptr, indices, seeds.shape[0], fanouts)
        if recorded is not None:
            return recorded(seeds, host_keys)
        sizes = _sizes(xp, seeds.shape[0], n_hops)
        keys = xp.asarray(host_keys)
        hops = [None] * n_hops
        pending = []  # (h, src, ptr, cols, fanout) of kernel hops whose rows wait for the read of the sizes

        def rows_so_far():
            """Read the sizes once, and write the pending hops' rows (the ``hop_rows`` kernel)."""
            known = to_host(sizes)  # synchronize! (the sizes of every hop so far, in one read)
            for h, src, ptr, cols, fanout in pending:
                hops[h] = _rows_of(xp, known, h, src, ptr, cols, fanout, slot)
            pending.clear()
            return known

        nodes, bound, placed = seeds, seeds.shape[0], False
        try:
            for h, fanout in enumerate(fanouts):
                if not _kernel_path(n, bound, fanout):
                    known = rows_so_far()
                    nodes = nodes[:int(known[2 * h])]
                    if placed:
                        _place(nodes, slot, 0)
                        placed = False
                    src, ptr, local, rows, values = _general_hop(indptr, indices, nodes, fanout, int(host_keys[h]),
                                                                 relabel)
                    hops[h] = (src, ptr.astype(np.int32), local, rows, values)
                    sizes[2 * h + 2] = src.shape[0]
                    nodes, bound = src, src.shape[0]
                    continue
                if not placed:
                    _place(nodes, slot, 1)
                    placed = True
                src, ptr, cols, _ = _kernel_hop(xp, indptr, indices, nodes, bound, fanout, keys, h, relabel, sizes)
                pending.append((h, src, ptr, cols, fanout))
                nodes, bound = src, src.shape[0]
            known = rows_so_far()
            if placed:
                nodes = nodes[:int(known[2 * n_hops])]
                _place(nodes, slot, 0)
        except BaseException:
            relabel.reset()
            raise
    return hops


def _kernel_hop(xp, indptr, indices, nodes, bound, fanout, keys, h, relabel, sizes, out=None):
    """``(src, ptr, cols, scan)`` of hop ``h`` (destinations ``nodes[:sizes[2 h]]``, at most ``bound``) on buffers
    of its bound (``out``'s, else made here), its sizes written at ``sizes[2 h + 1:]``: ``sample_mark_rows``, one
    scan and ``hop_sources``, no host read (what a recorded batch captures)."""
    from ..kernels import sample as k
    from ..kernels.launch import THREADS_PER_BLOCK, grid, launch_numba

    slot, n = relabel.slot, relabel.slot.shape[0]
    work = relabel.work(bound)
    src, ptr, cols, scan = out or _hop_buffers(xp, n, bound, fanout)
    launch_numba(k.sample_mark_rows, grid(bound), THREADS_PER_BLOCK, indptr, indices, nodes, int(fanout), keys, cols,
                 work, n, slot, sizes, h)
    xp.cumsum(work[:n + bound], dtype=np.int32, out=scan)
    launch_numba(k.hop_sources, grid(max(n, bound + 1)), THREADS_PER_BLOCK, nodes, work, scan, n, slot, src, ptr,
                 sizes, h)
    return src, ptr, cols, scan


def _sizes(xp, size, n_hops):
    """The batch's sizes on the device: ``sizes[2 h]`` hop ``h``'s destinations (the seeds' ``size`` first),
    ``sizes[2 h + 1]`` its entries, which the kernels write hop after hop."""
    return xp.asarray(np.r_[size, np.zeros(2 * n_hops + 1, np.int64)])


def _place(nodes, slot, place):
    """``place_slots``: each of ``nodes`` given its place in the map (``place`` 1), or its slot cleared (0)."""
    from ..kernels import sample as k
    from ..kernels.launch import THREADS_PER_BLOCK, grid, launch_numba

    launch_numba(k.place_slots, grid(nodes.shape[0]), THREADS_PER_BLOCK, nodes, slot, place)


def _hop_buffers(xp, n, bound, fanout):
    """``(src, ptr, cols, scan)`` for a hop of at most ``bound`` destinations on a graph of ``n`` nodes: the sources'
    bound is the destinations' times one more, at most ``n``."""
    return (xp.empty(min(n, bound * (fanout + 1)), np.int64), xp.empty(bound + 1, np.int32),
            xp.empty(bound * fanout, np.int32), xp.empty(n + bound, np.int32))


def _rows_of(xp, known, h, src, ptr, cols, fanout, slot):
    """``(src, ptr, local, rows, values)`` of hop ``h`` in arrays of its sizes (``known``, read from the device):
    one ``hop_rows`` launch copies the sources and the row pointer out of their bound-sized buffers (which a
    recorded batch's next replay overwrites) and writes the rows."""
    from ..kernels import sample as k
    from ..kernels.launch import THREADS_PER_BLOCK, grid, launch_numba

    n_dst, nnz, n_src = (int(v) for v in known[2 * h:2 * h + 3])
    src_out, ptr_out = xp.empty(n_src, np.int64), xp.empty(n_dst + 1, np.int32)
    local, rows, values = xp.empty(nnz, np.int32), xp.empty(nnz, np.int32), xp.empty(nnz, np.float32)
    launch_numba(k.hop_rows, grid(max(n_src, n_dst + 1)), THREADS_PER_BLOCK, cols, int(fanout), ptr, slot, src, local,
                 rows, values, src_out, ptr_out)
    return src_out, ptr_out, local, rows, values


def _hop_bounds(n, size, fanouts):
    """Each hop's bound on its destinations, from a batch of ``size`` seeds on a graph of ``n`` nodes, and the
    last hop's bound on its sources; None where the kernels would not make every hop (:func:`_kernel_path`)."""
    bounds = [size]
    for fanout in fanouts:
        if not _kernel_path(n, bounds[-1], fanout):
            return None
        bounds.append(min(n, bounds[-1] * (fanout + 1)))
    return bounds


class RecordedHops:
    """A batch's kernel hops for ``size`` seeds and these fan-outs, recorded once as a CUDA graph
    (:class:`tcgnn_py.CUDAGraph`) and replayed per batch: a sampled step waits on the host, and the hops' dozen
    launches, scans and allocations cost more host time than the GPU takes to run them.  Its inputs are the seeds
    and the hops' keys, written into its buffers; its sizes are read once, then each hop's rows are written as on
    the eager path, with the sources and row pointers copied out of the buffers the next replay overwrites.

    Every buffer is made before the capture (the relabelling's ``work`` grown to the largest hop's bound), so the
    graph allocates nothing but the scans' scratch, and the launches it records are :meth:`launches`, which the
    simulator's tests replay by calling them again (``xp`` NumPy: no graph)."""

    def __init__(self, xp, indptr, indices, size, fanouts, relabel):
        n = relabel.slot.shape[0]
        bounds = _hop_bounds(n, size, fanouts)
        self._work = relabel.work(max(bounds[:-1]))  # (grown now: the graph keeps this buffer)
        self._relabel, self._fanouts, self._xp = relabel, tuple(fanouts), xp
        self._graph_arrays = (indptr, indices)
        self.seeds, self.keys = xp.empty(size, np.int64), xp.empty(len(fanouts), np.uint64)
        self.sizes = _sizes(xp, size, len(fanouts))
        self._buffers = [_hop_buffers(xp, n, bounds[h], f) for h, f in enumerate(fanouts)]
        self._bounds = bounds
        if xp is np:
            self._replay = self.launches
        else:
            from .._capture import CUDAGraph

            graph = CUDAGraph()
            with graph.capture():
                self.launches()
            self._replay = graph.replay
        self.replays = 0

    def launches(self):
        """The batch's launches up to the read: the seeds placed, then each hop's sample, scan and sources."""
        indptr, indices = self._graph_arrays
        relabel, xp = self._relabel, self._xp
        _place(self.seeds, relabel.slot, 1)
        nodes = self.seeds
        for h, fanout in enumerate(self._fanouts):
            nodes = _kernel_hop(xp, indptr, indices, nodes, self._bounds[h], fanout, self.keys, h, relabel,
                                self.sizes, self._buffers[h])[0]

    def __call__(self, seeds, keys):
        """The hops of ``seeds`` (``size`` of them, int64, on the arrays' side) with ``keys`` (NumPy uint64, one
        per hop)."""
        xp, slot = self._xp, self._relabel.slot
        try:
            if xp is np:
                self.keys[...] = keys
            else:
                self.keys.set(keys)
            self.seeds[...] = seeds
            self._replay()
            known = to_host(self.sizes)  # synchronize! (the sizes of every hop, in one read)
            hops = [_rows_of(xp, known, h, src, ptr, cols, fanout, slot)
                    for h, ((src, ptr, cols, _), fanout) in enumerate(zip(self._buffers, self._fanouts))]
            last = self._buffers[-1][0][:int(known[2 * len(self._fanouts)])]
            _place(last, slot, 0)
        except BaseException:
            self._relabel.reset()
            raise
        self.replays += 1
        return hops


def row_entries(ptr, local, n_src, fanout):
    """``(rows, local, values)`` of a hop's entries (``ptr`` its row pointer; ``local`` each entry's source column,
    int32, in the sampler's order): each row's columns ascending -- a canonical CSR, which the translation takes as
    it is -- with each entry's row (int32) and value ``1 / count`` (float32, the mean over the row's sampled
    neighbors; a row's values are all equal, so only the columns move), by a sort of all entries by ``(row,
    column)`` (the reference of the ``hop_rows`` kernel)."""
    xp = array_module(ptr)
    rows = xp.searchsorted(ptr, xp.arange(local.shape[0]), side="right") - 1
    local = local[xp.argsort(rows * n_src + local)]
    values = (1.0 / xp.maximum(xp.diff(ptr), 1)).astype(np.float32)[rows]
    return rows.astype(np.int32), local, values


class Relabel:
    """A hop's source nodes and each sampled entry's column among them, by a dense map of one graph's ``n`` nodes
    (NumPy or CuPy, as ``xp``): its slots are made once and reset after each call, so a hop costs a few passes
    over what it sampled and one scan of the marks -- no sort (a sort-based ``unique`` / ``isin`` per hop costs
    several times more on the GPU).  Its marks are the head of one int32 buffer whose tail holds a hop's counts
    (:func:`hop_kernels`: one scan for both)."""

    def __init__(self, n, xp):
        self.slot = xp.full(n, -1, np.int32)  # node -> its column in the hop's sources, -1 where none
        self._work = xp.zeros(n, np.int32)
        self._xp, self._lock = xp, threading.RLock()  # (re-entered: the kernels' path calls the general one)
        self._recorded, self._seen = {}, {}  # (each in order of last use: keep drops the oldest)

    def recorded(self, xp, indptr, indices, size, fanouts):
        """The :class:`RecordedHops` of a batch of ``size`` seeds and these fan-outs on this graph, or None: on the
        host, under a capture, where the kernels would not make every hop, at a shape's first batch (which runs
        eagerly: it compiles and loads the kernels, which a capture cannot), and where recording failed.  Made at
        a shape's second batch; the :data:`RECORDED_KEPT` most recently used are kept."""
        if xp is np:
            return None
        key = (indptr.data.ptr, indices.data.ptr, int(size), tuple(int(f) for f in fanouts))
        rec = self._recorded.get(key)
        if rec is not None:
            return keep(self._recorded, key, self._recorded.pop(key), RECORDED_KEPT)  # (now the last used)
        first = key not in self._seen
        self._seen.pop(key, None)  # (shapes seen once are forgotten, oldest first: kept bounded)
        keep(self._seen, key, None, 4 * RECORDED_KEPT)
        if (first or key in self._recorded or xp.cuda.get_current_stream().is_capturing()
                or _hop_bounds(self.slot.shape[0], size, fanouts) is None):
            return None
        try:
            rec = RecordedHops(xp, indptr, indices, size, fanouts, self)
        except Exception:  # noqa: BLE001  (a capture this stream or CuPy cannot make: the eager path serves)
            return keep(self._recorded, key, None, RECORDED_KEPT)
        return keep(self._recorded, key, rec, RECORDED_KEPT)

    def work(self, n_dst):
        """The marks (all 0) followed by room for ``n_dst`` counts; grown by doubling, up to ``2 n``."""
        n = self.slot.shape[0]
        if self._work.shape[0] < n + n_dst:
            self._work = self._xp.zeros(n + min(n, max(n_dst, 2 * (self._work.shape[0] - n))), np.int32)
        return self._work

    @property
    def mark(self):
        """The nodes a hop sampled that are not its destinations (1), the head of the counts' buffer."""
        return self._work[:self.slot.shape[0]]

    def reset(self):
        """The map whole again (every slot -1, no mark), after a failure part way."""
        self.slot[...] = -1
        self.mark[...] = 0

    def __call__(self, nodes, cols):
        """``(src, local)``: ``src`` the destinations ``nodes`` (distinct, int64) then the other nodes of ``cols``
        ascending (int64), ``local[i]`` the position of ``cols[i]`` in ``src`` (int32)."""
        xp, slot, mark = self._xp, self.slot, self.mark
        with self._lock:
            new = None
            try:
                mark[cols] = 1
                mark[nodes] = 0
                new = xp.flatnonzero(mark)  # synchronize! (how many new sources)
                mark[new] = 0
                n_dst = nodes.shape[0]
                slot[nodes] = xp.arange(n_dst, dtype=np.int32)
                slot[new] = xp.arange(n_dst, n_dst + new.shape[0], dtype=np.int32)
                local = slot[cols]
            finally:  # (the map is whole again for the next call, whatever happened)
                slot[nodes] = -1
                if new is None:
                    mark[...] = 0
                else:
                    slot[new] = -1
        return xp.concatenate([nodes, new.astype(np.int64)]), local
