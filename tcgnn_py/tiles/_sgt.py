"""Layer 2: Sparse Graph Translation, on the GPU or through the reference.

:func:`translate` takes validated CSR arrays (NumPy or CuPy) and returns the
tiled arrays documented in :mod:`tcgnn_py._reference`, on the same device as
its input.  The GPU path runs the Numba kernels of :mod:`tcgnn_py.kernels.sgt`
and CuPy scans; it produces arrays identical to the reference.
"""

from typing import NamedTuple

import numpy as np

from .. import _reference as ref
from .._device import array_module, scratch_views, to_host
from .._tuning import options
from .._validation import INDEX_MAX, check_csr_arrays
from ..kernels import registry
from ..kernels.launch import THREADS_PER_BLOCK as _TPB
from ..kernels.launch import grid as _grid
from ..kernels.launch import launch_numba as _launch

__all__ = ["tile", "translate", "translate_kernels", "canonicalize_kernels", "coo_to_csr_order",
           "csr_of_order_kernels", "csr_transpose", "transpose_kernels", "TRANSPOSE_RANK_MAX",
           "host_limit", "on_host", "upload", "kernels_ran", "warm_kernels", "HOST_PLAN_MAX", "DERIVED", "WindowStats",
           "block_meta_layout"]

#: Tilings of at most this many stored entries plan their products on the host, with NumPy, and upload the plans:
#: on the device, a fresh process would first compile some 45 of CuPy's own kernels (about 0.3 s each, with empty
#: caches) for plans that take microseconds to compute.  Their translation on the GPU hands over what that planning
#: reads (the tiling's derived data, :data:`DERIVED`): planning them reads nothing back.
HOST_PLAN_MAX = 1 << 22
#: Derived data a translation may hand over beside the structure: its key in the translation's output -> its key in
#: the tiling's cache.  The window pointers on the host, each block's metadata (:func:`block_meta_layout`), and the
#: windows' statistics (:class:`WindowStats`).
DERIVED = {"host_win_ptr": ("host", "win_ptr"), "block_meta": "block_meta", "window_stats": "window_stats"}


