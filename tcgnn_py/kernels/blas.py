"""Layer 1: dense matrix products through cuBLAS that a CUDA graph can capture.

CuPy's cuBLAS binding refuses to run while the stream is capturing
(``NotImplementedError: calling cuBLAS API during stream capture``): it cannot
vouch for the workspace cuBLAS would allocate.  cuBLAS itself supports capture
when it is given its workspace up front (``cublasSetWorkspace``, the cuBLAS
guide's "CUDA Graphs Support").  This module does exactly that: one cuBLAS
handle per device with a workspace owned here, and ``cublasGemmEx`` called
through ``ctypes`` on CuPy's current stream.  The GNN layers use it for every
dense product, eager or captured, so a replayed step computes what the eager
step computes, bit for bit.

Operands are 2-D CuPy arrays, C- or F-contiguous (so transposed views such as
``H.T`` cost no copy); float32 and float64 accumulate in their own precision
(``CUBLAS_COMPUTE_32F`` / ``_64F``, as CuPy's default), float16 and bfloat16 in
float32.

A layer calls the same few shapes over and over, so each product shape is planned once through cuBLASLt
(``cublasLtMatmul``): its descriptors and the heuristic's algorithm are kept per shape, transposes,
leading dimensions and operand alignment, and a call is one ``cublasLtMatmul`` on the handle's workspace.
A signature seen before (dtypes, shapes, strides, the addresses' low bits, device) is bound: its call is one
lookup, one allocation and that ``cublasLtMatmul``, no checks redone.
``cublasGemmEx`` (which runs the heuristic on every call) serves the shapes cuBLASLt finds no algorithm for.
"""

import ctypes
import functools

import numpy as np

from .._cache import BOUND

__all__ = ["matmul", "LT_PLANS_MAX", "WORKSPACE_BYTES"]

#: cuBLAS workspace per device (the guide's recommendation for Hopper is 32 MiB).
WORKSPACE_BYTES = 32 << 20

_CUDA_R = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}  # cudaDataType_t
_COMPUTE = {"float32": 68, "float64": 70, "float16": 68, "bfloat16": 68}  # CUBLAS_COMPUTE_32F / _64F
_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1
# cuBLASLt attributes (cublasLt.h): the matmul descriptor's transposes, the preference's workspace and alignments.
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_PREF_MAX_WORKSPACE_BYTES = 1
_PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # of A, B, C, D
_HEURISTIC_RESULT_BYTES = 96  # cublasLtMatmulHeuristicResult_t: the 64-byte algo, workspace size, state, waves, 4 ints
#: Product shapes planned through cuBLASLt at most (descriptors and an algorithm each; a few per layer).
LT_PLANS_MAX = 1024


def _load(names, mapped):
    """The first of ``names`` the loader finds, else the copy already in this process whose ``/proc/self/maps``
    line satisfies ``mapped`` (CuPy loaded it from its own wheel's path, which the loader does not search)."""
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    with open("/proc/self/maps") as maps:
        return ctypes.CDLL(next(line.split()[-1] for line in maps if mapped(line)))


@functools.cache
def _lib():
    import importlib

    importlib.import_module("cupy_backends.cuda.libs.cublas")  # loads libcublas into the process
    lib = _load(("libcublas.so.13", "libcublas.so.12", "libcublas.so"),
                lambda line: "libcublas.so" in line and "Lt" not in line)
    vp, i32 = ctypes.c_void_p, ctypes.c_int
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    lib.cublasGemmEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32,
                                 i32, i32]
    for f in (lib.cublasCreate_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2, lib.cublasGemmEx):
        f.restype = i32
    return lib


@functools.cache
def _lt():
    """libcublasLt (loaded with libcublas), its functions typed."""
    _lib()
    lib = _load(("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"), lambda line: "libcublasLt.so" in line)
    vp, i32, u64, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
    lib.cublasLtCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), i32, i32]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, i32, vp, sz]
    lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), i32, u64, u64, i64]
    lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, i32, vp, sz]
    lib.cublasLtMatmulPreferenceDestroy.argtypes = [vp]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, i32, vp, ctypes.POINTER(i32)]
    lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp]
    for f in (lib.cublasLtCreate, lib.cublasLtMatmulDescCreate, lib.cublasLtMatmulDescSetAttribute,
              lib.cublasLtMatrixLayoutCreate, lib.cublasLtMatmulPreferenceCreate,
              lib.cublasLtMatmulPreferenceSetAttribute, lib.cublasLtMatmulPreferenceDestroy,
              lib.cublasLtMatmulAlgoGetHeuristic, lib.cublasLtMatmul):
        f.restype = i32
    return lib


