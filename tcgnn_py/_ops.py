"""Layer 2: products over the tiled format -- operand handling, precision, dispatch.

``spmm_raw`` and ``sddmm_raw`` are the private raw-buffer entry points: the
public :func:`tcgnn_py.spmm` / :func:`tcgnn_py.sddmm` and
``TiledMatrix.__matmul__`` check shapes with scipy's wording, then land here.
On the GPU they launch the RawModule kernels of :mod:`tcgnn_py.kernels.products`;
on the host they run the NumPy/SciPy reference.

Precision
---------
``precision=None`` (default) picks tensor cores where the tiles have kernels
(``16 x 8`` and the vector layout's ``8 x 4``): TF32 for float32 products, and
on the vector layout float16 / bfloat16 MMAs when X is 16-bit; CUDA cores in
the data's own precision otherwise.  ``"tf32"`` demands TF32 tensor cores (an
error where they cannot be used), ``"fp32"`` demands CUDA cores, ``"fp16"`` /
``"bf16"`` demand the 16-bit MMA (X of that type, vector layout).  Every
tensor-core product accumulates in float32.  16-bit operands elsewhere are
widened to float32 (exactly) and the product is rounded once to the result
dtype.  float64 products always run on CUDA cores in float64: tensor cores have
no float64 TF32 mode, and silently dropping 29 mantissa bits would be a wrong
answer.  On the host every product is exact in its dtype (float32 for 16-bit
data, rounded once) and ``precision`` only gets validated.
"""

import functools
import sys
from typing import NamedTuple

import numpy as np

from . import _reference as ref
from ._device import DeviceMismatchError, get_cupy, is_cupy_array, is_device_array, publish, to_host
from ._tuning import options, overrides_key
from ._validation import check_exact, check_real_dtype, is_half, promote, value_dtype

__all__ = [
    "as_operand",
    "result_dtype",
    "check_out",
    "resolve_precision",
    "spmm_raw",
    "sddmm_raw",
    "MISMATCH",
    "PRECISIONS",
    "HALF_PRECISIONS",
    "compute_dtype",
    "UNITS_PER_WINDOW_MAX",
    "build_plan",
    "spmm_plan",
    "block_mask",
]

MISMATCH = "matmul: dimension mismatch with signature"
PRECISIONS = (None, "tf32", "fp32", "fp16", "bf16")
#: The 16-bit precisions and the operand dtype each needs.
HALF_PRECISIONS = {"fp16": "float16", "bf16": "bfloat16"}
HALF_MODES = frozenset(HALF_PRECISIONS.values())
_F32 = np.dtype(np.float32)
#: Tile shapes with TF32 tensor-core kernels: TC-GNN's 16x8 tiles and the vector layout's 8x4 blocks.
TC_TILES = ((16, 8), (8, 4))
_VEC_TILE = (8, 4)

# Work decomposition of the SpMM kernels (see the kernels.products package).
UNITS_PER_WINDOW_MAX = 64  # a hub window is split over at most this many CTAs
SDDMM_BLOCKS_PER_WARP = 4


def as_operand(X, on_device):
    """Return ``(array, kind)``: X as an array on the matrix's device, and what to return.

    ``kind`` is ``"numpy"`` (hand back a NumPy array) or ``"cupy"``.  Device
    producers (``__cuda_array_interface__`` or ``__dlpack__`` with a CUDA
    device) are wrapped without a copy and answered with CuPy arrays.
    """
    if isinstance(X, np.ndarray):
        kind = "numpy"
    elif is_cupy_array(X):
        if on_device:
            check_real_dtype(X.dtype, "operand")
            return check_exact(X, "X"), "cupy"
        kind = "cupy"
    elif is_device_array(X) or _is_cuda_dlpack(X):
        kind = "cupy"
    else:
        X = np.asarray(X)
        kind = "numpy"
    check_real_dtype(X.dtype, "operand")
    if on_device:
        cp = get_cupy()
        if kind == "cupy" and not hasattr(X, "__cuda_array_interface__"):
            X = cp.from_dlpack(X)
        else:
            X = cp.asarray(X)
    elif kind == "cupy":
        raise DeviceMismatchError("a device operand needs a matrix on the GPU, but this one lives on the CPU")
    return check_exact(X, "X"), kind