def block_meta_layout(window, block):
    """``(words, columns)`` of a tiling's block metadata: the occupancy mask in ``ceil(window * block / 32)`` words,
    then, where one word holds it, the block's first entry -- what the product kernels read per block (the vector
    kernels a (mask, first entry) pair, the TF32 kernels a 4-word mask beside ``block_ptr``)."""
    words = -(-window * block // 32)
    return words, words + 1 if words == 1 else words


_RAN = [False]  # the translation kernels have run, or been compiled and loaded, on the GPU in this process
_WARMING = {}  # "thread": the one background compile of the kernels in this process, "stop": asked to end early,
#               "cold": the builds sent to the host only because the kernels had not run


def kernels_ran():
    """Whether the translation kernels are ready on the GPU in this process: they have run, or a background
    compile (:func:`warm_kernels`) has compiled and loaded them -- their first compile is behind us."""
    return _RAN[0]


def warm_kernels():
    """Compile and load the translation kernels in a background thread, once a process, for the current device.

    Cold builds translated on the host start it (:func:`on_host`), so that later builds of their size use the
    kernels without waiting for their compile (seconds).  A failure is left to the kernels' next use, which
    compiles them itself and raises it there.  Numba compiles one kernel at a time, so a kernel of another
    family compiled meanwhile waits for the one in hand; at exit the thread stops after it.  The compile registry
    tracks it (:func:`tcgnn_py.kernels.registry.wait_for_compiles` waits for it, as for its own), and where
    background compiles are off (:func:`~tcgnn_py.kernels.registry.stop_background_compiles`: a process of NCCL
    collectives, which a module load on another thread can deadlock) none starts.  Returns the thread, or None.
    """
    thread = _WARMING.get("thread")
    if thread is not None or _RAN[0] or not registry.background_compiles():
        return thread
    import atexit
    import concurrent.futures
    import threading

    import cupy

    device = cupy.cuda.Device().id
    done = concurrent.futures.Future()
    done.set_running_or_notify_cancel()

    def run():
        from ..kernels import sgt as k
        from ..kernels.numba_launch import numba_gpus

        try:
            with numba_gpus()[device]:  # (the device list built once, under a lock: the caller may be launching)
                for kernel, signature in k.KERNELS.values():
                    if _WARMING.get("stop"):
                        return
                    kernel.compile(signature)  # (or reads Numba's disk cache; a compile also loads it here)
            _RAN[0] = True
        except Exception:  # noqa: BLE001 -- reported by the kernels' next use, which compiles them in the caller
            pass
        finally:
            done.set_result(None)

    def stop():
        _WARMING["stop"] = True
        thread.join()

    thread = _WARMING["thread"] = threading.Thread(target=run, name="tcgnn_py SGT compile", daemon=True)
    registry.track(done)
    thread.start()
    atexit.register(stop)
    return thread


def host_limit(device_input=False):
    """Entries up to which a translation runs on the host now (-1: none).

    A host input goes to the host up to ``sgt_host_max`` entries, and up to ``sgt_host_cold_max`` until the
    kernels have run in this process (their first compile costs seconds, a host pass of that size tenths of
    one); a ``device_input`` (a transpose) only while they have not.  ``sgt_host_max=-1`` keeps every size on
    the kernels.
    """
    opts = options()
    if opts["sgt_host_max"] < 0:
        return -1
    cold = -1 if _RAN[0] else opts["sgt_host_cold_max"]
    return cold if device_input else max(opts["sgt_host_max"], cold)


def on_host(nnz, device_input=False):
    """Whether a translation of ``nnz`` entries runs on the host now (:func:`host_limit`).

    Builds sent there only because the kernels have not run yet are counted; the one after the first
    ``sgt_compile_after`` starts the kernels' compile in the background (:func:`warm_kernels`), so that later
    builds find them ready.  The first such build does not, by default: the compile shares the interpreter with
    the caller, and a process that builds one large matrix reaches its first product sooner without it.
    """
    if nnz > host_limit(device_input):
        return False
    opts = options()
    if nnz > (-1 if device_input else opts["sgt_host_max"]):
        cold = _WARMING["cold"] = _WARMING.get("cold", 0) + 1
        if 0 <= opts["sgt_compile_after"] < cold:
            warm_kernels()
    return True


def upload(arrays, tile_shape, derived=True):
    """The tiled arrays of a host translation copied to the GPU (one copy each, on the current stream), with
    (``derived``) the derived data a device translation hands over (:data:`DERIVED`), made here on the host where
    the arrays are."""
    import cupy

    out = {k: cupy.asarray(v) for k, v in arrays.items() if k not in DERIVED}
    if derived and arrays["tile_pos"].shape[0] <= HOST_PLAN_MAX:
        meta = ref.block_meta(arrays["block_ptr"], arrays["tile_pos"], *block_meta_layout(*tile_shape))
        out["block_meta"], out["host_win_ptr"] = cupy.asarray(meta), arrays["win_ptr"]
    return out


def tile(data, indices, indptr, shape, window=16, block=8):
    """The whole SGT of CSR arrays on their device: O(nnz) checks, canonicalization, translation.

    The caller has made the O(1) checks (``check_csr_arrays(..., full_check=False)``
    on the GPU path, the full check on the host path).  On the GPU the O(nnz)
    checks run inside the translation's first kernel and raise ``ValueError``
    with scipy's messages after its one host read; non-canonical input (unsorted
    or duplicate columns) is sorted and summed first, then translated again.
    Device arrays whose ``indptr[0]`` and ``indptr[-1]`` were not read
    (``check_csr_arrays(..., read_sizes=False)``) are checked there too: where
    they are not 0 and nnz, they are read and checked as scipy does.
    """
    if isinstance(indices, np.ndarray):
        csr = ref.canonicalize_csr(data, indices, indptr, shape)
        return ref.translate(*csr, shape, window, block)
    import cupy

    try:
        out = translate_kernels(cupy, data, indices, indptr, shape, window, block, check=True)
    except _SizesUnread:  # (the caller left indptr's ends to the check kernel, and they are not 0 and nnz)
        data, indices, indptr = check_csr_arrays(data, indices, indptr, shape)  # scipy's error, or entries cut
        return tile(data, indices, indptr, shape, window, block)
    if out is None:
        *csr, rows = _canonical_with_rows(cupy, data, indices, indptr, shape)
        out = translate_kernels(cupy, *csr, shape, window, block, edge_row=rows)
    return out


def canonicalize_kernels(xp, data, indices, indptr, shape):
    """Sorted indices, duplicates summed in input order, through the Numba kernels; ``xp`` is CuPy, or NumPy in the simulator."""
    return _canonical_with_rows(xp, data, indices, indptr, shape)[:3]


def _canonical_with_rows(xp, data, indices, indptr, shape):
    """Canonical ``(data, indices, indptr)`` and the row of each entry, computed once."""
    from ..kernels import sgt as k

    cp = xp
    n_rows, n_cols = shape
    nnz = indices.shape[0]
    rows = ref.edge_rows(indptr, nnz)
    if nnz < 2:
        return data, indices, indptr, rows
    unsorted = (rows[1:] == rows[:-1]) & (indices[1:] <= indices[:-1])
    if not bool(unsorted.any()):  # synchronize!
        return data, indices, indptr, rows
    key = rows.astype(np.int64) * n_cols + indices
    order = cp.argsort(key, kind="stable")
    key = key[order]
    is_start = cp.empty(nnz, dtype=np.bool_)
    is_start[0] = True
    cp.not_equal(key[1:], key[:-1], out=is_start[1:])
    starts = cp.flatnonzero(is_start).astype(np.int32)
    new_data = cp.empty(starts.shape[0], dtype=data.dtype)
    _launch(k.sum_runs, _grid(starts.shape[0]), _TPB, starts, data[order], new_data)
    ukey = key[starts]
    new_rows = (ukey // n_cols).astype(np.int32)
    new_indices = (ukey % n_cols).astype(np.int32)
    new_indptr = cp.searchsorted(new_rows, cp.arange(n_rows + 1), side="left").astype(np.int32)
    return new_data, new_indices, new_indptr, new_rows


def translate(data, indices, indptr, shape, window=16, block=8, *, host_when_cold=False):
    """Tiled arrays of a canonical CSR matrix (see :mod:`tcgnn_py._reference`).

    ``host_when_cold``: device arrays of up to ``host_limit(device_input=True)`` entries are translated on
    the host and uploaded (a transpose built before the kernels ever ran waits no compile).
    """
    if isinstance(indices, np.ndarray):
        return ref.translate(data, indices, indptr, shape, window, block)
    import cupy

    if host_when_cold and on_host(indices.shape[0], device_input=True):
        out = ref.translate(*(to_host(a) for a in (data, indices, indptr)), shape, window, block)  # synchronize!
        return upload(out, (window, block), derived=False)  # (a caller may regroup them: no derived data)
    try:
        out = translate_kernels(cupy, data, indices, indptr, shape, window, block, check=True)
    except _SizesUnread:
        out = None
    if out is None:
        raise ValueError("translate needs canonical CSR arrays (sorted, distinct column indices in each row)")
    return out


class _SizesUnread(Exception):
    """The check kernel found ``indptr[0] != 0`` or ``indptr[-1] != nnz``, which the caller did not read: its
    caller reads them (scipy's error, or the entries before ``indptr[-1]`` translated)."""


#: ``status`` bits of the check kernel -> scipy's message (in the order scipy checks).
def _check_messages(n_cols):
    from ..kernels import sgt as k

    return (
        (k.BAD_INDPTR, "indptr must be a non-decreasing sequence"),
        (k.INDEX_TOO_LARGE, f"indices must be < {n_cols}"),
        (k.NEGATIVE_INDEX, "indices must be >= 0"),
    )


def translate_kernels(xp, data, indices, indptr, shape, H=16, W=8, edge_row=None, check=False, small=None):
    """:func:`translate` through the Numba kernels; ``xp`` is CuPy, or NumPy in the simulator.

    A matrix of at most ``options()["sgt_one_launch_max"]`` entries (``small=None``; True or False picks) is
    translated by one launch of one CTA (:func:`~tcgnn_py.kernels.sgt.translate_small`: the same kernels' work, in
    order), its scratch arrays one buffer: a small matrix's translation costs its host launches, not its GPU time.

    Without ``edge_row`` (the row of each entry) the first kernel finds the
    rows and checks the arrays: invalid arrays raise ``ValueError``; with
    ``check``, non-canonical ones (unsorted or duplicate columns) return None,
    and without it they raise too.  The host reads the device once, at the end
    (the errors and the number of blocks, with a tiling of at most
    :data:`HOST_PLAN_MAX` entries' window pointers in the same read).  Such a tiling also gets
    its blocks' metadata (``"block_meta"``, ``"host_win_ptr"``: the tiling's
    derived data, :data:`DERIVED`), which planning its products on the
    host would otherwise read back entry by entry.
    """
    from ..kernels import sgt as k

    cp = xp
    n_rows, n_cols = shape
    nnz = indices.shape[0]
    n_windows = -(-n_rows // H)
    if nnz == 0:
        first, last, bad = (int(v) for v in to_host(cp.stack([  # synchronize! (empty matrices only)
            indptr[0], indptr[-1], cp.any(indptr[1:] < indptr[:-1]).astype(indptr.dtype)])))
        if first or last:
            raise _SizesUnread
        if bad:
            raise ValueError("indptr must be a non-decreasing sequence")
        return {
            "win_ptr": cp.zeros(n_windows + 1, np.int32),
            "block_cols": cp.zeros((0, W), np.int32),
            "block_ptr": cp.zeros(1, np.int32),
            "tile_pos": cp.zeros(0, ref.tile_pos_dtype(H, W)),
            "values": cp.zeros(0, data.dtype),
            "perm": cp.zeros(0, np.int32),
            "block_meta": cp.zeros((0, block_meta_layout(H, W)[1]), np.uint32),
            "host_win_ptr": np.zeros(n_windows + 1, np.int32),
            "window_stats": _reference_stats(k, np.zeros(n_windows + 1)),  # (every window empty)
        }
    if nnz * H > INDEX_MAX:
        # rank_edges runs H threads per entry with int32 thread ids.
        raise ValueError(
            f"{nnz} stored entries x window {H} exceed the {INDEX_MAX} threads one translation launches"
        )
    # A window of m entries has at most ceil(m / W) blocks: buffers of this bound need no host read.
    bound = nnz // W + n_windows
    if bound * max(H, W) > INDEX_MAX:
        raise ValueError(f"up to {bound} tensor-core blocks do not fit the int32 tiled format")

    # win_ptr, then status (error bits, the number of blocks, the windows' statistics): one buffer, so that the one
    # host read takes both
    shared = cp.zeros(n_windows + 3 + k.N_STATS, np.int32)
    win_ptr, status = shared[:n_windows + 1], shared[n_windows + 1:]
    if small is None:
        small = edge_row is None and nnz <= options()["sgt_one_launch_max"]
    if small and edge_row is None:
        block_cols, block_ptr, tile_pos, values, perm, meta = _translate_small(
            cp, k, data, indices, indptr, n_cols, H, W, n_windows, bound, win_ptr, status)
    else:
        block_cols, block_ptr, tile_pos, values, perm, meta = _translate_steps(
            cp, k, data, indices, indptr, n_rows, n_cols, H, W, n_windows, bound, win_ptr, status, edge_row)
    # synchronize! (the translation's one host read: a small tiling's window pointers with it)
    host = to_host(shared if meta is not None else status)
    read = host[-status.shape[0]:]
    err, n_blocks = int(read[0]), int(read[1])
    if err & k.BAD_SIZES:
        raise _SizesUnread
    for bit, message in _check_messages(n_cols):
        if err & bit:
            raise ValueError(message)
    if err:
        if check:
            return None
        raise ValueError("translate needs canonical CSR arrays (sorted, distinct column indices in each row)")
    if cp is not np:
        _RAN[0] = True
    block_cols = block_cols[: n_blocks * W]
    block_ptr = block_ptr[: n_blocks + 1]
    meta = meta if meta is None else meta[:n_blocks]
    if (bound - n_blocks) * W * 4 > _SLACK_BYTES:  # give the bound's spare room back
        block_cols, block_ptr = block_cols.copy(), block_ptr.copy()
        meta = meta if meta is None else meta.copy()
    out = {
        "win_ptr": win_ptr,
        "block_cols": block_cols.reshape(n_blocks, W),
        "block_ptr": block_ptr,
        "tile_pos": tile_pos,
        "values": values,
        "perm": perm,
        "window_stats": _stats_of(k, read[2:].tolist(), n_windows),
    }
    if meta is not None:
        out["block_meta"] = meta
        out["host_win_ptr"] = host[:n_windows + 1]
    return out


class WindowStats(NamedTuple):
    """What a translation counts of its windows for planning products (:func:`tcgnn_py._reference.window_stats`),
    handed over with its one host read: a new matrix's first product reads them instead of passing over its
    windows."""

    longest: int  # blocks of the longest window
    empty: int  # windows without blocks
    sizes: tuple  # unit sizes (blocks)
    max_units: int  # units per window at most, in ``capped``
    units: tuple  # per size: the sum of ceil(nb / size) over the windows of nb blocks
    capped: tuple  # per size: the same, each window's at least 1 and at most max_units
    cut: tuple  # per size: the windows of more than size blocks


def _stat_sizes(k):
    """The unit sizes the kernels ``k`` count windows for."""
    return tuple([16 << i for i in range(k.STAT_SIZES)])


def _stats_of(k, read, n_windows):
    """The :class:`WindowStats` of the kernels ``k``'s counts ``read`` (Python ints, as
    :data:`~tcgnn_py.kernels.sgt.N_STATS` orders them) over ``n_windows`` windows: each non-empty window's first
    unit, and every window's first capped one, are added here."""
    n = k.STAT_SIZES
    longest, empty, beyond, over, cut = read[0], read[1], read[2:2 + n], read[2 + n:2 + 2 * n], read[2 + 2 * n:]
    return _window_stats(k, [longest, empty] + [b + n_windows - empty for b in beyond]
                         + [b + n_windows - o for b, o in zip(beyond, over)] + cut)


def _reference_stats(k, win_ptr):
    """The :class:`WindowStats` of ``win_ptr`` by the NumPy reference, for the kernels ``k``'s sizes."""
    return _window_stats(k, ref.window_stats(win_ptr, _stat_sizes(k), k.STAT_MAX_UNITS).tolist())


def _window_stats(k, values):
    """The :class:`WindowStats` of ``values`` (as :func:`tcgnn_py._reference.window_stats` orders them) for the
    kernels ``k``'s sizes."""
    n = k.STAT_SIZES
    return WindowStats(values[0], values[1], _stat_sizes(k), k.STAT_MAX_UNITS, tuple(values[2:2 + n]),
                       tuple(values[2 + n:2 + 2 * n]), tuple(values[2 + 2 * n:]))


def _translate_steps(cp, k, data, indices, indptr, n_rows, n_cols, H, W, n_windows, bound, win_ptr, status, edge_row):
    """:func:`translate_kernels`' kernels, one launch each: ``(block_cols, block_ptr, tile_pos, values, perm, meta)``
    of the bound (``meta`` None above :data:`HOST_PLAN_MAX` entries)."""
    nnz = indices.shape[0]
    # the int32 scratch in one buffer (first_flag: every merged position is written once)
    kidx, first_flag, scan, nblk, block_win, row_off, block_nnz, own_rows = scratch_views(
        cp, (nnz, nnz, nnz + 1, n_windows, bound, bound * H, bound, nnz if edge_row is None else 0))
    if edge_row is None:  # (the entries' rows, found and checked by the first kernel)
        edge_row = own_rows
        _launch(k.check_csr, _grid(max(nnz, n_rows)), _TPB, indptr, indices, n_cols, edge_row, status)
    _launch(k.rank_edges, _grid(nnz * H), _TPB, indptr, indices, edge_row, n_rows, H, kidx, first_flag, status)
    _scan(cp, k, first_flag, scan, status)
    _launch(k.window_blocks, _grid(n_windows), _TPB, indptr, scan, n_rows, H, W, nblk, status)
    _scan(cp, k, nblk, win_ptr, status)

    block_cols = cp.empty(bound * W, np.int32)
    _launch(k.condense_edges, _grid(nnz), _TPB,
            indptr, indices, edge_row, H, W, win_ptr, scan, first_flag, kidx, block_cols, block_win, status)
    block_ptr = cp.empty(bound + 1, np.int32)
    _launch(k.count_block_rows, _grid(bound * H), _TPB,
            indptr, indices, n_rows, H, W, win_ptr, block_cols, block_win, row_off, block_nnz, status)
    _scan(cp, k, block_nnz, block_ptr, status)

    tile_pos = cp.empty(nnz, ref.tile_pos_dtype(H, W))
    values = cp.empty(nnz, data.dtype)
    perm = cp.empty(nnz, np.int32)
    _launch(k.scatter_edges, _grid(nnz), _TPB,
            indptr, edge_row, data, H, W, win_ptr, kidx, block_ptr, row_off, tile_pos, values, perm, status)
    meta = None
    if nnz <= HOST_PLAN_MAX:  # (a small tiling's products plan on the host: what they read, ready)
        words, columns = block_meta_layout(H, W)
        meta = cp.empty((bound, columns), np.uint32)
        _launch(k.block_meta, _grid(bound), _TPB, win_ptr, block_ptr, tile_pos, words, meta, status)
    return block_cols, block_ptr, tile_pos, values, perm, meta


def _translate_small(cp, k, data, indices, indptr, n_cols, H, W, n_windows, bound, win_ptr, status):
    """:func:`translate_kernels`' one launch (:func:`~tcgnn_py.kernels.sgt.translate_small`): what
    :func:`_translate_steps` returns, its scratch arrays views of one buffer."""
    nnz = indices.shape[0]
    edge_row, kidx, first_flag, scan, nblk, block_win, row_off, block_nnz = scratch_views(
        cp, (nnz, nnz, nnz, nnz + 1, n_windows, bound, bound * H, bound))
    block_cols = cp.empty(bound * W, np.int32)
    block_ptr = cp.empty(bound + 1, np.int32)
    tile_pos = cp.empty(nnz, ref.tile_pos_dtype(H, W))
    values = cp.empty(nnz, data.dtype)
    perm = cp.empty(nnz, np.int32)
    words, columns = block_meta_layout(H, W)
    meta = cp.empty((bound, columns), np.uint32)
    threads = k.cta_threads(cp is np)
    _launch(k.translate_small, 1, threads, indptr, indices, data, n_cols, H, W, edge_row, kidx, first_flag, scan,
            nblk, win_ptr, block_cols, block_win, row_off, block_nnz, block_ptr, tile_pos, values, perm, words, meta,
            status)
    return block_cols, block_ptr, tile_pos, values, perm, meta


def _scan(cp, k, src, dst, status, threads=None):
    """``dst = [0, cumsum(src)]`` (int32): Numba's tiled scan for small arrays (one launch for one tile,
    two beyond), CuPy's for large ones.  ``threads``: per CTA (the simulator's tests use fewer)."""
    n = src.shape[0]
    if n > k.SCAN_SMALL_MAX:
        dst[:1] = 0
        cp.cumsum(src, dtype=np.int32, out=dst[1:])
        return
    threads = threads or min(k.SCAN_THREADS, max(32, -(-n // (32 * k.SCAN_ITEMS)) * 32))
    tiles = max(1, -(-n // (threads * k.SCAN_ITEMS)))
    tile_totals = cp.empty(tiles, np.int32)
    if tiles > 1:
        _launch(k.scan_tile_totals, tiles, threads, src, tile_totals, status)
    _launch(k.scan_tiles, tiles, threads, src, tile_totals, dst, status)


#: Unused bytes of the bound-sized block arrays that a translation keeps rather than copying them out.
_SLACK_BYTES = 1 << 20


def coo_to_csr_order(rows, cols, shape, cols_sorted=False):
    """``(order, indices, indptr)``: CSR of distinct COO pairs, ``data[order]`` its values.  ``cols_sorted``: the
    pairs come in ascending ``cols`` order (a CSR's entries, transposed), so a stable sort by row alone orders
    them, without (row, column) keys."""
    return _csr_of_order(rows, cols, shape, cols_sorted)[:3]


#: The most ``rows x entries`` of a matrix whose transpose :func:`csr_transpose` makes by its kernels: the last one
#: reads, per entry, its column's run of the transpose, at most that many reads in all (where one column holds every
#: row); above it, a stable sort's cost is the smaller bound.
TRANSPOSE_RANK_MAX = 1 << 32


def csr_transpose(rows, cols, shape, data=None):
    """``(order, indices, indptr, data[order])`` (``data`` None: None) of the transpose of a canonical CSR matrix of
    ``shape``, given its entries' rows and columns (int32, in its order): the transpose's CSR, each of its entries'
    position in the matrix's order.  :func:`coo_to_csr_order` of the pairs transposed, bit for bit.  On the GPU
    within :data:`TRANSPOSE_RANK_MAX`, :func:`transpose_kernels`: a transpose made every step (a sampled block's)
    costs a few launches, no sort and no device→host read."""
    xp = array_module(rows)
    if xp is np or int(shape[0]) * int(cols.shape[0]) > TRANSPOSE_RANK_MAX:
        return _csr_of_order(cols, rows, shape[::-1], True, data)
    gather = data is not None and data.dtype not in (np.float32, np.float64)  # (the kernel's value types)
    order, indices, indptr, out = transpose_kernels(xp, rows, cols, shape, None if gather else data)
    return order, indices, indptr, data[order] if gather else out


def transpose_kernels(xp, rows, cols, shape, data=None):
    """:func:`csr_transpose` by :func:`~tcgnn_py.kernels.sgt.transpose_count`, a scan,
    :func:`~tcgnn_py.kernels.sgt.transpose_place` and :func:`~tcgnn_py.kernels.sgt.transpose_rank` (``xp`` CuPy, or
    NumPy in the simulator)."""
    from ..kernels import sgt as k

    n = int(shape[1])
    nnz = cols.shape[0]
    rows, cols = rows.astype(np.int32, copy=False), cols.astype(np.int32, copy=False)
    count, status = xp.zeros(n, np.int32), xp.zeros(1, np.int32)
    indptr, indices, run_rows = xp.empty(n + 1, np.int32), xp.empty(nnz, np.int32), xp.empty(nnz, np.int32)
    order = xp.empty(nnz, np.int64)
    out = xp.empty(0 if data is None else nnz, np.float32 if data is None else data.dtype)
    if nnz:
        _launch(k.transpose_count, _grid(nnz), _TPB, cols, count)
    _scan(xp, k, count, indptr, status)
    if nnz:
        _launch(k.transpose_place, _grid(nnz), _TPB, cols, rows, indptr, count, run_rows)
        _launch(k.transpose_rank, _grid(nnz), _TPB, cols, rows, indptr, run_rows, out if data is None else data,
                order, indices, out)
    return order, indices, indptr, None if data is None else out


def _csr_of_order(rows, cols, shape, cols_sorted, data=None):
    """``(order, indices, indptr, data[order])`` (``data`` None: None): :func:`csr_of_order_kernels` on the device,
    NumPy's calls on the host."""
    xp = array_module(rows)
    if xp is not np:
        return csr_of_order_kernels(xp, rows, cols, shape, cols_sorted, data)
    order = np.argsort(_sort_key(rows, cols, shape, cols_sorted), kind="stable")
    indptr = np.searchsorted(rows[order], np.arange(shape[0] + 1), side="left").astype(np.int32)
    return order, cols[order].astype(np.int32), indptr, None if data is None else data[order]


def _sort_key(rows, cols, shape, cols_sorted):
    """The key of a stable sort of COO pairs into CSR order: the rows alone where ``cols_sorted``."""
    return rows if cols_sorted else rows.astype(np.int64) * shape[1] + cols


def csr_of_order_kernels(xp, rows, cols, shape, cols_sorted=False, data=None):
    """``(order, indices, indptr, data[order])`` of COO pairs (``data`` None: None) through one stable sort and one
    launch of :func:`~tcgnn_py.kernels.sgt.csr_of_order` (the gathers and the row pointers); ``xp`` is CuPy, or
    NumPy in the simulator: one launch instead of a CuPy call per array."""
    from ..kernels import sgt as k

    order = xp.argsort(_sort_key(rows, cols, shape, cols_sorted), kind="stable")
    rows, cols = rows.astype(np.int32, copy=False), cols.astype(np.int32, copy=False)  # (the kernel's one compile)
    nnz = order.shape[0]
    indices, indptr = xp.empty(nnz, np.int32), xp.empty(shape[0] + 1, np.int32)
    out = xp.empty(0 if data is None else nnz, np.float32 if data is None else data.dtype)
    _launch(k.csr_of_order, _grid(max(nnz, shape[0] + 1)), _TPB, order, rows, cols, out if data is None else data,
            indptr, indices, out)
    return order, indices, indptr, None if data is None else out