@functools.cache
def _lt_handle(device_id):
    h = ctypes.c_void_p()
    _check(_lt().cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
    return h.value


def _alignment(ptr):
    """The largest power of two (at most 256) that divides a device address: what cuBLASLt may assume."""
    return min(256, ptr & -ptr) if ptr else 256


@functools.lru_cache(maxsize=LT_PLANS_MAX)
def _lt_plan(device_id, name, op_b, op_a, n, m, k, ldb, lda, aligns):
    """``(desc, A, B, C layouts, algo address, its buffer)`` of one product shape through cuBLASLt (the column-major ``Cᵀ = Bᵀ Aᵀ``
    of :func:`matmul`), or None where the heuristic finds no algorithm.  Made once per shape (never under a
    capture: the first eager call plans it)."""
    lt = _lt()
    t, compute, _, _ = _TYPES[name]
    scale = _CUDA_R["float64"] if name == "float64" else _CUDA_R["float32"]
    desc = ctypes.c_void_p()
    _check(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), compute, scale), "cublasLtMatmulDescCreate")
    for attr, op in ((_DESC_TRANSA, op_b), (_DESC_TRANSB, op_a)):
        v = ctypes.c_int32(op)
        _check(lt.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), 4), "cublasLtMatmulDescSetAttribute")
    layouts = []
    for rows, cols, ld in ((n, k, ldb) if op_b == _OP_N else (k, n, ldb),
                           (k, m, lda) if op_a == _OP_N else (m, k, lda), (n, m, n)):
        lay = ctypes.c_void_p()
        _check(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lay), t, rows, cols, ld), "cublasLtMatrixLayoutCreate")
        layouts.append(lay.value)
    pref = ctypes.c_void_p()
    _check(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
    try:
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(lt.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), 8),
               "cublasLtMatmulPreferenceSetAttribute")
        for attr, align in zip(_PREF_MIN_ALIGNMENT, aligns):  # b, a, c (and d = c): what these addresses allow
            v = ctypes.c_uint32(align)
            _check(lt.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(v), 4),
                   "cublasLtMatmulPreferenceSetAttribute")
        result = (ctypes.c_char * _HEURISTIC_RESULT_BYTES)()
        found = ctypes.c_int(0)
        status = lt.cublasLtMatmulAlgoGetHeuristic(_lt_handle(device_id), desc, layouts[0], layouts[1], layouts[2],
                                                   layouts[2], pref, 1, result, ctypes.byref(found))
    finally:
        lt.cublasLtMatmulPreferenceDestroy(pref)
    if status != 0 or found.value < 1:
        return None
    # the algo is the result's first 64 bytes: its address goes to every call (the buffer kept with it)
    return desc.value, layouts[0], layouts[1], layouts[2], ctypes.addressof(result), result


def _check(status, what):
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


class _Handle:
    """One device's cuBLAS handle, its workspace, and the stream it was last set to."""

    __slots__ = ("ptr", "workspace", "stream")

    def __init__(self, ptr, workspace):
        self.ptr, self.workspace, self.stream = ptr, workspace, None

    def on(self, lib, stream):
        """The handle, set to ``stream`` if it is not already.  ``cublasSetStream`` resets the handle's workspace
        to cuBLAS's own pool (the cuBLAS guide), which a capture cannot use: the workspace is set again after."""
        if stream != self.stream:
            _check(lib.cublasSetStream_v2(self.ptr, stream), "cublasSetStream")
            _check(lib.cublasSetWorkspace_v2(self.ptr, self.workspace.data.ptr, WORKSPACE_BYTES), "cublasSetWorkspace")
            self.stream = stream
        return self.ptr


@functools.cache
def _handle(device_id):
    """The device's :class:`_Handle`, made once (outside any capture: the first call warms it)."""
    import cupy

    lib = _lib()
    with cupy.cuda.Device(device_id):
        h = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
        workspace = cupy.empty(WORKSPACE_BYTES, np.uint8)
        _check(lib.cublasSetWorkspace_v2(h, workspace.data.ptr, WORKSPACE_BYTES), "cublasSetWorkspace")
    return _Handle(h.value, workspace)


#: Per dtype: (cudaDataType_t, computeType, address of alpha = 1, address of beta = 0), the scalars made once.
_SCALARS = {"f": (ctypes.c_float(1.0), ctypes.c_float(0.0)), "d": (ctypes.c_double(1.0), ctypes.c_double(0.0))}
_TYPES = {name: (_CUDA_R[name], _COMPUTE[name], ctypes.addressof(_SCALARS["d" if name == "float64" else "f"][0]),
                 ctypes.addressof(_SCALARS["d" if name == "float64" else "f"][1])) for name in _CUDA_R}


