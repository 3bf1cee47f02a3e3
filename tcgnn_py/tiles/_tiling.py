"""Layer 2: :class:`Tiling`, the structure of a tiled matrix, and what derives from it.

A tiling is everything about a translated matrix except its values: the
structure arrays (documented in :mod:`tcgnn_py._reference`), the shape, the
layout, and derived data computed lazily and cached on the tiling -- entry rows,
occupancy masks, kernel work plans, the transpose.  Matrices that differ only in
their values (``with_values``, ``sddmm``, ``astype``) share one ``Tiling``
object, and with it every cache.
"""

import dataclasses

import numpy as np

from .. import _reference as ref
from .._cache import BOUND_KEEP, Store
from .._device import array_module, publish, to_host
from .._validation import check_tile_shape
from ._sgt import DERIVED

__all__ = ["Tiling", "TileStats", "Layout", "LAYOUTS", "DEFAULT_LAYOUT", "resolve_layout", "STRUCTURE"]

#: The structure arrays of a tiling, in the order ``Tiling`` takes them.
STRUCTURE = ("win_ptr", "block_cols", "block_ptr", "tile_pos", "perm")


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a tiling cuts a matrix: ``window`` rows per window, ``block`` column slots per block.

    ``orientation`` is ``"rows"``: windows are row windows and blocks hold
    condensed columns.  ``pattern`` ``(N, M)``, when set, groups each window's
    column slots so that every row holds at most N entries in each M
    consecutive slots (padding slots where needed: lossless for any matrix).
    The named layouts (:data:`LAYOUTS`):

    ``"tcgnn"`` (16 x 8)
        TC-GNN's format: each block is one ``16 x 8`` tile, the A operand of
        ``mma.m16n8k8``.
    ``"vector"`` (8 x 4)
        8-row windows of condensed ``8 x 1`` column vectors, 4 per block; the
        SpMM swaps operands (X is the MMA's A operand, two blocks of vectors its
        B operand, FlashSparse-style) and splits long windows into balanced
        parts.  Half the window height means fewer zeros per gathered X row.
    ``"2:4"`` (16 x 16, pattern 2:4)
        Sparse tensor cores: each block is the A operand of
        ``mma.sp.m16n8k16`` (float16 / bfloat16 X), stored compressed with its
        metadata.  float32 X runs on CUDA cores.
    ``"1:2"`` (16 x 8, pattern 1:2)
        Sparse tensor cores for float32 X: ``mma.sp.m16n8k8`` with TF32.

    Examples
    --------
    >>> import tcgnn_py as tg
    >>> tg.Layout(8, 4).name, tg.Layout(16, 8).name, tg.Layout(32, 4).name
    ('vector', 'tcgnn', None)
    >>> tg.LAYOUTS["2:4"]
    Layout(window=16, block=16, orientation='rows', pattern=(2, 4))
    """

    window: int = 16
    block: int = 8
    orientation: str = "rows"
    pattern: tuple = None

    @property
    def tile_shape(self):
        return (self.window, self.block)

    @property
    def name(self):
        """``"tcgnn"`` or ``"vector"`` for the tensor-core layouts, else ``None``."""
        return next((k for k, v in LAYOUTS.items() if v == self), None)

    def __str__(self):
        nm = f" {self.pattern[0]}:{self.pattern[1]}" if self.pattern else ""
        return f"{self.window}x{self.block} {self.orientation}{nm}"


#: The named layouts, each with tensor-core SpMM kernels.
LAYOUTS = {
    "tcgnn": Layout(16, 8),
    "vector": Layout(8, 4),
    "2:4": Layout(16, 16, pattern=(2, 4)),
    "1:2": Layout(16, 8, pattern=(1, 2)),
}
#: What ``TiledMatrix(A)`` uses when neither ``layout`` nor ``tile_shape`` is given: the vector layout, whose
#: 8-row windows share more columns per tile than the 16x8 layout's, and whose SpMM and SDDMM are faster on
#: nearly every real graph measured (see the results page).
DEFAULT_LAYOUT = "vector"


def resolve_layout(layout=None, tile_shape=None):
    """The :class:`Layout` of ``layout`` (a name or a Layout) and/or ``tile_shape``; they must agree."""
    if layout is None:
        if tile_shape is None:
            return LAYOUTS[DEFAULT_LAYOUT]
        return Layout(*check_tile_shape(tile_shape))
    if isinstance(layout, str):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {sorted(LAYOUTS)} or a tcgnn_py.Layout, got {layout!r}")
        out = LAYOUTS[layout]
    elif isinstance(layout, Layout):
        check_tile_shape(layout.tile_shape)
        if layout.orientation != "rows":
            raise ValueError(f"only row windows are supported, got orientation {layout.orientation!r}")
        if layout.pattern is not None and layout not in LAYOUTS.values():
            raise ValueError(f"N:M patterns come with the named layouts '2:4' and '1:2', got {layout!r}")
        out = layout
    else:
        raise TypeError(f"layout must be a str or a tcgnn_py.Layout, got {type(layout).__name__}")
    if tile_shape is not None and tuple(check_tile_shape(tile_shape)) != out.tile_shape:
        raise ValueError(f"tile_shape {tuple(tile_shape)} contradicts layout {layout!r} ({out.tile_shape})")
    return out


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
    #: Stored column slots holding no column (each window's last block, and N:M grouping padding).
    padding_slots: int = 0
    #: N:M layouts: the padding slots inside groups of M that hold a column (conflicts, and each window's column
    #: count rounded up to M); the others fill whole groups up to the block width (the MMA's K).
    group_padding_slots: int = 0
    #: Non-empty windows stored in the fewest blocks their columns need (no padding beyond the last block's).
    windows_unpadded: int = 0
    #: ``(N, M)`` of an N:M layout, else None.
    pattern: tuple = None

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
            + (f", {self.pattern[0]}:{self.pattern[1]} padding {self.padding_slots} slots "
               f"({100 * self.padding_fraction:.1f}%; in groups {self.group_padding_slots}, "
               f"{100 * self.group_padding_fraction:.1f}%), {self.windows_unpadded}/{self.nonempty_windows} windows "
               f"unpadded" if self.pattern else "")
        )

    @property
    def padding_fraction(self):
        """Padding slots per stored column slot."""
        H, W = self.tile_shape
        return self.padding_slots / (self.blocks * W) if self.blocks else 0.0

    @property
    def group_padding_fraction(self):
        """N:M layouts: padding slots inside groups per slot of the groups that hold a column."""
        H, W = self.tile_shape
        grouped = self.blocks * W - (self.padding_slots - self.group_padding_slots)
        return self.group_padding_slots / grouped if grouped else 0.0


#: Types whose values hold no device data, answered by their exact type before the checks of their subclasses: a new
#: matrix's first product caches a few dozen values, each checked here.
_HOST_TYPES = frozenset((type(None), bool, int, float, str, bytes, np.ndarray))


def _holds_device(value):
    """Whether a value to cache may hold device data: anything but NumPy arrays, numbers, strings and tuples, lists,
    dicts and dataclasses of them (a conservative answer: an object of another type counts as device data)."""
    t = type(value)
    if t in _HOST_TYPES:
        return False
    if t is dict:
        return any(map(_holds_device, value.values()))
    if t is tuple:
        return any(map(_holds_device, value))
    if isinstance(value, (np.ndarray, np.generic, int, float, str, bytes)):
        return False
    if isinstance(value, (tuple, list)):
        return any(_holds_device(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_device(v) for v in value.values())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_holds_device(getattr(value, f.name)) for f in dataclasses.fields(value))
    return True


@dataclasses.dataclass(frozen=True, eq=False)
class Tiling:
    """The structure of a tiled matrix: arrays, shape, layout, and cached derived data.

    Immutable: the arrays are read-only by contract and shared by every matrix
    built on this tiling.  Build one with :class:`tcgnn_py.TiledMatrix` (its
    ``tiling`` attribute); internal code uses :meth:`from_arrays`.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> T = tg.TiledMatrix(sp.csr_array(np.eye(3, dtype=np.float32)), device="cpu")
    >>> t = T.tiling
    >>> t.shape, t.layout.tile_shape, t.n_windows, t.n_blocks, t.nnz, t.device
    ((3, 3), (8, 4), 1, 1, 3, 'cpu')
    >>> T.with_values(np.ones(3)).tiling is t
    True
    """

    win_ptr: object
    block_cols: object
    block_ptr: object
    tile_pos: object
    perm: object
    shape: tuple
    layout: Layout = Layout()
    _cache: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    # Plain facts, read as attributes (planning a product asks for them dozens of times): set from the arrays.
    xp: object = dataclasses.field(default=None, init=False, repr=False)  #: NumPy or CuPy, the arrays' module
    device: str = dataclasses.field(default=None, init=False, repr=False)  #: ``"cuda"`` or ``"cpu"``
    nnz: int = dataclasses.field(default=0, init=False, repr=False)  #: stored entries
    n_windows: int = dataclasses.field(default=0, init=False, repr=False)  #: row windows
    n_blocks: int = dataclasses.field(default=0, init=False, repr=False)  #: condensed blocks (tiles)
    tile_shape: tuple = dataclasses.field(default=None, init=False, repr=False)  #: ``(window height, block width)``

    def __post_init__(self):
        xp = array_module(self.tile_pos)
        facts = {"xp": xp, "device": "cpu" if xp is np else "cuda", "nnz": int(self.tile_pos.shape[0]),
                 "n_windows": int(self.win_ptr.shape[0]) - 1, "n_blocks": int(self.block_cols.shape[0]),
                 "tile_shape": self.layout.tile_shape}
        for name, value in facts.items():
            object.__setattr__(self, name, value)

    def __getstate__(self):
        # The structure alone: a module does not pickle (set again on loading), and the cache -- plans, launches,
        # the transpose, device buffers -- is derived data that rebuilds where the copy is used.
        return {**self.__dict__, "xp": None, "_cache": {}}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__post_init__()

    @classmethod
    def from_arrays(cls, arrays, shape, tile_shape=(16, 8), layout=None):
        """``(tiling, values)`` from a dict of trusted tiled arrays (SGT's output, with any :data:`DERIVED` data it
        handed over; ``values`` None where the dict has none); no copies."""
        tiling = cls(
            *(arrays[k] for k in STRUCTURE),
            shape=(int(shape[0]), int(shape[1])),
            layout=Layout(int(tile_shape[0]), int(tile_shape[1])) if layout is None else layout,
        )
        tiling._cache.update({key: arrays[name] for name, key in DERIVED.items() if name in arrays})
        return tiling, arrays.get("values")

    # --- plain facts ------------------------------------------------------
    @property
    def nbytes(self):
        """Bytes of the structure arrays (not the cached derived data)."""
        return sum(int(getattr(self, k).nbytes) for k in STRUCTURE)

    def arrays(self, values=None):
        """The structure arrays as a dict (plus ``values`` when given), for the reference functions."""
        out = {k: getattr(self, k) for k in STRUCTURE}
        if values is not None:
            out["values"] = values
        return out

    # --- derived data, computed once --------------------------------------
    def cached(self, key, build):
        """``build()`` once per key; derived data that depends on the structure only.

        Kernel launchers keep their work plans here, so matrices sharing the
        tiling share them.  Device data is complete before it is cached
        (:func:`publish`): a call on another stream may use it next.  Host
        data (NumPy arrays, numbers, and containers of them only) needs no such
        wait, so building it does not synchronize.
        """
        try:
            return self._cache[key]
        except KeyError:
            value = build()
            if self.device == "cuda" and _holds_device(value):
                publish()
            self._cache[key] = value
            return value

    def peek(self, key, default=None):
        """The derived data cached under ``key``, or ``default`` (never builds: a planned launch's lookup)."""
        return self._cache.get(key, default)

    def bound(self):
        """This graph's store of bound calls (:class:`tcgnn_py._cache.Store`): the products' plans by operand
        signature (``products.signature``), their launches, the layers' bound calls and the attention passes,
        shared by the matrices on the tiling (``with_values``), at most ``BOUND_KEEP`` per device and stream."""
        store = self._cache.get("bound")
        if store is None:
            store = self._cache["bound"] = Store(BOUND_KEEP)
        return store

    def put(self, key, value):
        """Cache ``value`` under ``key`` (replacing any), as :meth:`cached` would have built it."""
        self._cache[key] = value
        return value

    def drop(self, key):
        """Forget what is cached under ``key`` (nothing if absent)."""
        self._cache.pop(key, None)

    def cached_items(self, kind):
        """``(key, value)`` of what is cached or bound (:meth:`bound`) under tuple keys starting with ``kind`` (e.g.
        ``"launch"``), oldest first."""
        items = list(self._cache.items()) + list(self._cache.get("bound", {}).items())
        return [(k, v) for k, v in items if isinstance(k, tuple) and k and k[0] == kind]

    def cache_nbytes(self):
        """Bytes of the arrays held by cached derived data (work plans, masks, entry rows, ...), each once."""
        seen = {}

        def walk(v):
            if isinstance(v, (tuple, list)):
                for x in v:
                    walk(x)
            elif isinstance(v, dict):
                for x in v.values():
                    walk(x)
            elif (not isinstance(v, Tiling) and hasattr(v, "shape")
                  and isinstance(getattr(v, "nbytes", None), (int, np.integer))):
                seen[id(v)] = int(v.nbytes)  # an array (a type's nbytes, e.g. a cached cupy.ndarray, is a descriptor)

        walk(list(self._cache.values()))
        return sum(seen.values())

    def rows_cols(self):
        """Global ``(row, column)`` of every tiled entry, in tiled order (int64)."""
        return ref.tiled_rows_cols(self.win_ptr, self.block_cols, self.block_ptr, self.tile_pos, self.layout.window)

    def entry_rows(self):
        """Row of every stored entry, in tiled order (int32; computed once)."""
        return self.cached("entry_rows", lambda: self.rows_cols()[0].astype(np.int32))

    def transpose(self):
        """``(tiling of Aᵀ, src)``: Aᵀ translated with the same layout, and where its entries come from.

        ``values_t = values[src]`` turns values of A (tiled order) into values of
        Aᵀ (its tiled order).  Computed once; the transpose's own transpose is
        this tiling, and its ``src`` (the inverse map) is made only when asked: a
        training step never asks, and it would cost 4 bytes per entry.
        """
        hit = self._cache.get("transpose")
        if hit is not None and hit[1] is None:  # the way back from a transpose: the inverse of the partner's map
            partner, (_, src) = hit[0], hit[0]._cache["transpose"]
            xp = self.xp
            inv = xp.empty_like(src)
            inv[src] = xp.arange(src.shape[0], dtype=src.dtype)
            if xp is not np:
                publish()  # complete before another stream uses it
            hit = self._cache["transpose"] = (partner, inv)
        if hit is not None:
            return hit
        from . import _sgt  # layer 2 sibling; SGT runs on the tiling's device

        xp = self.xp
        shape_t = self.shape[::-1]
        if xp is not np and self.layout.pattern is None and _sgt.on_host(self.nnz, device_input=True):
            # The SGT kernels have not run, so the translation would go to the host anyway: the whole transpose is
            # worked out there, from one read of the structure, and uploaded with its derived data as a host build
            # is -- the steps around the translation compile none of CuPy's kernels on the device.
            host, _ = Tiling.from_arrays({k: to_host(getattr(self, k)) for k in STRUCTURE},  # synchronize!
                                         self.shape, self.tile_shape, self.layout)
            host_t, src = host.transpose()
            tiling_t, _ = Tiling.from_arrays(_sgt.upload(host_t.arrays(), self.tile_shape), shape_t, self.tile_shape,
                                             self.layout)
            src = xp.asarray(src)
        else:
            rows, cols = self.rows_cols()
            order, indices, indptr = _sgt.coo_to_csr_order(cols, rows, shape_t)
            # Structure only: float32 zeros stand in for the values (the SGT kernels are compiled for them).
            arrays_t = _sgt.translate(xp.zeros(self.nnz, np.float32), indices, indptr, shape_t, *self.tile_shape,
                                      host_when_cold=True)
            if self.layout.pattern is not None:
                from . import _nm_group

                arrays_t = _nm_group.regroup(arrays_t, shape_t, self.layout)
            tiling_t, _ = Tiling.from_arrays(arrays_t, shape_t, self.tile_shape, self.layout)
            src = order[tiling_t.perm].astype(np.int32)  # tiled entry of Aᵀ -> tiled entry of A
        if xp is not np:
            publish()  # complete before another stream uses it
        # A tiling <-> transpose cycle: both are long-lived structure, freed together.
        tiling_t._cache["transpose"] = (self, None)
        self._cache["transpose"] = (tiling_t, src)
        return tiling_t, src

    def stats(self):
        """:class:`TileStats` of the translation (computed once)."""
        return self.cached("stats", self._stats)

    def _stats(self):
        xp = self.xp
        H, W = self.tile_shape
        n_windows, n_blocks = self.n_windows, self.n_blocks
        per_win = xp.diff(self.win_ptr)
        # Tiles of the uncondensed matrix: distinct (window, column // W) pairs.  Each
        # window's condensed columns are ascending, so count where the pair changes.
        flat = self.block_cols.reshape(-1)
        slot_win = (xp.searchsorted(self.win_ptr, xp.arange(n_blocks), side="right") - 1).repeat(W)
        keep = flat >= 0
        key = slot_win[keep].astype(np.int64) * (self.shape[1] // W + 1) + flat[keep] // W
        if self.layout.pattern is not None:
            key = xp.sort(key)  # N:M slots are grouped, not ascending
        before = int((key[1:] != key[:-1]).sum()) + 1 if key.shape[0] else 0  # synchronize!
        # Column slots per window and how many blocks they need: windows with more hold padding slots.
        cols_w = xp.zeros(n_windows, np.int64)
        if n_blocks:
            cols_w = xp.bincount(slot_win[keep], minlength=n_windows)[:n_windows]
        nonempty = per_win > 0
        unpadded = nonempty & (per_win == -(-cols_w // W))
        group_padding = 0
        if self.layout.pattern is not None and n_blocks:
            # Padding inside groups of M slots that hold a column (conflicts, and each window's columns rounded up
            # to M); the rest fills whole groups up to the block width.
            m = self.layout.pattern[1]
            g = self.block_cols.reshape(-1, m) >= 0
            group_padding = int((m - g.sum(axis=1))[g.any(axis=1)].sum())  # synchronize!
        return TileStats(
            shape=self.shape,
            nnz=self.nnz,
            tile_shape=(H, W),
            windows=n_windows,
            nonempty_windows=int((per_win > 0).sum()),  # synchronize!
            blocks=n_blocks,
            blocks_before=before,
            max_blocks_per_window=int(per_win.max()) if n_windows else 0,  # synchronize!
            padding_slots=int(n_blocks * W - int(keep.sum())),  # synchronize!
            group_padding_slots=group_padding,
            windows_unpadded=int(unpadded.sum()),  # synchronize!
            pattern=self.layout.pattern,
        )

    def check(self, full_check=False):
        """Check the structure's invariants; ``full_check`` scans every entry.  Raises ``ValueError``."""
        H, W = self.tile_shape
        M, N = self.shape
        n_windows = -(-M // H)
        n_blocks = self.n_blocks
        nnz = self.nnz
        if self.win_ptr.shape != (n_windows + 1,):
            raise ValueError(f"win_ptr size {self.win_ptr.shape[0]} should be {n_windows + 1}")
        if self.block_cols.ndim != 2 or self.block_cols.shape[1] != W:
            raise ValueError(f"block_cols should have shape (n_blocks, {W})")
        if self.block_ptr.shape != (n_blocks + 1,):
            raise ValueError(f"block_ptr size {self.block_ptr.shape[0]} should be {n_blocks + 1}")
        if self.perm.shape != (nnz,):
            raise ValueError("tile_pos and perm should have the same size")
        if not full_check:
            return
        h = {k: to_host(getattr(self, k)) for k in STRUCTURE}  # synchronize!
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
        if self.layout.pattern is not None:
            n, m = self.layout.pattern
            # Entries per (block, row, group of m slots): at most n.
            key = (entry_block.astype(np.int64) * H + h["tile_pos"] // W) * (W // m) + (h["tile_pos"] % W) // m
            if key.size and np.bincount(key).max() > n:
                raise ValueError(f"a row holds more than {n} entries in a group of {m} slots ({n}:{m} layout)")

    def copy(self):
        """A tiling with copies of the structure arrays (empty caches)."""
        return Tiling(*(getattr(self, k).copy() for k in STRUCTURE), shape=self.shape, layout=self.layout)

    def __repr__(self):
        return (
            f"<Tiling {self.shape[0]}x{self.shape[1]}, {self.layout} tiles: {self.n_blocks} blocks in "
            f"{self.n_windows} windows, {self.nnz} entries, on {self.device}>"
        )
