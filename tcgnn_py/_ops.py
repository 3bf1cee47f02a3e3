"""Layer 2: operands, precision, and the float32 products' launches (TF32 tensor cores, CUDA cores, SDDMM).

:func:`as_operand` decides an operand's kind once; :func:`resolve_precision` maps the user's precision
words to one internal mode in one place.  ``_dispatch`` builds a product's plan from these; the
functions here run the float32 and CUDA-core SpMM (:func:`spmm_f32`) and the SDDMM on the GPU, and bind
their launches for repeated calls (:func:`bind_f32`, :func:`bind_sddmm`).

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

import numpy as np

from ._device import DeviceMismatchError, get_cupy, is_cupy_array, is_device_array
from ._tuning import options
from ._validation import check_exact, check_real_dtype, is_half, promote, value_dtype
from ._plans import aligned16, spmm_plan, tile_mask, values_as, vec_dense_values
from ._launches import CoreSpmmLaunch, Fixup, TF32SpmmLaunch, VecSpmmLaunch, launch_key, planned, run_spmm
from ._vec_choice import vec_launch, vec_timed

__all__ = [
    "F32",
    "bind_f32",
    "bind_sddmm",
    "sddmm_launch",
    "FEW_CTAS",
    "HALF_MODES",
    "HALF_PRECISIONS",
    "MISMATCH",
    "PRECISIONS",
    "SDDMM_BLOCKS_PER_WARP",
    "TC_TILES",
    "VEC_TILE",
    "WHOLE_WINDOW_BLOCKS",
    "as_operand",
    "check_out",
    "compute_dtype",
    "resolve_precision",
    "result_dtype",
    "sddmm_gpu",
    "spmm_f32",
]


MISMATCH = "matmul: dimension mismatch with signature"
PRECISIONS = (None, "tf32", "fp32", "fp16", "bf16")
#: The 16-bit precisions and the operand dtype each needs.
HALF_PRECISIONS = {"fp16": "float16", "bf16": "bfloat16"}
HALF_MODES = frozenset(HALF_PRECISIONS.values())
F32 = np.dtype(np.float32)
#: Tile shapes with TF32 tensor-core kernels: TC-GNN's 16x8 tiles and the vector layout's 8x4 blocks.
TC_TILES = ((16, 8), (8, 4))
VEC_TILE = (8, 4)
SDDMM_BLOCKS_PER_WARP = 4


def as_operand(X, on_device, what="operand"):
    """Return ``(array, kind)``: X as an array on the matrix's device, and what to return.

    ``kind`` is ``"numpy"`` (hand back a NumPy array) or ``"cupy"``.  Device
    producers (``__cuda_array_interface__`` or ``__dlpack__`` with a CUDA
    device) are wrapped without a copy and answered with CuPy arrays; their
    dtype is read from the wrapped array (a producer need not have a ``dtype``).
    ``what`` names the argument in errors.
    """
    if isinstance(X, np.ndarray):
        kind = "numpy"
    elif is_cupy_array(X):
        if on_device:
            check_real_dtype(X.dtype, what)
            return check_exact(X, "X"), "cupy"
        raise DeviceMismatchError("a device operand needs a matrix on the GPU, but this one lives on the CPU")
    elif is_device_array(X) or _is_cuda_dlpack(X):
        if not on_device:
            raise DeviceMismatchError("a device operand needs a matrix on the GPU, but this one lives on the CPU")
        cp = get_cupy()
        X = cp.asarray(X) if hasattr(X, "__cuda_array_interface__") else cp.from_dlpack(X)
        check_real_dtype(X.dtype, what)
        return check_exact(X, "X"), "cupy"
    else:
        X = np.asarray(X)
        kind = "numpy"
    check_real_dtype(X.dtype, what)
    if on_device:
        X = get_cupy().asarray(X)
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
    return F32 if is_half(dtype) else np.dtype(dtype)


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
    half_tile = tile_shape == VEC_TILE or pattern == (2, 4)  # layouts with 16-bit MMA kernels
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


# --- SpMM on TF32 tensor cores and CUDA cores -------------------------------


def spmm_f32(tiling, values, X, dtype, mode, out, casts):
    """``A @ X`` into ``out`` (or a new array) of ``dtype``: TF32 tensor cores (``mode="tf32"``) or CUDA cores."""
    cp = get_cupy()
    M = tiling.shape[0]
    D = X.shape[1]
    Y = cp.empty((M, D), dtype=dtype) if out is None else out
    if M == 0 or D == 0:
        return Y
    if X.dtype != dtype or not X.flags.c_contiguous:
        X = cp.ascontiguousarray(X, dtype=dtype)
    values = values_as(values, dtype, casts)
    vec = mode == "tf32" and aligned16(D, X, Y)
    key = launch_key(mode, dtype, D, vec)
    launch = tiling.peek(key)  # planned once: no closure per call
    if launch is None:
        launch = planned(tiling, key, lambda: _spmm_launch(cp, tiling, mode, dtype, D, vec, (values, X, Y)))
    run_spmm(cp, launch, tiling, values, X, Y, dtype)
    return Y


def _spmm_launch(cp, tiling, mode, dtype, D, vec, operands=None):
    """The launch (kernel, geometry, plan arrays, fixup) of one SpMM configuration.

    ``operands``: ``(values, X, Y)`` of the call being planned; the vector layout's launch is then
    chosen by timing (:func:`vec_timed`).
    """
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    H, W = tiling.tile_shape
    if mode == "tf32" and (H, W) == VEC_TILE:
        if operands is not None and options()["vec_timed_choice"] and dtype == F32:
            return vec_timed(cp, tiling, dtype, D, vec, *operands)
        return vec_launch(cp, tiling, dtype, D, vec)
    if mode == "tf32":
        cfg = options()["tf32_kernel"] or kp.tf32_spmm_config(1 if D <= 32 else 2, vec)
        if cfg not in kp.TF32_SPMM_CONFIGS:
            raise ValueError(f"tf32_kernel={cfg!r} is not compiled: see kernels.products.TF32_SPMM_CONFIGS")
        if isinstance(cfg, kp.SpmmTF32Async) and not vec:  # cp.async copies 16-byte aligned rows only
            cfg = kp.tf32_spmm_config(cfg.CH, False)
        use_async = isinstance(cfg, kp.SpmmTF32Async)
        chunks = cfg.CH
        n_slabs = -(-D // (32 * chunks))
        nwarps, bpw = _tf32_work_shape(tiling, n_slabs)
        if options()["tf32_nwarps"] is not None:
            nwarps = options()["tf32_nwarps"][chunks - 1]
        if options()["blocks_per_warp"] is not None:
            bpw = options()["blocks_per_warp"]

        def smem_of(nw):
            return kp.tf32_async_smem(nw, chunks, cfg.NS) if use_async else kp.tf32_spmm_smem(nw, chunks)

        while nwarps > 1 and smem_of(nwarps) > kp.SPMM_SMEM_LIMIT:
            nwarps //= 2
        family = "tf32"
        plan = spmm_plan(tiling, max(nwarps * bpw, 1))
        # Slabs of one unit side by side (1-D grid): they share its metadata in L2.
        kernel = get_kernel(family, cfg.name)
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
    if plan["n_slots"] and family == "tf32":  # split windows (at most UNITS_PER_WINDOW_MAX parts) summed in the launch
        launch = launch._replace(n_slots=plan["n_slots"], unit_k0=plan["unit_k0"], scratch={})
    elif plan["n_slots"]:
        fix_grid = (plan["splits"].shape[0], min(-(-(H * D) // kp.FIXUP_THREADS), 1024))
        fixup = Fixup(get_kernel(family, kp.fixup_name(dtype.name)), fix_grid, plan["splits"], plan["n_slots"])
        launch = launch._replace(fixup=fixup, n_slots=plan["n_slots"], **({"scratch": {}} if family == "tf32" else {}))
    return launch


def bind_f32(tiling):
    """The binder of a float32 product on TF32 tensor cores (float32 X and values, result written directly).

    ``binder(values, casts, X, out, general)`` returns ``f(values, casts, X, out) -> Y`` with the
    tiling's final launch for X's width and alignment bound (one launch, or two with a fixup), or
    None while the launch is not final.
    """
    M = tiling.shape[0]

    def binder(values, casts, X, out, general):
        D = X.shape[1]
        vec = aligned16(D, X, out)  # out None: a new result, as the general path's was
        launch = tiling.peek(launch_key("tf32", F32, D, vec))
        if not isinstance(launch, (TF32SpmmLaunch, VecSpmmLaunch)):
            return None
        run = launch.bind(tiling, F32, M, D)
        if isinstance(launch, VecSpmmLaunch) and launch.dense:
            bound = run

            def run(values, X, Y):
                bound(vec_dense_values(tiling, values), X, Y)

        shape, ndarray = (M, D), get_cupy().ndarray
        if launch.fixup is None:
            def f(values, casts, X, out):
                Y = ndarray(shape, F32) if out is None else out  # cupy.empty without its wrapper
                run(values, X, Y)
                return Y

            return f
        fixup = launch.fixup.bind(launch.partial(F32, D), M, D, tiling.layout.window)

        def f2(values, casts, X, out):
            Y = ndarray(shape, F32) if out is None else out
            run(values, X, Y)
            fixup(Y)
            return Y

        return f2

    return binder


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


# --- SDDMM -----------------------------------------------------------------


def sddmm_gpu(tiling, values, Xa, Xb, dtype, multiply_values=False, precision=None, casts=None, out=None):
    """SDDMM values in tiled order on the GPU (see ``_dispatch.sddmm_raw``)."""
    dtype = np.dtype(dtype)
    cdt = compute_dtype(dtype)
    operand = Xa.dtype if Xa.dtype == Xb.dtype else None
    mode = resolve_precision(precision, dtype, tiling.tile_shape, operand, tiling.layout.pattern)
    if mode in HALF_MODES:
        # 16-bit inputs widen exactly to TF32: the same products, accumulated in float32 (CUDA cores on 2:4 tiles).
        mode = "tf32" if tiling.tile_shape in TC_TILES else "exact"
    if cdt != dtype:
        e = sddmm_gpu(tiling, values, Xa, Xb, cdt, multiply_values, "tf32" if mode == "tf32" else "fp32", casts)
        if out is None:
            return e.astype(dtype)
        out[...] = e
        return out
    cp = get_cupy()
    nnz = tiling.nnz
    if out is None:
        out = cp.empty(nnz, dtype=dtype)
    D = Xa.shape[1]
    if nnz == 0:
        return out
    if D == 0:
        out.fill(0)
        return out
    Xa = cp.ascontiguousarray(Xa, dtype=dtype)
    Xb = cp.ascontiguousarray(Xb, dtype=dtype)
    values = values_as(values, dtype, {} if casts is None else casts)
    kernel, grid, block, smem, head, tail = sddmm_launch(tiling, mode, dtype, D, aligned16(D, Xa, Xb),
                                                         multiply_values)
    kernel(grid, block, head + (values, Xa, Xb, out) + tail, shared_mem=smem)
    return out


def sddmm_launch(tiling, mode, dtype, D, aligned, multiply_values):
    """``(kernel, grid, block, smem, head, tail)`` of the SDDMM: its arguments are ``head + (values, Xa, Xb, out)
    + tail`` (the one place their order is written)."""
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    H, W = tiling.tile_shape
    mv = np.int32(multiply_values)
    if mode == "tf32" and (H, W) == VEC_TILE:
        units = spmm_plan(tiling, kp.VEC_SDDMM_BLOCKS, np.iinfo(np.int32).max)["units"]
        head = (units, np.int32(units.shape[0]), tiling.block_ptr, tiling.block_cols, tiling.tile_pos)
        return (get_kernel("vec", kp.sddmm_vec_name(aligned)), (-(-units.shape[0] // kp.VEC_WARPS),),
                (32 * kp.VEC_WARPS,), 0, head, (np.int32(tiling.shape[0]), np.int32(D), mv))
    bpw, warps, n_blocks = SDDMM_BLOCKS_PER_WARP, kp.SDDMM_WARPS, tiling.n_blocks
    grid, block = (-(-n_blocks // (bpw * warps)),), (32 * warps,)
    head = (tiling.win_ptr, np.int32(tiling.n_windows), tiling.block_ptr, tiling.block_cols, tiling.tile_pos)
    if mode == "tf32":
        tail = (np.int32(tiling.shape[0]), np.int32(n_blocks), np.int32(D), mv, np.int32(bpw))
        return (get_kernel("tf32", kp.sddmm_tf32_name(aligned)), grid, block, warps * kp.SDDMM_TF32_SMEM_PER_WARP,
                head, tail)
    tail = (np.int32(n_blocks), np.int32(D), np.int32(H), np.int32(W), np.int32(W.bit_length() - 1), mv,
            np.int32(bpw))
    return get_kernel("core", kp.sddmm_core_name(np.dtype(dtype).name, tiling.tile_pos.dtype.name)), grid, block, 0, \
        head, tail


def bind_sddmm(tiling, multiply_values):
    """The binder of a float32 SDDMM on TF32 tensor cores: ``binder(values, casts, Xa, Xb, out, general)``
    returns ``f(values, casts, Xa, Xb, out) -> e`` (``out`` None) with the launch bound."""
    from .kernels.driver import BoundLaunch

    def binder(values, casts, Xa, Xb, out, general):
        cp = get_cupy()
        D = Xa.shape[1]
        kernel, grid, block, smem, head, tail = sddmm_launch(tiling, "tf32", F32, D, aligned16(D, Xa, Xb),
                                                             multiply_values)
        n, nnz = len(head), tiling.nnz
        run = BoundLaunch(kernel.kernel.ptr, grid, block, head + (None,) * 4 + tail, range(n, n + 4),
                          cp.cuda.get_current_stream().ptr, smem)
        empty = cp.empty

        def f(values, casts, Xa, Xb, out):
            e = empty(nnz, F32)
            run(values, Xa, Xb, e)
            return e

        return f

    return binder
