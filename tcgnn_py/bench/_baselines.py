"""Layer 4 (bench): What a user would run instead of tcgnn_py, set up once and called per input.

Device baselines take a ``cupyx.scipy.sparse.csr_matrix`` (canonical: sorted
indices, no duplicates) and a list of row-major float32 inputs; ``fn(i)``
computes on input ``i``.  Host baselines are SciPy / NumPy.
"""

import ctypes
import importlib

import numpy as np

__all__ = ["CusparseRowMajor", "CusparseSDDMM", "GatherDotSDDMM", "CSR_ALG2", "CSR_ALG3", "cusparse_library"]

# cuSPARSE enums (cusparse.h, library_types.h), in case the binding does not export them.
CSR_ALG2, CSR_ALG3 = 6, 12
_ORDER_ROW, _R_32F, _SDDMM_ALG_DEFAULT = 2, 0, 0
_OP_N, _OP_T = 0, 1
#: cudaDataType of the value types the row-major SpMM baseline takes.
_CUDA_TYPES = {"float32": _R_32F, "float16": 2, "bfloat16": 14}


def _csr_int32(A):
    """``(indptr, indices)`` of a cupyx CSR matrix as int32, which these kernels and descriptors read.

    cupyx keeps a scipy matrix's int64 indices as they are; read as int32 they would be wrong.
    """
    import cupy as cp

    return A.indptr.astype(cp.int32, copy=False), A.indices.astype(cp.int32, copy=False)


class CusparseRowMajor:
    """``Y = A @ X`` through cusparseSpMM with row-major X and Y (one algorithm).

    Descriptors and the work buffer are made once per X; ``spMM_preprocess``
    runs once where the binding has it (it helps ALG3), outside any timing.
    """

    def __init__(self, A, Xs, Y, alg):
        import cupy as cp
        from cupy.cuda import device
        from cupy_backends.cuda.libs import cusparse as cs

        # A, X and Y of one type: float32, or float16 / bfloat16 (A's values cast; float32 compute).
        dt = np.dtype(Y.dtype)
        vtype = _CUDA_TYPES[dt.name]
        self.cs, self.alg = cs, alg
        self.handle = device.get_cusparse_handle()
        self.alpha, self.beta = np.array(1, np.float32), np.array(0, np.float32)
        self.op = cs.CUSPARSE_OPERATION_NON_TRANSPOSE
        i32 = cs.CUSPARSE_INDEX_32I
        indptr, indices = _csr_int32(A)
        data = A.data if A.data.dtype == dt else A.data.astype(dt)
        self._keep = (A, Xs, Y, indptr, indices, data)
        self.matA = cs.createCsr(A.shape[0], A.shape[1], A.nnz, indptr.data.ptr, indices.data.ptr,
                                 data.data.ptr, i32, i32, cs.CUSPARSE_INDEX_BASE_ZERO, vtype)
        order = getattr(cs, "CUSPARSE_ORDER_ROW", _ORDER_ROW)
        D = Y.shape[1]
        self.matXs = [cs.createDnMat(X.shape[0], D, D, X.data.ptr, vtype, order) for X in Xs]
        self.matY = cs.createDnMat(Y.shape[0], D, D, Y.data.ptr, vtype, order)
        size = max(self._call(cs.spMM_bufferSize, self.matXs[0]), 1)
        self.buf = cp.empty(size, cp.int8)
        if hasattr(cs, "spMM_preprocess"):
            for m in self.matXs:
                self._call(cs.spMM_preprocess, m, self.buf.data.ptr)

    def _call(self, fn, matX, *extra):
        return fn(self.handle, self.op, self.op, self.alpha.ctypes.data, self.matA, matX,
                  self.beta.ctypes.data, self.matY, _R_32F, self.alg, *extra)

    def __call__(self, i):
        self._call(self.cs.spMM, self.matXs[i], self.buf.data.ptr)

    def close(self):
        for m in self.matXs + [self.matY]:
            self.cs.destroyDnMat(m)
        self.cs.destroySpMat(self.matA)


