"""Layer 0: CUDA-graph capture of library calls on a CuPy stream, replayed with one launch.

Small graphs are launch-bound: a GCN step on Cora issues about a hundred
kernels of a few microseconds each, and issuing them from Python takes as long
as running them.  A CUDA graph records the kernels once and replays them with
one launch.  :class:`CUDAGraph` does the bookkeeping that makes replays
correct:

* capture runs on a private stream, ordered after the caller's stream;
* allocations made while capturing come from a private memory pool that only
  this graph uses, so the addresses baked into the graph stay valid and no
  other code is handed them (arrays freed after capture go back to that pool,
  not to CuPy's);
* every kernel the library launches -- CuPy RawModule kernels, CuPy array
  operations, cuBLAS, and the Numba kernels (launched on CuPy's current
  stream) -- goes to the capturing stream; a host read inside the captured
  region raises instead of being skipped;
* :attr:`CUDAGraph.kernel_names` lists the kernels the graph holds, so tests
  (and users) can check that what they expect was captured (None where
  cuda-python's driver bindings are missing).

What a replay recomputes is what the captured code computed, from the same
buffers: write new inputs into the arrays used while capturing
(``X[...] = new``), replay, read the results from the arrays the captured
code returned.  State kept on the device advances with every replay --
CuPy's random generators (``cupy.random.default_rng``) and the step count of
:class:`tcgnn_py.nn.Adam` -- so dropout masks are fresh and bias corrections
move on each step.  Values the host computed while capturing (Python scalars
passed to kernels) are frozen into the graph.

Work that reads the device from the host (building a :class:`TiledMatrix`,
the first product of a new shape, which plans its launch) cannot be captured:
run the code once before capturing (a warm-up), as with any CUDA graph.
"""

import contextlib

from ._device import get_cupy

__all__ = ["CUDAGraph", "before_capture"]

_BEFORE_CAPTURE = []


def before_capture(fn):
    """Call ``fn()`` before every capture starts (the kernel registry finishes its background compiles there:
    a module loaded by another thread during a capture could invalidate it)."""
    if fn not in _BEFORE_CAPTURE:
        _BEFORE_CAPTURE.append(fn)
    return fn


class CUDAGraph:
    """A CUDA graph captured from Python code, replayed on the current CuPy stream.

    Examples
    --------
    The recipe for a loop of one's own (warm up, capture, then replay with new
    inputs written in place)::

        import cupy as cp, tcgnn_py as tg

        T = tg.TiledMatrix(A)                    # A: a scipy.sparse matrix
        X = cp.asarray(features)
        Y = T @ X                                # warm-up: plans the launch
        g = tg.CUDAGraph()
        with g.capture():
            Y = T @ X                            # recorded, not run
        for batch in batches:
            X[...] = batch                       # new inputs, same buffer
            g.replay()                           # Y holds T @ batch
        print(g.kernel_names)                    # ('tcgnn_spmm_...',)

    >>> import tcgnn_py as tg
    >>> tg.CUDAGraph.__name__
    'CUDAGraph'
    """

    def __init__(self):
        cp = get_cupy()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._pool = cp.cuda.MemoryPool()
        self._graph = None
        self.kernel_names = None

    @contextlib.contextmanager
    def capture(self):
        """Record the CUDA work of the ``with`` block instead of running it (once per graph)."""
        cp = get_cupy()
        if self._graph is not None:
            raise RuntimeError("this CUDAGraph holds a capture already; make a new one")
        for fn in _BEFORE_CAPTURE:
            fn()
        caller = cp.cuda.get_current_stream()
        self.stream.wait_event(caller.record())  # after what the caller queued
        with self.stream, cp.cuda.using_allocator(self._pool.malloc):
            self.stream.begin_capture()
            try:
                yield self
            except BaseException:
                with contextlib.suppress(Exception):
                    self.stream.end_capture()  # drop the partial graph; the error is what matters
                raise
            try:
                names = _kernel_names(self.stream.ptr)
            except Exception:  # noqa: BLE001  a listing for diagnosis: it must not fail the capture
                names = None
            graph = self.stream.end_capture()
        self._graph = graph
        self.kernel_names = names

    def replay(self):
        """Run the captured work once, on the current CuPy stream (ordered with the caller's work)."""
        if self._graph is None:
            raise RuntimeError("nothing captured yet: use 'with graph.capture(): ...' first")
        self._graph.launch(get_cupy().cuda.get_current_stream())


def _kernel_names(stream_ptr):
    """Names of the kernel nodes of the graph a stream is capturing (None without cuda-python)."""
    try:
        from cuda.bindings import driver as drv
    except ImportError:  # cuda-python is optional (Numba brings it)
        return None

    def ok(result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver call failed: {err}")
        return rest

    info = ok(drv.cuStreamGetCaptureInfo(drv.CUstream(stream_ptr)))
    graph = info[2]  # status, id, graph, dependencies, ...
    _, count = ok(drv.cuGraphGetNodes(graph, 0))
    nodes, _ = ok(drv.cuGraphGetNodes(graph, count))
    names = []
    for node in nodes:
        (kind,) = ok(drv.cuGraphNodeGetType(node))
        if kind == drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
            (params,) = ok(drv.cuGraphKernelNodeGetParams(node))
            (name,) = ok(drv.cuFuncGetName(params.func))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
    return tuple(names)