def _is_cuda_dlpack(X):
    dev = getattr(X, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return dev()[0] in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
    except Exception:
        return False


@functools.lru_cache(maxsize=256)
def result_dtype(matrix_dtype, operand_dtype):
    """Promotion of the two (:func:`~tcgnn_py._validation.promote`), integer operands made float."""
    return promote(matrix_dtype, value_dtype(operand_dtype))


def compute_dtype(dtype):
    """The dtype a product is computed in: float32 for 16-bit results (rounded once), else ``dtype``."""
    return _F32 if is_half(dtype) else np.dtype(dtype)


def check_out(out, shape, dtype, xp, half_ok=False):
    """Validate an ``out=`` array: the right module, shape, dtype and C-contiguous.

    ``half_ok``: a product computed in float32 (float32 or 16-bit result) may
    go to any of float32, float16, bfloat16 (rounded once).
    """
    if xp is np and not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray here, got {type(out).__name__}")
    if xp is not np and not isinstance(out, xp.ndarray):
        raise TypeError(f"out must be a cupy.ndarray here, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"out has shape {out.shape}, expected {shape}")
    f32_family = half_ok and compute_dtype(dtype) == np.float32
    if out.dtype != dtype and not (f32_family and compute_dtype(out.dtype) == np.float32):
        extra = " (or float32, float16, bfloat16)" if f32_family else ""
        raise ValueError(f"out has dtype {out.dtype}, expected {dtype}{extra}")
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")


def resolve_precision(precision, dtype, tile_shape, operand=None, pattern=None):
    """How a product runs: ``"tf32"``, ``"exact"`` (CUDA cores) or ``"float16"`` / ``"bfloat16"`` (16-bit MMA).

    ``dtype`` is the result's dtype, ``operand`` the dtype of the gathered
    operand X (16-bit MMAs need a 16-bit X on the vector or 2:4 layout);
    ``pattern`` is the layout's N:M pattern, if any.
    """
    if not (precision is None or isinstance(precision, str)) or precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    op = None if operand is None else np.dtype(operand)
    return _resolve(precision, np.dtype(dtype), tuple(tile_shape), op, pattern)


@functools.lru_cache(maxsize=64)
def _resolve(precision, dtype, tile_shape, operand, pattern=None):
    cdt = compute_dtype(dtype)
    tc_ok = cdt == np.float32 and tile_shape in TC_TILES
    half_tile = tile_shape == _VEC_TILE or pattern == (2, 4)  # layouts with 16-bit MMA kernels
    half_op = operand is not None and is_half(operand) and cdt == np.float32
    if precision in HALF_PRECISIONS:
        want = HALF_PRECISIONS[precision]
        if cdt != np.float32:
            raise TypeError(
                f"precision={precision!r} needs a float32 or 16-bit product, this one is {dtype}: "
                "cast the matrix and the operands with .astype(numpy.float32), or leave precision=None"
            )
        if operand is None or operand.name != want:
            raise TypeError(
                f"precision={precision!r} needs {want} operands, got {operand}: "
                f"cast them with .astype({want!r}), or leave precision=None"
            )
        if not half_tile:
            raise ValueError(f"precision={precision!r} needs layout='vector' or '2:4', got tile_shape {tile_shape}")
        return want
    if precision == "tf32" and not tc_ok:
        if cdt != np.float32:
            raise TypeError(
                f"precision='tf32' needs a float32 product, this one is {dtype}: "
                "cast the matrix and the operands with .astype(numpy.float32), or leave precision=None"
            )
        raise ValueError(f"precision='tf32' needs tile_shape=(16, 8) or (8, 4), got {tile_shape}")
    if precision is None and half_op and half_tile:
        return operand.name
    if precision == "fp32" or not tc_ok:
        return "exact"
    return "tf32"


# --- SpMM ------------------------------------------------------------------

_NM_PRODUCTS = []  # (spmm, bind) of the N:M layouts, registered by _sparse_tc (which builds on this module)


def register_nm_products(spmm, bind):
    """Install the N:M layouts' SpMM and its hot-path binder (``_sparse_tc`` calls it when imported)."""
    _NM_PRODUCTS[:] = [(spmm, bind)]


def _nm_products():
    if not _NM_PRODUCTS:
        raise RuntimeError("the N:M layouts' products are not registered: import tcgnn_py._sparse_tc first")
    return _NM_PRODUCTS[0]


def spmm_raw(tiling, values, X, dtype, precision=None, out=None, casts=None):
    """``A @ X`` for a 2-D X of shape ``(tiling.shape[1], D)`` already on the tiling's device.

    ``out`` (optional) is a validated C-contiguous array of the result's shape
    and dtype on the same device.  Work plans are cached on the tiling (they
    depend on the structure only); ``casts`` caches ``values`` cast to the
    product's dtype (per matrix).
    """
    dtype = np.dtype(dtype)
    mode = resolve_precision(precision, dtype, tiling.tile_shape, X.dtype, tiling.layout.pattern)
    if isinstance(X, np.ndarray):
        Y = ref.spmm(tiling.arrays(values), tiling.shape, tiling.layout.window, X, compute_dtype(dtype))
        Y = Y.astype(dtype, copy=False)
        if out is None:
            return Y
        out[...] = Y
        return out
    casts = {} if casts is None else casts
    # The kernels write ``kdt``: the result's dtype, or float32 rounded once into it afterwards (a 16-bit
    # result the kernel does not write, or one computed on widened X).
    sp = tiling.layout.pattern is not None and mode != "exact"  # sparse tensor cores (N:M layouts)
    if mode in HALF_MODES:
        hv = None if sp else half_values(values, X.dtype, casts)
        kdt = dtype if dtype in (_F32, X.dtype) else _F32
    else:
        hv, kdt = None, compute_dtype(dtype)
    # An out the kernel can write directly, unless it overlaps X (read while writing): then a temporary.
    direct = out if out is not None and kdt == dtype and not overlaps(out, X) else None
    if sp:  # 16-bit X on "2:4", TF32 on "1:2"
        Xs = X if mode in HALF_MODES else X.astype(_F32, copy=False)
        Y = _nm_products()[0](tiling, values, Xs, kdt, direct, casts)
    elif hv is not None:
        Y = _spmm_half(tiling, hv, X, kdt, direct)
    else:
        Y = _spmm_gpu(tiling, values, X, kdt, mode, direct, casts)
    if out is None:
        return Y if kdt == dtype else Y.astype(dtype)
    if Y is not out:
        out[...] = Y
    return out


def overlaps(a, b):
    """Whether two device arrays' byte ranges intersect (O(1), conservative)."""
    a0, b0 = a.data.ptr, b.data.ptr
    return a.nbytes > 0 and b.nbytes > 0 and a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


class Fixup(NamedTuple):
    """Second launch of a split (hub) window: sum its partial tiles in unit order."""

    kernel: object
    grid: tuple
    splits: object  # int4 rows (window, first slot, number of slots, 0)
    n_slots: int

    def run(self, partial, Y, M, D, H):
        from .kernels.products import FIXUP_THREADS

        self.kernel(self.grid, (FIXUP_THREADS,), (self.splits, partial, Y, np.int32(M), np.int32(D), np.int32(H)))

    def bind(self, partial, M, D, H):
        """``f(Y)``: this launch with the split rows, partial tiles and sizes fixed (hot paths)."""
        from .kernels.driver import BoundLaunch
        from .kernels.products import FIXUP_THREADS

        args = (self.splits, partial, None, np.int32(M), np.int32(D), np.int32(H))
        return BoundLaunch(self.kernel.kernel.ptr, self.grid, (FIXUP_THREADS,), args, (2,),
                           get_cupy().cuda.get_current_stream().ptr)


def stream_scratch(store, kind, make):
    """Per-stream scratch kept in a launch's ``store`` (calls on one stream run in order, so they can share it)."""
    key = (kind, get_cupy().cuda.get_current_stream().ptr)
    buf = store.get(key)
    if buf is None:
        buf = store[key] = make()
    return buf


def bound_launch(kernel, grid, block, smem, head, tail, partial, n_extra=0):
    """``f(values, X, Y, *extra)``: ``kernel(head + (values, X, Y, partial or Y) + tail + extra)`` through the driver.

    The parameters are set once (:class:`.kernels.driver.BoundLaunch`); a call writes the operands'
    addresses (``n_extra`` device arrays after the tail) and launches on the stream current now (hot-path
    entries are kept per stream).
    """
    from .kernels.driver import BoundLaunch

    n = len(head)
    args = head + (None, None, None, partial) + tail + (None,) * n_extra
    variable = (n, n + 1, n + 2) if partial is not None else (n, n + 1, (n + 2, n + 3))  # Y is the partial too
    variable += tuple(range(len(args) - n_extra, len(args)))
    return BoundLaunch(kernel.kernel.ptr, grid, block, args, variable, get_cupy().cuda.get_current_stream().ptr,
                       smem)


class TF32SpmmLaunch(NamedTuple):
    """One configuration of ``tcgnn_spmm_tf32``: kernel, geometry and its plan arrays."""

    kernel: object
    grid: tuple
    block: tuple
    smem: int
    units: object  # int4 rows (window, first block, end block, slot or -1)
    mask: object  # (n_blocks, 4) uint32 occupancy masks
    n_slabs: int  # CTAs per unit, side by side in the 1-D grid
    fixup: Fixup = None
    n_slots: int = 0  # partial tiles the launch writes (split windows)
    sizes: tuple = ()  # (M, D, n_slabs) as int32 scalars, made once
    unit_k0: object = None  # int2 rows (first slot of the unit's window, parts): split windows summed in the launch
    scratch: dict = None  # per-stream counters (one per (first slot, slab)) and partial tiles

    def _counters(self):
        """This stream's counters of split windows (each call resets the ones it uses), or None."""
        if self.unit_k0 is None:
            return None
        n = self.n_slots * self.n_slabs
        return stream_scratch(self.scratch, "counters", lambda: get_cupy().zeros(n, np.int32))

    def _fixed(self, tiling, M, D):
        """The arguments around ``(values, X, Y, partial)``: everything but the operands (one place for the order)."""
        head = (self.units, tiling.block_ptr, tiling.block_cols, self.mask)
        sizes = self.sizes or (np.int32(M), np.int32(D), np.int32(self.n_slabs))
        return head, (self._counters(), self.unit_k0, *sizes)

    def run(self, tiling, values, X, Y, partial, M, D):
        head, tail = self._fixed(tiling, M, D)
        self.kernel(self.grid, self.block, head + (values, X, Y, partial) + tail, shared_mem=self.smem)

    def partial(self, dtype, D):
        """This stream's buffer of partial tiles, or None without split windows."""
        if not self.n_slots:
            return None
        return stream_scratch(self.scratch, "partial", lambda: get_cupy().empty((self.n_slots, 16, D), dtype=dtype))

    def bind(self, tiling, dtype, M, D):
        """``f(values, X, Y)``: this launch with everything but the operands fixed (current stream's scratch)."""
        return bound_launch(self.kernel, self.grid, self.block, self.smem, *self._fixed(tiling, M, D), self.partial(dtype, D))


class CoreSpmmLaunch(NamedTuple):
    """One configuration of ``tcgnn_spmm_core`` (CUDA cores, any tile shape)."""

    kernel: object
    grid: tuple
    block: tuple
    smem: int
    units: object
    fixup: Fixup = None
    n_slots: int = 0

    def run(self, tiling, values, X, Y, partial, M, D):
        W = tiling.layout.block
        args = (self.units, tiling.block_ptr, tiling.block_cols, tiling.tile_pos, values, X, Y, partial,
                np.int32(M), np.int32(D), np.int32(W), np.int32(W.bit_length() - 1))
        self.kernel(self.grid, self.block, args, shared_mem=self.smem)


class VecSpmmLaunch(NamedTuple):
    """One configuration of ``tcgnn_spmm_vec`` (vector layout, one warp per unit x feature slice)."""

    kernel: object
    grid: tuple
    block: tuple
    smem: int
    units: object  # int4 rows (window, first block, end block, slot or -1)
    unit_k0: object  # int2 rows (first slot of the unit's window, parts of the window)
    meta: object  # (n_blocks, 2) uint32: occupancy mask, first entry
    n_slices: int
    n_work: int  # units x slices
    n_counters: int  # split windows are summed in the launch: one counter per (first slot, slice); 0: fixup launch
    counters: dict  # per-stream scratch: stream pointer -> int32 counters (each call resets the ones it uses),
    #                 ("partial", stream pointer) -> partial-tile buffer
    fixup: Fixup = None
    n_slots: int = 0
    sizes: tuple = ()  # (M, D, n_slices, n_work) as int32 scalars, made once (per-call cost on small graphs)
    dense: bool = False  # takes vec_dense_values(tiling, values) in place of the values

    def _counters_now(self):
        """This stream's counters of split windows summed in the launch, or None."""
        if not self.n_counters:
            return None
        # keyed by size: launches that share a store (the timed choice's candidates) each get their own
        return stream_scratch(self.counters, ("counters", self.n_counters),
                               lambda: get_cupy().zeros(self.n_counters, np.int32))

    def _fixed(self, tiling, M, D):
        """The arguments around ``(values, X, Y, partial)``: everything but the operands (one place for the order)."""
        sizes = self.sizes or (np.int32(M), np.int32(D), np.int32(self.n_slices), np.int32(self.n_work))
        return (self.units, self.unit_k0, tiling.block_cols, self.meta), (self._counters_now(), *sizes)

    def run(self, tiling, values, X, Y, partial, M, D, extra=()):
        head, tail = self._fixed(tiling, M, D)
        self.kernel(self.grid, self.block, head + (values, X, Y, partial) + tail + tuple(extra), shared_mem=self.smem)

    def partial(self, dtype, D):
        """This stream's buffer of partial tiles (reused: calls on one stream run in order), or None."""
        if not self.n_slots:
            return None
        return stream_scratch(self.counters, ("partial", np.dtype(dtype).char, D),
                               lambda: get_cupy().empty((self.n_slots, 8, D), dtype=dtype))

    def bind(self, tiling, dtype, M, D, n_extra=0):
        """``f(values, X, Y, *extra)``: this launch with everything but the operands fixed (current stream's
        scratch); ``n_extra`` device arrays follow the sizes (the 16-bit kernel's unscale)."""
        return bound_launch(self.kernel, self.grid, self.block, self.smem, *self._fixed(tiling, M, D),
                      self.partial(dtype, D), n_extra)


def launch_key(mode, dtype, D, vec):
    """The one key under which a tiling caches its SpMM launch for ``mode``, the result's dtype, D and alignment."""
    return ("launch", mode, np.dtype(dtype).char, D, vec, overrides_key())


def half_launch_key(x_dtype, split, dtype, D, aligned):
    """The one key of a 16-bit X's vector SpMM launch (X's type, value pairs or not, result's dtype, D, alignment)."""
    return ("half_launch", np.dtype(x_dtype).name, split, np.dtype(dtype).name, D, aligned, overrides_key())


def _spmm_gpu(tiling, values, X, dtype, mode, out, casts):
    cp = get_cupy()
    M = tiling.shape[0]
    D = X.shape[1]
    Y = cp.empty((M, D), dtype=dtype) if out is None else out
    if M == 0 or D == 0:
        return Y
    if X.dtype != dtype or not X.flags.c_contiguous:
        X = cp.ascontiguousarray(X, dtype=dtype)
    values = values_as(values, dtype, casts)
    vec = mode == "tf32" and _aligned16(D, X, Y)
    key = launch_key(mode, dtype, D, vec)
    launch = tiling.peek(key)  # hot path: no closure per call
    if launch is None:
        launch = _planned(tiling, key, lambda: _spmm_launch(cp, tiling, mode, dtype, D, vec, (values, X, Y)))
    _run_spmm(cp, launch, tiling, values, X, Y, dtype)
    return Y


class Provisional(NamedTuple):
    """A launch chosen while some of the timed choice's candidates were still compiling in the background."""

    launch: object
    futures: list  # the background compiles it waits for


def _planned(tiling, key, plan):
    """The launch of ``plan()``, cached on the tiling under ``key`` once it is final.

    A :class:`Provisional` launch (the timed choice ran while some candidates were
    compiling) is kept aside and used until those compiles finish; the next call then
    plans again, timing every candidate, and that launch is the one cached (and bound
    by the hot paths).  Every candidate gives the same bits, so only speed changes.
    """
    aside = ("provisional", key)
    prov = tiling.peek(aside)
    if prov is not None:
        if not all(f.done() for f in prov.futures):
            return prov.launch
        tiling.drop(aside)
    launch = plan()
    if isinstance(launch, Provisional):
        tiling.put(aside, launch)
        return launch.launch
    return tiling.cached(key, lambda: launch)


def _run_spmm(cp, launch, tiling, values, X, Y, dtype):
    """One call of a planned SpMM launch (and its fixup) into Y."""
    M, D = Y.shape
    partial = Y
    if isinstance(launch, VecSpmmLaunch) and launch.dense:
        values = vec_dense_values(tiling, values)
    if isinstance(launch, (VecSpmmLaunch, TF32SpmmLaunch)):
        buf = launch.partial(dtype, D)
        partial = Y if buf is None else buf
    elif launch.n_slots:
        partial = cp.empty((launch.n_slots, tiling.layout.window, D), dtype=dtype)
    launch.run(tiling, values, X, Y, partial, M, D)
    if launch.fixup is not None:
        launch.fixup.run(partial, Y, M, D, tiling.layout.window)


# --- hot paths: repeated products with operands of one signature -----------------------
#
# A product's slow path validates, resolves the precision, finds the launch and its scratch.  Its result
# depends only on the operands' signatures (shapes, strides, dtypes, 16-byte alignment), the stream, the
# device and the tuning, so the first call of a signature caches a closure that only allocates the result
# and launches; later calls with the same signature go straight to it.  The cache lives on the tiling
# (matrices from ``with_values`` share it: a product's closure takes the matrix, for its values and casts).


#: Precisions the SpMM hot paths serve: the default, and the explicit precision the default resolves to for
#: the operands ("tf32" for float32 X, "fp16" / "bf16" for 16-bit X on the vector layout).
HOT_PRECISIONS = (None, "tf32", "fp16", "bf16")
#: Precisions the SDDMM hot path serves (float32 operands).
HOT_SDDMM_PRECISIONS = (None, "tf32")


def hot_key(values, X, out, precision=None):
    """The signature a cached product depends on (``out`` may be None)."""
    cp = sys.modules["cupy"]
    key = (values.dtype.char, X.shape, X.strides, X.dtype.char, X.data.ptr & 15,
           cp.cuda.get_current_stream().ptr, cp.cuda.runtime.getDevice(), overrides_key(), precision)
    if out is None:
        return key
    return key + (out.shape, out.strides, out.dtype.char, out.data.ptr & 15)


def spmm_bind(tiling, values, X, out, precision=None, casts=None):
    """``f(T, X, out) -> Y`` for ``T @ X`` with operands like these, or None when not cacheable.

    ``T`` is a matrix on ``tiling`` whose values have ``values``' dtype (its values and casts are read
    per call).  Cacheable, with a C-contiguous 2-D X and ``out`` and one launch (or two with a fixup):
    a float32 product on TF32 tensor cores (float32 X and values), a 16-bit X on the vector layout's
    16-bit MMAs whose result the kernel writes itself (see :func:`_half_bind`), and the N:M layouts'
    ``mma.sp`` products (``_sparse_tc.sp_bind``).
    Call it after the slow path ran once (the launch is then cached); ``casts`` is the matrix's cache of
    cast values that call filled (the 16-bit and N:M products launch for the values' form found there).
    """
    if X.ndim != 2 or not X.flags.c_contiguous:
        return None
    if out is not None and (not out.flags.c_contiguous or out.ndim != 2):
        return None
    if tiling.layout.pattern is not None:  # the N:M layouts' mma.sp kernels
        return _nm_products()[1](tiling, values, X, out, precision, casts)
    if is_half(X.dtype):
        return _half_bind(tiling, values, X, out, precision, casts)
    if X.dtype != _F32 or values.dtype != _F32 or (out is not None and out.dtype != _F32):
        return None
    M, D = tiling.shape[0], X.shape[1]
    if M == 0 or D == 0 or resolve_precision(precision, _F32, tiling.tile_shape, X.dtype) != "tf32":
        return None
    cp = get_cupy()
    vec = D % 4 == 0 and X.data.ptr % 16 == 0 and (out is None or out.data.ptr % 16 == 0)
    launch = tiling.peek(launch_key("tf32", _F32, D, vec))
    if not isinstance(launch, (TF32SpmmLaunch, VecSpmmLaunch)):
        return None
    run = launch.bind(tiling, _F32, M, D)
    if isinstance(launch, VecSpmmLaunch) and launch.dense:
        bound = run

        def run(values, X, Y):
            bound(vec_dense_values(tiling, values), X, Y)

    shape, ndarray = (M, D), cp.ndarray
    if launch.fixup is None:
        def f(T, X, out):
            Y = ndarray(shape, _F32) if out is None else out  # cupy.empty without its wrapper
            run(T._values, X, Y)
            return Y

        return f
    fixup = launch.fixup.bind(launch.partial(_F32, D), M, D, tiling.layout.window)

    def f2(T, X, out):
        Y = ndarray(shape, _F32) if out is None else out
        run(T._values, X, Y)
        fixup(Y)
        return Y

    return f2


def _half_bind(tiling, values, X, out, precision, casts=None):
    """:func:`spmm_bind` for a 16-bit X: the vector layout's 16-bit SpMM, or None.

    Cacheable where the slow path makes no copy: the product runs on the 16-bit MMAs
    (not the N:M layouts', nor TF32 on widened X) and its kernel writes the result's dtype
    (float32, or X's type).  Per call the closure takes the matrix's 16-bit values
    (:func:`half_values`, cached on the matrix) and launches.
    """
    xdt = X.dtype
    dtype = result_dtype(values.dtype, xdt) if out is None else out.dtype
    M, D = tiling.shape[0], X.shape[1]
    if M == 0 or D == 0 or tiling.tile_shape != _VEC_TILE or tiling.layout.pattern is not None:
        return None
    if resolve_precision(precision, dtype, tiling.tile_shape, xdt) not in HALF_MODES:
        return None
    if dtype not in (_F32, xdt):  # the slow path computes in float32 and rounds into a copy
        return None
    # A new result comes from the memory pool, 256-byte aligned, as the slow path's did.
    aligned = D % 8 == 0 and X.data.ptr % 16 == 0 and (out is None or out.data.ptr % 16 == 0)
    hv = (casts or {}).get(_half_key(xdt))
    if hv is None:
        return None
    split = hv[0]
    launch = tiling.peek(half_launch_key(xdt, split, dtype, D, aligned))
    if not isinstance(launch, VecSpmmLaunch):
        return None
    run = launch.bind(tiling, _F32, M, D, n_extra=1)  # float32 partial tiles; the values' unscale per call
    fixup = launch.fixup.bind(launch.partial(_F32, D), M, D, tiling.layout.window) if launch.fixup else None
    return cast_closure(run, fixup, (M, D), dtype, _half_key(xdt), lambda T: half_values(T._values, xdt, T._casts),
                        split, precision)


def cast_closure(run, fixup, shape, dtype, key, make, split, precision):
    """``f(T, X, out) -> Y``: a bound launch fed, per call, the matrix's cast values.

    ``T._casts[key]`` (made by ``make(T)`` on a miss, cached on the matrix) is ``(split, values, unscale)``;
    ``run(values, X, Y, unscale or values)`` launches, then the bound ``fixup(Y)`` if any.  The 16-bit and N:M
    hot paths: matrices sharing a tiling (``with_values``) each bring their own values, and one whose values
    take the other form than ``split`` (the launch bound) goes the slow way (:func:`spmm_raw`).
    """
    ndarray = get_cupy().ndarray

    def f(T, X, out):
        form, vals, unscale = T._casts.get(key) or make(T)
        if form != split:  # (hi, lo) pairs against values exact in X's type: another kernel
            return spmm_raw(T._tiling, T._values, X, dtype, precision, out=out, casts=T._casts)
        Y = ndarray(shape, dtype) if out is None else out
        run(vals, X, Y, vals if unscale is None else unscale)
        if fixup is not None:
            fixup(Y)
        return Y

    return f


def sddmm_bind(tiling, values, Xa, Xb, multiply_values, precision=None):
    """``f(values, Xa, Xb) -> e`` for SDDMM with operands like these, or None (as :func:`spmm_bind`)."""
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    if values.dtype != _F32 or tiling.nnz == 0:
        return None
    for X in (Xa, Xb):
        if X.ndim != 2 or X.dtype != _F32 or not X.flags.c_contiguous:
            return None
    D = Xa.shape[1]
    if D == 0 or resolve_precision(precision, _F32, tiling.tile_shape, _F32) != "tf32":
        return None
    cp = get_cupy()
    nnz, aligned = tiling.nnz, _aligned16(D, Xa, Xb)
    mv = np.int32(multiply_values)
    if tiling.tile_shape == _VEC_TILE:
        units = spmm_plan(tiling, kp.VEC_SDDMM_BLOCKS, np.iinfo(np.int32).max)["units"]
        kernel = get_kernel("vec", kp.sddmm_vec_name(aligned))
        grid, block, smem = (-(-units.shape[0] // kp.VEC_WARPS),), (32 * kp.VEC_WARPS,), 0
        head = (units, np.int32(units.shape[0]), tiling.block_ptr, tiling.block_cols, tiling.tile_pos)
        tail = (np.int32(tiling.shape[0]), np.int32(D), mv)
    elif tiling.tile_shape == (16, 8):
        bpw, warps = SDDMM_BLOCKS_PER_WARP, kp.SDDMM_WARPS
        kernel = get_kernel("tf32", kp.sddmm_tf32_name(aligned))
        grid, block = (-(-tiling.n_blocks // (bpw * warps)),), (32 * warps,)
        smem = warps * kp.SDDMM_TF32_SMEM_PER_WARP
        head = (tiling.win_ptr, np.int32(tiling.n_windows), tiling.block_ptr, tiling.block_cols, tiling.tile_pos)
        tail = (np.int32(tiling.shape[0]), np.int32(tiling.n_blocks), np.int32(D), mv, np.int32(bpw))
    else:
        return None

    from .kernels.driver import BoundLaunch

    n = len(head)
    run = BoundLaunch(kernel.kernel.ptr, grid, block, head + (None,) * 4 + tail, range(n, n + 4),
                      cp.cuda.get_current_stream().ptr, smem)

    def f(values, Xa, Xb):
        out = cp.empty(nnz, _F32)
        run(values, Xa, Xb, out)
        return out

    return f


#: Marks a matrix's cache of casts when its values were made on the device (``with_values`` of a device array, as
#: in training steps): the 16-bit products then skip the exactness check of :func:`half_values` (a host read).
DEVICE_VALUES = "device_values"


def _half_key(xdt):
    """The key of :func:`half_values`' result in a matrix's cache of casts."""
    return ("half_values", xdt.name, options()["half_exact_values"])


def half_values(values, xdt, cache):
    """``(split, values, unscale)`` for the 16-bit SpMM with operands of ``xdt``, cached per matrix.

    Values of X's type go as they are, and so do values that X's type holds
    exactly (``options()["half_exact_values"]``; unweighted graphs, small
    integers): one MMA per block pair, the same sums as the pairs below, whose
    ``lo`` parts would all be zero.  Finding that out reads one flag back from
    the device, once per matrix and type; it is skipped (pairs) under CUDA-graph
    capture and for values made on the device (:data:`DEVICE_VALUES`: a training
    step's new values would each cost a host read).  Other values (float32, or
    the other 16-bit type) become ``(hi, lo)`` pairs of ``xdt`` packed in a uint32 (hi in
    the low half): ``hi = xdt(v * scale)``, ``lo = xdt(v * scale - hi)``, the
    kernel sums both products and multiplies by ``unscale = 1 / scale``.
    ``scale`` is a power of two that keeps the largest finite float16 part below
    2**14 (1 for bfloat16); Inf and NaN values stay in ``hi`` (``lo = 0``), so
    they propagate as in float32.  ``unscale`` is a one-element device array,
    found without a host read.
    """
    key = _half_key(xdt)
    hv = cache.get(key)
    if hv is not None:
        return hv
    cp = get_cupy()
    check = (options()["half_exact_values"] and not cache.get(DEVICE_VALUES)
             and not cp.cuda.get_current_stream().is_capturing())  # no host read under capture
    # The check reads the device anyway: small matrices are converted on the host, with NumPy (the same IEEE
    # roundings), so that a fresh process does not compile CuPy's kernels for each step below.
    xp = np if check and values.size <= HOST_PLAN_MAX else cp
    src = to_host(values) if xp is np else values  # synchronize!
    with np.errstate(over="ignore", invalid="ignore"):  # NumPy warns where CuPy is silent: out of range, Inf - Inf
        hv = _half_parts(cp, xp, values, src, xdt, check)
    cache[key] = publish(hv)  # complete before another stream uses it
    return hv


def _half_parts(cp, xp, values, src, xdt, check):
    """The ``(split, values, unscale)`` of :func:`half_values`, computed with ``xp`` from ``src`` (values there)."""
    v = None if values.dtype == xdt else src.astype(np.float32)
    bits = _round16(xp, v, xdt) if check and v is not None else None
    # synchronize! once per matrix and type; NaN compares unequal, so NaN values keep the pairs
    if bits is not None and not bool(xp.all(_widen16(xp, bits, xdt) == v)):
        bits = None
    if v is None:
        hv = (False, values, _device_one(cp))
    elif bits is not None:  # exact in xdt: one MMA on these values
        hv = (False, cp.asarray(bits), _device_one(cp))
    else:
        unscale = _device_one(cp)
        if xdt.name == "float16" and v.size:  # float16's range needs a scale (bfloat16 has float32's)
            a = xp.abs(v)
            amax = xp.where(xp.isfinite(a), a, np.float32(0)).max()
            e = xp.frexp(amax)[1]  # amax < 2**e
            scale = xp.where(amax > 0, xp.ldexp(np.float32(1), xp.clip(14 - e, -100, 100)), np.float32(1))
            v = v * scale.astype(np.float32)  # a power of two: exact
            unscale = cp.asarray((1 / scale).astype(np.float32).reshape(1))
        hi = _round16(xp, v, xdt)
        hf = _widen16(xp, hi, xdt)
        lo = _round16(xp, xp.where(xp.isfinite(hf), v - hf, np.float32(0)), xdt)  # Inf / NaN: all in hi
        hv = (True, cp.asarray(hi.astype(np.uint32) | (lo.astype(np.uint32) << 16)), unscale)
    return hv


@functools.lru_cache(maxsize=16)
def _device_one_on(device_id):
    return get_cupy().ones(1, np.float32)


def _device_one(cp):
    """A float32 1 on the current device (the unscale of unscaled values)."""
    return _device_one_on(cp.cuda.runtime.getDevice())


def _round16(cp, v, xdt):
    """float32 -> bits (uint16) of ``xdt``, round to nearest even."""
    if xdt.name == "float16":
        return v.astype(np.float16).view(np.uint16)
    u = v.view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def _widen16(cp, bits, xdt):
    """Bits (uint16) of ``xdt`` -> float32 (exact)."""
    if xdt.name == "float16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def result_and_operand(cp, tiling, X, dtype, out):
    """``(Y, X)``: the result (``out``, or a new array) and X C-contiguous; ``X`` None when there is nothing to do."""
    M, D = tiling.shape[0], X.shape[1]
    Y = cp.empty((M, D), dtype=dtype) if out is None else out
    if M == 0 or D == 0:
        return Y, None
    return Y, X if X.flags.c_contiguous else cp.ascontiguousarray(X)


def _spmm_half(tiling, hv, X, dtype, out):
    """``A @ X`` for a 16-bit X on the vector layout: m16n8k16 MMAs, float32 accumulation, one rounding."""
    cp = get_cupy()
    split, vals, unscale = hv
    D = X.shape[1]
    Y, X = result_and_operand(cp, tiling, X, dtype, out)
    if X is None:
        return Y
    aligned = D % 8 == 0 and X.data.ptr % 16 == 0 and Y.data.ptr % 16 == 0
    key = half_launch_key(X.dtype, split, dtype, D, aligned)
    launch = tiling.peek(key)
    if launch is None:
        half = (X.dtype.name, split, dtype.name)
        if options()["vec_timed_choice"]:
            plan = lambda: _vec_timed(cp, tiling, dtype, D, aligned, vals, X, Y, half, unscale)  # noqa: E731
        else:
            plan = lambda: _vec_launch(cp, tiling, dtype, D, aligned, half)  # noqa: E731
        launch = _planned(tiling, key, plan)
    _run_half(launch, tiling, vals, X, Y, unscale)
    return Y


def _run_half(launch, tiling, vals, X, Y, unscale):
    """One call of a planned 16-bit SpMM launch (and its fixup) into Y."""
    M, D = Y.shape
    buf = launch.partial(np.float32, D)
    partial = Y if buf is None else buf
    launch.run(tiling, vals, X, Y, partial, M, D, (unscale,))
    if launch.fixup is not None:
        launch.fixup.run(partial, Y, M, D, 8)


def _spmm_launch(cp, tiling, mode, dtype, D, vec, operands=None):
    """The launch (kernel, geometry, plan arrays, fixup) of one SpMM configuration.

    ``operands``: ``(values, X, Y)`` of the call being planned; the vector layout's launch is then
    chosen by timing (:func:`_vec_timed`).
    """
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    H, W = tiling.tile_shape
    if mode == "tf32" and (H, W) == _VEC_TILE:
        if operands is not None and options()["vec_timed_choice"] and dtype == _F32:
            return _vec_timed(cp, tiling, dtype, D, vec, *operands)
        return _vec_launch(cp, tiling, dtype, D, vec)
    if mode == "tf32":
        chunks = min(options()["tf32_max_chunks"], 1 if D <= 32 else 2 if D <= 64 else 4)
        n_slabs = -(-D // (32 * chunks))
        nwarps, bpw = _tf32_work_shape(tiling, n_slabs)
        if options()["tf32_nwarps"] is not None:
            nwarps = options()["tf32_nwarps"][{1: 0, 2: 1, 4: 2}[chunks]]
        if options()["blocks_per_warp"] is not None:
            bpw = options()["blocks_per_warp"]
        stages = options()["tf32_async_stages"]
        min_blocks = options()["tf32_async_min_blocks"]
        use_async = vec and (chunks, stages, min_blocks) in kp.TF32_ASYNC  # cp.async needs 16-byte aligned rows

        def smem_of(nw):
            return kp.tf32_async_smem(nw, chunks, stages) if use_async else kp.tf32_spmm_smem(nw, chunks)

        while nwarps > 1 and smem_of(nwarps) > kp.SPMM_SMEM_LIMIT:
            nwarps //= 2
        family = "tf32"
        plan = spmm_plan(tiling, max(nwarps * bpw, 1))
        # Slabs of one unit side by side (1-D grid): they share its metadata in L2.
        if use_async:
            kernel = get_kernel(family, kp.spmm_tf32_async_name(chunks, stages, min_blocks))
        else:
            kernel = get_kernel(family, kp.spmm_tf32_name(chunks, vec, options()["prefetch_values"]))
        smem = smem_of(nwarps)
        launch = TF32SpmmLaunch(
            kernel, (plan["units"].shape[0] * n_slabs, 1), (32 * nwarps,), smem, plan["units"],
            tile_mask(tiling),
            n_slabs, sizes=tuple(np.int32(v) for v in (tiling.shape[0], D, n_slabs)),
        )
    else:
        nwarps = options()["core_nwarps"]
        family = "core"
        plan = spmm_plan(tiling, nwarps * (options()["blocks_per_warp"] or 16))
        launch = CoreSpmmLaunch(
            get_kernel(family, kp.spmm_core_name(dtype.name, H, tiling.tile_pos.dtype.name)),
            (plan["units"].shape[0], -(-D // 32)), (32 * nwarps,), kp.core_spmm_smem(nwarps, H, dtype.itemsize),
            plan["units"],
        )
    if plan["n_slots"] and family == "tf32" and options()["tf32_combine"]:  # at most UNITS_PER_WINDOW_MAX parts
        launch = launch._replace(n_slots=plan["n_slots"], unit_k0=plan["unit_k0"], scratch={})
    elif plan["n_slots"]:
        fix_grid = (plan["splits"].shape[0], min(-(-(H * D) // kp.FIXUP_THREADS), 1024))
        fixup = Fixup(get_kernel(family, kp.fixup_name(dtype.name)), fix_grid, plan["splits"], plan["n_slots"])
        launch = launch._replace(fixup=fixup, n_slots=plan["n_slots"], **({"scratch": {}} if family == "tf32" else {}))
    return launch


#: A window of the vector layout is cut into at most this many units (their partial tiles are summed in order).
VEC_UNITS_PER_WINDOW_MAX = 1024
#: 64 features per warp (instead of 32) while units x slices still give this many warps per SM: a warp then
#: reads each block's metadata once for twice the features, which pays only while enough warps remain to hide
#: the gathers' latency (graphs of few, long windows lose with fewer warps).
VEC_WIDE_WARPS = 32
#: Blocks per unit the automatic choice of the vector layout considers (4 blocks = 16 column vectors).
#: Windows of fewer than 16 blocks are never cut: a part's partial tile, fence and counter cost more than
#: the parallelism gained.
VEC_UNIT_SIZES = (16, 32, 64, 128, 256)
#: Warps of the vector SpMM resident per SM (8 CTAs of 4 warps at 64 registers).
VEC_RESIDENT_WARPS = 32


class VecChoice(NamedTuple):
    """One launch of the vector SpMM: the knobs the timed choice varies and the partition it keeps."""

    slices: int  # float4 groups per lane: a warp covers 32 * slices features
    bpu: int  # blocks per unit: fixes the partition of each window, hence the order of every sum
    cp_async: bool  # X rows through the cp.async pipeline (16-byte aligned rows), else straight to registers
    combine: bool  # split windows summed inside the launch, else by the fixup launch
    unroll: int = 4  # blocks per step (their loads issued together; the MMAs pair the same blocks whatever it is)
    dense: bool = False  # values read dense, 32 per block (vec_dense_values): no metadata, one load per block
    ks: int = 0  # 16-bit kernel: k16 chunks (4 blocks each) per step (0: options()["half_ks"])
    stages: int = 0  # 16-bit kernel: steps in flight per warp (0: options()["half_stages"])
    coop: bool = False  # one CTA per window x slice, its 4 parts summed in shared memory (_vec_coop_units)
    l1: bool = False  # cp.async copies of X rows through L1 (TF32: kernels.products.VEC_ASYNC_L1 shapes)


def _vec_plan(tiling, bpu):
    return spmm_plan(tiling, bpu, VEC_UNITS_PER_WINDOW_MAX)


def _async_rows(D, vec):
    """Whether the cp.async vector SpMM can gather X's rows: 16-byte aligned, and 4 D bytes fit an int."""
    return vec and D < 1 << 29


def _vec_choice(tiling, D, vec, half=None):
    """The vector SpMM's launch from the tiling's statistics and the SM count (no timing)."""
    from .kernels import products as kp

    def shape(slices):
        n_slices = -(-D // (32 * slices))
        return n_slices, options()["vec_blocks_per_unit"] or _vec_unit_size(tiling, n_slices, half is not None)

    if half is not None and not vec:
        slices = kp.HALF_DEFAULT[0]  # unaligned rows: one configuration
    elif options()["vec_slices"]:
        slices = 1 << (options()["vec_slices"] - 1).bit_length()
    else:
        # Wider slices (64 features per warp) read each block's metadata half as often, but halve the warps:
        # keep them only while the grid still holds VEC_WIDE_WARPS warps per SM.
        slices = 1
        if D > 32 and options()["vec_max_slices"] >= 2:
            n2, bpu2 = shape(2)
            if _vec_plan(tiling, bpu2)["units"].shape[0] * n2 >= VEC_WIDE_WARPS * _sm_count(tiling):
                slices = 2
    bpu = shape(slices)[1]
    # Split windows of at most options()["vec_combine_parts_max"] parts are summed inside the SpMM launch (the
    # last part's warp reads them all); longer ones go to the fixup launch, which spreads each sum over threads.
    max_parts = _vec_plan(tiling, bpu)["max_parts"]
    combine = 0 < max_parts <= options()["vec_combine_parts_max"] and options()["vec_combine"]
    cp_async = (half is None and _async_rows(D, vec)
                and (slices, options()["vec_async_unroll"], options()["vec_async_stages"]) in kp.VEC_ASYNC)
    if cp_async and (slices, options()["vec_async_unroll"]) in kp.VEC_COOP and _vec_coop(tiling, D):
        return VecChoice(slices, bpu, True, False, options()["vec_async_unroll"], coop=True)
    if half is not None and vec and (slices, 1, 2) in kp.VEC_HALF_COOP and _vec_coop(tiling, D, True):
        return VecChoice(slices, bpu, False, False, ks=1, stages=2, coop=True)
    unroll = options()["vec_async_unroll" if cp_async else "vec_unroll"]
    dense = cp_async and options()["vec_dense_values"]
    l1 = cp_async and not dense and options()["vec_async_l1"] is True and _l1_compiled(slices, unroll)
    return VecChoice(slices, bpu, cp_async, combine, unroll, dense, l1=l1)


def _l1_compiled(slices, unroll):
    """Whether the TF32 cp.async vector SpMM is compiled with copies through L1 for this shape and tuning."""
    from .kernels import products as kp

    return ((slices, unroll, options()["vec_async_stages"]) in kp.VEC_ASYNC_L1 and options()["vec_prefetch_values"]
            and options()["vec_async_l1"] is not False)


def _vec_candidates(tiling, D, vec):
    """The float32 vector SpMM launches the timed choice compares: the default first.

    Every candidate keeps the default's partition (blocks per unit), so each
    output is the same MMAs over the same block pairs in the same order, and
    split windows are summed in part order by either the launch or the fixup:
    the results are bit-identical whichever wins (a GPU test checks it).
    Candidates: 32 or 64 features per warp; cp.async gathers of 4 or 2 blocks
    per step (values through the block's mask, or dense with 4), each also
    through L1 (the L1 copies win where an SM's warps gather the same X rows
    again, e.g. blogcatalog3, and lose elsewhere), or register gathers; in-launch
    sums or the fixup launch.
    """
    from .kernels import products as kp

    default = _vec_choice(tiling, D, vec)
    if default.coop:  # its own partition (4 parts per window): candidates among its own shapes
        shapes = [(f, u) for f in ((1, 2) if D > 32 else (1,)) for u in (4, 2)]
        return list(dict.fromkeys([default] + [default._replace(slices=f, unroll=u) for f, u in shapes]))
    has_splits = _vec_plan(tiling, default.bpu)["n_slots"] > 0
    ns = options()["vec_async_stages"]
    gathers = [(False, options()["vec_unroll"], False, False)]
    if _async_rows(D, vec):
        ua = options()["vec_async_unroll"]
        gathers = [(True, u, False, l1) for u in dict.fromkeys((ua, 2)) for l1 in (False, True)] + gathers
        if tiling.n_blocks * 32 * 4 <= VEC_DENSE_BYTES_MAX:
            gathers.insert(2, (True, ua, True, False))
    out = [default]
    for slices in (1, 2) if D > 32 else (1,):
        for cp_async, unroll, dense, l1 in gathers:
            if cp_async and (slices, unroll, ns) not in kp.VEC_ASYNC or l1 and not _l1_compiled(slices, unroll):
                continue
            for combine in (True, False) if has_splits else (False,):
                c = VecChoice(slices, default.bpu, cp_async, combine, unroll, dense, l1=l1)
                if c not in out:
                    out.append(c)
    return out


def _half_candidates(tiling, D, vec, half):
    """The 16-bit vector SpMM launches the timed choice compares: the default first.

    As :func:`_vec_candidates`, every candidate keeps the default's partition, and
    the 16-bit kernel's compiled shapes (:data:`.kernels.products.VEC_HALF`: 32 or
    64 features per warp, 1 or 2 k16 chunks per step, 2 or 3 steps in flight) only
    change which warp computes an output and how far its loads run ahead: each
    output is the same MMAs in the same order, and split windows are summed in part
    order by the launch or by the fixup.  Unaligned rows have one compiled shape.
    """
    from .kernels import products as kp

    def fits(slices):  # 64 features per warp only for D > 32, and within the cap
        return slices == 1 or (16 * slices < D and slices <= options()["vec_max_slices"])

    default = _vec_choice(tiling, D, vec, half)
    if not vec:
        return [default]
    if default.coop:  # its own partition (4 parts per window): candidates among its own shapes
        return list(dict.fromkeys([default] + [default._replace(slices=f, ks=ks, stages=ns)
                                               for f, ks, ns in kp.VEC_HALF_COOP if fits(f)]))
    default = default._replace(ks=options()["half_ks"], stages=options()["half_stages"])
    has_splits = _vec_plan(tiling, default.bpu)["n_slots"] > 0
    out = [default]
    for slices, ks, stages in kp.VEC_HALF:
        if not fits(slices):
            continue
        for combine in (True, False) if has_splits else (False,):
            c = default._replace(slices=slices, ks=ks, stages=stages, combine=combine)
            if c not in out:
                out.append(c)
    return out


#: The dense values of a vector tiling (32 floats per block) are a candidate while they take at most this much.
VEC_DENSE_BYTES_MAX = 1 << 30
#: Dense values kept per tiling, for the latest distinct value arrays (matrices sharing the tiling).
VEC_DENSE_KEEP = 4


def vec_dense_values(tiling, values):
    """``(n_blocks * 32,)`` float32: ``values`` at ``32 * block + tile position``, zeros elsewhere.

    Built on first use for a values array and kept on the tiling for the last
    :data:`VEC_DENSE_KEEP` arrays, each held with its values (so that the memory
    of an array in use is never another's; values are read-only by contract).
    """
    lru = tiling.peek("vec_dense")
    if lru is None:
        lru = tiling.put("vec_dense", {})
    hit = lru.get(id(values))
    if hit is not None and hit[0] is values:
        return hit[1]
    xp = tiling.xp
    dense = xp.zeros(tiling.n_blocks * 32, np.float32)
    eb = lru.get("entry_blocks")
    if eb is None:
        eb = ref.entry_blocks(tiling.block_ptr, tiling.nnz).astype(np.int64)
    dense[eb * 32 + tiling.tile_pos.astype(np.int64)] = values
    if xp.cuda.get_current_stream().is_capturing():
        return dense  # the graph holds the scatter; its arrays must not outlive it in a cache
    lru["entry_blocks"] = eb
    if len(lru) > VEC_DENSE_KEEP:  # the oldest array's (entry_blocks stays first)
        del lru[next(k for k in lru if k != "entry_blocks")]
    lru[id(values)] = (values, dense)
    return dense


#: The timed choice replaces the default launch only with one at least this much faster: timing noise
#: must not flip a product between launches from one process to the next.
VEC_TIMED_MARGIN = 0.03
#: Timed calls of each candidate (after a warm-up round); the least counts.
VEC_TIMED_ROUNDS = 3
#: Products of more blocks x features than this keep the statistics' launch untimed: calls of ~0.3 ms and more,
#: where timing 16 candidates costs ~100 ms and picked the statistics' launch on the 1M-node graphs anyway.
VEC_TIMED_MAX_WORK = 10**8


def pick_fastest(ms, margin=VEC_TIMED_MARGIN):
    """Index of the fastest of ``ms``, or 0 (the default) unless that one is ``margin`` faster.

    >>> pick_fastest([10.0, 9.8, 12.0]), pick_fastest([10.0, 9.0, 12.0])
    (0, 1)
    """
    best = min(range(len(ms)), key=ms.__getitem__)
    return best if ms[best] < (1.0 - margin) * ms[0] else 0


def _vec_timed(cp, tiling, dtype, D, vec, values, X, Y, half=None, unscale=None):
    """The fastest launch of :func:`_vec_candidates` on the operands of the call being planned.

    Timed once per (tiling, D, alignment, tuning), GPU time only (the calls are
    queued behind a spin kernel): one warm-up and :data:`VEC_TIMED_ROUNDS` calls
    of each candidate, which write Y (the planned call then writes it again).
    The candidates give bit-identical results, so the choice changes speed only.
    Under CUDA-graph capture nothing can be timed, and large products
    (:data:`VEC_TIMED_MAX_WORK`) are not: the default is kept.  The
    times are kept on the tiling, under ``("vec_timed", D, vec, tuning version)``.
    ``half``: ``(X type, split values, Y type)`` of the 16-bit kernel, whose candidates are
    :func:`_half_candidates` (``values`` its 16-bit values, ``unscale`` theirs; times under
    ``("half_timed", half, D, vec, tuning version)``).
    """
    from .kernels.registry import background_compiles, compile_in_background, is_compiled
    from .kernels.timing import time_round_robin

    if tiling.n_blocks * D > VEC_TIMED_MAX_WORK or cp.cuda.get_current_stream().is_capturing():
        return _vec_launch(cp, tiling, dtype, D, vec, half)
    choices = _vec_candidates(tiling, D, vec) if half is None else _half_candidates(tiling, D, vec, half)
    # A first product must not wait for a family's worth of compiles: the default (compiled now) and the
    # candidates compiled already are timed; the others compile in the background, and the launch stays
    # provisional until they are done (_planned).
    needs = [_choice_kernels(cp, tiling, dtype, D, vec, half, c) for c in choices]
    missing = {k for ks in needs[1:] for k in ks if not is_compiled(*k)} - set(needs[0])
    if not background_compiles():
        missing = set()  # compiled here, by _vec_launch, before the timing
    futures = []
    if missing:
        for family in sorted({f for f, _ in missing}):
            futures += compile_in_background(family, sorted(n for f, n in missing if f == family))
        choices = [c for i, c in enumerate(choices) if i == 0 or not missing.intersection(needs[i])]
    scratch = {}  # one set of partial tiles for all candidates (same partition), not one each
    launches = [_vec_launch(cp, tiling, dtype, D, vec, half, choice=c, scratch=scratch) for c in choices]
    if len(launches) == 1:
        return Provisional(launches[0], futures) if futures else launches[0]
    if half is None:
        calls = [functools.partial(_run_spmm, cp, launch, tiling, values, X, Y, dtype) for launch in launches]
        key = ("vec_timed", D, vec, overrides_key())
    else:
        calls = [functools.partial(_run_half, launch, tiling, values, X, Y, unscale) for launch in launches]
        key = ("half_timed", half, D, vec, overrides_key())
    ms = time_round_robin(calls, VEC_TIMED_ROUNDS)
    tiling.put(key, dict(zip(choices, ms)))
    best = launches[pick_fastest(ms)]
    return Provisional(best, futures) if futures else best


def timed_choices(tiling):
    """What the timed choices on ``tiling`` measured: one dict per product signature timed (oldest first).

    Each has ``"x_dtype"``, ``"D"``, ``"aligned"``, ``"tuning"`` (the overrides in effect), ``"ms"``
    (each candidate's :class:`VecChoice` as a dict -> milliseconds, the default first) and ``"kept"``
    (the index of the launch kept, :func:`pick_fastest`).
    """
    out = []
    for kind in ("vec_timed", "half_timed"):
        for key, ms in tiling.cached_items(kind):
            xdt = "float32" if kind == "vec_timed" else key[1][0]
            D, aligned, tuned = key[-3:]
            times = list(ms.values())
            out.append({"x_dtype": xdt, "D": D, "aligned": aligned, "tuning": dict(tuned),
                        "ms": [(c._asdict(), t) for c, t in ms.items()], "kept": pick_fastest(times)})
    return out


def _choice_kernels(cp, tiling, dtype, D, vec, half, choice):
    """``(family, name)`` of every kernel the launch of ``choice`` needs (nothing is compiled to find out)."""
    names = []

    def record(family, name):
        names.append((family, name))

    _vec_launch(cp, tiling, dtype, D, vec, half, choice=choice, scratch={}, get=record)
    return tuple(names)


def _vec_launch(cp, tiling, dtype, D, vec, half=None, choice=None, scratch=None, get=None):
    """The launch of the vector-layout SpMM; split windows summed in it, or by a fixup launch for hubs.

    ``half``: ``(X type, split values, Y type)`` of the 16-bit kernel (``vec``: rows aligned for cp.async).
    ``choice``: a :class:`VecChoice` (default: :func:`_vec_choice`).  ``scratch``: the per-stream scratch
    store, shared by launches of one partition (the timed choice's candidates: one set of partial tiles).
    ``get(family, name)``: where kernels come from (default: compiled on first use).
    """
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    get_kernel = get or get_kernel
    choice = choice or _vec_choice(tiling, D, vec, half)
    if choice.coop:
        return _vec_coop_launch(tiling, D, choice, half, get_kernel)
    slices, bpu, cp_async, combine, unroll, dense, ks, stages, _, l1 = choice
    n_slices = -(-D // (32 * slices))
    plan = _vec_plan(tiling, bpu)
    units, unit_k0 = plan["units"], plan["unit_k0"]
    if options()["vec_sort_units"]:
        units, unit_k0 = tiling.cached(("vec_sorted", bpu), lambda: _sorted_units(tiling, bpu))
    n_work = units.shape[0] * n_slices
    nw = options()["vec_warps"]
    ns = options()["vec_async_stages"]
    smem = 0
    if half is not None:
        cfg = (slices, ks or options()["half_ks"], stages or options()["half_stages"]) if vec else kp.HALF_DEFAULT
        if cfg not in kp.VEC_HALF:
            raise ValueError(f"no 16-bit SpMM compiled for (slices, ks, stages) = {cfg}: see kernels.products.VEC_HALF")
        while nw > 1 and kp.vech_smem(nw, *cfg) > kp.SPMM_SMEM_LIMIT:
            nw //= 2
        smem = kp.vech_smem(nw, *cfg)
        pv = options()["half_prefetch"] or not (vec and combine and cfg in kp.VEC_HALF[:3])  # compiled without it
        kernel = get_kernel("half", kp.spmm_vech_name(half[0], half[1], half[2], *cfg, combine, vec, pv))
    elif cp_async:
        while nw > 1 and kp.vec_async_smem(nw, slices, unroll, ns) > kp.SPMM_SMEM_LIMIT:
            nw //= 2
        smem = kp.vec_async_smem(nw, slices, unroll, ns)
        kernel = get_kernel("vec", kp.spmm_vec_async_name(slices, unroll, ns, combine, True,
                                                          options()["vec_prefetch_values"],
                                                          dense, l1=l1))
    else:
        kernel = get_kernel("vec", kp.spmm_vec_name(slices, unroll, vec, combine, options()["vec_prefetch"]))
    launch = VecSpmmLaunch(kernel, (-(-n_work // nw),), (32 * nw,), smem, units, unit_k0, vec_meta(tiling),
                           n_slices, n_work, plan["n_slots"] * n_slices if combine else 0,
                           {} if scratch is None else scratch,
                           n_slots=plan["n_slots"],
                           sizes=tuple(np.int32(v) for v in (tiling.shape[0], D, n_slices, n_work)),
                           dense=bool(dense and cp_async))
    if plan["n_slots"] and not combine:
        fix_grid = (plan["splits"].shape[0], min(-(-(8 * D) // kp.FIXUP_THREADS), 1024))
        fix = (get_kernel("vec", kp.fixup_name(dtype.name)) if half is None else
               get_kernel("half", kp.fixup_name("float32", dtype.name)))
        launch = launch._replace(fixup=Fixup(fix, fix_grid, plan["splits"], plan["n_slots"]))
    return launch


#: The automatic choice of the one-CTA-per-window launch (:func:`_vec_coop`): at most this many CTAs of a window
#: x 32 features per SM (and a warp's quarter of the longest window at most options()["vec_coop_chain"] usual units).
VEC_COOP_CTAS = 16


def _vec_coop(tiling, D, half=False):
    """Whether the vector SpMM (float32 or 16-bit X) takes one CTA per window x slice (:func:`_vec_coop_units`).

    ``options()["vec_coop"]`` True / False, or None: by the grid, where it pays: at most
    :data:`VEC_COOP_CTAS` CTAs per SM (a small grid, whose time is a warp's chain of steps), a window the
    usual units split (its parts summed through global partial tiles: a fence, a counter and a second read),
    and none so long that a warp's quarter of it exceeds ``options()["vec_coop_chain"]`` usual units (a CTA's
    4 warps take a long window alone).  Grids of short unsplit windows gain nothing from it, and long
    windows lose, so neither takes it.
    """
    mode = options()["vec_coop"]
    if mode is not None:
        return bool(mode)
    n_slices = -(-D // 32)
    if tiling.n_windows * n_slices > VEC_COOP_CTAS * _sm_count(tiling):
        return False
    longest = int(_vec_hist(tiling).max(initial=0))
    bpu = options()["vec_blocks_per_unit"] or _vec_unit_size(tiling, n_slices, half)
    return bpu < longest <= 4 * options()["vec_coop_chain"] * bpu


def _vec_coop_units(tiling):
    """``(4 * windows, 4)`` int32 rows ``(window, first block, end block, -1)``: each window's blocks in 4 balanced
    parts (possibly empty), the units of the COOP launch, whose CTA sums a window's parts in shared memory."""
    def build():
        xp, arrays = _planner(tiling)
        wp = arrays("win_ptr").astype(np.int64)
        start, nb = wp[:-1], wp[1:] - wp[:-1]
        j = xp.arange(4, dtype=np.int64)
        lo = start[:, None] + j * nb[:, None] // 4
        hi = start[:, None] + (j + 1) * nb[:, None] // 4
        w = xp.broadcast_to(xp.arange(nb.shape[0], dtype=np.int64)[:, None], lo.shape)
        units = xp.stack([w, lo, hi, xp.full(lo.shape, -1, np.int64)], axis=-1).reshape(-1, 4)
        return _uploaded(tiling, xp.ascontiguousarray(units.astype(np.int32)))
    return tiling.cached("vec_coop_units", build)


def _vec_coop_launch(tiling, D, choice, half=None, get=None):
    """The one-CTA-per-window launch of ``choice`` (2 stages; no partial tiles, counters or fixup).

    ``half``: ``(X type, split values, Y type)`` of the 16-bit kernel (aligned rows), as :func:`_vec_launch`.
    """
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    get_kernel = get or get_kernel
    n_slices = -(-D // (32 * choice.slices))
    units = _vec_coop_units(tiling)
    n_windows = units.shape[0] // 4
    if half is None:
        kernel = get_kernel("vec", kp.spmm_vec_async_name(choice.slices, choice.unroll, 2, coop=True))
        smem = kp.vec_async_smem(4, choice.slices, choice.unroll, 2)
    else:
        cfg = (choice.slices, choice.ks, choice.stages)
        kernel = get_kernel("half", kp.spmm_vech_name(*half, *cfg, coop=True))
        smem = kp.vech_smem(4, *cfg)
    return VecSpmmLaunch(kernel, (n_windows * n_slices,), (128,), smem,
                         units, units, vec_meta(tiling), n_slices, units.shape[0] * n_slices, 0, {},  # unit_k0: unread
                         sizes=tuple(np.int32(v) for v in (tiling.shape[0], D, n_slices, units.shape[0] * n_slices)))


def _sm_count(tiling):
    """Multiprocessors of the device the tiling lives on (cached on it)."""
    return tiling.cached("sm_count", lambda: get_cupy().cuda.Device().attributes["MultiProcessorCount"])


def _sorted_units(tiling, bpu):
    """The vector plan's units and split rows, longest first, computed where :func:`_planner` computes."""
    xp, _ = _planner(tiling)
    on_host = xp is not tiling.xp
    plan = _plan_where_planned(tiling, bpu, VEC_UNITS_PER_WINDOW_MAX) if on_host else _vec_plan(tiling, bpu)
    return _uploaded(tiling, _longest_first(xp, plan["units"], plan["unit_k0"]))


def _longest_first(xp, units, unit_k0):
    """Units (and their split rows) sorted by decreasing block count, stable."""
    order = xp.argsort(-(units[:, 2] - units[:, 1]).astype(np.int64), kind="stable")
    return xp.ascontiguousarray(units[order]), xp.ascontiguousarray(unit_k0[order])


def _vec_hist(tiling):
    """Blocks per window on the host (cached on the tiling)."""
    return tiling.cached("vec_hist", lambda: np.diff(to_host(tiling.win_ptr)).astype(np.int64))  # synchronize!


def _vec_unit_size(tiling, n_slices, half=False):
    """Blocks per unit of the vector SpMM, from the tiling's blocks-per-window histogram.

    The largest size in :data:`VEC_UNIT_SIZES` whose units x slices still give
    ``options()["vec_target_warps"]`` warps per SM: long windows are cut into balanced parts only as far
    as the GPU needs parallelism (each cut costs a partial tile written and read
    again), and no further than keeps the longest unit within
    ``options()["vec_tail_factor"]`` times the blocks each resident warp gets on
    average: on small grids that longest unit is the kernel's critical path.
    Nor beyond ``max(that mean, options()["vec_tail_floor"])`` blocks: on large grids
    units twice a resident warp's share leave SMs idle while the last of them run.
    ``half``: the 16-bit kernel's units, capped by ``options()["half_tail_floor"]``
    instead: it moves half the bytes a block, so its grids run short of warps sooner.
    No separate rule for hub windows: the caps bound their units, and a rule of its
    own cut them too finely.
    """
    nb, sms = _vec_hist(tiling), _sm_count(tiling)
    target = options()["vec_target_warps"] * sms
    longest = int(nb.max(initial=0))
    floor = -(-longest // VEC_UNITS_PER_WINDOW_MAX)
    factor = options()["vec_tail_factor"]
    # The grid's critical path is its longest unit: keep it within `factor` x the mean work of a resident warp.
    per_warp = int(nb.sum()) * n_slices / (VEC_RESIDENT_WARPS * sms)
    cap = np.inf if factor is None else factor * per_warp
    tail_floor = options()["half_tail_floor" if half else "vec_tail_floor"]
    if tail_floor:
        cap = min(cap, max(per_warp, tail_floor))
    best = VEC_UNIT_SIZES[0]
    for size in VEC_UNIT_SIZES:
        units = int(np.maximum(-(-nb // size), 1).sum())
        if units * n_slices >= target and min(size, longest) <= max(cap, VEC_UNIT_SIZES[0]):
            best = size
    return max(best, floor)


def vec_meta(tiling):
    """``(n_blocks, 2)`` uint32 of an 8x4 tiling: occupancy mask (bit ``4 * row + slot``) and first entry."""
    def build():
        xp, arrays = _planner(tiling)
        block_ptr = arrays("block_ptr")
        mask = block_mask(xp, block_ptr, arrays("tile_pos"), tiling.n_blocks)[:, 0]
        return _uploaded(tiling, xp.ascontiguousarray(xp.stack([mask, block_ptr[:-1].astype(np.uint32)], axis=1)))

    return tiling.cached("vec_meta", build)


def tile_mask(tiling):
    """:func:`block_mask` of the tiling (cached on it)."""
    def build():
        xp, arrays = _planner(tiling)
        return _uploaded(tiling, block_mask(xp, arrays("block_ptr"), arrays("tile_pos"), tiling.n_blocks))

    return tiling.cached("mask", build)


#: Windows of at most this many blocks stay whole (one unit each, no partial tiles, no fixup).
WHOLE_WINDOW_BLOCKS = 256
#: Below this many CTAs (windows x slabs), whole windows get 8 warps instead of 4.
FEW_CTAS = 2048


def _tf32_work_shape(tiling, n_slabs):
    """``(warps per CTA, blocks per warp)`` of the TF32 SpMM, from the tiling's statistics.

    Chosen from launch sweeps on real graphs:

    * no window holds more than :data:`WHOLE_WINDOW_BLOCKS` blocks: every window
      is one unit, so no window is split -- no partial tiles, no fixup launch.
      With few windows (fewer than :data:`FEW_CTAS` CTAs: facebook, ppi) 8 warps
      share a window for parallelism; with many (wing, 1M-node graphs) 4 warps
      keep the cross-warp sum cheap.
    * hub-heavy graphs split their long windows into units of 4 warps x 16
      blocks per warp at one 64-feature slab, 32 at several.

    Deterministic: the shape depends on the tiling and D only.
    """
    stats = tiling.stats()
    mbw = stats.max_blocks_per_window
    if mbw <= WHOLE_WINDOW_BLOCKS:
        nwarps = 8 if stats.windows * n_slabs < FEW_CTAS else 4
        return nwarps, max(1, -(-mbw // nwarps))
    return 4, 16 if n_slabs == 1 else 32


def _aligned16(D, *arrays):
    """16-byte loads/stores need rows of a multiple of 4 floats and 16-byte aligned bases."""
    return D % 4 == 0 and all(a.data.ptr % 16 == 0 for a in arrays)


def values_as(values, dtype, cache):
    if values.dtype == dtype:
        return values
    key = ("values", dtype.str)
    if key not in cache:
        cast = values.astype(dtype)
        if not isinstance(cast, np.ndarray):
            publish()  # complete before another stream uses it
        cache[key] = cast
    return cache[key]


#: Tilings of at most this many stored entries build their launch plans on the host, with NumPy, and upload them:
#: on the device, a fresh process would first compile some 45 of CuPy's own kernels (about 0.3 s each, with empty
#: caches) for plans that take microseconds to compute.  Larger ones build them where they live.
HOST_PLAN_MAX = 1 << 22


def _planner(tiling):
    """``(xp, arrays)``: where the tiling's plans are computed, and its structure arrays there (cached)."""
    if tiling.xp is np or tiling.nnz > HOST_PLAN_MAX:
        return tiling.xp, lambda name: getattr(tiling, name)
    return np, lambda name: tiling.cached(("host", name), lambda: to_host(getattr(tiling, name)))  # synchronize!


def _uploaded(tiling, value):
    """A plan built by :func:`_planner`, with its arrays on the tiling's device."""
    if tiling.xp is np:
        return value
    if isinstance(value, np.ndarray):
        return tiling.xp.asarray(value)
    if isinstance(value, dict):
        return {k: _uploaded(tiling, v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_uploaded(tiling, v) for v in value)
    return value


def spmm_plan(tiling, blocks_per_unit, max_units=None):
    """Work plan of the SpMM kernels for one unit size, cached on the tiling.

    ``units`` rows are ``(window, first block, end block, slot)``: a window of
    ``nb`` blocks becomes ``k = ceil(nb / blocks_per_unit)`` units (at most
    ``max_units``, default ``UNITS_PER_WINDOW_MAX``; an empty window keeps one unit, which writes its
    zero rows).  Units of a split window (``k > 1``) write partial tiles to
    consecutive slots; ``splits`` rows are ``(window, first slot, k, 0)``.
    """
    max_units = UNITS_PER_WINDOW_MAX if max_units is None else max_units
    return tiling.cached(("plan", blocks_per_unit, max_units),
                         lambda: _uploaded(tiling, _plan_where_planned(tiling, blocks_per_unit, max_units)))


def _plan_where_planned(tiling, blocks_per_unit, max_units):
    """:func:`spmm_plan` on the side :func:`_planner` computes on (the host copy is kept for derived plans)."""
    xp, arrays = _planner(tiling)
    if xp is tiling.xp:
        return build_plan(xp, tiling.win_ptr, blocks_per_unit, max_units)
    return tiling.cached(("host_plan", blocks_per_unit, max_units),
                         lambda: build_plan(xp, arrays("win_ptr"), blocks_per_unit, max_units))


def build_plan(xp, win_ptr, blocks_per_unit, max_units=UNITS_PER_WINDOW_MAX):
    """The plan of :func:`spmm_plan` from ``win_ptr`` (any device)."""
    nb = xp.diff(win_ptr).astype(np.int64)
    k = xp.clip(-(-nb // blocks_per_unit), 1, max_units)
    unit_ptr = xp.concatenate((xp.zeros(1, np.int64), xp.cumsum(k)))
    n_units = int(unit_ptr[-1])  # synchronize!
    uid = xp.arange(n_units, dtype=np.int64)
    uw = xp.searchsorted(unit_ptr, uid, side="right") - 1
    j = uid - unit_ptr[uw]
    kw, nbw, start = k[uw], nb[uw], win_ptr[uw].astype(np.int64)
    split = kw > 1
    slot = xp.where(split, xp.cumsum(split) - 1, -1)
    units = xp.stack([uw, start + j * nbw // kw, start + (j + 1) * nbw // kw, slot], axis=1)
    sw = xp.flatnonzero(k > 1)
    splits = xp.stack([sw, slot[unit_ptr[sw]], k[sw], xp.zeros_like(sw)], axis=1)
    unit_k0 = xp.stack([slot[unit_ptr[uw]], kw], axis=1)
    return {
        "units": xp.ascontiguousarray(units.astype(np.int32)),
        "unit_k0": xp.ascontiguousarray(unit_k0.astype(np.int32)),
        "splits": xp.ascontiguousarray(splits.astype(np.int32)),
        "n_slots": int(split.sum()),  # synchronize!
        "max_parts": int(k.max()) if k.shape[0] else 0,  # synchronize!
    }


def block_mask(xp, block_ptr, tile_pos, n_blocks):
    """``(n_blocks, 4)`` uint32: bit ``p`` of block ``b`` set when tile position ``p`` is stored.

    Positions within a block are distinct, so summing ``1 << bit`` per word is
    an OR; float64 holds those sums (< 2**32) exactly.
    """
    entry_block = ref.entry_blocks(block_ptr, tile_pos.shape[0])
    pos = tile_pos.astype(np.int64)
    words = xp.bincount(entry_block.astype(np.int64) * 4 + (pos >> 5), weights=(1 << (pos & 31)).astype(np.float64),
                        minlength=4 * n_blocks)
    return xp.ascontiguousarray(words.astype(np.uint32).reshape(n_blocks, 4))


# --- SDDMM -----------------------------------------------------------------


def sddmm_raw(tiling, values, Xa, Xb, dtype, multiply_values=False, precision=None, casts=None, out=None):
    """Values ``<Xa[i], Xb[j]>`` (times the entry's value if ``multiply_values``) in tiled order.

    ``Xa`` is ``(shape[0], D)`` and ``Xb`` ``(shape[1], D)``, on the tiling's device;
    ``out`` (device only) is a C-contiguous ``(nnz,)`` array of ``dtype`` to write.
    """
    dtype = np.dtype(dtype)
    cdt = compute_dtype(dtype)
    operand = Xa.dtype if Xa.dtype == Xb.dtype else None
    mode = resolve_precision(precision, dtype, tiling.tile_shape, operand, tiling.layout.pattern)
    if mode in HALF_MODES:
        # 16-bit inputs widen exactly to TF32: the same products, accumulated in float32 (CUDA cores on 2:4 tiles).
        mode = "tf32" if tiling.tile_shape in TC_TILES else "exact"
    if isinstance(Xa, np.ndarray):
        e = ref.sddmm(tiling.arrays(values), tiling.shape, tiling.layout.window, Xa, Xb, cdt, multiply_values)
        return e.astype(dtype, copy=False)
    if cdt != dtype:
        e = sddmm_raw(tiling, values, Xa, Xb, cdt, multiply_values, "tf32" if mode == "tf32" else "fp32", casts)
        if out is None:
            return e.astype(dtype)
        out[...] = e
        return out
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    cp = get_cupy()
    dtype = np.dtype(dtype)
    nnz = tiling.nnz
    if out is None:
        out = cp.empty(nnz, dtype=dtype)
    n_blocks = tiling.n_blocks
    D = Xa.shape[1]
    if nnz == 0:
        return out
    if D == 0:
        out.fill(0)
        return out
    H, W = tiling.tile_shape
    Xa = cp.ascontiguousarray(Xa, dtype=dtype)
    Xb = cp.ascontiguousarray(Xb, dtype=dtype)
    values = values_as(values, dtype, {} if casts is None else casts)
    bpw = SDDMM_BLOCKS_PER_WARP
    warps = kp.SDDMM_WARPS
    grid = (-(-n_blocks // (bpw * warps)),)
    common = (tiling.win_ptr, np.int32(tiling.n_windows), tiling.block_ptr, tiling.block_cols, tiling.tile_pos,
              values, Xa, Xb, out)
    if mode == "tf32" and (H, W) == _VEC_TILE:
        units = spmm_plan(tiling, kp.VEC_SDDMM_BLOCKS, np.iinfo(np.int32).max)["units"]
        n_units = units.shape[0]
        kernel = get_kernel("vec", kp.sddmm_vec_name(_aligned16(D, Xa, Xb)))
        args = (units, np.int32(n_units), tiling.block_ptr, tiling.block_cols, tiling.tile_pos, values, Xa, Xb, out,
                np.int32(tiling.shape[0]), np.int32(D), np.int32(multiply_values))
        kernel((-(-n_units // kp.VEC_WARPS),), (32 * kp.VEC_WARPS,), args)
    elif mode == "tf32":
        kernel = get_kernel("tf32", kp.sddmm_tf32_name(_aligned16(D, Xa, Xb)))
        args = common + (np.int32(tiling.shape[0]), np.int32(n_blocks), np.int32(D), np.int32(multiply_values),
                         np.int32(bpw))
        kernel(grid, (32 * warps,), args, shared_mem=warps * kp.SDDMM_TF32_SMEM_PER_WARP)
    else:
        kernel = get_kernel("core", kp.sddmm_core_name(dtype.name, tiling.tile_pos.dtype.name))
        args = common + (np.int32(n_blocks), np.int32(D), np.int32(H), np.int32(W), np.int32(W.bit_length() - 1),
                         np.int32(multiply_values), np.int32(bpw))
        kernel(grid, (32 * warps,), args)
    return out