def cusparse_library():
    """``ctypes.CDLL`` of the libcusparse CuPy loaded (SDDMM has no CuPy binding)."""
    importlib.import_module("cupy_backends.cuda.libs.cusparse")  # loads the library

    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return ctypes.CDLL(load_nvidia_dynamic_lib("cusparse").abs_path)
    except Exception:  # older CuPy: find what the process mapped
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcusparse.so" in line}
        if not paths:
            raise RuntimeError("libcusparse is not loaded in this process") from None
        return ctypes.CDLL(sorted(paths)[0])


class CusparseSDDMM:
    """``out = (Xa @ Xb.T)`` sampled at A's pattern through cusparseSDDMM (ctypes).

    ``Xa`` row-major ``(n, D)`` with ``opA = N``; ``Xb`` row-major ``(k, D)`` read
    as ``(D, k)`` through ``opB = T``.  ``out`` holds values in A's CSR order.
    """

    def __init__(self, A, Xs, out):
        import cupy as cp
        from cupy.cuda import device
        from cupy_backends.cuda.libs import cusparse as cs

        lib = cusparse_library()
        vp, ci = ctypes.c_void_p, ctypes.c_int
        sig = [vp, ci, ci, vp, vp, vp, vp, vp, ci, ci]
        self._size = lib.cusparseSDDMM_bufferSize
        self._size.argtypes = sig + [ctypes.POINTER(ctypes.c_size_t)]
        self._pre, self._run = lib.cusparseSDDMM_preprocess, lib.cusparseSDDMM
        for f in (self._pre, self._run):
            f.argtypes = sig + [vp]
        for f in (self._size, self._pre, self._run):
            f.restype = ci
        self.cs, self.handle = cs, device.get_cusparse_handle()
        self.alpha, self.beta = np.array(1, np.float32), np.array(0, np.float32)
        i32 = cs.CUSPARSE_INDEX_32I
        indptr, indices = _csr_int32(A)
        self._keep = (A, Xs, out, indptr, indices)
        self.matC = cs.createCsr(A.shape[0], A.shape[1], A.nnz, indptr.data.ptr, indices.data.ptr,
                                 out.data.ptr, i32, i32, cs.CUSPARSE_INDEX_BASE_ZERO, _R_32F)
        D = Xs[0].shape[1]
        self.mats = [cs.createDnMat(X.shape[0], D, D, X.data.ptr, _R_32F, _ORDER_ROW) for X in Xs]
        n = ctypes.c_size_t(0)
        self._check(self._size, self.mats[0], ctypes.byref(n))
        self.buf = cp.empty(max(n.value, 1), cp.int8)
        self._check(self._pre, self.mats[0], self.buf.data.ptr)

    def _check(self, fn, mat, extra):
        status = fn(self.handle, _OP_N, _OP_T, self.alpha.ctypes.data, mat, mat, self.beta.ctypes.data,
                    self.matC, _R_32F, _SDDMM_ALG_DEFAULT, extra)
        if status != 0:
            raise RuntimeError(f"{fn.__name__} failed with cusparseStatus_t {status}")

    def __call__(self, i):
        self._check(self._run, self.mats[i], self.buf.data.ptr)

    def close(self):
        for m in self.mats:
            self.cs.destroyDnMat(m)
        self.cs.destroySpMat(self.matC)


class GatherDotSDDMM:
    """``out[e] = <Xs[i][rows[e]], Xs[i][cols[e]]>``: the gather-and-dot kernel of :mod:`._kernels`."""

    def __init__(self, A, Xs, out):
        import cupy as cp

        from ..kernels.launches import make
        from ..kernels.registry import get_kernel
        from ._kernels import BASELINE_GROUPS, BASELINE_THREADS, baseline_sddmm_name

        indptr, self.cols = _csr_int32(A)
        self.rows = cp.repeat(cp.arange(A.shape[0], dtype=cp.int32), cp.diff(indptr).astype(cp.int64))
        self.Xs, self.out = Xs, out
        D = Xs[0].shape[1]
        self.group = next(g for g in BASELINE_GROUPS if g >= min(D, 32))
        name = baseline_sddmm_name(self.group)
        get_kernel("baseline", name)  # compiled now, not in the timed calls
        self.launch = make("baseline", name, -(-A.nnz * self.group // BASELINE_THREADS), BASELINE_THREADS,
                           (("Xa", "Xb"),), dict(rows=self.rows, cols=self.cols, out=out, nnz=A.nnz, D=D))

    def __call__(self, i):
        self.launch.run(self.Xs[i])

    def close(self):
        pass