def _operand(a):
    """``(op, leading dimension, array)`` of a row-major operand, as the column-major call sees it."""
    m, k = a.shape
    if a.flags.c_contiguous:
        return _OP_N, max(k, 1), a
    if a.flags.f_contiguous:
        return _OP_T, max(m, 1), a
    a = a.copy(order="C")
    return _OP_N, max(k, 1), a


#: Per operand signature (dtypes, shapes, strides, the addresses' low bits, device), in the store of bound calls
#: (:data:`tcgnn_py._cache.BOUND`): the planned call's fixed arguments, so a repeated product is one dictionary
#: lookup, one allocation and one ``cublasLtMatmul``.
_bound = BOUND


def matmul(a, b):
    """``a @ b`` for 2-D CuPy arrays, through cuBLAS on the current stream (capturable).

    Mixed dtypes are promoted first, as CuPy's ``@`` does; other dtypes (integers, complex) or
    operands of other dimensions go to CuPy's ``@`` (which a capture refuses).
    """
    import cupy

    pa, pb = a.data.ptr, b.data.ptr
    device = cupy.cuda.runtime.getDevice()
    key = ("blas", a.dtype, b.dtype, a.shape, b.shape, a.strides, b.strides, (pa & 255) << 8 | (pb & 255), device)
    bound = _bound.get(key)
    if bound is None:
        return _matmul(a, b, key)
    shape, dtype, fn, head, mid, tail, _ = bound
    c = cupy.ndarray(shape, dtype)
    pc = c.data.ptr
    _check(fn(*head, pb, mid[0], pa, mid[1], mid[2], pc, mid[3], pc, mid[3], *tail,
              cupy.cuda.get_current_stream().ptr), "cublasLtMatmul")
    return c


def _matmul(a, b, key):
    """:func:`matmul` of a signature not bound yet: checks, plans (cuBLASLt, else ``cublasGemmEx``) and, where the
    operands go to cuBLASLt as they are, binds the signature."""
    import cupy

    if a.ndim != 2 or b.ndim != 2:
        return a @ b
    if a.dtype != b.dtype:  # promote as CuPy's @ does (float16 activations with a float32 gradient)
        dt = cupy.result_type(a.dtype, b.dtype)
        a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
        key = None
    if a.dtype.name not in _CUDA_R:
        return a @ b
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(f"matmul: dimension mismatch with signature (n,k={k}),(k={b.shape[0]},m)->(n,m)")
    n = b.shape[1]
    c = cupy.empty((m, n), a.dtype)
    if m == 0 or n == 0:
        return c
    if k == 0:
        c.fill(0)
        return c
    device = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream().ptr
    hd = _handle(device)
    op_a, lda, a2 = _operand(a)
    op_b, ldb, b2 = _operand(b)
    if a2 is not a or b2 is not b:
        key = None  # a copy was made: the next call copies again
    a, b = a2, b2
    name = a.dtype.name
    t, compute, one, zero = _TYPES[name]
    pa, pb, pc = a.data.ptr, b.data.ptr, c.data.ptr
    # Row-major C = A B is column-major Cᵀ = Bᵀ Aᵀ: B first, the m and n swapped.
    plan = _lt_plan(device, name, op_b, op_a, n, m, k, ldb, lda, (_alignment(pb), _alignment(pa), _alignment(pc),
                                                                 _alignment(pc)))
    if plan is not None:
        desc, lay_b, lay_a, lay_c, algo, _ = plan
        fn = _lt().cublasLtMatmul
        head = (_lt_handle(device), desc, one)
        tail = (algo, hd.workspace.data.ptr, WORKSPACE_BYTES)
        _check(fn(*head, pb, lay_b, pa, lay_a, zero, pc, lay_c, pc, lay_c, *tail, stream), "cublasLtMatmul")
        if key is not None and _alignment(pc) == 256:  # (every new result is: the pool hands out 256-byte blocks)
            _bound.put(key, ((m, n), a.dtype, fn, head, (lay_b, lay_a, zero, lay_c), tail, plan), ("blas", device))
        return c
    lib = _lib()
    _check(lib.cublasGemmEx(hd.on(lib, stream), op_b, op_a, n, m, k, one, pb, t, ldb, pa, t, lda, zero, pc, t, n,
                            compute, _GEMM_DEFAULT), "cublasGemmEx")
    return c
