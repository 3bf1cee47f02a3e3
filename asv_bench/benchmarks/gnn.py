"""Time per training epoch of GCN and AGNN (tcgnn_py.nn): tiled tensor cores against cupyx sparse ops."""

from .common import require_gpu


def _sync():
    import cupy

    cupy.cuda.Device().synchronize()


class TrainEpoch:
    """One full-batch step: forward with dropout, loss, backward, Adam (``python -m tcgnn_py.bench --ops gcn,agnn``)."""

    params = (["cora", "pubmed"], ["gcn", "agnn"], ["tcgnn_py", "tcgnn_py_graph", "cupyx"])
    param_names = ("graph", "model", "impl")
    timeout = 300

    def setup_cache(self):
        from tcgnn_py.bench import gnn_problem

        return {g: gnn_problem(g) for g in self.params[0]}  # graph, features, labels, split

    def setup(self, problems, graph, model, impl):
        require_gpu()
        from tcgnn_py.bench import train_step

        # tcgnn_py_graph: the step captured once as a CUDA graph and replayed (tcgnn_py.CUDAGraph)
        sparse = "csr" if impl == "cupyx" else "tiled"
        self.step = train_step(problems[graph], model, sparse, "cuda", cuda_graph=impl == "tcgnn_py_graph")
        for _ in range(3):
            self.step()
        _sync()

    def time_epoch(self, problems, graph, model, impl):
        self.step()
        _sync()


class CallCost:
    """Wall time of one repeated product on Cora at D = 16 (launch-bound): ``T @ X``, ``tg.sddmm``, a replay."""

    params = (["T @ X", "spmm(out=)", "sddmm", "graph replay"],)
    param_names = ("call",)

    def setup_cache(self):
        return None  # the bundled Cora is loaded in setup (keeps the signature of the other benchmarks)

    def setup(self, cache, call):
        require_gpu()
        import cupy as cp
        import numpy as np

        import tcgnn_py as tg

        A = tg.load_cora().adj.astype(np.float32)
        T = tg.TiledMatrix(A)
        X = cp.asarray(np.random.default_rng(0).standard_normal((A.shape[1], 16), dtype=np.float32))
        Y = cp.empty((A.shape[0], 16), np.float32)
        if call == "graph replay":
            tg.spmm(T, X, out=Y)
            graph = tg.CUDAGraph()
            with graph.capture():
                tg.spmm(T, X, out=Y)
            self.fn = graph.replay
        else:
            self.fn = {"T @ X": lambda: T @ X, "spmm(out=)": lambda: tg.spmm(T, X, out=Y),
                       "sddmm": lambda: tg.sddmm(T, X)}[call]
        for _ in range(50):
            self.fn()
        _sync()

    def time_100_calls(self, cache, call):
        for _ in range(100):
            self.fn()
        _sync()
